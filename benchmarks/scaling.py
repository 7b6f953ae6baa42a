"""How mlmkit's training cost grows with the work: sequence length 128 -> 512 (bert-mini) and
model size tiny -> base (seq 128), each through ``mlmkit.train`` with its defaults.

Tokens per step are held at ``--tokens`` (batch = tokens / seq), so each row differs only in
sequence length or model size. Prints a Markdown table: tokens/s, training FLOPs per token
(``mlmkit.training.perf``), model TFLOP/s and MFU against the bf16 (or fp32, where mlmkit runs in
fp32) matmul rate measured in this run.

A second table prices document isolation (``data.packing=documents``: a block-diagonal
attention mask, positions restarting per document) against plain packing, the two measured in
alternating rounds at each sequence length.

    python benchmarks/scaling.py [--steps 4] [--warmup 2] [--tokens 4096] [--quick]
                                 [--documents-only]
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from harness import (  # noqa: E402
    flops_per_token,
    machine,
    matmul_rates,
    mlmkit_config,
    quiet_logging,
    run_mlmkit,
    tokenizer_and_data,
)

from mlmkit.training.runtime import resolve_precision  # noqa: E402

DOCUMENTS = [("bert-mini", 128), ("bert-mini", 512)]  # document isolation against plain packing
GRID = [
    ("bert-mini", 128),
    ("bert-mini", 256),
    ("bert-mini", 512),
    ("bert-tiny", 128),
    ("bert-small", 128),
    ("bert-medium", 128),
    ("bert-base", 128),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4, help="timed steps per row")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--tokens", type=int, default=4096, help="tokens per step (batch x seq)")
    p.add_argument("--quick", action="store_true", help="bert-tiny at seq 128 and 256 only")
    p.add_argument(
        "--documents-only", action="store_true", help="only the document-isolation table"
    )
    p.add_argument(
        "--rounds", type=int, default=2, help="alternating rounds of the document-isolation table"
    )
    args = p.parse_args()
    quiet_logging()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    precision = resolve_precision("auto", use_cpu=device == "cpu")
    grid = [("bert-tiny", 128), ("bert-tiny", 256)] if args.quick else GRID
    if args.documents_only:
        grid = []

    t0 = time.perf_counter()
    rates = matmul_rates(device)
    rows = []
    for preset, seq in grid:
        batch = max(1, args.tokens // seq)
        cfg = mlmkit_config(preset, seq, batch, args.steps, args.warmup, 30522)
        tokenizer, _ = tokenizer_and_data(cfg)
        logging.getLogger("mlmkit").setLevel(logging.WARNING)
        r = run_mlmkit(f"{preset} seq {seq}", cfg, args.warmup)
        fpt = flops_per_token(cfg, len(tokenizer), r.predicted_share)
        rows.append((preset, seq, batch, r.tokens_per_s, fpt))
        print(f"  {preset} seq {seq}: {r.tokens_per_s:,.0f} tokens/s", flush=True)
    after = matmul_rates(device)
    rates = {k: max(rates[k], after[k]) for k in rates}
    ref = "bf16" if precision in ("bf16", "fp16") else "fp32"

    print(
        f"\nmachine: {machine()}; mlmkit precision {precision}; {args.tokens} tokens per step; "
        f"{ref} matmul rate measured {rates[ref] / 1e12:.2f} TFLOP/s; wall "
        f"{time.perf_counter() - t0:.0f} s\n"
    )
    if rows:
        print("| model | seq | batch | tokens/s | GFLOPs/token | model TFLOP/s | MFU |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for preset, seq, batch, tps, fpt in rows:
        print(
            f"| {preset} | {seq} | {batch} | {tps:,.0f} | {fpt / 1e9:.3f} | {tps * fpt / 1e12:.3f} "
            f"| {tps * fpt / rates[ref]:.1%} |"
        )
    documents_table(args, [("bert-tiny", 128)] if args.quick else DOCUMENTS)


def documents_table(args, grid) -> None:
    """tokens/s of plain packing and of document isolation, in alternating rounds; the cost is
    the ratio of their means."""
    rows = []
    for preset, seq in grid:
        batch = max(1, args.tokens // seq)
        plain = mlmkit_config(preset, seq, batch, args.steps, args.warmup, 30522)
        isolated = dataclasses.replace(
            plain, data=dataclasses.replace(plain.data, packing="documents")
        )
        tokenizer, packed = tokenizer_and_data(plain)  # the same blocks for both (one cache entry)
        docs = documents_per_block(packed["train"], tokenizer.sep_token_id)
        logging.getLogger("mlmkit").setLevel(logging.WARNING)
        speed = {"concatenate": [], "documents": []}
        for _ in range(args.rounds):
            for packing, cfg in (("concatenate", plain), ("documents", isolated)):
                speed[packing].append(
                    run_mlmkit(f"{preset} seq {seq} {packing}", cfg, args.warmup).tokens_per_s
                )
        mean = {k: sum(v) / len(v) for k, v in speed.items()}
        rows.append((preset, seq, batch, docs, mean["concatenate"], mean["documents"]))
        print(
            f"  {preset} seq {seq}: concatenate {mean['concatenate']:,.0f}, documents "
            f"{mean['documents']:,.0f} tokens/s",
            flush=True,
        )
    print(
        f"\ndocument isolation (data.packing=documents) against plain packing, {args.rounds} "
        "alternating round(s) each\n"
    )
    print(
        "| model | seq | batch | documents per block | concatenate tokens/s | documents tokens/s | "
        "cost |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for preset, seq, batch, docs, plain, isolated in rows:
        print(
            f"| {preset} | {seq} | {batch} | {docs:.1f} | {plain:,.0f} | {isolated:,.0f} | "
            f"{plain / isolated - 1:+.1%} |"
        )


def documents_per_block(blocks, sep_id: int, sample: int = 500) -> float:
    """Mean number of documents (or pieces of one) per block, over the first ``sample`` blocks."""
    ids = torch.tensor(
        blocks.with_format(None).select(range(min(sample, len(blocks))))["input_ids"]
    )
    return float((ids[:, 1:-1] == sep_id).sum(1).float().mean()) + 1.0


if __name__ == "__main__":
    main()
