"""``mlmkit <command> [settings]``: every job of the toolkit behind one command.

    mlmkit train     model=bert-mini train.max_steps=200      pretrain (conf/config.yaml)
    mlmkit eval      checkpoint=outputs/<run>                  MLM figures of a model
    mlmkit eval-sts  checkpoint=outputs/<run> data_dir=<STS-B> zero-shot sentence similarity
    mlmkit eval-retrieval checkpoint=outputs/<run> data_dir=<BEIR folder>  zero-shot retrieval
    mlmkit eval-pairs checkpoint=outputs/<run> files=[<pairs.jsonl>]  minimal pairs (BLiMP)
    mlmkit finetune  checkpoint=outputs/<run> task=sst2        GLUE fine-tuning
    mlmkit glue      checkpoint=outputs/<run> data_dir=<glue_data>  the GLUE table and average
    mlmkit scorecard models=[outputs/<a>,outputs/<b>] data_dir=<data>  did pretraining pay?
    mlmkit embed     checkpoint=outputs/<run> pairs.files=[pairs.jsonl]  a sentence embedder
    mlmkit export    outputs/<run>/checkpoints/step_0001000 out/  a checkpoint as a model dir
    mlmkit tokenizer data=files data.train_files=[a.txt] out=tok/
    mlmkit fill-mask outputs/<run>/final "The [MASK] is here."
    mlmkit predict   outputs/finetune/<task>/<date>/<time>/model "a text"
    mlmkit plot      outputs/<run> [more runs] [--out file.png]
    mlmkit sweep     multirun/<date>/<time>
    mlmkit doctor    model=bert-base [--out report.json]      what a run gets on this machine,
                                                              and what to change
    mlmkit accelerate-config ddp_bf16 --out ddp.yaml        a packaged accelerate config
    mlmkit launch    --multi_gpu --num_processes 2 train ...  accelerate launch, one sentence
                                                              however it ends

Each command lives in ``mlmkit.cli.<name>`` and takes Hydra overrides (or, for fill-mask, predict,
plot and sweep, plain arguments). Under ``accelerate launch -m mlmkit train ...`` (or
``accelerate launch train.py ...``) it runs on every process. A problem with a setting or
an input stops with exit status 2 and one sentence that names it (``cli.errors``).
"""

from __future__ import annotations

import importlib
import os
import sys

from mlmkit.cli.errors import end_rank, report_errors

# the commands whose training stops on a signal with a checkpoint (``training.signals``)
STOPPABLE = ("train", "embed")
# command -> (module, whether main() takes the arguments (else Hydra reads sys.argv), what it does);
# a Hydra command's config is in HYDRA_CONFIGS
COMMANDS: dict[str, tuple[str, bool, str]] = {
    "train": ("mlmkit.pretrain", False, "pretrain a masked language model"),
    "eval": (
        "mlmkit.cli.evaluate",
        False,
        "masked-token loss and accuracy of a model on held-out text",
    ),
    "eval-sts": (
        "mlmkit.cli.eval_sts",
        False,
        "zero-shot STS-B similarity of the model's sentence embeddings",
    ),
    "eval-retrieval": (
        "mlmkit.cli.eval_retrieval",
        False,
        "zero-shot retrieval (nDCG@10) of the model's sentence embeddings on a BEIR folder",
    ),
    "eval-pairs": (
        "mlmkit.cli.eval_pairs",
        False,
        "minimal-pair acceptability (BLiMP) by the model's pseudo-log-likelihoods",
    ),
    "finetune": (
        "mlmkit.cli.finetune",
        False,
        "fine-tune on a GLUE task or your own labelled files",
    ),
    "glue": (
        "mlmkit.cli.glue",
        False,
        "GLUE's tasks under one protocol: the table and its average",
    ),
    "scorecard": (
        "mlmkit.cli.scorecard",
        False,
        "did pretraining pay? models against a random init on a suite, with intervals",
    ),
    "embed": (
        "mlmkit.cli.embed",
        False,
        "fine-tune a model as a sentence embedder (search, RAG): pairs or raw text",
    ),
    "export": ("mlmkit.cli.export", True, "a checkpoint as a plain model dir (as final/)"),
    "tokenizer": ("mlmkit.cli.tokenizer", True, "train a tokenizer on a corpus"),
    "fill-mask": ("mlmkit.cli.fill_mask", True, "fill the [MASK] of a sentence"),
    "predict": ("mlmkit.cli.predict", True, "classify texts with a fine-tuned model"),
    "plot": ("mlmkit.cli.plot", True, "plot the curves of runs"),
    "sweep": ("mlmkit.cli.sweep", True, "the final figures of a sweep, as a table"),
    "doctor": (
        "mlmkit.cli.doctor",
        True,
        "what a run gets on this machine (kernels, speed, parity), and what to change",
    ),
    "accelerate-config": (
        "mlmkit.cli.accelerate_config",
        True,
        "print or write a packaged accelerate config (none: list them)",
    ),
    "launch": (
        "mlmkit.cli.launch",
        True,
        "a command on several processes (accelerate launch), with one "
        "sentence and a meaningful exit status however it ends",
    ),
}
# the config (conf/<name>.yaml) each Hydra command composes
HYDRA_CONFIGS = {
    "train": "config",
    "eval": "evaluate",
    "eval-sts": "eval_sts",
    "eval-retrieval": "eval_retrieval",
    "eval-pairs": "eval_pairs",
    "finetune": "finetune",
    "glue": "glue",
    "scorecard": "scorecard",
}
HELP_FLAGS = ("-h", "--help")


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: mlmkit <command> [settings]", "", "commands:"]
    lines += [f"  {name:<{width}}  {what}" for name, (_, _, what) in COMMANDS.items()]
    lines += ["", "mlmkit <command> --help shows a command's settings."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the ``mlmkit`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        print(
            f"Error: unknown command {command!r}; choose one of {', '.join(COMMANDS)}.",
            file=sys.stderr,
        )
        return 2
    module, takes_args, what = COMMANDS[command]
    if command in HYDRA_CONFIGS and any(arg in HELP_FLAGS for arg in rest):
        from mlmkit.config.help import command_help

        try:
            print(command_help(command, HYDRA_CONFIGS[command], what))
        except BrokenPipeError:  # mlmkit train --help | head
            sys.stdout = open(os.devnull, "w")
        return 0
    from mlmkit.cli.launch import record_pid
    from mlmkit.cli.output import quiet_libraries

    quiet_libraries()
    record_pid()  # a rank under mlmkit launch: where the launcher's signals go
    if command not in STOPPABLE:
        return _run(command, module, takes_args, rest)
    # a scheduler's warning during the imports and setup is kept, and let go when it ends
    from mlmkit.training.signals import hold_warnings, release_warnings

    hold_warnings()
    try:
        return _run(command, module, takes_args, rest)
    finally:
        release_warnings()


def _run(command: str, module: str, takes_args: bool, rest: list[str]) -> int:
    run = importlib.import_module(module).main
    sys.argv = [f"mlmkit {command}", *rest]  # Hydra and argparse read the command line here
    # Hydra's mains report their own errors (exit_on_error) and a Ctrl-C outside them here
    return end_rank(report_errors(run if not takes_args else lambda: run(rest)))


def fill_mask_main() -> int:
    """Run the ``mlmkit-fill-mask`` console script: ``mlmkit fill-mask``."""
    return main(["fill-mask", *sys.argv[1:]])
