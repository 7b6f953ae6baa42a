"""BERT against ModernBERT, document isolation, linear against WSD: held-out loss at equal
wall-clock, one table per corpus.

Every variant trains with ``python train.py`` for the same ``--budget`` seconds (its schedule
decays over that budget), on the same text with the same tokenizer, and is evaluated at its
last step on the same held-out blocks with the same fixed masks (15%, BERT's 80-10-10):

  bert-mini                         the preset's defaults (plain packing, linear decay)
  bert-mini, documents              data.packing=documents: attention within each document
  bert-mini, wsd                    optim.schedule=wsd (decay in the last 20% of the budget)
  modernbert-mini                   the preset's defaults
  modernbert-mini, documents        data.packing=documents

A documents run is evaluated as it trains, each held-out document alone in its block.

Corpora: the built-in one (its validation split), and where ../shared/data is present the 13
Gutenberg books with WikiText-2 valid held out (as ``make bench-quality``).

    python benchmarks/modern.py [--budget 60] [--corpus builtin shared] [--variant NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from quality import GUTENBERG, ROOT, WIKITEXT_VALID, choose_data, train_mlmkit  # noqa: E402

VARIANTS = {
    "bert-mini": ["model=bert-mini"],
    "bert-mini, documents": ["model=bert-mini", "data.packing=documents"],
    "bert-mini, wsd": ["model=bert-mini", "optim.schedule=wsd"],
    "modernbert-mini": ["model=modernbert-mini"],
    "modernbert-mini, documents": ["model=modernbert-mini", "data.packing=documents"],
}


def run_variant(
    overrides: list[str],
    data_overrides: list[str],
    budget: float,
    run_dir: Path,
    cache: Path,
    name: str,
    eval_min_masked: int = 10_000,
) -> dict:
    events = train_mlmkit(
        [
            *overrides,
            *data_overrides,
            "logger=none",
            "train.progress=false",
            f"paths.cache_dir={cache}",
            f"train.max_time={budget:g}s",
            f"masking.eval_min_masked_tokens={eval_min_masked}",
            "train.max_steps=1000000000",
            "train.eval_every=1000000000",
            "train.save_every=0",
            "train.export=false",
        ],
        run_dir,
        f"the {name} run",
    )
    last = [e for e in events if e["event"] == "train"][-1]
    final = [e for e in events if e["event"] == "eval"][-1]
    return {
        "variant": name,
        "steps": last["step"],
        "tokens": last["tokens_seen"],
        "train_s": last["elapsed_s"],
        "eval_loss": final["eval_loss"],
        "eval_accuracy": final["eval_accuracy"],
        "eval_accuracy_stderr": final.get("eval_accuracy_stderr"),
        "eval_tokens": final["eval_tokens"],
    }


def print_table(corpus: str, training: str, held_out: str, budget: float, rows: list[dict]) -> None:
    print(f"\n{corpus}: {budget:g} s per run; training text: {training}; held out: {held_out}\n")
    print("| variant | steps | tokens | held-out loss | held-out accuracy |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        se = r["eval_accuracy_stderr"]
        acc = f"{r['eval_accuracy']:.1%}" + (f" ± {se:.1%}" if se is not None else "")
        print(
            f"| {r['variant']} | {r['steps']:,} | {r['tokens'] / 1e6:.2f} M | {r['eval_loss']:.3f} "
            f"| {acc} |"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--budget", type=float, default=60.0, help="training seconds per run (default 60)"
    )
    p.add_argument(
        "--corpus", nargs="+", default=["builtin", "shared"], choices=["builtin", "shared"]
    )
    p.add_argument("--variant", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default outputs/bench-modern/<date>_<time>)",
    )
    p.add_argument(
        "--eval-min-masked",
        type=int,
        default=10_000,
        help="masked tokens the held-out figures are taken over at least "
        "(masking.eval_min_masked_tokens; default 10,000; 0: one mask draw, a quick look)",
    )
    args = p.parse_args()
    if args.budget <= 0:
        p.error("--budget must be positive")
    if args.eval_min_masked < 0:
        p.error("--eval-min-masked must be 0 or more")

    from harness import machine

    from mlmkit.training.runtime import describe_cpu

    out = (
        args.out or ROOT / "outputs" / "bench-modern" / time.strftime("%Y-%m-%d_%H-%M-%S")
    ).resolve()
    out.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine()}")
    print(f"cpu: {describe_cpu()}")
    print(f"output: {out}")
    t0 = time.perf_counter()
    tables = {}
    for corpus in args.corpus:
        if corpus == "shared" and not (GUTENBERG.is_dir() and WIKITEXT_VALID.is_file()):
            print(f"\n{GUTENBERG.parent} is absent: the shared-text table is left out")
            continue
        data = choose_data(builtin=corpus == "builtin")
        rows = []
        for name in args.variant:
            print(f"== {corpus}: {name}", flush=True)
            slug = name.replace(", ", "-")
            rows.append(
                run_variant(
                    VARIANTS[name],
                    data.overrides,
                    args.budget,
                    out / corpus / slug,
                    out / "cache",
                    name,
                    args.eval_min_masked,
                )
            )
        tables[corpus] = {"training": data.training, "held_out": data.held_out, "rows": rows}
        print_table(corpus, data.training, data.held_out, args.budget, rows)
    (out / "summary.json").write_text(
        json.dumps(
            {
                "machine": machine(),
                "cpu": describe_cpu(),
                "budget_s": args.budget,
                "tables": tables,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"\ntotal wall time {time.perf_counter() - t0:.0f} s; figures in {out}/summary.json")


if __name__ == "__main__":
    main()
