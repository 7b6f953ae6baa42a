"""Where the rows of words an old vocabulary cannot spell start (``tokenizer.extend_vocab``): the
average word's row (mlmkit's start) against [UNK]'s (the start before), on the Hindi novel of the
walk-through (examples/new_language.sh).

    python benchmarks/vocab_init.py [--base-steps 300] [--steps 200] [--extend 2000] [--lr 1e-3]
                                    [--out DIR]

An English bert-mini (the walk-through's size; WordPiece 8,192 and ``--base-steps`` steps on the
Gutenberg books of ../shared/data) is continued on *Sevasadan* with its vocabulary extended by
``--extend`` Hindi words, every one of which its English vocabulary makes a single [UNK]. The
two starts differ only in those rows (``model.bert.extend_embeddings``'s ``unspelt``): the
extended model of each is saved as a model dir and continued from it with the same settings
(``model.init_from``, the continued-pretraining recipe's rate or ``--lr``, the walk-through's
128-token blocks; a base already in ``--out`` is reused). Printed side by side: the held-out
masked-LM loss before any step (``mlmkit eval`` on the run's validation split), the training loss
of the first steps and the held-out loss at each evaluation.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# this folder's kernels.py would stand for the kernels package that transformers imports
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
DATA = ROOT.parent / "shared" / "data" / "corpora"
HINDI = DATA / "hindi" / "sevasadan.txt"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
SHAPE = [
    "data.max_seq_length=128",
    "data.max_eval_samples=64",
    "train.batch_size=16",
    "train.progress=false",
    "logger=none",
    "train.save_every=0",
]


def mlmkit(*args: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mlmkit", *args], cwd=ROOT, env=ENV, capture_output=True, text=True
    )
    if proc.returncode != 0:
        sys.exit(f"mlmkit {args[0]} failed:\n{proc.stderr[-3000:]}")


def base_model(out: Path, cache: Path, steps: int) -> Path:
    """An English bert-mini: its final/ dir."""
    if (out / "final" / "config.json").is_file():
        return out / "final"
    mlmkit(
        "train",
        "model=bert-mini",
        "data=files",
        f"data.train_files=[{DATA}/gutenberg/*.txt]",
        *SHAPE,
        f"train.max_steps={steps}",
        "train.eval_every=0",
        f"paths.cache_dir={cache}",
        f"hydra.run.dir={out}",
    )
    return out / "final"


def extended_dirs(base: Path, out: Path, words: int) -> dict[str, Path]:
    """The base extended by ``words`` Hindi words, once per start of the rows it cannot spell."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from mlmkit.data.vocab import coverage, extend_tokenizer, word_counts
    from mlmkit.model.bert import extend_embeddings

    base_tokenizer = AutoTokenizer.from_pretrained(base)
    texts = HINDI.read_text(encoding="utf-8").split("\n\n")
    extended, added = extend_tokenizer(base_tokenizer, texts, words)
    unspellable = sum(
        base_tokenizer(w, add_special_tokens=False)["input_ids"] == [base_tokenizer.unk_token_id]
        for w in added
    )
    counts = word_counts(base_tokenizer, texts)
    (_, before), (_, after) = coverage(base_tokenizer, counts), coverage(extended, counts)
    print(
        f"{len(added)} Hindi words added, {unspellable} of them a single [UNK] to the English "
        f"vocabulary; [UNK] {before:.1%} -> {after:.1%} of the novel's tokens"
    )
    dirs = {}
    for start in ("average", "unk"):
        model = AutoModelForMaskedLM.from_pretrained(base)
        extend_embeddings(model, extended, base_tokenizer, unspelt=start)
        dirs[start] = out / f"extended-{start}"
        model.save_pretrained(dirs[start])
        extended.save_pretrained(dirs[start])
    return dirs


def continued(init: Path, out: Path, cache: Path, steps: int, every: int, lr: float | None) -> dict:
    """The loss before training and the events of ``steps`` steps of continued pretraining."""
    data = [
        "data=files",
        f"data.train_files=[{HINDI}]",
        "data.max_seq_length=128",
        "data.max_eval_samples=64",
        f"paths.cache_dir={cache}",
    ]
    before = out / "before.json"
    mlmkit("eval", f"checkpoint={init}", *data, f"output={before}")
    mlmkit(
        "train",
        "model=bert-mini",
        f"model.init_from={init}",
        *data,
        *SHAPE,
        f"train.max_steps={steps}",
        f"train.eval_every={every}",
        "train.log_every=5",
        f"hydra.run.dir={out / 'run'}",
        *([f"optim.lr={lr}"] if lr else []),
    )
    events = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    return {
        "before": json.loads(before.read_text())["loss"],
        "train": {e["step"]: e["loss"] for e in events if e["event"] == "train"},
        "eval": {e["step"]: e["eval_loss"] for e in events if e["event"] == "eval"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-steps", type=int, default=300)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=25, help="steps between evaluations")
    parser.add_argument(
        "--extend", type=int, default=2000, help="Hindi words added to the vocabulary"
    )
    parser.add_argument(
        "--lr", type=float, default=None, help="default: the continued-pretraining recipe's"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not HINDI.is_file():
        sys.exit(f"{HINDI} is absent (../shared/data beside the checkout)")
    out = args.out or Path(tempfile.mkdtemp(prefix="vocab-init-"))
    cache = out / "cache"
    base = base_model(out / "base", cache, args.base_steps)
    dirs = extended_dirs(base, out, args.extend)
    tag = f"-lr{args.lr:g}" if args.lr else ""
    results = {
        start: continued(path, out / f"{start}{tag}", cache, args.steps, args.every, args.lr)
        for start, path in dirs.items()
    }
    train_steps = [s for s in (5, 10, 25, 50, 100) if s in results["average"]["train"]]
    eval_steps = sorted(results["average"]["eval"])
    print(
        "| start of the unspellable rows | held-out loss, step 0 | "
        + " | ".join(f"train loss, step {s}" for s in train_steps)
        + " | "
        + " | ".join(f"held-out loss, step {s}" for s in eval_steps)
        + " |"
    )
    print("| --- |" + " ---: |" * (1 + len(train_steps) + len(eval_steps)))
    for start, name in (("average", "the average word (mlmkit)"), ("unk", "[UNK]'s row (before)")):
        r = results[start]
        print(
            f"| {name} | {r['before']:.3f} | "
            + " | ".join(f"{r['train'][s]:.3f}" for s in train_steps)
            + " | "
            + " | ".join(f"{r['eval'][s]:.3f}" for s in eval_steps)
            + " |"
        )
    print(f"(runs in {out})")


if __name__ == "__main__":
    main()
