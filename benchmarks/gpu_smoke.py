"""The GPU check's first step: a few steps of a real run and the attention kernels, in seconds, so
that an environment that cannot train shows in the first minute of a lent GPU.

1. a kernel report (``mlmkit.training.doctor``'s machine and attention parts): the chip, its
   number formats, and which of SDPA's kernels take bert-base at 128 tokens and modernbert-base at
   1,024 tokens, per kind of batch, in the run's precision;
2. ``mlmkit.compose`` and ``mlmkit.train`` as ``mlmkit train`` runs them: bert-tiny on the
   built-in corpus (a 2,000-token tokenizer trained, the corpus turned into a dataset and
   packed), 5 steps on the GPU with 2 dataloader workers started by spawn, which pickles what
   each worker receives (the dataset, the sampler, the collator), as a run started from a spawned
   process (the benchmarks' runs) or with Python's forkserver default (3.14) starts them.

    python benchmarks/gpu_smoke.py --out smoke.json [--cache DIR] [--tiny] [override ...]

``--tiny`` sizes the run and the kernels' shapes for a CPU (the GPU check's rehearsal); extra
arguments are overrides of the run, as for ``mlmkit train``.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
from harness import counting_workers, quiet_logging  # noqa: E402

TINY = [
    "model.num_hidden_layers=2",
    "model.hidden_size=64",
    "model.num_attention_heads=2",
    "model.intermediate_size=128",
    "tokenizer.vocab_size=2000",
    "data.max_seq_length=64",
    "data.max_eval_samples=32",
    "train.batch_size=8",
]
# what the run on a GPU takes beside bert-tiny's sizes: kept small, so that the step ends within
# its 30 s (a small vocabulary trains and packs quicker; a few validation rows)
LEAN = [
    "tokenizer.vocab_size=2000",
    "data.max_seq_length=128",
    "data.max_eval_samples=32",
    "train.batch_size=32",
]
# the later steps' shapes: (overrides, what they are)
KERNEL_SHAPES = (
    (["model=bert-base", "data.max_seq_length=128"], "bert-base, 128 tokens"),
    (["model=modernbert-base", "data.max_seq_length=1024"], "modernbert-base, 1,024 tokens"),
)
TINY_SHAPES = (
    (["model=bert-tiny", *TINY], "bert-tiny (rehearsal sizes)"),
    (["model=modernbert-tiny", *TINY, "model.local_attention=32"], "modernbert-tiny"),
)


def train_figures(overrides: list[str], cache: str, steps: int, workers: int) -> dict:
    """Train bert-tiny for ``steps`` steps with ``workers`` dataloader workers; what it did."""
    import mlmkit
    from mlmkit.training.metrics_log import read_metrics

    cfg = mlmkit.compose(
        [
            "model=bert-tiny",
            "data=builtin",
            "logger=none",
            f"paths.cache_dir={cache}",
            f"train.max_steps={steps}",
            "optim.warmup_steps=1",  # the rate decays within the few steps
            f"train.num_workers={workers}",
            "train.log_every=1",
            "train.eval_every=0",
            "train.save_every=0",
            "train.export=false",
            "train.progress=false",
            *overrides,
        ]
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mlmkit-smoke-") as run_dir:
        with counting_workers() as found:
            last_eval = mlmkit.train(cfg, os.path.join(run_dir, "run"))
        events = [e for e in read_metrics(os.path.join(run_dir, "run")) if e["event"] == "train"]
    return {
        "steps": len(events),
        "loss": events[-1]["loss"] if events else None,
        "finite": bool(events) and all(math.isfinite(e["loss"]) for e in events),
        "eval_loss": last_eval.get("eval_loss"),
        "tokens_per_s": events[-1]["tokens_per_s"] if events else None,
        "workers": found,
        "seconds": round(time.perf_counter() - started, 1),
    }


def kernel_figures(shapes, cache: str) -> dict:
    """The machine and, per shape, the attention implementation and SDPA's kernels, on this
    process's device in the precision a run takes there (bf16 on CUDA, fp32 on a CPU)."""
    import torch

    import mlmkit
    from mlmkit.training.doctor import attention_report, machine_report

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    precision = "bf16" if cuda else "no"
    report = {"machine": machine_report(device, precision), "attention": {}}
    for overrides, label in shapes:
        cfg = mlmkit.compose([*overrides, f"paths.cache_dir={cache}"])
        report["attention"][label] = attention_report(cfg, device, precision)
    return report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", help="overrides of the run, as for mlmkit train")
    p.add_argument("--out", required=True, help="the figures' JSON file")
    p.add_argument("--cache", default=".cache/mlmkit", help="tokenizers and packed data")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--workers", type=int, default=2, help="dataloader workers (default 2)")
    p.add_argument(
        "--start-method",
        default="spawn",
        choices=("spawn", "forkserver", "fork"),
        help="how this process starts the workers (default spawn)",
    )
    p.add_argument("--tiny", action="store_true", help="rehearsal sizes, for a CPU")
    args = p.parse_args()
    # the workers' start method is this process's default: set before anything starts one
    multiprocessing.set_start_method(args.start_method, force=True)
    quiet_logging()
    overrides = [*(TINY if args.tiny else LEAN), *args.overrides]
    figures: dict = {"kernels": None, "train": None}

    def write() -> None:
        partial = f"{args.out}.partial"
        with open(partial, "w", encoding="utf-8") as f:
            json.dump(figures, f, indent=1, default=str)
        os.replace(partial, args.out)

    # the kernels first (a few seconds): they are kept if the run then hangs or runs out of time
    started = time.perf_counter()
    figures["kernels"] = kernel_figures(TINY_SHAPES if args.tiny else KERNEL_SHAPES, args.cache)
    figures["kernels"]["seconds"] = round(time.perf_counter() - started, 1)
    write()
    for label, a in figures["kernels"]["attention"].items():
        taken = ", ".join(f"{case}: {k['taken']}" for case, k in a["kernels"].items())
        print(f"{label}: {a['implementation']} ({a['dtype']}); {taken}", flush=True)
    figures["train"] = train_figures(overrides, args.cache, args.steps, args.workers)
    write()
    t = figures["train"]
    print(
        f"train: {t['steps']} steps, loss {t['loss']}, {t['workers']['started']} workers "
        f"({t['workers']['start_method']}), {t['seconds']} s"
    )
    ok = t["steps"] == args.steps and t["finite"] and t["workers"]["started"] == args.workers
    if not ok:
        print(
            f"Error: the run took {t['steps']} of {args.steps} steps (finite losses: "
            f"{t['finite']}) with {t['workers']['started']} of {args.workers} workers.",
            file=sys.stderr,
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
