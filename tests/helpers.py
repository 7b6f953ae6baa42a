"""Small helpers the tests of several modules share."""

from __future__ import annotations

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
