"""Small helpers the tests of several modules share."""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def warnings_of(name: str):
    """The warning messages logged by ``name`` inside the block (whatever propagation the
    ``mlmkit`` logger has been given by a run in this process)."""
    records: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger(name)
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def write_file(folder: Path, name: str, content: str | bytes) -> Path:
    """``folder/name`` holding ``content`` (bytes as they are, text as UTF-8)."""
    path = folder / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


# ---- labelled files, as fine-tuning reads them ----------------------------------------------


def task_config(name: str, **settings):
    """conf/task/<name>.yaml with ``settings``, as a TaskConfig."""
    from omegaconf import OmegaConf

    from mlmkit.config import TaskConfig

    return OmegaConf.to_object(
        OmegaConf.merge(
            OmegaConf.structured(TaskConfig),
            OmegaConf.load(Path(__file__).resolve().parents[1] / "conf" / "task" / f"{name}.yaml"),
            settings,
        )
    )


WORDS = ["cat", "dog", "bird", "fish", "horse", "mouse", "tree", "house", "river", "road"]


def pair_rows(n: int, seed: int = 0) -> list[dict]:
    """``n`` premise/hypothesis pairs labelled same or other (the same animal or not), with a
    comma and a quote in some texts (CSV quoting)."""
    import random

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.choice(WORDS), rng.choice(WORDS)
        rows.append(
            {
                "premise": f'The {a} sat, said "{WORDS[i % 10]}", by the {b}.'
                if i % 3 == 0
                else f"The {a} sat by the {b}.",
                "hypothesis": f"A {a if i % 2 else rng.choice(WORDS)} was there.",
                "gold": "same" if i % 2 else "other",
                "score": round(i % 5 + 0.5 * (i % 2), 1),
            }
        )
    return rows


def write_rows(path, rows: list[dict], columns=("premise", "hypothesis", "gold", "score")):
    """``rows`` as a CSV, JSONL or TSV file, by the suffix of ``path``."""
    import csv

    with open(path, "w", encoding="utf-8", newline="") as f:
        if path.suffix == ".jsonl":
            f.writelines(json.dumps({c: r[c] for c in columns}) + "\n" for r in rows)
        else:
            writer = csv.writer(
                f,
                delimiter="," if path.suffix == ".csv" else "\t",
                quoting=csv.QUOTE_MINIMAL if path.suffix == ".csv" else csv.QUOTE_NONE,
                escapechar=None if path.suffix == ".csv" else "\\",
            )
            writer.writerow(columns)
            writer.writerows([r[c] for c in columns] for r in rows)
    return path
