"""Training throughput: transformers' Trainer against mlmkit, side by side in one run.

The same BertConfig sizes (bert-mini by default: 4 layers, hidden 256, FFN 1024), the same
WordPiece tokenizer (30,522 tokens, trained on the Gutenberg and WikiText-2 text in
../shared/data, or the built-in corpus where that is absent) and the same packed blocks of
128 tokens, batch 32, the same number of steps (AdamW step included):

  (a) Trainer + DataCollatorForLanguageModeling, their defaults (fp32, BertConfig's
      dropout 0.1, the vocabulary projection at every position);
  (b) the same Trainer with bf16=True;
  (c) mlmkit with its defaults (precision auto, dropout 0, the head only at the chosen
      positions, vocabulary padded to a multiple of 64);
  (d) mlmkit with dropout 0.1, BERT's recipe, so that (d)/(b) is the gain of the speed
      settings alone and (c)/(d) the effect of the dropout choice;
  (e) on a CPU, mlmkit with train.reuse_cpu_memory=false, so that (c)/(e) is the gain of
      malloc keeping freed memory for reuse.

Each mlmkit variant trains in a process of its own (process-wide settings stay there).

Each variant runs ``--rounds`` times, the order alternating, and keeps its best round (a
shared machine's load bursts then hit no variant alone). It prints tokens/s, the ratios,
and MFU: model FLOPs per token (``mlmkit.training.perf``: the encoder at every position, the head
only where it predicts) x tokens/s, over the bf16 or fp32 matmul rate measured in this run
on this machine (the best of the measurements between rounds).

    python benchmarks/trainer_vs_mlmkit.py [--preset bert-mini] [--steps 12] [--warmup 3]
                                           [--rounds 2]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import replace

import torch

sys.path.insert(0, os.path.dirname(__file__))
from harness import (  # noqa: E402
    PRESETS,
    Result,
    bf16_native,
    flops_per_token,
    machine,
    matmul_rates,
    mlmkit_config,
    quiet_logging,
    run_mlmkit,
    run_trainer,
    tokenizer_and_data,
)

from mlmkit.training.runtime import resolve_precision  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="bert-mini", choices=sorted(PRESETS))
    p.add_argument("--steps", type=int, default=12, help="timed steps per variant and round")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=30522, help="WordPiece vocabulary to train")
    p.add_argument("--rounds", type=int, default=2, help="rounds, alternating the order; best kept")
    p.add_argument("--skip-dropout", action="store_true", help="leave out variant (d)")
    p.add_argument("--skip-memory", action="store_true", help="leave out variant (e)")
    p.add_argument(
        "--force-bf16",
        action="store_true",
        help="run variant (b) on a CPU where bf16 is emulated (very slow)",
    )
    args = p.parse_args()
    quiet_logging()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    log_every = math.gcd(
        args.warmup, args.steps
    )  # mlmkit's events must split warm-up and timed steps
    cfg = mlmkit_config(
        args.preset, args.seq, args.batch, args.steps, args.warmup, args.vocab, log_every=log_every
    )
    tokenizer, packed = tokenizer_and_data(cfg)
    vocab = len(tokenizer)
    precision = resolve_precision("auto", use_cpu=device == "cpu")
    print(f"machine: {machine()}")
    print(
        f"model: {args.preset}, vocab {vocab:,}, batch {args.batch} x seq {args.seq}, "
        f"{args.steps} timed steps after {args.warmup}, {len(packed['train']):,} packed blocks; "
        f"mlmkit precision auto -> {precision}"
    )

    t0 = time.perf_counter()
    runs = {
        "(a) Trainer, defaults (fp32)": lambda n: run_trainer(
            n, cfg, tokenizer, packed["train"], args.warmup, bf16=False
        ),
        "(b) Trainer, bf16=True": lambda n: run_trainer(
            n, cfg, tokenizer, packed["train"], args.warmup, bf16=True
        ),
        "(c) mlmkit, defaults": lambda n: run_mlmkit(n, cfg, args.warmup),
    }
    if not bf16_native(device) and not args.force_bf16:
        del runs["(b) Trainer, bf16=True"]
        print(
            "(b) Trainer with bf16=True is left out: this CPU has no AVX512-BF16 or AMX, so bf16 "
            "is emulated (a round would take tens of minutes); --force-bf16 runs it anyway."
        )
    if not args.skip_dropout:
        cfg_d = mlmkit_config(
            args.preset,
            args.seq,
            args.batch,
            args.steps,
            args.warmup,
            args.vocab,
            dropout=0.1,
            log_every=log_every,
        )
        runs["(d) mlmkit, dropout 0.1"] = lambda n: run_mlmkit(n, cfg_d, args.warmup)
    if device == "cpu" and not args.skip_memory:
        cfg_e = replace(cfg, train=replace(cfg.train, reuse_cpu_memory=False))
        runs["(e) mlmkit, no memory reuse"] = lambda n: run_mlmkit(n, cfg_e, args.warmup)
    # Rounds in alternating order (a b c d, d c b a, ...); each variant keeps its best round,
    # so a burst of load from other processes on a shared machine hits no variant alone.
    rates = matmul_rates(device)
    best: dict[str, float] = {}
    shares: dict[str, float] = {}
    for k in range(args.rounds):
        for name in list(runs) if k % 2 == 0 else list(reversed(runs)):
            r = runs[name](name)
            print(f"  round {k + 1}: {name:<30} {r.tokens_per_s:>9,.0f} tokens/s", flush=True)
            best[name] = max(best.get(name, 0.0), r.tokens_per_s)
            shares[name] = r.predicted_share
        again = matmul_rates(device)
        rates = {key: max(rates[key], again[key]) for key in rates}
    results = [Result(name, best[name], shares[name], args.steps, 0.0) for name in runs]

    print(
        f"matmul rate measured on this machine: bf16 {rates['bf16'] / 1e12:.2f} TFLOP/s "
        f"(nan: emulated, not timed), fp32 {rates['fp32'] / 1e12:.2f} TFLOP/s"
    )
    print(f"{'':<32}{'tokens/s':>12}{'model TFLOP/s':>15}{'MFU':>8}  (against)")
    by_name = {}
    for r in results:
        flops = flops_per_token(cfg, vocab, r.predicted_share) * r.tokens_per_s
        ref = "fp32" if r.name.startswith("(a)") or precision == "no" else "bf16"
        print(
            f"{r.name:<32}{r.tokens_per_s:>12,.0f}{flops / 1e12:>15.3f}{flops / rates[ref]:>8.1%}  "
            f"({ref})"
        )
        by_name[r.name[:3]] = r.tokens_per_s
    trainer_peer = "(b)" if "(b)" in by_name else "(a)"  # the fastest Trainer this machine runs
    print(f"c/a = {by_name['(c)'] / by_name['(a)']:.2f}x", end="")
    if "(b)" in by_name:
        print(f"   c/b = {by_name['(c)'] / by_name['(b)']:.2f}x", end="")
    if "(d)" in by_name:
        print(
            f"   d/{trainer_peer[1]} = {by_name['(d)'] / by_name[trainer_peer]:.2f}x "
            "(speed settings alone)"
            f"   c/d = {by_name['(c)'] / by_name['(d)']:.2f}x (dropout 0 vs 0.1)",
            end="",
        )
    if "(e)" in by_name:
        print(f"   c/e = {by_name['(c)'] / by_name['(e)']:.2f}x (memory reuse)", end="")
    print()
    print(
        f"FLOPs per token (mlmkit.training.perf): {flops_per_token(cfg, vocab, 0.15) / 1e6:.1f} M "
        f"at 15% predicted; total wall time {time.perf_counter() - t0:.0f} s"
    )


if __name__ == "__main__":
    main()
