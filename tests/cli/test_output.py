"""What a command prints: the libraries' progress bars only on a terminal, and DeepSpeed's
no-GPU note silenced."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from mlmkit.cli.output import PROGRESS_BAR_SWITCHES, quiet_libraries


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [True, False])
def test_progress_bars_are_switched_off_only_off_a_terminal(monkeypatch, terminal):
    for name in PROGRESS_BAR_SWITCHES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "stderr", Terminal() if terminal else io.StringIO())
    quiet_libraries()
    import os

    assert all((os.environ.get(name) == "1") != terminal for name in PROGRESS_BAR_SWITCHES)


def test_a_users_own_switch_is_kept(monkeypatch):
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    quiet_libraries()
    import os

    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"


def test_deepspeeds_no_gpu_note_is_dropped_and_its_other_warnings_kept():
    quiet_libraries()
    quiet_libraries()  # once is enough: the filter is not added twice
    logger = logging.getLogger("DeepSpeed")
    assert len(logger.filters) == len(set(logger.filters))

    def record(text: str) -> logging.LogRecord:
        return logging.LogRecord("DeepSpeed", logging.WARNING, __file__, 1, text, None, None)

    note = (
        "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to "
        "detect it."
    )
    assert not logger.filter(record(note)) and logger.filter(record("ZeRO stage 3 offloads"))
