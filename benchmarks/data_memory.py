"""Preprocessing memory: peak RSS of map mode on a 200 MB corpus, and of streaming as the
corpus grows.

The corpus is the text of ../shared/data repeated into a temporary dir (never into the
project). Each measurement runs in a fresh child process; the script samples the memory of
the child and all its descendants (``datasets.map`` workers, dataloader workers) every
50 ms from /proc and prints the peak of their sum (PSS: pages shared after a fork count
once), and the largest single process's peak RSS (``ru_maxrss``, what ``/usr/bin/time -v``
reports).

- map: ``prepare_datasets`` (read the .txt files, tokenize and pack with ``--num-proc``
  processes, save the cache) on a ``--mb`` MB corpus;
- streaming: one full pass (one epoch) over corpora of each ``--stream-mb`` size through
  the trainer's streaming loader (``--workers`` dataloader workers, default shuffle
  buffer), counting the blocks.

    python benchmarks/data_memory.py [--mb 200] [--stream-mb 50 200] [--num-proc 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data_speed import build_corpus  # noqa: E402

CHILD = r"""
import json, os, sys, time
os.environ["HF_DATASETS_CACHE"] = sys.argv[3] + "/hf"
import datasets
datasets.disable_progress_bars()
from mlmkit.config import DataConfig, TokenizerConfig
from mlmkit.data.sources import builtin_documents
from mlmkit.data.tokenizer import train_tokenizer
mode, folder, tmp = sys.argv[1], sys.argv[2], sys.argv[3]
num_proc, workers = int(sys.argv[4]), int(sys.argv[5])
tok = train_tokenizer(
    TokenizerConfig(vocab_size=8192, max_train_chars=2_000_000), builtin_documents()
)
files = sorted(str(p) for p in __import__("pathlib").Path(folder).glob("*.txt"))
t0 = time.perf_counter()
if mode == "map":
    from mlmkit.data.packing import prepare_datasets
    cfg = DataConfig(source="files", train_files=files, num_proc=num_proc)
    packed = prepare_datasets(cfg, tok, tmp + "/cache")
    n = len(packed["train"])
else:
    import torch
    from mlmkit.masking.collator import MLMCollator
    from mlmkit.data.streaming import StreamingBatches, StreamingBlocks
    cfg = DataConfig(source="files", train_files=files, streaming=True)
    ds = StreamingBlocks(cfg, tok, 64, 0, 1, workers, seed=0, skip_first=0)
    stream = StreamingBatches(ds, MLMCollator(tok, 0.15), workers, torch.device("cpu"))
    n = 0
    while True:
        next(stream)
        if stream.epoch > 0:
            break
        n += 64
print(json.dumps({"blocks": n, "seconds": time.perf_counter() - t0}))
"""


def _pss(pid: str) -> int:
    """Proportional set size: resident bytes, pages shared by n processes counted 1/n each."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def tree_rss(pid: int) -> int:
    """Memory of ``pid`` and all its descendants (sum of PSS, so forked copies of shared
    pages are not counted twice)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            rss[int(entry)] = _pss(entry)
            children.setdefault(ppid, []).append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo.extend(children.get(p, []))
    return total


def measure(mode: str, folder: Path, tmp: Path, num_proc: int, workers: int) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, mode, str(folder), str(tmp), str(num_proc), str(workers)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(0.05)
    out = proc.stdout.read()
    if proc.returncode != 0:
        sys.exit(f"{mode} run failed ({proc.returncode})")
    result = json.loads(out.strip().splitlines()[-1])
    single = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB, max over children
    result.update(peak_tree_mb=peak / 2**20, peak_single_mb=max(single, before) / 2**10)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=200.0, help="map-mode corpus size in MB")
    p.add_argument("--stream-mb", type=float, nargs="+", default=[50.0, 200.0])
    p.add_argument("--num-proc", type=int, default=2, help="map-mode tokenizing processes")
    p.add_argument("--workers", type=int, default=2, help="streaming dataloader workers")
    p.add_argument("--skip-map", action="store_true")
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="mlmkit-mem-") as tmp:
        tmp = Path(tmp)
        if not args.skip_map:
            folder = tmp / "map"
            folder.mkdir()
            files = build_corpus(folder, args.mb)
            mb = sum(f.stat().st_size for f in files) / 1e6
            r = measure("map", folder, tmp, args.num_proc, 0)
            print(
                f"map mode, {mb:.0f} MB corpus, num_proc {args.num_proc}: peak RSS "
                f"{r['peak_tree_mb']:.0f} MB (all processes together; largest single process "
                f"{r['peak_single_mb']:.0f} MB), {r['blocks']} blocks in {r['seconds']:.0f} s",
                flush=True,
            )
            for f in files:
                f.unlink()
        for size in args.stream_mb:
            folder = tmp / f"stream{size:g}"
            folder.mkdir()
            files = build_corpus(folder, size)
            mb = sum(f.stat().st_size for f in files) / 1e6
            r = measure("stream", folder, tmp, 1, args.workers)
            print(
                f"streaming, {mb:.0f} MB corpus, {args.workers} workers: peak RSS "
                f"{r['peak_tree_mb']:.0f} MB (all processes together), {r['blocks']} blocks in "
                f"{r['seconds']:.0f} s",
                flush=True,
            )
            for f in files:
                f.unlink()


if __name__ == "__main__":
    main()
