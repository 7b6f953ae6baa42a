"""The rows ``mlmkit embed`` trains on, and the held-out data they must not share a text with.

Rows are ``{"anchor", "positive"[, "negative"]}`` texts, the column order sentence-transformers'
in-batch-negatives losses read (the first column the query, the second its positive, any later
one a hard negative):

- ``objective=pairs``: the user's pairs, from JSONL (one object a line), CSV or TSV files (a
  header line names the columns; ``pairs.anchor_column``, ``positive_column``,
  ``negative_column``), or a Hugging Face dataset (``pairs.hub_name``);
- ``objective=simcse``: each sentence of the raw corpus paired with itself: the two copies
  differ only by dropout, so the encoder learns what survives it (unsupervised SimCSE: Gao,
  Yao & Chen, 2021, "SimCSE: Simple Contrastive Learning of Sentence Embeddings");
- ``objective=same_document``: two neighbouring sentences of one document of the raw corpus.

The raw corpus is read as pretraining reads it (``data=``, ``mlmkit.data.sources.load_corpus``),
and only its training split is used: the documents pretraining held out for validation stay
held out. Sentences are cut at sentence-final punctuation (Latin, Devanagari's danda, CJK).

Held out: the texts of the evaluation data (the STS pairs of ``sts_dir``, the queries and
documents of ``retrieval_dir``). A training row that shares a text with them, compared
case-folded with runs of white space as one space, is dropped and counted (``overlap=drop``),
or stops the run (``overlap=error``): the figures then measure texts never trained on.
"""

from __future__ import annotations

import csv
import glob
import json
import logging
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlmkit.config import EmbedConfig, EmbedPairsConfig
from mlmkit.data.sources import check_not_binary, load_corpus
from mlmkit.errors import DataError
from mlmkit.evaluation.retrieval import BeirData, read_beir
from mlmkit.finetune.reader import load_split

log = logging.getLogger("mlmkit")

PAIR_SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "tsv"}
COLUMNS = ("anchor", "positive", "negative")  # the dataset's columns, in the losses' order
MIN_SENTENCE_CHARS = 16  # shorter pieces (headings, numbers) are no sentence to train on
_SENTENCE_END = re.compile(r"(?<=[.!?।॥。！？])\s+")


def normalise(text: str) -> str:
    """Fold ``text`` for comparison: case-folded, runs of white space as one space."""
    return " ".join(text.casefold().split())


# ---- the held-out evaluation data ---------------------------------------------------------------


@dataclass
class EvalData:
    """The held-out data of a run: STS pairs ``(sentence1, sentence2, score)`` and a BEIR
    folder's texts, with a name for each part (for the log and the model card)."""

    sts: list[tuple[str, str, float]] = field(default_factory=list)
    beir: BeirData | None = None
    names: list[str] = field(default_factory=list)

    def texts(self) -> set[str]:
        """Every held-out text, normalised."""
        texts = {normalise(t) for a, b, _ in self.sts for t in (a, b)}
        if self.beir is not None:
            beir = (*self.beir.queries.values(), *self.beir.corpus.values())
            texts |= {normalise(t) for t in beir}
        return texts


def load_eval_data(cfg: EmbedConfig) -> EvalData:
    """Load the STS split of ``cfg.sts_dir`` and the BEIR folder ``cfg.retrieval_dir``, if set."""
    data = EvalData()
    if cfg.sts_dir:
        examples = load_split(cfg.task, "train" if cfg.sts_split == "train" else "eval")
        data.sts = [(e["text"][0], e["text"][1], float(e["label"])) for e in examples]
        data.names.append(f"{cfg.sts_dir} ({cfg.sts_split}, {len(data.sts)} pairs)")
    if cfg.retrieval_dir:
        data.beir = read_beir(cfg.retrieval_dir, cfg.retrieval_split)
        data.names.append(
            f"{cfg.retrieval_dir} ({cfg.retrieval_split}, {len(data.beir.relevant)} "
            f"queries, {len(data.beir.corpus)} documents)"
        )
    return data


def drop_held_out(
    rows: list[dict[str, str]], held_out: set[str], overlap: str, what: str
) -> tuple[list[dict[str, str]], int]:
    """``(rows that share no text with held_out, how many were dropped)``; with
    ``overlap=error`` a shared text stops the run instead."""
    if not held_out:
        return rows, 0
    kept = [r for r in rows if not any(normalise(t) in held_out for t in r.values())]
    dropped = len(rows) - len(kept)
    if dropped and overlap == "error":
        first = next(r for r in rows if any(normalise(t) in held_out for t in r.values()))
        raise DataError(
            f"{dropped} of the {len(rows)} {what} share a text with the evaluation "
            f"data (the first: {first['anchor'][:60]!r}); remove them, or set "
            "overlap=drop to leave them out."
        )
    if dropped:
        log.warning(
            "Left out %d of the %d %s that share a text with the evaluation data, so that "
            "its figures stay held out (overlap=drop)",
            dropped,
            len(rows),
            what,
        )
    return kept, dropped


# ---- pairs files and Hub datasets ---------------------------------------------------------------


def pair_files(patterns: list[str]) -> list[Path]:
    """List the files of ``pairs.files`` (paths or globs): .jsonl, .json, .csv or .tsv files."""
    files: list[Path] = []
    for pattern in patterns:
        expanded = os.path.expanduser(str(pattern))
        matches = sorted(glob.glob(expanded)) if glob.has_magic(expanded) else [expanded]
        matches = [m for m in matches if os.path.isfile(m)]
        if not matches:
            raise DataError(
                f"pairs.files: no file matches {pattern!r}; list .jsonl, .csv or .tsv files."
            )
        for m in matches:
            if Path(m).suffix.lower() not in PAIR_SUFFIXES:
                raise DataError(
                    f"pairs.files: {m!r} is not a .jsonl, .json, .csv or .tsv file; "
                    "list files of those kinds (a header line naming the columns in "
                    "CSV and TSV)."
                )
        files += [Path(m) for m in matches]
    return files


def _records(path: Path) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    """``(column names, (line, record) of each row)`` of a JSONL, CSV or TSV file; a JSON line
    that is no object is an empty record."""
    check_not_binary(str(path), "pairs.files")
    kind = PAIR_SUFFIXES[path.suffix.lower()]
    with open(path, encoding="utf-8-sig", errors="replace", newline="") as f:
        if kind == "jsonl":
            rows = []
            for line, text in enumerate(f, 1):
                if text.strip():
                    try:
                        obj = json.loads(text)
                    except ValueError:
                        obj = None
                    rows.append((line, obj if isinstance(obj, dict) else {}))
            names = next((list(r) for _, r in rows if r), [])
            return names, rows
        csv.field_size_limit(1 << 24)
        dialect = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if kind == "tsv" else {}
        reader = csv.DictReader(f, **dialect)
        names = [n.strip() for n in reader.fieldnames or []]
        reader.fieldnames = names
        return names, [(reader.line_num, dict(r)) for r in reader]


def read_pair_file(path: Path, pairs: EmbedPairsConfig) -> list[dict[str, str]]:
    """Read the rows of one pairs file; a row with an empty anchor, positive (or negative, when one
    is named) is left out with a warning, and a file without a named column is an error."""
    names, records = _records(path)
    if not records:
        raise DataError(
            f"pairs.files: {str(path)!r} holds no pairs; fill it with pairs (a header "
            "line naming the columns first, in CSV and TSV), or list other files."
        )
    wanted = _wanted(pairs)
    for setting, column in wanted:
        if column not in names:
            raise DataError(
                f"pairs.files: {str(path)!r} has no column {column!r} (columns: "
                f"{', '.join(names) or 'none'}); set pairs.{setting} to one of its "
                "columns."
            )
    rows = [_row(record, wanted) for _, record in records]
    kept = [r for r in rows if r is not None]
    if len(kept) < len(rows):
        log.warning(
            "%s: left out %d row(s) with an empty or missing %s",
            path,
            len(rows) - len(kept),
            " or ".join(c for _, c in wanted),
        )
    return kept


def _wanted(pairs: EmbedPairsConfig) -> list[tuple[str, str]]:
    """Return ``(setting, column)`` of the anchor, the positive and the negative (when named)."""
    wanted = [("anchor_column", pairs.anchor_column), ("positive_column", pairs.positive_column)]
    return wanted + ([("negative_column", pairs.negative_column)] if pairs.negative_column else [])


def _row(record: dict[str, Any], wanted: list[tuple[str, str]]) -> dict[str, str] | None:
    """Make a training row (``anchor``, ``positive``[, ``negative``]) of a record; None when a text
    is missing or empty."""
    texts = [record.get(column) for _, column in wanted]
    if not all(isinstance(t, str) and t.strip() for t in texts):
        return None
    return {name: t.strip() for name, t in zip(COLUMNS, texts)}


def read_hub_pairs(pairs: EmbedPairsConfig) -> list[dict[str, str]]:
    """Read the rows of a Hub dataset (or a local dataset dir) of pairs."""
    import datasets

    try:
        if any((Path(pairs.hub_name) / f).is_file() for f in ("state.json", "dataset_dict.json")):
            ds = datasets.load_from_disk(pairs.hub_name)
            ds = ds[pairs.hub_split] if isinstance(ds, datasets.DatasetDict) else ds
        else:
            ds = datasets.load_dataset(pairs.hub_name, pairs.hub_config, split=pairs.hub_split)
    except Exception as exc:  # offline, missing dataset, config or split
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:160].rstrip(".")
        raise DataError(
            f"pairs.hub_name: could not load the dataset {pairs.hub_name!r} "
            f"({reason}); save it where the Hub is reachable (save_to_disk) and set "
            "pairs.hub_name to that folder, or set pairs.files=[...] to files of "
            "pairs."
        ) from None
    wanted = _wanted(pairs)
    for setting, column in wanted:
        if column not in ds.column_names:
            raise DataError(
                f"pairs.hub_name: the dataset {pairs.hub_name!r} has no column "
                f"{column!r} (columns: {', '.join(ds.column_names)}); set "
                f"pairs.{setting}."
            )
    rows = [_row(r, wanted) for r in ds.select_columns([c for _, c in wanted])]
    return [r for r in rows if r is not None]


def pair_rows(cfg: EmbedConfig, held_out: set[str]) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """``(rows, what they are)`` of ``objective=pairs``."""
    pairs = cfg.pairs
    if pairs.files:
        files = pair_files(pairs.files)
        rows = [r for path in files for r in read_pair_file(path, pairs)]
        source = ", ".join(map(str, files))
    else:
        rows, source = read_hub_pairs(pairs), f"{pairs.hub_name} ({pairs.hub_split})"
    rows, dropped = drop_held_out(rows, held_out, cfg.overlap, "training pairs")
    rows = rows[: pairs.max_pairs] if pairs.max_pairs else rows
    return rows, {
        "source": source,
        "dropped": dropped,
        "hard_negatives": pairs.negative_column is not None,
    }


# ---- the raw corpus -----------------------------------------------------------------------------


def sentences(document: str) -> list[str]:
    """Return the sentences of ``document`` (cut at sentence-final punctuation; white space folded),
    each of at least ``MIN_SENTENCE_CHARS`` characters."""
    text = " ".join(document.split())
    return [s for s in _SENTENCE_END.split(text) if len(s) >= MIN_SENTENCE_CHARS]


Rows = list[dict[str, str]]


def corpus_rows(cfg: EmbedConfig, held_out: set[str]) -> tuple[Rows, dict[str, Any]]:
    """``(rows, what they are)`` of ``objective=simcse`` (each sentence once, as anchor and
    positive) or ``same_document`` (sentences 1 and 2, 3 and 4, ... of each document)."""
    documents = load_corpus(cfg.data)["train"]["text"]
    rows: list[dict[str, str]] = []
    seen: set[str] = set()
    for doc in documents:
        found = sentences(doc)
        if cfg.objective == "simcse":
            fresh = [s for s in found if normalise(s) not in seen]
            seen.update(normalise(s) for s in fresh)
            rows += [{"anchor": s, "positive": s} for s in fresh]
        else:
            rows += [{"anchor": a, "positive": b} for a, b in zip(found[::2], found[1::2])]
    if len(rows) < 2:
        what, more = (
            ("sentence", "")
            if cfg.objective == "simcse"
            else ("pair of sentences", ", two or more to a document")
        )
        raise DataError(
            f"The corpus of data={cfg.data.source} gives {len(rows)} training {what}; "
            f"point data at more text (sentences of at least {MIN_SENTENCE_CHARS} "
            f"characters{more})."
        )
    rows, dropped = drop_held_out(rows, held_out, cfg.overlap, "training rows")
    random.Random(cfg.seed).shuffle(rows)
    rows = rows[: cfg.max_texts] if cfg.max_texts else rows
    return rows, {"source": corpus_name(cfg), "dropped": dropped, "documents": len(documents)}


def corpus_name(cfg: EmbedConfig) -> str:
    """Describe the corpus of ``cfg.data`` in a few words (for the log and the model card)."""
    data = cfg.data
    if data.source == "files":
        return ", ".join(data.train_files) + " (its training split)"
    if data.source == "hub":
        return f"{data.hub_name} ({data.hub_split})"
    if data.source == "mix":
        return "a mix of " + ", ".join(s.name or ",".join(s.files) or s.kind for s in data.sources)
    return "the built-in corpus (Python's documentation; its training split)"


def training_rows(cfg: EmbedConfig, held_out: set[str]) -> tuple[Rows, dict[str, Any]]:
    """``(rows, what they are)`` for ``cfg.objective``; at least two rows."""
    read = pair_rows if cfg.objective == "pairs" else corpus_rows
    rows, about = read(cfg, held_out)
    if len(rows) < 2:
        raise DataError(
            f"{len(rows)} training row(s) are left after leaving out the evaluation "
            "data's texts; in-batch negatives need two or more: give more pairs or "
            "text."
        )
    return rows, {**about, "rows": len(rows)}
