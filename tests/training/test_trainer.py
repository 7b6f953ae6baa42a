"""The Trainer: its construction from a config, when each of the loop's jobs is due, a
checkpoint held back while steps are skipped as non-finite, and the log window's pauses."""

from __future__ import annotations

import logging

import pytest
import torch
from runs import TINY

from mlmkit.config import compose
from mlmkit.training import setup
from mlmkit.training.step import train_step
from mlmkit.training.trainer import Trainer


@pytest.fixture
def trainer(tmp_path, cache_dir):
    cfg = compose(
        [
            *TINY,
            "train.max_steps=12",
            "train.log_every=4",
            "train.eval_every=6",
            "train.save_every=6",
            "logger=none",
            f"paths.cache_dir={cache_dir}",
        ]
    )
    made = Trainer(cfg, tmp_path / "run")
    yield made
    setup.stop_logging()
    from mlmkit.training import lock

    lock.release()


def test_the_parts_are_built_and_the_jobs_fall_due_on_their_intervals(trainer):
    assert trainer.state.step == 0 and not trainer.done() and trainer.plan is None
    assert not (trainer.run_dir / "model").exists()  # nothing written before the checks pass
    trainer.resume()  # a new run: every check passed, the run dir opens
    assert (trainer.run_dir / "model" / "config.json").is_file()  # any checkpoint loads from it
    due = {}
    for step in range(1, 13):
        trainer.state.step = step
        due[step] = (
            trainer.log_due(last=False),
            trainer.eval_due(last=False),
            trainer.probe_due(last=False),
        )
    assert [s for s, (log, _, _) in due.items() if log] == [4, 8, 12]
    assert [s for s, (_, ev, _) in due.items() if ev] == [6, 12]
    assert not any(probe for _, _, probe in due.values())  # no probe set
    trainer.state.step = 5
    assert trainer.log_due(last=True) and trainer.eval_due(
        last=True
    )  # the last step does every job


def test_steps_count_in_the_state_and_the_budget_ends_the_run(trainer):
    trainer.start_fit()
    while not trainer.done():
        result = train_step(trainer)
    trainer.end_fit()
    assert trainer.state.step == 12 and trainer.state.tokens_seen == 12 * 8 * 64
    assert (
        torch.isfinite(result.loss_sum) and trainer.window.blocks
    )  # the window counts until a log


def test_a_due_checkpoint_waits_while_steps_are_skipped_but_the_last_one_is_saved(trainer, caplog):
    trainer.start_fit()
    train_step(trainer)
    trainer.state.step = 6
    trainer.skips.counts = torch.tensor([1, 1, 1])  # one step skipped, the streak still on
    with caplog.at_level(logging.WARNING, logger="mlmkit"):
        trainer.checkpoint(last=False, stop=False)
    assert not (trainer.run_dir / "checkpoints").exists()
    assert "no checkpoint while steps are skipped as non-finite" in caplog.text
    trainer.skips.counts = torch.tensor([0, 1, 1])
    trainer.checkpoint(last=True, stop=False)  # the run's end saves one whatever the streak
    assert (trainer.run_dir / "checkpoints" / "step_0000006" / "loop_state.json").is_file()


def test_a_paused_jobs_time_is_kept_out_of_the_windows_throughput(trainer):
    import time

    trainer.start_fit()
    assert trainer.paused(lambda: time.sleep(0.05) or "done") == "done"
    assert trainer.window.paused >= 0.05
