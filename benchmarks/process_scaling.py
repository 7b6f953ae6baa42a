"""Throughput of 1 process against N processes (data parallel) on this machine.

    python benchmarks/process_scaling.py [--processes 2] [--steps 60] [--rounds 2]

Trains the same model on the same data with 1 process and with N processes (each with
the same per-device batch, so the global batch grows N-fold, as when adding GPUs), reads
tokens/s from each run's metrics.jsonl (the log events after the first, so start-up is
left out) and prints the scaling efficiency: tokens/s(N) / (N x tokens/s(1)). Rounds
alternate 1 and N processes so machine noise falls on both. On CPU, N processes use gloo
and split the cores (OMP threads = cores / N); on a GPU machine each process has a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = [
    "model=bert-mini",
    "tokenizer.vocab_size=8192",
    "data.max_seq_length=128",
    "data.max_eval_samples=32",
    "train.batch_size=16",
    "train.eval_every=0",
    "train.save_every=0",
    "train.export=false",
    "train.progress=false",
    "logger=none",
    "train.log_every=10",
]


def run(processes: int, steps: int, cache: Path, out: Path, gpu: bool) -> float:
    cores = os.cpu_count() or 1
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": str(max(1, cores // processes)),
    }
    args = [*MODEL, f"train.max_steps={steps}", f"paths.cache_dir={cache}", f"hydra.run.dir={out}"]
    if processes == 1:
        cmd = [sys.executable, str(ROOT / "train.py"), *args]
    else:
        if not gpu:
            env["ACCELERATE_USE_CPU"] = "1"
        cmd = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            "--num_processes",
            str(processes),
            "--num_machines",
            "1",
            "--dynamo_backend",
            "no",
            str(ROOT / "train.py"),
            *args,
        ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"run with {processes} process(es) failed:\n{proc.stderr[-3000:]}")
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [e["tokens_per_s"] for e in events if e["event"] == "train"]
    return statistics.median(rates[1:] or rates)  # without the first (start-up) where possible


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    import torch

    gpu = torch.cuda.is_available()
    if gpu and torch.cuda.device_count() < args.processes:  # processes would share a GPU
        parser.error(
            f"--processes {args.processes} needs as many GPUs, and this machine has "
            f"{torch.cuda.device_count()}; lower --processes (or run it on CPU processes "
            "with CUDA_VISIBLE_DEVICES=)."
        )
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run(1, 10, tmp / "cache", tmp / "warm", gpu)  # tokenizer and data cache
        one, many = [], []
        for r in range(args.rounds):
            one.append(run(1, args.steps, tmp / "cache", tmp / f"one-{r}", gpu))
            many.append(run(args.processes, args.steps, tmp / "cache", tmp / f"many-{r}", gpu))
    t1, tn = statistics.median(one), statistics.median(many)
    device = torch.cuda.get_device_name(0) if gpu else f"CPU, {os.cpu_count()} cores"
    print(f"bert-mini, seq 128, batch 16 per process, {args.steps} steps, {device}")
    print(f"{'processes':>9}  {'tokens/s':>10}  {'per process':>11}")
    print(f"{1:>9}  {t1:>10.0f}  {t1:>11.0f}")
    print(f"{args.processes:>9}  {tn:>10.0f}  {tn / args.processes:>11.0f}")
    print(f"speed-up {tn / t1:.2f}x, scaling efficiency {tn / (args.processes * t1):.0%}")


if __name__ == "__main__":
    main()
