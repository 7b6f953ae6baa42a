"""Held-out retrieval sets and training pairs built from data at hand, for ``mlmkit embed`` and
``mlmkit eval-retrieval`` where no BEIR set is available.

    python -m mlmkit.embed.sets stsb <STS-B dir> <out dir>     # two sets, below
    python -m mlmkit.embed.sets documents <out dir> <file.txt> ...

- ``stsb`` writes ``retrieval/`` (``sts_retrieval``), from STS-B's dev split: each pair scored
  ``min_score`` (4) or more gives a query, its first sentence, whose relevant document is its
  second sentence; the corpus is every other sentence of the split, as distractors. A query's
  own text is left out of the corpus (it would find itself), and so is a query left without a
  relevant document.
- ``stsb`` also writes ``train-pairs.jsonl`` (``sts_training_pairs``), from STS-B's train split:
  the pairs scored ``min_score`` or more, as JSONL rows ``{"anchor", "positive"}``, a training
  set of paraphrases whose sentences come from another split than the retrieval set's (the few
  texts the splits share are left out by ``mlmkit embed``, which drops training rows that share
  a text with its evaluation data).
- ``documents`` (``document_retrieval``): from the documents pretraining holds out of text
  files (``data=files`` with its defaults: paragraphs, 5% held out with mlmkit's fixed split),
  cut into passages of four sentences: each passage gives a query, its first sentence, whose
  relevant document is the passage's other sentences; the other passages, of the same document
  and of the others, are the distractors. A set for a language without one (the Hindi
  walk-through), which neither pretraining nor ``mlmkit embed`` on the same files ever trains
  on (both read only the training split).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mlmkit.config import DataConfig, TaskConfig
from mlmkit.embed.data import normalise, sentences
from mlmkit.errors import DataError, MLMKitError
from mlmkit.finetune.reader import load_split

PASSAGE_SENTENCES = 4  # document-retrieval: a query's passage, its first sentence included
STS_COLUMNS = [
    "index",
    "genre",
    "filename",
    "year",
    "old_index",
    "source1",
    "source2",
    "sentence1",
    "sentence2",
    "score",
]  # GLUE's STS-B TSV, without a header line


def stsb_task(sts_dir: str | Path) -> TaskConfig:
    """Return the STS-B layout of ``conf/task/stsb.yaml`` for the folder ``sts_dir``."""
    return TaskConfig(
        name="stsb",
        data_dir=str(sts_dir),
        header=False,
        column_names=STS_COLUMNS,
        text_columns=["sentence1", "sentence2"],
        label_column="score",
        labels=[],
        kind="regression",
        label_range=[0.0, 5.0],
        metrics=["spearman", "pearson"],
        hub_path=None,
        hub_name=None,
    )


def sts_pairs(sts_dir: str | Path, split: str) -> list[tuple[str, str, float]]:
    """``(sentence1, sentence2, score)`` of the STS-B ``split`` (dev or train)."""
    examples = load_split(stsb_task(sts_dir), "eval" if split == "dev" else "train")
    return [(e["text"][0], e["text"][1], float(e["label"])) for e in examples]


def write_beir(
    out: Path, queries: dict[str, str], corpus: dict[str, str], relevant: dict[str, list[str]]
) -> dict[str, int]:
    """Write a BEIR-format folder (``corpus.jsonl``, ``queries.jsonl``, ``qrels/test.tsv``)."""
    (out / "qrels").mkdir(parents=True, exist_ok=True)
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as f:
        f.writelines(
            json.dumps({"_id": i, "title": "", "text": t}, ensure_ascii=False) + "\n"
            for i, t in corpus.items()
        )
    with open(out / "queries.jsonl", "w", encoding="utf-8") as f:
        f.writelines(
            json.dumps({"_id": i, "text": t}, ensure_ascii=False) + "\n" for i, t in queries.items()
        )
    with open(out / "qrels" / "test.tsv", "w", encoding="utf-8") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        f.writelines(f"{q}\t{d}\t1\n" for q, docs in relevant.items() for d in docs)
    return {
        "queries": len(queries),
        "documents": len(corpus),
        "judgments": sum(len(d) for d in relevant.values()),
    }


def sts_retrieval(
    sts_dir: str | Path, out: str | Path, split: str = "dev", min_score: float = 4.0
) -> dict[str, int]:
    """Write the retrieval set of STS-B's ``split`` to ``out`` (see the module's docstring)."""
    pairs = sts_pairs(sts_dir, split)
    wanted: dict[str, set[str]] = {}  # query text -> relevant texts (normalised keys)
    text_of: dict[str, str] = {}
    for a, b, score in pairs:
        text_of.setdefault(normalise(a), a)
        text_of.setdefault(normalise(b), b)
        if score >= min_score and normalise(a) != normalise(b):
            wanted.setdefault(normalise(a), set()).add(normalise(b))
    doc_ids = {t: f"d{i}" for i, t in enumerate(t for t in text_of if t not in wanted)}
    queries, relevant = {}, {}
    for n, (query, docs) in enumerate(wanted.items()):
        found = sorted(doc_ids[d] for d in docs if d in doc_ids)
        if found:
            queries[f"q{n}"], relevant[f"q{n}"] = text_of[query], found
    if not queries:
        raise DataError(f"{sts_dir}: no {split} pair scores {min_score} or more; lower min_score.")
    return write_beir(Path(out), queries, {i: text_of[t] for t, i in doc_ids.items()}, relevant)


def sts_training_pairs(
    sts_dir: str | Path, out: str | Path, split: str = "train", min_score: float = 4.0
) -> int:
    """Write STS-B's ``split`` pairs scored ``min_score`` or more as JSONL pairs; their count."""
    rows = [{"anchor": a, "positive": b} for a, b, s in sts_pairs(sts_dir, split) if s >= min_score]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    return len(rows)


def document_retrieval(files: list[str], out: str | Path) -> dict[str, int]:
    """Write the retrieval set of the held-out documents of ``files`` to ``out``."""
    from mlmkit.data.sources import load_corpus

    corpus = load_corpus(DataConfig(source="files", train_files=list(files)))
    held_out = corpus["validation"]["text"]
    queries, corpus, relevant = {}, {}, {}
    for n, doc in enumerate(held_out):
        found = sentences(doc)
        for k in range(0, len(found) - 1, PASSAGE_SENTENCES):
            passage = found[k : k + PASSAGE_SENTENCES]
            if len(passage) >= 2:
                key = f"{n}-{k // PASSAGE_SENTENCES}"
                queries[f"q{key}"], corpus[f"d{key}"] = passage[0], " ".join(passage[1:])
                relevant[f"q{key}"] = [f"d{key}"]
    if len(queries) < 2:
        raise DataError(
            f"The held-out documents of {', '.join(files)} give {len(queries)} queries "
            "(a passage needs two sentences); give more text."
        )
    return write_beir(Path(out), queries, corpus, relevant)


def main(argv: list[str] | None = None) -> int:
    """Run the command line of the module's docstring."""
    parser = argparse.ArgumentParser(
        prog="python -m mlmkit.embed.sets", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="kind", required=True)
    p = sub.add_parser("stsb", help="a retrieval set of STS-B dev, training pairs of STS-B train")
    p.add_argument("sts_dir")
    p.add_argument("out", help="folder: retrieval/ (BEIR format) and train-pairs.jsonl")
    p.add_argument("--min-score", type=float, default=4.0)
    p = sub.add_parser("documents", help="a retrieval set of the held-out documents of text files")
    p.add_argument("out")
    p.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    try:
        if args.kind == "stsb":
            out = Path(args.out)
            found = sts_retrieval(args.sts_dir, out / "retrieval", "dev", args.min_score)
            found["training pairs"] = sts_training_pairs(
                args.sts_dir, out / "train-pairs.jsonl", "train", args.min_score
            )
        else:
            found = document_retrieval(args.files, args.out)
    except MLMKitError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.out}: " + ", ".join(f"{v} {k}" for k, v in found.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
