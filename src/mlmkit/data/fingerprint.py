"""Fingerprints of mlmkit's own for every dataset it builds and every transform it applies.

datasets names a dataset's cache files by a fingerprint. Left to itself, it computes one by
pickling the in-memory table, or a transform's function and arguments, with dill. That hashing
is slow for large closures (a tokenizer), falls back to a random fingerprint (and no reuse of
the cache) where it fails, and from datasets 5.0.1 on fails outright for an in-memory table
wherever pyarrow is installed outside a folder named site-packages (``pip --target``, vendored
folders, a container's dependency folder on PYTHONPATH): dill then pickles the pyarrow module by
value, and ``pyarrow.MonthDayNano`` cannot be pickled. So mlmkit passes a fingerprint to each
step, derived here from what it already knows (file sizes and times, hub names, the settings
that change the output), and datasets hashes nothing.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def derive(*parts: Any) -> str:
    """Return a fingerprint: 16 hex digits of the SHA-256 of ``parts`` as JSON (values JSON
    cannot write are written as their ``str``)."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def content(rows: list) -> str:
    """Return the fingerprint of in-memory rows (lists of ids, arrays, strings or dicts of
    these) from their content."""
    digest = hashlib.sha256()
    for row in rows:
        raw = row.tobytes() if hasattr(row, "tobytes") else json.dumps(row, default=str).encode()
        digest.update(len(raw).to_bytes(8, "little") + raw)
    return digest.hexdigest()[:16]


def in_memory(columns: dict[str, list], fingerprint: str):
    """Return a ``datasets.Dataset`` of ``columns`` held in memory, with ``fingerprint``
    (``Dataset.from_dict`` would hash the whole table with dill to make one)."""
    import datasets
    import pyarrow as pa

    return datasets.Dataset(pa.table(columns), fingerprint=fingerprint)
