"""The run (mlmkit.pretrain): setup -> resume -> fit -> export in one call, its jobs in the
loop's order, and the summary it ends with."""

from __future__ import annotations

import json

import pytest
from runs import TINY

import mlmkit


def _events(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_run_logs_evaluates_and_saves_in_order_exports_and_says_where_it_all_is(
    tmp_path, cache_dir
):
    run = tmp_path / "run"
    settings = [
        *TINY,
        "train.max_steps=6",
        "train.log_every=2",
        "train.eval_every=3",
        "train.save_every=3",
        "logger=none",
        f"paths.cache_dir={cache_dir}",
    ]
    figures = mlmkit.train(mlmkit.compose(settings), run)
    assert figures["eval_loss"] > 0 and (run / "final" / "model.safetensors").is_file()
    kinds = [(e["event"], e["step"]) for e in _events(run)]
    assert kinds == [
        ("baseline", 0),
        ("train", 2),
        ("eval", 3),
        ("train", 4),
        ("train", 6),
        ("eval", 6),
    ]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step_0000003",
        "step_0000006",
    ]
    log = (run / "train.log").read_text().splitlines()
    assert "Done: 6 steps in this run, 6 in all (3,072 tokens)" in log[-2]
    assert (
        f"eval loss {figures['eval_loss']:.4f}" in log[-2]
        and f"The model: {run / 'final'}" in log[-1]
    )
    # continued with a larger budget: the summary tells this run's steps from the run's
    mlmkit.train(mlmkit.compose([*settings, "train.max_steps=8", "train.resume=auto"]), run)
    assert "Done: 2 steps in this run, 8 in all" in (run / "train.log").read_text().splitlines()[-2]
