"""Streaming: how long a resumed run waits for its first batch, at 10% and at 90% of a corpus,
and what the stream's shards cost while reading.

The corpus is the text of ../shared/data repeated into a temporary dir (``--mb`` MB of .txt,
paragraphs as documents), read by one process (no dataloader workers) with the released
multilingual BERT tokenizer, 128-token blocks and the default shuffle buffer.

- **Resume.** The document stream is read once without tokenizing, noting its position (file
  and byte offset) at 10% and at 90% of the documents. Each of the stream's shards then gets
  the state a run holds at a window's start there (``ShardBlocks.state``: the position after
  the window's last document, no carry, nothing of the new window handed out), and the time
  from ``load_state_dict`` to the first batch is measured, beside a run from the start (0%).
  A resume seeks to the byte offset and fills one window per shard, so the time should not
  grow with the position.
- **Reading.** Blocks per second over the first ``--blocks`` blocks with the default layout (12
  shards for the one reader, ``SharedDocs`` dealing one reading of the stream to all of them)
  and with ``data.stream_shards=1`` (one shard per reader: a resume only on as many readers),
  side by side, alternating.

    python benchmarks/stream_resume.py [--mb 200] [--blocks 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data_speed import build_corpus  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "tokenizers"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=200)
    parser.add_argument("--blocks", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import torch
    from harness import machine
    from transformers import AutoTokenizer

    from mlmkit.config import DataConfig
    from mlmkit.data import streaming
    from mlmkit.masking.collator import MLMCollator

    tokenizer_dir = SHARED / "bert-base-multilingual-cased"
    if not tokenizer_dir.is_dir():
        sys.exit(f"The released tokenizers under {SHARED} are absent; this benchmark reads one.")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    print(machine())
    with tempfile.TemporaryDirectory() as tmp:
        files = build_corpus(Path(tmp), args.mb)
        size = sum(f.stat().st_size for f in files) / 1e6
        cfg = DataConfig(
            source="files",
            train_files=[str(f) for f in files],
            streaming=True,
            max_seq_length=128,
        )

        def stream(layout_cfg, state=None):
            dataset = streaming.StreamingBlocks(layout_cfg, tokenizer, 64, 0, 1, 0, 0, 0)
            batches = streaming.StreamingBatches(
                dataset, MLMCollator(tokenizer, 0.15), 0, torch.device("cpu")
            )
            if state is not None:
                batches.load_state_dict(state)
            return batches

        # the positions at 10% and 90% of the documents, read without tokenizing
        t0 = time.perf_counter()
        docs = streaming.DocStream(cfg)
        count = 0
        for _ in docs.docs():
            if docs.state["epoch"] > 0:
                break
            count += 1
        marks = {0.1: int(count * 0.1), 0.9: int(count * 0.9)}
        positions = {0.0: None}
        docs = streaming.DocStream(cfg)
        for i, _ in docs.docs():
            for share, at in marks.items():
                if i + 1 == at:
                    positions[share] = docs.position()
            if i + 1 >= marks[0.9]:
                break
        print(
            f"corpus: {size:.0f} MB, {count:,} documents in {len(files)} files "
            f"(read without tokenizing in {time.perf_counter() - t0:.1f} s)"
        )

        fresh = stream(cfg)
        layout = fresh.state_dict()["layout"]
        print(
            f"layout: {layout['shards']} shards, windows of {layout['window']} blocks, "
            f"{layout['tokenize_docs']} documents tokenized together"
        )
        print("\nresume: seconds from load_state_dict to the first batch of 64 blocks")
        times: dict[float, list[float]] = {share: [] for share in positions}
        for _ in range(args.rounds):
            for share, position in positions.items():
                shards = {
                    str(v): {"docs": position, "carry": [], "window": 7, "emitted": 0}
                    for v in range(layout["shards"])
                }
                state = {
                    "streaming": True,
                    "consumed": 0,
                    "workers": 1,
                    "epoch": 0,
                    "layout": layout,
                    "readers": [{"shards": shards, "next": 0, "batches": 0}],
                }
                t0 = time.perf_counter()
                next(stream(cfg, state))
                times[share].append(time.perf_counter() - t0)
        for share, seconds in times.items():
            where = "the start" if share == 0 else f"{share:.0%} of the documents"
            print(
                f"  from {where:<22} {statistics.median(seconds):6.2f} s (median of {args.rounds})"
            )

        print(f"\nreading: blocks per second over the first {args.blocks:,} blocks")
        one = DataConfig(**{**cfg.__dict__, "stream_shards": 1})
        rates: dict[str, list[float]] = {"12 shards (default)": [], "1 shard": []}
        for _ in range(args.rounds):
            for name, layout_cfg in (("12 shards (default)", cfg), ("1 shard", one)):
                batches = stream(layout_cfg)
                t0 = time.perf_counter()
                for _ in range(args.blocks // 64):
                    next(batches)
                rates[name].append(args.blocks / (time.perf_counter() - t0))
        for name, values in rates.items():
            print(f"  {name:<20} {statistics.median(values):8,.0f} blocks/s")
        ratio = statistics.median(rates["12 shards (default)"]) / statistics.median(
            rates["1 shard"]
        )
        print(f"  ratio (12 shards / 1 shard): {ratio:.2f}")


if __name__ == "__main__":
    main()
