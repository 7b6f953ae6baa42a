"""A run's progress: a bar on a terminal, one plain line every LINE_EVERY seconds elsewhere,
against whichever budget the run has (a time budget too), with the time left."""

from __future__ import annotations

import logging

import pytest

from mlmkit.training import progress
from mlmkit.training.progress import Progress, duration


class Budget:
    """A budget whose share is step / 10 (any of steps, tokens or time)."""

    def progress(self, step: int) -> float:
        return step / 10


def test_durations_read_as_people_write_them():
    assert [duration(s) for s in (0, 45, 60, 725, 3600, 12_000)] == [
        "0s",
        "45s",
        "1m00s",
        "12m05s",
        "1h00m",
        "3h20m",
    ]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_off_a_terminal_a_plain_line_comes_every_interval_with_the_time_left(monkeypatch, caplog):
    clock = Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    monkeypatch.setattr(progress, "LINE_EVERY", 15)
    shown = Progress(Budget(), 0, enabled=True, terminal=False)
    with caplog.at_level(logging.INFO, logger="mlmkit"):
        for step in range(1, 6):
            clock.now += 10  # ten seconds a step
            shown.show(loss=f"{5 - step}.000")
            shown.update(step)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all(
        "\r" not in line for line in lines
    )  # every other step: 20 s apart
    assert lines[0].startswith(
        "progress: 20% of the budget, step 2, loss 3.000; 20s so far, about 1m20s left"
    )


def test_a_resumed_run_counts_the_time_left_from_its_own_pace(monkeypatch, caplog):
    clock = Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    shown = Progress(Budget(), 5, enabled=True, terminal=False)  # half the budget spent before
    clock.now = 30
    with caplog.at_level(logging.INFO, logger="mlmkit"):
        shown.update(6)
    assert (
        caplog.records[0]
        .getMessage()
        .endswith("60% of the budget, step 6; 30s so far, about 2m00s left")
    )


@pytest.mark.parametrize("enabled", [True, False])
def test_on_a_terminal_a_bar_moves_with_the_budgets_share(enabled, caplog):
    shown = Progress(Budget(), 2, enabled=enabled, terminal=True)
    with caplog.at_level(logging.INFO, logger="mlmkit"):
        shown.update(7)
    assert not caplog.records  # no log lines beside a bar
    if enabled:
        assert shown.bar.n == 700 and shown.bar.total == 1000
    else:
        assert shown.bar is None
    shown.close()
