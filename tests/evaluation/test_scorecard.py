"""``mlmkit scorecard`` (``mlmkit.evaluation.scorecard``): intervals over seeds and examples,
paired differences, the table and its cache."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from runs import run_cli

from mlmkit.data.sources import builtin_documents
from mlmkit.evaluation import scorecard as sc


def accuracy(predictions, examples):
    return sum(p == e for p, e in zip(predictions, examples)) / len(examples)


def cell_of(seed_predictions: list[list[int]], gold: list[int], replicates: int = 1000):
    draws = sc.example_draws("a task", len(gold), replicates)
    return sc.Cell(
        [accuracy(p, gold) for p in seed_predictions],
        [sc.replicate_scores(accuracy, p, gold, draws) for p in seed_predictions],
    )


def noisy(gold: list[int], right: float, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [g if rng.random() < right else 1 - g for g in gold]


def test_one_seeds_interval_is_the_binomial_one_and_more_seeds_add_their_spread():
    gold = [random.Random(0).randrange(2) for _ in range(400)]
    one = cell_of([noisy(gold, 0.8, 1)], gold)
    low, high = one.interval(0.95)
    assert low < one.mean < high
    p = one.mean
    assert high - low == pytest.approx(2 * 1.96 * (p * (1 - p) / 400) ** 0.5, rel=0.2)
    # seeds that disagree widely (0.6 and 0.9 of the examples right): a wider interval than
    # either seed's examples alone give
    spread = cell_of([noisy(gold, 0.6, 2), noisy(gold, 0.9, 3)], gold)
    s_low, s_high = spread.interval(0.95)
    assert s_high - s_low > 2 * (high - low)


def test_a_paired_difference_separates_a_better_model_and_not_an_equal_one():
    gold = [random.Random(1).randrange(2) for _ in range(500)]
    base = cell_of([noisy(gold, 0.7, s) for s in (10, 11, 12)], gold)
    better = cell_of([noisy(gold, 0.8, s) for s in (20, 21, 22)], gold)
    equal = cell_of([noisy(gold, 0.7, s) for s in (30, 31, 32)], gold)
    d = sc.difference(better, base, 0.95)
    assert d["separated"] and d["low"] > 0 and d["difference"] == pytest.approx(0.1, abs=0.04)
    e = sc.difference(equal, base, 0.95)
    assert not e["separated"] and e["low"] < 0 < e["high"]


def test_the_same_draws_for_every_model_of_a_task():
    a, b = sc.example_draws("UPOS", 50, 20), sc.example_draws("UPOS", 50, 20)
    assert np.array_equal(a, b) and a.shape == (20, 50) and a.max() < 50
    assert not np.array_equal(a, sc.example_draws("SST-2", 50, 20))


PEOPLE, PLACES = ["Anna", "Tom", "Maria", "Ken"], ["Paris", "Oslo", "Lima", "Rome"]


def write_tasks(folder):
    """A tagging task (person, place) and held-out text for the masked-LM figure."""
    rng = random.Random(0)
    lines = []
    for _ in range(120):
        p, c = rng.choice(PEOPLE), rng.choice(PLACES)
        lines.append(f"{p}\tB-PER\nlives\tO\nin\tO\n{c}\tB-LOC\n.\tO\n")
    (folder / "tags").mkdir(parents=True)
    (folder / "tags" / "all.conll").write_text("\t\n".join(lines), encoding="utf-8")
    # held-out text like the fixture run's corpus (the built-in one), whose masked tokens 30
    # steps of pretraining guess about 3% of, a random init almost none
    held_out = builtin_documents()[-400:]
    (folder / "text.txt").write_text("\n".join(held_out) + "\n", encoding="utf-8")


@pytest.fixture
def tiny_suite(monkeypatch, tmp_path):
    write_tasks(tmp_path / "data")
    # the suite: the masked-LM figure alone; the tagging task comes as the user's own (own_tasks)
    tasks = [
        sc.SuiteTask(
            "masked LM",
            "mlm",
            "accuracy",
            {"file": "text.txt", "max_seq_length": 32, "blocks": 128},
        )
    ]
    monkeypatch.setitem(sc.SUITES, "fast", tasks)
    return tmp_path / "data"


def test_scorecard_tables_a_model_against_its_random_init_and_reuses_its_cells(
    trained_run, tiny_suite, tmp_path
):
    args = [
        "scorecard",
        f"models=[{trained_run}]",
        f"data_dir={tiny_suite}",
        "seeds=2",
        "own_tasks=[{name: tags, task: ner, overrides: {data_dir: tags, train_file: all.conll,"
        " eval_file: null, eval_share: 0.25}, settings: {epochs: 2, lr: 1e-3}}]",
        "bootstrap=200",
        "max_seq_length=32",
        "precision=no",
        f"cache_dir={tmp_path / 'cache'}",
    ]
    first = run_cli(*args, f"hydra.run.dir={tmp_path / 'one'}")
    assert first.returncode == 0, first.stderr[-3000:]
    report = json.loads((tmp_path / "one" / "scorecard.json").read_text())
    assert [r["label"] for r in report["rows"]] == ["random init", str(trained_run)]
    # the masked-LM figure has one evaluation; each fine-tuned task one per seed
    assert [r["scored_cells"] for r in report["rows"]] == [3, 3]
    for row in report["rows"]:
        for column, cell in row["cells"].items():
            low, high = cell["interval"]
            assert low <= cell["mean"] <= high, (row["label"], column)
        assert len(row["cells"]["tags"]["seeds"]) == 2
    assert report["baselines"]["tags"]["baseline"] == "every word O"
    (d_mlm, d_tags) = report["differences"]
    assert d_mlm["a"] == str(trained_run) and d_mlm["b"] == "random init"
    # 30 steps of pretraining against random weights: more masked tokens right, clearly
    assert d_mlm["separated"] and d_mlm["difference"] > 0
    table = (tmp_path / "one" / "scorecard.md").read_text()
    assert "| random init |" in table and "| lookup baseline |" in table
    assert (tmp_path / "one" / "scorecard.png").stat().st_size > 1000
    assert "6 cells scored, 0 read from the cache" in first.stdout

    # again, into the same run dir: refused, the first scorecard left as it was
    written = (tmp_path / "one" / "scorecard.json").read_bytes()
    refused = run_cli(*args, f"hydra.run.dir={tmp_path / 'one'}")
    assert refused.returncode == 2 and "choose a new hydra.run.dir" in refused.stderr
    assert (tmp_path / "one" / "scorecard.json").read_bytes() == written

    # again, into another run dir, with a copy of the model beside it: every cell from the
    # cache (the copy's weights are the same), the same figures, and the model against its
    # copy differs by nothing
    copy = tmp_path / "copy"
    shutil.copytree(trained_run / "final", copy)
    args[1] = f"models=[{trained_run},{copy}]"
    second = run_cli(*args, f"hydra.run.dir={tmp_path / 'two'}")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "0 cells scored, 9 read from the cache" in second.stdout
    again = json.loads((tmp_path / "two" / "scorecard.json").read_text())
    assert again["differences"][:2] == report["differences"]
    itself = [d for d in again["differences"] if d["a"] == str(copy) and d["b"] != "random init"]
    assert len(itself) == 2
    assert all(d["difference"] == d["low"] == d["high"] == 0 for d in itself)
    assert not any(d["separated"] for d in itself)

    # a changed setting is scored anew: another number of replicates
    args = ["bootstrap=150" if a.startswith("bootstrap=") else a for a in args]
    third = run_cli(*args, f"hydra.run.dir={tmp_path / 'three'}")
    assert third.returncode == 0, third.stderr[-3000:]
    # the model's cells anew; its copy's read back from them
    assert "6 cells scored, 3 read from the cache" in third.stdout


@pytest.mark.parametrize(
    "settings, names",
    [
        (["data_dir=null"], "data_dir"),
        (["tasks=[sst2,wnli]"], "tasks: wnli is not in suite fast"),
        (["suite=huge"], "suite must be one of fast, full"),
        (["models=[]"], "models is empty"),
        (["own_tasks=[{name: x, task: nothing}]"], "'nothing' is not a task of conf/task/"),
        (["own_tasks=[{name: x}]"], "own_tasks: each entry takes"),
        (["own_tasks=[{name: x, task: ner, settings: {epoch: 3}}]"], "x's settings epoch are not"),
        (["max_seq_length=4096"], "lower max_seq_length"),
        (["own_tasks=[{name: x, task: ner, settings: {epochs: many}}]"], "give numbers"),
        (["own_tasks=[{name: x, task: ner, settings: {lr: -1}}]"], "must be positive"),
        (["models=[/work]"], "is not a model dir"),
        (["data_dir=/nonexistent"], "point data_dir at a folder"),
    ],
)
def test_a_scorecard_mistake_is_one_sentence(trained_run, tmp_path, settings, names):
    proc = run_cli(
        "scorecard",
        f"models=[{trained_run}]",
        "data_dir=/work",
        *settings,
        f"cache_dir={tmp_path / 'cache'}",
        f"hydra.run.dir={tmp_path / 'out'}",
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert names in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out" / "scorecard.json").exists()


def test_a_scorecard_under_several_processes_is_refused_in_one_sentence(trained_run, tmp_path):
    import os

    proc = run_cli(
        "scorecard",
        f"models=[{trained_run}]",
        "data_dir=/work",
        f"hydra.run.dir={tmp_path / 'out'}",
        env={**os.environ, "WORLD_SIZE": "2"},
    )
    assert proc.returncode == 2 and "runs in one process" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "out" / "scorecard.json").exists()


def test_an_own_task_file_that_does_not_parse_is_one_sentence(trained_run, tiny_suite, tmp_path):
    broken = tmp_path / "broken.conll"
    broken.write_text("Anna\tB-PER\nlives\n", encoding="utf-8")  # line 2: no tag column
    proc = run_cli(
        "scorecard",
        f"models=[{trained_run}]",
        f"data_dir={tiny_suite}",
        "random_init=false",
        "seeds=1",
        f"own_tasks=[{{name: mine, task: ner, overrides: {{train_file: {broken}, eval_file: null,"
        " eval_share: 0.5}}]",
        f"cache_dir={tmp_path / 'cache'}",
        f"hydra.run.dir={tmp_path / 'out'}",
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("Error")]
    assert len(error) == 1 and str(broken) in error[0] and "line 2" in error[0], proc.stderr
    assert not (tmp_path / "out" / "scorecard.json").exists()


def test_a_cell_is_keyed_by_the_data_and_the_settings_it_was_scored_with(tmp_path):
    from types import SimpleNamespace

    write_tasks(tmp_path / "data")
    task = sc.SuiteTask("tags", "ner", "f1", {"data_dir": "tags", "train_file": "all.conll"})
    cfg = SimpleNamespace(bootstrap=200, max_seq_length=32, batch_size=32, precision="no")
    stamp = sc.data_stamp(task, tmp_path / "data")
    assert [Path(p).name for p, _, _ in stamp] == ["all.conll"]
    key = sc.cell_key("m", task, 0, cfg, stamp)
    assert key == sc.cell_key("m", task, 0, cfg, sc.data_stamp(task, tmp_path / "data"))
    with open(tmp_path / "data" / "tags" / "all.conll", "a", encoding="utf-8") as f:
        f.write("\t\nKen\tB-PER\n")  # the data edited: another key
    assert sc.cell_key("m", task, 0, cfg, sc.data_stamp(task, tmp_path / "data")) != key
    for changed in ({"batch_size": 16}, {"precision": "bf16"}, {"max_seq_length": 64}):
        other = SimpleNamespace(**{**vars(cfg), **changed})
        assert sc.cell_key("m", task, 0, other, stamp) != key, changed
    assert sc.cell_key("m", task, 1, cfg, stamp) != key
