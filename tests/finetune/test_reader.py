"""The labelled-file reader (``mlmkit.finetune.reader``): GLUE's TSVs, your own TSV, CSV and
JSONL files, their labels, and one sentence for each fault in them."""

from __future__ import annotations

import json

import pytest
from conftest import shared_file
from helpers import WORDS, pair_rows, task_config, write_rows

from mlmkit.config import TaskConfig
from mlmkit.errors import DataError
from mlmkit.finetune.reader import load_task, read_tsv


@pytest.mark.parametrize(
    "name,folder,n_text", [("sst2", "SST-2", 1), ("cola", "CoLA", 1), ("rte", "RTE", 2)]
)
def test_glue_tsv_files_are_read_as_the_task_says(name, folder, n_text):
    task = task_config(name)
    task.data_dir = str(shared_file(f"glue/{folder}/dev.tsv").parent)
    train, dev = load_task(task)
    lines = sum(1 for _ in open(shared_file(f"glue/{folder}/dev.tsv"), encoding="utf-8"))
    assert len(dev) == lines - int(task.header)  # every line is an example
    assert len(train) > len(dev) / 10
    for ex in dev[:50]:
        assert len(ex["text"]) == n_text and all(isinstance(t, str) and t for t in ex["text"])
        assert ex["label"] in (0, 1)
    assert {ex["label"] for ex in dev} == {0, 1}


def test_rte_labels_map_to_class_ids(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_text(
        "index\tsentence1\tsentence2\tlabel\n0\tA cat.\tAn animal.\tentailment\n"
        "1\tA cat.\tA dog.\tnot_entailment\n2\tbroken line\n"
    )
    task = task_config("rte")
    examples = read_tsv(path, task)
    assert [e["label"] for e in examples] == [0, 1]  # the broken line is skipped with a warning
    assert examples[0]["text"] == ["A cat.", "An animal."]


def test_bad_task_data_is_one_sentence(tmp_path):
    task = task_config("sst2")
    task.data_dir = str(tmp_path)
    with pytest.raises(DataError, match="task.data_dir"):
        load_task(task)
    (tmp_path / "train.tsv").write_text("text\tlabel\nfine\t1\n")
    with pytest.raises(DataError, match=r"no column 'sentence'.*task.text_columns"):
        read_tsv(tmp_path / "train.tsv", task)
    task.data_dir = None  # the Hub, which tests never reach
    with pytest.raises(DataError, match=r"nyu-mll/glue \(sst2\).*task.data_dir"):
        load_task(task)


def _files_task(tmp_path, train, dev, **settings) -> TaskConfig:
    return task_config(
        "files",
        **{
            "data_dir": str(tmp_path),
            "train_file": str(train),
            "eval_file": str(dev),
            "text_columns": ["premise", "hypothesis"],
            "label_column": "gold",
            **settings,
        },
    )


def test_own_csv_jsonl_and_tsv_files_give_the_same_examples(tmp_path):
    rows = pair_rows(12)
    rows[4]["premise"] = "A line\nbroken, in a quoted CSV field."
    examples = {}
    for suffix in (".csv", ".jsonl"):
        write_rows(tmp_path / f"train{suffix}", rows)
        write_rows(tmp_path / f"dev{suffix}", rows[:5])
        # relative to task.data_dir, and absolute
        task = _files_task(tmp_path, f"train{suffix}", tmp_path / f"dev{suffix}")
        train, dev = load_task(task)
        assert task.labels == ["other", "same"]  # taken from the training file, sorted
        examples[suffix] = (train, dev)
    assert examples[".csv"] == examples[".jsonl"]
    train, dev = examples[".csv"]
    assert len(train) == 12 and len(dev) == 5
    assert train[0] == {"text": [rows[0]["premise"], rows[0]["hypothesis"]], "label": 0}
    assert '"' in train[0]["text"][0] and "," in train[0]["text"][0] and "\n" in train[4]["text"][0]
    # a TSV (no quoting, as GLUE's) of the texts without tabs or newlines
    plain = [dict(r, premise=f"The {WORDS[i % 10]} sat.") for i, r in enumerate(rows)]
    write_rows(tmp_path / "train.tsv", plain)
    write_rows(tmp_path / "plain.jsonl", plain)
    tsv = load_task(_files_task(tmp_path, "train.tsv", "train.tsv"))
    assert tsv == load_task(_files_task(tmp_path, "plain.jsonl", "plain.jsonl"))
    # numbers as labels: sorted by value; a JSONL number reads as the same label
    for i, r in enumerate(plain):
        r["gold"] = [2, 10, 1][i % 3]
    write_rows(tmp_path / "numbers.jsonl", plain)
    task = _files_task(tmp_path, "numbers.jsonl", "numbers.jsonl")
    train, _ = load_task(task)
    assert task.labels == ["1", "2", "10"] and [e["label"] for e in train[:3]] == [1, 2, 0]
    # regression: the score column
    task = _files_task(tmp_path, "train.csv", "dev.csv", kind="regression", label_column="score")
    train, _ = load_task(task)
    assert task.metrics == ["spearman", "pearson"] and [e["label"] for e in train[:3]] == [
        0.0,
        1.5,
        2.0,
    ]


def test_jsonl_lines_that_do_not_parse_or_hold_no_text_are_skipped_with_a_count(tmp_path):
    """As pretraining reads JSONL: a line that is no JSON object, a row without a value and a
    row whose text column holds a number are skipped and counted by cause in one warning; a
    text column whose first value is a number is an error; a label that is a number reads as
    its text."""
    import logging

    rows = pair_rows(8)
    lines = [json.dumps({c: r[c] for c in ("premise", "hypothesis", "gold")}) for r in rows]
    lines[2] = '{"premise": "cut short'  # not JSON
    lines[4] = json.dumps({"premise": 42, "hypothesis": "A number.", "gold": "same"})
    lines[6] = json.dumps({"premise": "No hypothesis.", "gold": "same"})
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("mlmkit").addHandler(handler)
    try:
        train, _ = load_task(_files_task(tmp_path, "train.jsonl", "train.jsonl"))
    finally:
        logging.getLogger("mlmkit").removeHandler(handler)
    assert [e["text"][0] for e in train] == [rows[i]["premise"] for i in (0, 1, 3, 5, 7)]
    (warning,) = {r.getMessage() for r in records if r.levelno == logging.WARNING}
    assert warning.endswith(
        "train.jsonl: skipped 1 line(s) that are not JSON objects, 1 row(s) with a value "
        "missing, 1 row(s) whose 'premise' or 'hypothesis' is not text"
    ), warning
    numbers = [
        json.dumps({"premise": i, "hypothesis": "h", "gold": "same" if i % 2 else "other"})
        for i in range(6)
    ]
    (tmp_path / "numbers.jsonl").write_text("\n".join(numbers) + "\n")
    with pytest.raises(
        DataError,
        match=r"numbers.jsonl': the column 'premise' holds numbers, not text; "
        r"set task.text_columns",
    ):
        load_task(_files_task(tmp_path, "numbers.jsonl", "numbers.jsonl"))


def test_a_label_outside_the_task_labels_is_an_error(tmp_path):
    rows = pair_rows(6)
    rows[3]["gold"] = "maybe"
    write_rows(tmp_path / "train.csv", rows)
    task = _files_task(tmp_path, "train.csv", "train.csv", labels=["other", "same"])
    with pytest.raises(
        DataError,
        match=r"train.csv' line 5: the gold 'maybe' is not one of "
        r"task.labels \(other, same\)",
    ):
        load_task(task)  # line 5: the header is line 1
    # labels from the training file: the eval file's own label is an error, naming it
    rows[3]["gold"] = "same"
    write_rows(tmp_path / "train.jsonl", rows)
    write_rows(tmp_path / "dev.jsonl", [dict(rows[0], gold="maybe")])
    with pytest.raises(
        DataError, match=r"dev.jsonl' line 1: the gold 'maybe' is not one of task.labels"
    ):
        load_task(_files_task(tmp_path, "train.jsonl", "dev.jsonl", labels=[]))
    # the GLUE presets too: SST-2's labels are 0 and 1
    (tmp_path / "sst").mkdir()
    (tmp_path / "sst" / "train.tsv").write_text("sentence\tlabel\nfine\t1\nbad\tnegative\n")
    sst = task_config("sst2")
    sst.data_dir = str(tmp_path / "sst")
    with pytest.raises(
        DataError, match=r"line 3: the label 'negative' is not one of task.labels \(0, 1\)"
    ):
        load_task(sst)


def test_own_files_errors_name_the_setting(tmp_path):
    from mlmkit.config import FinetuneConfig
    from mlmkit.errors import ConfigError

    write_rows(tmp_path / "train.csv", pair_rows(4))
    with pytest.raises(
        DataError, match=r"task.eval_file: '.*dev.csv' does not exist; set task.eval_file"
    ):
        load_task(_files_task(tmp_path, "train.csv", "dev.csv"))
    with pytest.raises(
        DataError, match=r"no column 'gold2' \(columns: premise, hypothesis, gold, score\)"
    ):
        load_task(_files_task(tmp_path, "train.csv", "train.csv", label_column="gold2"))
    write_rows(tmp_path / "one.csv", [dict(r, gold="same") for r in pair_rows(4)])
    with pytest.raises(DataError, match=r"every example has the gold 'same'.*task.kind=regression"):
        load_task(_files_task(tmp_path, "one.csv", "one.csv"))
    with pytest.raises(ConfigError, match=r"set task.train_file=<file> and task.eval_file=<file>"):
        TaskConfig(name="files", hub_path=None, train_file=None, eval_file=None, labels=[])
    with pytest.raises(ConfigError, match=r"task.metrics: accuracy scores classes"):
        TaskConfig(kind="regression", labels=[])
    assert (
        FinetuneConfig(checkpoint="x").pooling == "mean"
        and FinetuneConfig(checkpoint="x").save_model
    )
