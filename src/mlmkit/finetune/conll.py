"""Word-tagged sentences from CoNLL and CoNLL-U files (``task.kind=tokens``).

- **CoNLL** (any suffix but ``.conllu``; WNUT-17, CoNLL-2003): one word a line, its first
  column the word and its last column the tag (``token<TAB>tag``; columns split at tabs, or at
  spaces in a line without a tab); an empty line, or one of blanks alone (WNUT-17's lone tab),
  ends a sentence; CoNLL-2003's ``-DOCSTART-`` lines are document breaks.
- **CoNLL-U** (``.conllu``; Universal Dependencies): ten tab-separated columns; the tag is the
  ``UPOS`` column (``task.label_column=upos``) or ``XPOS`` (``xpos``); ``#`` comment lines,
  multiword-token ranges (``1-2``, whose words follow on lines of their own) and empty nodes
  (``8.1``) are skipped.

Each sentence is ``{"words": [...], "tags": [...], "lines": [each word's line]}``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from mlmkit.config import TaskConfig
from mlmkit.data.sources import check_not_binary
from mlmkit.errors import ConfigError, DataError

log = logging.getLogger("mlmkit")

CONLLU_TAGS = {"upos": 3, "xpos": 4}  # task.label_column -> the CoNLL-U column


def is_conllu(path: Path) -> bool:
    """Whether ``path`` is read as CoNLL-U (by its suffix)."""
    return path.suffix.lower() == ".conllu"


def read_sentences(path: Path, task: TaskConfig, setting: str) -> list[dict[str, Any]]:
    """Return the sentences of a CoNLL or CoNLL-U file; a line without a tag column, a CoNLL-U line
    without its ten columns, a missing or empty file are errors naming the file (and line)."""
    if not path.is_file():
        raise DataError(
            f"{setting}: {str(path)!r} does not exist; set {setting} to a .conll or .conllu "
            "file (absolute, or relative to task.data_dir)."
        )
    check_not_binary(str(path), setting)
    if is_conllu(path) and task.label_column not in CONLLU_TAGS:
        raise ConfigError(
            f"task.label_column={task.label_column!r} is no CoNLL-U tag column; set "
            f"task.label_column=upos or xpos for {str(path)!r}."
        )
    word_tag = _conllu_word if is_conllu(path) else _conll_word
    sentences: list[dict[str, Any]] = []
    words: list[str] = []
    tags: list[str] = []
    lines: list[int] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line, text in enumerate(f, 1):
            pair = None if not text.strip() else word_tag(text, line, path, task, setting)
            if pair is None or pair is _BREAK:
                if words:
                    sentences.append({"words": words, "tags": tags, "lines": lines})
                words, tags, lines = [], [], []
            elif pair is not _SKIP:
                words.append(pair[0])
                tags.append(pair[1])
                lines.append(line)
    if words:
        sentences.append({"words": words, "tags": tags, "lines": lines})
    if not sentences:
        raise DataError(
            f"{setting}: {str(path)!r} holds no sentence; fill it with token<TAB>tag lines "
            f"(an empty line between sentences), or point {setting} at another file."
        )
    return sentences


_SKIP, _BREAK = object(), object()  # a line that is no word; a document break


def _conll_word(text: str, line: int, path: Path, task: TaskConfig, setting: str):
    """``(word, tag)`` of a CoNLL line: its first and last columns."""
    fields = text.rstrip("\r\n").split("\t") if "\t" in text else text.split()
    fields = [f.strip() for f in fields if f.strip()]
    if fields and fields[0] == "-DOCSTART-":
        return _BREAK
    if len(fields) < 2:
        raise DataError(
            f"{str(path)!r} line {line}: {text.strip()!r} has no tag column; write each word "
            f"as token<TAB>tag (an empty line between sentences), or point {setting} at a "
            "CoNLL file."
        )
    return fields[0], fields[-1]


def _conllu_word(text: str, line: int, path: Path, task: TaskConfig, setting: str):
    """``(word, tag)`` of a CoNLL-U word line; comments, ranges and empty nodes are skipped."""
    if text.startswith("#"):
        return _SKIP
    fields = text.rstrip("\r\n").split("\t")
    if len(fields) != 10:
        raise DataError(
            f"{str(path)!r} line {line}: {len(fields)} tab-separated column(s) where CoNLL-U "
            f"has 10; correct the line, or point {setting} at a CoNLL-U file (a .conll "
            "suffix reads token<TAB>tag lines)."
        )
    if "-" in fields[0] or "." in fields[0]:  # a multiword token's range, an empty node
        return _SKIP
    return fields[1], fields[CONLLU_TAGS[task.label_column]]
