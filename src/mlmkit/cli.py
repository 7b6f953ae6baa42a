"""``mlmkit <command> [settings]``: every job of the toolkit behind one command.

    mlmkit train     model=bert-mini train.max_steps=200      pretrain (conf/config.yaml)
    mlmkit eval      checkpoint=outputs/<run>                  MLM figures of a model
    mlmkit finetune  checkpoint=outputs/<run> task=sst2        GLUE fine-tuning
    mlmkit tokenizer data=files data.train_files=[a.txt] out=tok/
    mlmkit fill-mask outputs/<run>/final "The [MASK] is here."
    mlmkit plot      outputs/<run> [more runs] [--out file.png]
    mlmkit sweep     multirun/<date>/<time>

Each command takes the same Hydra overrides (or arguments) as before; under
``accelerate launch -m mlmkit train ...`` (or ``accelerate launch train.py ...``) it runs
on every process. A problem with a setting or an input stops with exit status 2 and one
sentence that names it (``report_errors``, the one handler of every command).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable

from mlmkit.errors import MLMKitError, Preempted

# command -> (module, function, what it does); each function reads its arguments from
# sys.argv (Hydra's way) and returns an exit status or None
COMMANDS: dict[str, tuple[str, str, str]] = {
    "train": ("mlmkit.cli", "train_main", "pretrain a masked language model"),
    "eval": ("mlmkit.evaluate", "_main", "masked-token loss and accuracy of a model on held-out text"),
    "finetune": ("mlmkit.finetune", "_main", "fine-tune on a GLUE task (SST-2, CoLA, RTE)"),
    "tokenizer": ("mlmkit.tokenizer", "main", "train a tokenizer on a corpus"),
    "fill-mask": ("mlmkit.fill_mask", "main", "fill the [MASK] of a sentence"),
    "plot": ("mlmkit.plot", "main", "plot the curves of runs"),
    "sweep": ("mlmkit.sweep", "main", "the final figures of a sweep, as a table"),
}


def report_errors(fn: Callable[[], int | None]) -> int:
    """Run ``fn``; a user's error becomes one sentence on stderr and exit status 2, a
    preemption the message and ``Preempted.exit_code`` (after the checkpoint)."""
    try:
        return fn() or 0
    except Preempted as exc:
        print(str(exc), file=sys.stderr)
        _hand_back_signal(exc.signum)
        return Preempted.exit_code
    except MLMKitError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2


def exit_on_error(fn: Callable[[], int | None]) -> None:
    """``report_errors``, then exit with its status when it is not 0 (inside Hydra's main,
    which would print a traceback for an exception)."""
    status = report_errors(fn)
    if status:
        sys.exit(status)


def _hand_back_signal(signum: int | None) -> None:
    """After the checkpoint, pass a SIGUSR1 on to the handler that was there before training.

    Under Hydra's submitit launcher that is submitit's, which requeues the SLURM job; the
    requeued job runs the same overrides, and train.resume=auto continues from the checkpoint.
    """
    import signal

    if signum is None or signum != getattr(signal, "SIGUSR1", None):
        return
    handler = signal.getsignal(signum)
    if callable(handler):
        handler(signum, None)


def _check_run_dir_override(argv: list[str]) -> None:
    """Fail with one sentence, before Hydra does with a traceback, on an unusable run dir."""
    import os

    from mlmkit.errors import ConfigError

    for arg in argv:
        if arg.startswith("hydra.run.dir=") and "${" not in arg:
            path = arg.split("=", 1)[1]
            try:
                os.makedirs(path, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"Cannot create the run dir {path!r} ({exc.strerror}); set "
                                  "hydra.run.dir to a writable folder.") from None


def train_main() -> None:
    """``mlmkit train`` / ``python train.py``: Hydra composes conf/config.yaml with the
    command line's overrides, then ``mlmkit.trainer.train`` runs in Hydra's run dir."""
    import hydra
    from omegaconf import DictConfig

    from mlmkit.config import CONFIG_PATH, register_configs, to_config

    exit_on_error(lambda: _check_run_dir_override(sys.argv[1:]))
    register_configs()

    @hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="config")
    def main(cfg: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig

        from mlmkit.trainer import train

        exit_on_error(lambda: train(to_config(cfg), HydraConfig.get().runtime.output_dir) and None)

    main()


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: mlmkit <command> [settings]", "", "commands:"]
    lines += [f"  {name:<{width}}  {what}" for name, (_, _, what) in COMMANDS.items()]
    lines += ["", "mlmkit <command> --help shows a command's settings."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The ``mlmkit`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(f"Error: unknown command {command!r}; choose one of {', '.join(COMMANDS)}.",
              file=sys.stderr)
        return 2
    module, function, _ = COMMANDS[command]
    run = getattr(importlib.import_module(module), function)
    sys.argv = [f"mlmkit {command}", *rest]  # Hydra and argparse read the command line here
    if function in ("train_main", "_main"):  # Hydra mains report their own errors
        return run() or 0
    return report_errors(lambda: run(rest))


def fill_mask_main() -> int:
    """The ``mlmkit-fill-mask`` console script: ``mlmkit fill-mask``."""
    return main(["fill-mask", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
