"""Preprocessing speed: mlmkit's tokenize-and-pack against run_mlm's way, side by side.

The same documents (the text of ../shared/data repeated to --mb megabytes), the same
WordPiece tokenizer and the same ``num_proc`` go through:

- run_mlm (transformers' examples/pytorch/language-modeling/run_mlm.py without
  line_by_line): ``datasets.map`` calling the tokenizer with special-tokens masks, then a
  second ``datasets.map`` with ``group_texts`` concatenating every column and cutting it
  into max_seq_length blocks;
- mlmkit: ``mlmkit.data.packing.pack_corpus`` (one map: offsets-free batch encoding, packing into
  [CLS] ... [SEP] blocks, int32 ids only).

Both write their Arrow results to a temporary datasets cache and neither reuses a cache.
The rounds alternate so machine noise hits both alike; prints MB/s of each and the ratio.
Then times mlmkit's whole map-mode preparation (``prepare_datasets``: read, tokenize,
pack, save the cache) twice with the same settings: the second run only loads the cache.

    python benchmarks/data_speed.py [--mb 20] [--num-proc 2] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from itertools import chain
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "corpora"


def build_corpus(folder: Path, mb: float) -> list[Path]:
    """Text files of about ``mb`` MB made by repeating the shared corpora (in a temp dir)."""
    sources = sorted(SHARED.glob("*/*.txt"))
    if not sources:
        sys.exit(f"The reference corpora under {SHARED} are absent; this benchmark reads them.")
    text = b"\n\n".join(p.read_bytes() for p in sources)
    target = int(mb * 1e6)
    files, written, i = [], 0, 0
    per_file = max(len(text), target // 4 + 1)
    while written < target:
        path = folder / f"part{i:04d}.txt"
        with open(path, "wb") as fh:
            n = 0
            while n < per_file and written < target:
                piece = text[: target - written]
                if len(piece) < len(text):  # the last piece ends at a paragraph
                    piece = piece[: piece.rfind(b"\n\n") + 1] or piece
                fh.write(piece + b"\n\n")
                n += len(piece) + 2
                written += len(piece) + 2
        files.append(path)
        i += 1
    return files


def run_mlm_way(raw, tokenizer, max_seq_length: int, num_proc: int | None):
    """Tokenize, then group_texts, as run_mlm does for a text corpus."""

    def tokenize_function(examples):
        return tokenizer(examples["text"], return_special_tokens_mask=True)

    tokenized = raw.map(
        tokenize_function,
        batched=True,
        num_proc=num_proc,
        remove_columns=["text"],
        load_from_cache_file=False,
    )

    def group_texts(examples):
        joined = {k: list(chain(*examples[k])) for k in examples.keys()}
        total = len(joined[next(iter(examples.keys()))]) // max_seq_length * max_seq_length
        return {
            k: [t[i : i + max_seq_length] for i in range(0, total, max_seq_length)]
            for k, t in joined.items()
        }

    return tokenized.map(group_texts, batched=True, num_proc=num_proc, load_from_cache_file=False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=float, default=20.0, help="corpus size in MB")
    p.add_argument("--num-proc", type=int, default=2, help="datasets.map processes for both")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-seq-length", type=int, default=128)
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="mlmkit-bench-") as tmp:
        os.environ["HF_DATASETS_CACHE"] = str(Path(tmp) / "hf")  # before datasets is imported
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false" if args.num_proc > 1 else "true")
        import datasets

        from mlmkit.config import DataConfig, TokenizerConfig
        from mlmkit.data.packing import pack_corpus
        from mlmkit.data.sources import builtin_documents, load_corpus
        from mlmkit.data.tokenizer import train_tokenizer

        datasets.disable_progress_bars()
        files = build_corpus(Path(tmp), args.mb)
        mb = sum(f.stat().st_size for f in files) / 1e6
        tokenizer = train_tokenizer(
            TokenizerConfig(vocab_size=8192, max_train_chars=2_000_000), builtin_documents()
        )
        cfg = DataConfig(
            source="files", train_files=[str(f) for f in files], validation_files=[str(files[0])]
        )
        raw = load_corpus(cfg)["train"]  # the same documents for both
        procs = args.num_proc if args.num_proc > 1 else None
        print(
            f"corpus: {mb:.1f} MB, {len(raw)} documents; max_seq_length {args.max_seq_length}; "
            f"num_proc {args.num_proc}"
        )
        times: dict[str, list[float]] = {"run_mlm": [], "mlmkit": []}
        blocks = {}
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            out = run_mlm_way(raw, tokenizer, args.max_seq_length, procs)
            times["run_mlm"].append(time.perf_counter() - t0)
            blocks["run_mlm"] = len(out)
            t0 = time.perf_counter()
            out = pack_corpus(
                datasets.DatasetDict({"train": raw}),
                tokenizer,
                args.max_seq_length,
                args.num_proc,
                cache_files=False,
            )["train"]
            times["mlmkit"].append(time.perf_counter() - t0)
            blocks["mlmkit"] = len(out)
        speed = {k: mb / statistics.median(v) for k, v in times.items()}
        for k in ("run_mlm", "mlmkit"):
            print(
                f"{k:8s} {speed[k]:6.2f} MB/s  ({statistics.median(times[k]):.1f} s, "
                f"{blocks[k]} blocks)"
            )
        print(f"ratio mlmkit / run_mlm: {speed['mlmkit'] / speed['run_mlm']:.2f}x")

        # The whole map-mode preparation twice: read the files, tokenize, pack, save the
        # cache; then the same settings again, which only loads the cache.
        from mlmkit.data.packing import prepare_datasets

        cfg = DataConfig(
            source="files",
            train_files=[str(f) for f in files],
            num_proc=args.num_proc,
            max_seq_length=args.max_seq_length,
        )
        for run in ("first run (tokenize, pack, cache)", "second run (from the cache)"):
            t0 = time.perf_counter()
            packed = prepare_datasets(cfg, tokenizer, Path(tmp) / "cache")
            print(
                f"prepare_datasets, {run}: {time.perf_counter() - t0:.2f} s "
                f"({len(packed['train'])} train blocks)"
            )


if __name__ == "__main__":
    main()
