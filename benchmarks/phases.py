"""Pretraining in phases at equal compute: held-out masked-token loss and accuracy on short and
long blocks of text no run trained on.

Every run trains bert-mini (or modernbert-mini) with ``python train.py`` on the same text and
tokenizer for the same number of tokens (``--tokens``: ``train.max_tokens``, so the learning
rate schedule spans the same budget), then ``mlmkit eval`` scores its ``final/`` (and a phase's
export) on the held-out files at each evaluation length, with the same fixed masks (15%,
BERT's 80-10-10):

  bert   128                    all of the tokens in blocks of 128 (32 rows a step)
  bert   128 -> 512 (90/10)     BERT's recipe: 90% at 128, the last 10% at 512 (8 rows a step)
  bert   512                    all at 512 (8 rows a step)
  modern 128                    modernbert-mini, all at 128, global RoPE theta 10k
  modern 128 -> 1024 (90/10)    the last 10% at 1,024 tokens (4 rows) with the global theta raised
                                to 160k (ModernBERT's context extension), at a constant rate; its
                                phase-1 export is the "before" row

Each step holds 4,096 tokens in every phase. Corpora: where ../shared/data is present, six
Gutenberg books to train on and two others held out (Austen's Persuasion, Chesterton's The Man
Who Was Thursday); else the built-in corpus and its validation split.

    python benchmarks/phases.py [--tokens 4194304] [--only bert modern] [--corpus shared]
                                [--size mini] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from quality import GUTENBERG, ROOT, train_mlmkit  # noqa: E402

TRAIN_BOOKS = [
    "austen-emma.txt",
    "austen-sense.txt",
    "chesterton-brown.txt",
    "melville-moby_dick.txt",
    "milton-paradise.txt",
    "whitman-leaves.txt",
]
HELD_OUT = ["austen-persuasion.txt", "chesterton-thursday.txt"]
BERT_LONG = "{data:{max_seq_length:512},train:{batch_size:8}}"
MODERN_LONG = "{data:{max_seq_length:1024},train:{batch_size:4},model:{global_rope_theta:160000}}"
RUNS = {
    "bert": [
        ("128", ["model=bert-mini", "data.max_seq_length=128", "train.batch_size=32"], []),
        (
            "128 -> 512 (90/10)",
            [
                "model=bert-mini",
                "data.max_seq_length=128",
                "train.batch_size=32",
                f"phases=[{{name:short,share:0.9}},{{name:long,share:0.1,set:{BERT_LONG}}}]",
            ],
            ["short"],
        ),
        ("512", ["model=bert-mini", "data.max_seq_length=512", "train.batch_size=8"], []),
    ],
    "modern": [
        (
            "128",
            [
                "model=modernbert-mini",
                "model.global_rope_theta=10000",
                "data.max_seq_length=128",
                "train.batch_size=32",
            ],
            [],
        ),
        (
            "128 -> 1024 (90/10), theta 10k -> 160k",
            [
                "model=modernbert-mini",
                "model.global_rope_theta=10000",
                "data.max_seq_length=128",
                "train.batch_size=32",
                "phases=[{name:short,share:0.9},{name:extend,share:0.1,schedule:constant,"
                f"lr:5e-4,set:{MODERN_LONG}}}]",
            ],
            ["short"],
        ),
    ],
}
EVAL_LENGTHS = {"bert": (128, 512), "modern": (128, 1024)}


def data_overrides(corpus: str) -> tuple[list[str], list[str], str]:
    """(training overrides, held-out files, a description)."""
    if corpus == "shared" and all((GUTENBERG / name).is_file() for name in TRAIN_BOOKS + HELD_OUT):
        files = ",".join(str(GUTENBERG / name) for name in TRAIN_BOOKS)
        return (
            ["data=files", f"data.train_files=[{files}]"],
            [str(GUTENBERG / n) for n in HELD_OUT],
            f"Gutenberg: {', '.join(TRAIN_BOOKS)}; held out: {', '.join(HELD_OUT)}",
        )
    return ["data=builtin"], [], "the built-in corpus; held out: its validation split"


def evaluate(
    model_dir: Path,
    held_out: list[str],
    length: int,
    cache: Path,
    out: Path,
    min_masked: int = 10_000,
) -> dict:
    """``mlmkit eval``'s figures (its Python API, in this process) of ``model_dir`` on the held-out
    files (else the built-in corpus's validation split) in blocks of ``length``, over at least
    ``min_masked`` masked tokens (``masking.eval_min_masked_tokens``)."""
    from mlmkit.config import DataConfig, EvalConfig, MaskingConfig, PathsConfig
    from mlmkit.evaluation.mlm import run_evaluation

    data = (
        DataConfig(source="files", train_files=held_out, max_seq_length=length)
        if held_out
        else DataConfig(source="builtin", max_seq_length=length)
    )
    return run_evaluation(
        EvalConfig(
            checkpoint=str(model_dir),
            data=data,
            files=held_out,
            masking=MaskingConfig(eval_min_masked_tokens=min_masked),
            paths=PathsConfig(cache_dir=str(cache)),
            output=str(out),
        )
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--tokens",
        type=int,
        default=4 * 1024 * 1024,
        help="training tokens per run (default 4,194,304)",
    )
    p.add_argument("--only", nargs="+", default=list(RUNS), choices=list(RUNS))
    p.add_argument(
        "--corpus",
        default="shared",
        choices=["shared", "builtin"],
        help="shared: the Gutenberg books where ../shared/data has them (default); builtin",
    )
    p.add_argument(
        "--eval-min-masked",
        type=int,
        default=10_000,
        help="masked tokens each evaluation scores at least (default 10,000, mlmkit eval's)",
    )
    p.add_argument(
        "--size",
        default="mini",
        choices=["mini", "tiny"],
        help="the presets' size: mini (bert-mini, modernbert-mini; default) or tiny (a quick look)",
    )
    p.add_argument(
        "--out", type=Path, default=None, help="output folder (default outputs/bench-phases/<time>)"
    )
    args = p.parse_args()
    if args.tokens < 4096:
        p.error("--tokens must be at least one step (4,096)")

    from harness import machine

    out = args.out or ROOT / "outputs" / "bench-phases" / time.strftime("%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "cache"
    data, held_out, described = data_overrides(args.corpus)
    print(f"{machine()}\n{args.tokens:,} training tokens per run; {described}")
    summary = {"tokens": args.tokens, "data": described, "tables": {}}
    for family in args.only:
        lengths = EVAL_LENGTHS[family]
        rows = []
        for name, overrides, phase_exports in RUNS[family]:
            run_dir = out / family / re.sub(r"[^\w.]+", "-", name).strip("-")
            overrides = [
                o.replace("-mini", f"-{args.size}") if o.startswith("model=") else o
                for o in overrides
            ]
            events = train_mlmkit(
                [
                    *overrides,
                    *data,
                    "logger=none",
                    "train.progress=false",
                    f"masking.eval_min_masked_tokens={args.eval_min_masked}",
                    f"paths.cache_dir={cache}",
                    "train.max_steps=null",
                    f"train.max_tokens={args.tokens}",
                    "train.eval_every=0",
                    "train.save_every=0",
                ],
                run_dir,
                f"the {family} {name} run",
            )
            last = [e for e in events if e["event"] == "train"][-1]
            models = [
                (f"{name}, after phase 1 ({phase})", run_dir / "phases" / phase)
                for phase in phase_exports
            ]
            models.append((name, run_dir / "final"))
            for label, model_dir in models:
                figures = {
                    n: evaluate(
                        model_dir,
                        held_out,
                        n,
                        cache,
                        run_dir / f"eval-{model_dir.name}-{n}.json",
                        args.eval_min_masked,
                    )
                    for n in lengths
                }
                rows.append(
                    {
                        "run": label,
                        "steps": last["step"],
                        "tokens": last["tokens_seen"],
                        "train_s": round(last["elapsed_s"], 1),
                        **{
                            f"eval_{k}_{n}": figures[n][k]
                            for n in lengths
                            for k in ("loss", "accuracy")
                        },
                    }
                )
        summary["tables"][family] = rows
        print(f"\n{family}: held-out masked-token loss / accuracy by evaluation block length\n")
        print("| run | steps | training s | " + " | ".join(f"{n} tokens" for n in lengths) + " |")
        print("| --- | ---: | ---: | " + " | ".join("---:" for _ in lengths) + " |")
        for r in rows:
            cells = " | ".join(
                f"{r[f'eval_loss_{n}']:.3f} / {r[f'eval_accuracy_{n}']:.1%}" for n in lengths
            )
            print(f"| {r['run']} | {r['steps']:,} | {r['train_s']:.0f} | {cells} |")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\nsummary: {out / 'summary.json'}")


if __name__ == "__main__":
    main()
