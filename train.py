"""Pretrain a masked language model: ``python train.py`` or ``accelerate launch train.py``.

Any setting can be overridden Hydra-style, e.g.
``accelerate launch train.py model=bert-mini optim.lr=5e-4 train.max_steps=200``.
"""

import sys

import hydra
from omegaconf import DictConfig

from mlmkit.config import register_configs

register_configs()


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from mlmkit.config import to_config
    from mlmkit.errors import MLMKitError, Preempted

    try:
        config = to_config(cfg)
        from mlmkit.trainer import train

        train(config, HydraConfig.get().runtime.output_dir)
    except Preempted as exc:
        print(str(exc), file=sys.stderr)
        _hand_back_signal(exc.signum)
        sys.exit(Preempted.exit_code)
    except MLMKitError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        sys.exit(2)


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

    for arg in argv:
        if arg.startswith("hydra.run.dir=") and "${" not in arg:
            path = arg.split("=", 1)[1]
            try:
                os.makedirs(path, exist_ok=True)
            except OSError as exc:
                print(f"Error: cannot create the run dir {path!r} ({exc.strerror}); set "
                      "hydra.run.dir to a writable folder.", file=sys.stderr)
                sys.exit(2)


if __name__ == "__main__":
    _check_run_dir_override(sys.argv[1:])
    main()
