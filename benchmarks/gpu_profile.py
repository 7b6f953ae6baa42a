"""Where a step's time goes on the GPU: mlmkit's own loop (``Trainer`` and ``train_step``, its
default settings) for a few warm-up steps, then 20 steps under ``torch.profiler``; writes the 15
CUDA kernels that took the most GPU time and the share of the profiled steps' wall time in which
no kernel ran (the GPU sat idle: waiting for the host to launch work, for batches, or for a host
read of a device value).

    python benchmarks/gpu_profile.py --out profile.json            # bert-base, 128 tokens, bf16
    python benchmarks/gpu_profile.py --tiny --out profile.json     # bert-tiny on a CPU: CPU ops

The idle share is taken from the profiler's own events: the union of the kernels' intervals
(copies and memsets left out) against the wall time of the profiled steps, which end with a
synchronisation, so every kernel they launched is inside. The profiler's own overhead on the host
makes the share somewhat larger than in an unprofiled run. On a CPU (``--tiny``) the same figures
are taken over the CPU ops, which checks the script, not a machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from harness import PRESETS, counting_workers, mlmkit_config, quiet_logging  # noqa: E402

WINDOW = "mlmkit profiled steps"
COPIES = ("Memcpy", "Memset", "memcpy", "memset")


def union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by ``intervals`` (start, end in microseconds), overlaps counted once."""
    covered, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        covered += stop - max(start, end)
        end = stop
    return covered / 1e6


def profile_figures(events, cuda: bool, top: int) -> dict:
    """The ``top`` kernels (on a CPU: ops) by time, and how much of the profiled window the device
    was busy, from the profiler's events."""
    from torch.autograd import DeviceType

    window = [e for e in events if e.name == WINDOW and e.device_type == DeviceType.CPU]
    if not window:
        raise SystemExit(f"the profiler recorded no {WINDOW!r} range")
    w0, w1 = window[0].time_range.start, window[0].time_range.end
    if cuda:
        chosen = [
            e
            for e in events
            if e.device_type == DeviceType.CUDA
            and e.name != WINDOW
            and not e.name.startswith(COPIES)
        ]
        busy = [(e.time_range.start, e.time_range.end) for e in chosen]
        own = {id(e): e.time_range.elapsed_us() for e in chosen}
    else:
        chosen = [e for e in events if e.device_type == DeviceType.CPU and e.name != WINDOW]
        busy = [(e.time_range.start, e.time_range.end) for e in chosen]
        own = {id(e): e.self_cpu_time_total for e in chosen}
    busy = [(max(a, w0), min(b, w1)) for a, b in busy if b > w0 and a < w1]
    totals: dict[str, list] = {}
    for e in chosen:
        entry = totals.setdefault(e.name, [0.0, 0])
        entry[0] += own[id(e)]
        entry[1] += 1
    wall = (w1 - w0) / 1e6
    busy_s = union_seconds(busy)
    total = sum(t for t, _ in totals.values()) / 1e6 or 1e-12
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "what": "CUDA kernels" if cuda else "CPU ops (self time)",
        "wall_seconds": wall,
        "busy_seconds": busy_s,
        "idle_share": max(0.0, 1.0 - busy_s / wall) if wall > 0 else None,
        "kernels": [
            {"name": name[:240], "seconds": t / 1e6, "share": t / 1e6 / total, "calls": n}
            for name, (t, n) in ranked
        ],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the figures' JSON file")
    p.add_argument("--tiny", action="store_true", help="bert-tiny, batch 8, 64 tokens: a CPU")
    p.add_argument("--preset", default=None, choices=sorted(PRESETS), help="default bert-base")
    p.add_argument("--seq", type=int, default=None, help="default 128; --tiny 64")
    p.add_argument("--batch", type=int, default=None, help="default 128; --tiny 8")
    p.add_argument("--steps", type=int, default=20, help="profiled steps (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="steps before the profiler (default 5)")
    p.add_argument(
        "--workers", type=int, default=None, help="dataloader workers (default mlmkit's)"
    )
    p.add_argument("--top", type=int, default=15, help="kernels to list (default 15)")
    p.add_argument("--cache", default=".cache/mlmkit", help="tokenizers and packed data")
    args = p.parse_args()
    quiet_logging()
    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        print("No CUDA GPU here; run with --tiny to check the script on a CPU.")
        return 2
    preset = args.preset or ("bert-tiny" if args.tiny else "bert-base")
    seq, batch = args.seq or (64 if args.tiny else 128), args.batch or (8 if args.tiny else 128)

    from mlmkit.config import DataConfig
    from mlmkit.training import setup
    from mlmkit.training.step import train_step
    from mlmkit.training.trainer import Trainer

    cfg = mlmkit_config(
        preset,
        seq,
        batch,
        args.steps,
        args.warmup,
        2000 if args.tiny else 30522,
        log_every=1000,  # no log events: nothing read from the device between steps
        precision="bf16" if cuda else "auto",
    )
    cfg.data = DataConfig(max_seq_length=seq, max_eval_samples=32)  # the built-in corpus
    cfg.paths.cache_dir = args.cache
    cfg.train.num_workers = args.workers
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    with tempfile.TemporaryDirectory(prefix="mlmkit-profile-") as scratch:
        with counting_workers() as workers:
            try:
                trainer = Trainer(cfg, Path(scratch) / "run")
                trainer.start_fit()
                for _ in range(args.warmup):
                    train_step(trainer)
                sync()
                with torch.profiler.profile(activities=activities) as prof:
                    started = time.perf_counter()
                    with torch.profiler.record_function(WINDOW):
                        for _ in range(args.steps):
                            train_step(trainer)
                        sync()
                    seconds = time.perf_counter() - started
                trainer.end_fit()
            finally:
                setup.stop_logging()
    figures = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "preset": preset,
        "batch": batch,
        "seq": seq,
        "precision": trainer.accelerator.mixed_precision,
        "steps": args.steps,
        "warmup": args.warmup,
        "workers": workers,
        "tokens_per_s_profiled": args.steps * batch * seq / seconds,
        **profile_figures(prof.events(), cuda, args.top),
    }
    partial = f"{args.out}.partial"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(figures, f, indent=1)
    os.replace(partial, args.out)
    print(
        f"{preset}, batch {batch} x {seq}, {args.steps} profiled steps: {figures['what']} busy "
        f"{figures['busy_seconds']:.3f} s of {figures['wall_seconds']:.3f} s (idle "
        f"{figures['idle_share']:.1%})"
    )
    for k in figures["kernels"]:
        print(f"{k['seconds'] * 1e3:10.2f} ms {k['share']:6.1%} {k['calls']:6d}  {k['name'][:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
