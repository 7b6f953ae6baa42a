"""The labelled-file reader that fine-tuning, probes, STS and the embedder share: a sentence
(-pair) task's examples from TSV (GLUE's layout: no quoting), CSV (quoted fields allowed) or JSONL
files (one object per line, its keys the columns), or from the Hub's ``glue`` dataset.

    from mlmkit.finetune.reader import load_task, load_split, read_rows
    train, dev = load_task(task)          # task: a TaskConfig (conf/task/*.yaml)

Each file is read into rows ``(line number, {column: value})``, then into examples ``{"text":
[...], "label": class id | score}``; a classification task that lists no labels takes the
training file's values, sorted. A label outside the task's labels, a score that is no number
or lies outside ``task.label_range``, a missing column or file is one sentence naming the file
and line and the setting to change.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from pathlib import Path
from typing import Any

from mlmkit.config import TaskConfig
from mlmkit.data.sources import check_not_binary
from mlmkit.errors import ConfigError, DataError

log = logging.getLogger("mlmkit")

CSV_DIALECTS = {"tsv": {"delimiter": "\t", "quoting": csv.QUOTE_NONE}, "csv": {"delimiter": ","}}


def file_format(path: Path) -> str:
    """csv, jsonl or tsv, by the file's suffix (any other suffix: TSV, as GLUE's files)."""
    suffix = path.suffix.lower()
    return "csv" if suffix == ".csv" else "jsonl" if suffix in (".jsonl", ".json") else "tsv"


def reads_files(task: TaskConfig) -> bool:
    """Whether the task's examples come from files (else from the Hub)."""
    return bool(task.data_dir) or not task.hub_path


def task_file(task: TaskConfig, split: str) -> Path:
    """Return the file of ``split`` (train | eval): absolute, or relative to task.data_dir."""
    path = Path(task.train_file if split == "train" else task.eval_file).expanduser()
    return path if path.is_absolute() else Path(task.data_dir or ".").expanduser() / path


def file_setting(task: TaskConfig, split: str) -> str:
    """Return the setting that points at the file of ``split``, for messages: task.data_dir for the
    GLUE presets (a folder of their files), else task.train_file or task.eval_file."""
    return "task.data_dir" if task.hub_path else f"task.{split}_file"


def read_rows(
    path: Path, task: TaskConfig, setting: str = "task.data_dir", columns: list[str] | None = None
) -> list[tuple[int, dict[str, str]]]:
    """``(line, {column: value})`` of each row of a TSV, CSV or JSONL file that holds all of
    ``columns`` (texts; default: the task's text and label columns); a file without one of the
    columns is an error, and so is a JSONL text column that holds no text (numbers, objects), as
    in pretraining. Other rows are skipped with a warning that counts them by cause: a line that
    is no JSON object (or has too few fields), a value missing, a JSONL value that is not text
    in a text column. A JSONL label that is a number reads as that number's text."""
    if not path.is_file():
        if setting == "task.data_dir":
            raise DataError(
                f"{str(path)!r} does not exist; set task.data_dir to the folder holding "
                f"{task.train_file} and {task.eval_file}."
            )
        raise DataError(
            f"{setting}: {str(path)!r} does not exist; set {setting} to a .tsv, .csv or "
            ".jsonl file (absolute, or relative to task.data_dir)."
        )
    check_not_binary(str(path), setting)  # UTF-16 (named) or binary: one sentence
    fmt = file_format(path)
    names, rows = _json_rows(path) if fmt == "jsonl" else _delimited_rows(path, task, fmt, setting)
    if names is None:
        raise DataError(
            f"{setting}: {str(path)!r} is empty; fill it with examples, or point {setting} "
            "at other files."
        )
    if not names:  # JSON lines, none of them an object
        raise DataError(
            f"{setting}: {str(path)!r} holds no JSON object; write one object per line, "
            "its keys the columns."
        )
    wanted = list(columns or [*task.text_columns, task.label_column])
    missing = [c for c in wanted if c not in names]
    if missing:
        fix = (
            "set task.text_columns / task.label_column, or task.column_names for files without "
            "a header"
            if setting.startswith("task.")
            else f"give {setting} a file with the columns {', '.join(wanted)}"
        )
        raise DataError(
            f"{str(path)!r} has no column {missing[0]!r} (columns: {', '.join(names)}); {fix}."
        )
    texts = list(columns or task.text_columns)
    if fmt == "jsonl":
        check_json_texts(path, rows, texts)
    kept, skipped = [], {"bad": 0, "missing": 0, "not_text": 0}
    for line, row in rows:
        if row is None:
            skipped["bad"] += 1
        elif any(row.get(c) is None for c in wanted):
            skipped["missing"] += 1
        elif any(not isinstance(row[c], str) for c in texts):
            skipped["not_text"] += 1
        else:
            kept.append(
                (line, {c: v if isinstance(v, str) else json.dumps(v) for c, v in row.items()})
            )
    if len(kept) < len(rows):
        warn_skipped(path, fmt, skipped, texts)
    return kept


def check_json_texts(path: Path, rows: list[tuple[int, dict | None]], texts: list[str]) -> None:
    """Refuse a JSONL text column that holds no text, by its first row with a value there (as
    pretraining's ``data.sources.check_text_column``): numbers or objects would become text such
    as "3" or "{...}" for the model to read."""
    for column in texts:
        first = next(
            (row[column] for _, row in rows if row is not None and row.get(column) is not None), ""
        )
        if not isinstance(first, str):
            what = (
                "numbers"
                if isinstance(first, (int, float)) and not isinstance(first, bool)
                else f"{type(first).__name__} values"
            )
            raise DataError(
                f"{str(path)!r}: the column {column!r} holds {what}, not text; set "
                "task.text_columns to the columns of text."
            )


def warn_skipped(path: Path, fmt: str, skipped: dict[str, int], texts: list[str]) -> None:
    """One warning counting the rows ``read_rows`` skipped, by cause."""
    bad = "that are not JSON objects" if fmt == "jsonl" else "with too few fields"
    causes = [
        (skipped["bad"], f"line(s) {bad}"),
        (skipped["missing"], "row(s) with a value missing"),
        (skipped["not_text"], f"row(s) whose {' or '.join(map(repr, texts))} is not text"),
    ]
    log.warning("%s: skipped %s", path, ", ".join(f"{n} {what}" for n, what in causes if n))


def _delimited_rows(path: Path, task: TaskConfig, fmt: str, setting: str):
    """``(column names, rows)`` of a TSV or CSV file; a row with too few fields is None, blank
    lines are left out; names are None for a file without a line. A UTF-8 byte-order mark
    before the first line is dropped (GLUE's MRPC files start with one: its download script
    copies the header line of Microsoft's msr_paraphrase_train.txt, mark and all)."""
    csv.field_size_limit(1 << 24)
    with open(path, encoding="utf-8-sig", errors="replace", newline="") as f:
        reader, lines, end = csv.reader(f, **CSV_DIALECTS[fmt]), [], 0
        for fields in reader:
            if fields:  # a blank line is no row
                lines.append((end + 1, fields))
            end = reader.line_num
    if not lines:
        return None, []
    names, lines = _columns(path, task, lines, fmt, setting)
    return names, [
        (line, dict(zip(names, fields)) if len(fields) >= len(names) else None)
        for line, fields in lines
    ]


def _columns(path: Path, task: TaskConfig, lines: list, fmt: str, setting: str):
    """``(column names, data lines)``: the header's names, or task.column_names."""
    first = lines[0][1]
    if task.header:
        return [c.strip() for c in first], lines[1:]
    names = list(task.column_names)
    if [c.strip().lower() for c in first] == [c.lower() for c in names]:
        return names, lines[1:]  # a header line that repeats task.column_names (GLUE's STS-B)
    if len(first) != len(names):
        sep = "tab" if fmt == "tsv" else "comma"
        raise DataError(
            f"{str(path)!r} has {len(first)} {sep}-separated columns in its first line, "
            f"but {task.name} files have {len(names)} ({', '.join(names)}); point "
            f"{setting} at files in that format, or set task.column_names."
        )
    return names, lines


def _json_rows(path: Path):
    """``(column names, rows)`` of a JSONL file: the keys of its first object, and each line's
    values as JSON gives them (null as missing); a line that is no JSON object is None; names
    are None for a file without a line."""
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except ValueError:
                obj = None
            rows.append((line, obj if isinstance(obj, dict) else None))
    if not rows:
        return None, []
    return next((list(row) for _, row in rows if row is not None), []), rows


def examples_of(
    rows: list[tuple[int, dict[str, str]]], path: Path, task: TaskConfig
) -> list[dict[str, Any]]:
    """Examples ``{"text": [...], "label": class id | score}`` of rows of ``path``."""
    label_of = _label_reader(path, task)
    examples = [
        {
            "text": [row[c].strip() for c in task.text_columns],
            "label": label_of(row[task.label_column], line),
        }
        for line, row in rows
    ]
    if not examples:
        raise DataError(
            f"{str(path)!r} holds no usable example; check the columns and that it has "
            "lines below its header."
        )
    return examples


def read_examples(
    path: Path, task: TaskConfig, setting: str = "task.data_dir"
) -> list[dict[str, Any]]:
    """Examples ``{"text": [...], "label": class id | score}`` of a TSV, CSV or JSONL file."""
    return examples_of(read_rows(path, task, setting), path, task)


read_tsv = read_examples  # the name of the GLUE-format reader


def discover_labels(
    rows: list[tuple[int, dict[str, str]]], path: Path, task: TaskConfig
) -> list[str]:
    """Return the label values of the training rows, sorted (numbers by value), for a task that
    lists none."""
    values = {row[task.label_column].strip() for _, row in rows}

    def number(value: str) -> float | None:
        try:
            return float(value)
        except ValueError:
            return None

    numbers = {v: number(v) for v in values}
    labels = sorted(
        values, key=lambda v: (0, numbers[v], v) if numbers[v] is not None else (1, 0.0, v)
    )
    if len(labels) < 2:
        raise DataError(
            f"{str(path)!r}: every example has the {task.label_column} "
            f"{(labels or [''])[0]!r}; a classifier needs two labels or more (for scores "
            "set task.kind=regression)."
        )
    log.info(
        "task.labels from %s: %s (class ids in this order; set task.labels=[...] to fix them)",
        path,
        ", ".join(labels),
    )
    if len(labels) > 20 and all(numbers[v] is not None for v in labels):
        log.warning(
            "%s: the %s takes %d different numbers; if they are scores, set task.kind=regression",
            path,
            task.label_column,
            len(labels),
        )
    return labels


def _label_reader(path: Path, task: TaskConfig):
    """``(value, line) -> label``: the class id, or for a regression task the score; a value
    outside task.labels, one that is no number, or one outside task.label_range is an error
    naming the line."""
    if task.kind == "classification":
        if not task.labels:
            raise ConfigError("task.labels is empty; list the label values (task.labels=[...]).")
        label_ids = {v: i for i, v in enumerate(task.labels)}

        def class_id(value: str, line: int) -> int:
            if value.strip() not in label_ids:
                raise DataError(
                    f"{str(path)!r} line {line}: the {task.label_column} {value.strip()!r} "
                    f"is not one of task.labels ({', '.join(task.labels)}); correct the "
                    "line, or list every label value in task.labels."
                )
            return label_ids[value.strip()]

        return class_id
    low, high = task.label_range or (-math.inf, math.inf)

    def score(value: str, line: int) -> float:
        try:
            x = float(value)
        except ValueError:
            x = math.nan
        if not low <= x <= high:  # NaN fails too
            what = (
                "is not a number"
                if math.isnan(x)
                else f"is outside task.label_range [{low}, {high}]"
            )
            raise DataError(
                f"{str(path)!r} line {line}: the {task.label_column} {value.strip()!r} "
                f"{what}; correct the line, or use other files."
            )
        return x

    return score


def _hub_label(task: TaskConfig, value) -> float | int | None:
    """Return the label of a Hub row (None for an unlabelled one, -1 in GLUE's test splits)."""
    if task.kind == "regression":
        return float(value)
    return int(value) if int(value) >= 0 else None


def load_split(task: TaskConfig, split: str) -> list[dict[str, Any]]:
    """Load the examples of ``split`` (train | eval) from the task's files or the Hub."""
    if reads_files(task) and not task.eval_file:  # a share of the training file held out
        return load_task(task)[0 if split == "train" else 1]
    if reads_files(task):
        return read_examples(task_file(task, split), task, file_setting(task, split))
    return _from_hub(task, ["train" if split == "train" else task.hub_eval_split])[0]


def load_task(task: TaskConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, eval) examples from the task's files or the Hub; a classification task that
    lists no labels takes the training file's (``task.labels`` is set); without an eval file,
    ``task.eval_share`` of the training file's examples are held out (``hold_out``)."""
    if not reads_files(task):
        if task.kind == "classification" and not task.labels:
            raise ConfigError("task.labels is empty; list the label values (task.labels=[...]).")
        train, dev = _from_hub(task, ["train", task.hub_eval_split])
        return train, dev
    path = task_file(task, "train")
    rows = read_rows(path, task, file_setting(task, "train"))
    if task.kind == "classification" and not task.labels:
        task.labels = discover_labels(rows, path, task)
    if not task.eval_file:
        return hold_out(examples_of(rows, path, task), task, path)
    return examples_of(rows, path, task), load_split(task, "eval")


def hold_out(
    items: list, task: TaskConfig, path: Path, what: str = "examples"
) -> tuple[list, list]:
    """``(kept, held out)``: ``task.eval_share`` of ``items`` drawn with ``task.split_seed``
    for evaluation, each part in the file's order; an empty part is an error."""
    import random

    n = len(items)
    k = round(task.eval_share * n)
    if not 0 < k < n:
        raise DataError(
            f"task.eval_share={task.eval_share} of the {n} {what} of {str(path)!r} leaves an "
            f"empty split ({k} for evaluation, {n - k} for training); set task.eval_share so "
            "that both parts hold some, or set task.eval_file."
        )
    held = set(random.Random(task.split_seed).sample(range(n), k))
    log.info(
        "Held out %d of the %d %s of %s for evaluation (task.eval_share=%s, task.split_seed=%d)",
        k,
        n,
        what,
        path,
        task.eval_share,
        task.split_seed,
    )
    return [x for i, x in enumerate(items) if i not in held], [
        x for i, x in enumerate(items) if i in held
    ]


def _hub_columns(task: TaskConfig, features) -> tuple[list[str], str]:
    """Return the Hub dataset's text and label columns for the task's: the same names where the
    dataset has them, else its ``label`` and its text (string) columns in order. The Hub's ``glue``
    renames GLUE's file columns: MRPC's ``#1 String`` / ``#2 String`` are ``sentence1`` /
    ``sentence2``, MNLI's ``sentence1`` / ``sentence2`` ``premise`` / ``hypothesis``, and every
    task's label (``Quality``, ``is_duplicate``, ``gold_label``, ``score``) is ``label``."""
    label = task.label_column if task.label_column in features else "label"
    texts = list(task.text_columns)
    if any(c not in features for c in texts):
        strings = [name for name, f in features.items() if getattr(f, "dtype", None) == "string"]
        texts = strings if len(strings) == len(texts) else texts
    missing = [c for c in (*texts, label) if c not in features]
    if missing:
        raise DataError(
            f"{task.hub_path} ({task.hub_name}) has no column {missing[0]!r} (columns: "
            f"{', '.join(features)}); set task.text_columns and task.label_column to its "
            "columns, or task.data_dir to a folder of the task's files."
        )
    return texts, label


def _from_hub(task: TaskConfig, splits: list[str]) -> list[list[dict[str, Any]]]:
    import datasets

    try:
        ds = datasets.load_dataset(task.hub_path, task.hub_name)
    except Exception as exc:
        raise DataError(
            f"Could not load {task.hub_path} ({task.hub_name}) from the Hugging Face Hub "
            f"({str(exc).splitlines()[0][:120]}); set task.data_dir to a folder of GLUE TSV files."
        ) from None

    def rows(split):
        texts, label_column = _hub_columns(task, ds[split].features)
        labelled = ((r, _hub_label(task, r[label_column])) for r in ds[split])
        return [
            {"text": [r[c] for c in texts], "label": label}
            for r, label in labelled
            if label is not None
        ]

    return [rows(split) for split in splits]
