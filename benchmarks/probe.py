"""Seconds per linear probe (``probe.every``): a model dir's frozen encoder on a task's sentences,
in bf16 autocast and in fp32 side by side.

    python benchmarks/probe.py outputs/<run>/final --data-dir ../shared/data/glue/SST-2 \\
        --eval-file test.tsv --train-samples 10000
"""

from __future__ import annotations

import argparse

import torch

from mlmkit.config import TaskConfig
from mlmkit.evaluation.probe import LinearProbe
from mlmkit.training.runtime import describe_cpu
from mlmkit.training.trained_model import load_model_and_tokenizer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="a model dir, run dir or checkpoint")
    p.add_argument("--data-dir", required=True, help="the task's folder (GLUE's SST-2 layout)")
    p.add_argument("--eval-file", default="dev.tsv")
    p.add_argument("--train-samples", type=int, default=10000)
    p.add_argument("--rounds", type=int, default=2, help="each precision's best of this many")
    args = p.parse_args()
    probe = LinearProbe.from_task(
        TaskConfig(name="sst2", data_dir=args.data_dir, eval_file=args.eval_file),
        max_train_samples=args.train_samples,
    )
    model, tokenizer, _ = load_model_and_tokenizer(args.model)
    print(
        f"{describe_cpu()}; {torch.get_num_threads()} threads; {len(probe.train_texts)} training "
        f"and {len(probe.eval_texts)} dev sentences"
    )
    for name, dtype in (("bf16 autocast", torch.bfloat16), ("fp32", None)):
        runs = []
        for _ in range(args.rounds):
            with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
                runs.append(probe.score(model.base_model, tokenizer))
        best = min(runs, key=lambda r: r["probe_seconds"])
        print(f"{name}: {best['probe_seconds']:.1f} s, dev accuracy {best['probe_accuracy']:.4f}")


if __name__ == "__main__":
    main()
