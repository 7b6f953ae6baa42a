"""Stop requests: a signal asks the run to stop after its step, said at once; a second Ctrl-C
stops at once with one sentence."""

from __future__ import annotations

import signal

import pytest

from mlmkit.training.signals import StopSignals


def test_a_signal_is_said_at_once_and_a_second_ctrl_c_stops_in_one_sentence(capfd):
    with StopSignals() as signals:
        signal.raise_signal(signal.SIGINT)
        assert signals.received == signal.SIGINT and signals.name == "SIGINT"
        assert capfd.readouterr().err == (
            "Got SIGINT: stopping after this step, with a checkpoint; press "
            "Ctrl-C again to stop at once.\n"
        )
        with pytest.raises(
            KeyboardInterrupt, match="second Ctrl-C, without a checkpoint of this step"
        ):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # as it was


def test_sigterm_is_said_without_the_ctrl_c_hint(capfd):
    with StopSignals() as signals:
        signal.raise_signal(signal.SIGTERM)
    assert signals.received == signal.SIGTERM
    assert capfd.readouterr().err == "Got SIGTERM: stopping after this step, with a checkpoint.\n"


def test_other_ranks_stay_quiet(capfd, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    with StopSignals() as signals:
        signal.raise_signal(signal.SIGUSR1)
    assert signals.received == signal.SIGUSR1 and capfd.readouterr().err == ""
