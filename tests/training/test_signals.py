"""Stop requests: a signal asks the run to stop after its step, said at once; a second Ctrl-C
stops at once with one sentence."""

from __future__ import annotations

import signal

import pytest

from mlmkit.training.signals import StopSignals


def test_a_signal_is_said_at_once_and_a_second_ctrl_c_stops_in_one_sentence(capfd):
    # Ctrl-C's handler as a terminal's process has it (a background job's ignores SIGINT)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
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
    finally:
        signal.signal(signal.SIGINT, before)


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


def test_a_warning_held_since_setup_counts_on_entry_and_the_handler_before_it_comes_back(capfd):
    from mlmkit.training import signals as held

    usr1 = signal.getsignal(signal.SIGUSR1)
    before = signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # as a rank under mlmkit launch has it
    try:
        held.hold_warnings()
        signal.raise_signal(signal.SIGUSR2)
        signal.raise_signal(signal.SIGUSR2)  # said once
        assert capfd.readouterr().err == (
            "Got SIGUSR2: stopping after the first step, with a checkpoint.\n"
        )
        with StopSignals() as signals:
            assert signals.received == signal.SIGUSR2
        assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN  # the hold's, not the hold
        with StopSignals() as signals:  # taken once
            assert signals.received is None
    finally:
        signal.signal(signal.SIGUSR2, before)
        signal.signal(signal.SIGUSR1, usr1)
        held._held = None


def test_slurms_warning_during_setup_stops_the_run_after_its_first_step(
    tmp_path, cache_dir, monkeypatch, capfd
):
    """SLURM's warning (SIGUSR1) while ``mlmkit train`` is still setting up (here: as it reads
    its probe, before the tokenizer and the data) is not lost: the run trains one step, saves a
    checkpoint and exits 75 for the job to requeue."""
    from runs import run_train

    from mlmkit import pretrain

    probe_for_run = pretrain.probe_for_run

    def warned_during_setup(cfg):
        signal.raise_signal(signal.SIGUSR1)
        return probe_for_run(cfg)

    monkeypatch.setattr(pretrain, "probe_for_run", warned_during_setup)
    usr1 = signal.getsignal(signal.SIGUSR1)
    run = tmp_path / "run"
    try:
        proc = run_train(run, cache_dir, "train.max_steps=50", "logger=none", check=False)
    finally:
        signal.signal(signal.SIGUSR1, usr1)
    assert proc.returncode == 75, proc.stderr[-3000:]
    said = capfd.readouterr().err
    assert "Got SIGUSR1: stopping after the first step, with a checkpoint." in said
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_0000001"]
    assert "Stopped by SIGUSR1 at step 1 after saving a checkpoint" in proc.stderr


def test_a_command_that_ends_before_its_run_begins_gives_back_the_hold(
    tmp_path, cache_dir, monkeypatch
):
    """A warning held during setup, then a refusal before training: the command puts back the
    handler it found and keeps no warning, so the next command in the same process (a
    notebook, a sweep) does not stop at its first step."""
    from runs import TINY, _command_state

    from mlmkit import pretrain
    from mlmkit.cli import main
    from mlmkit.errors import ConfigError
    from mlmkit.training import signals as held

    def warned_then_refused(cfg):
        signal.raise_signal(signal.SIGUSR1)
        raise ConfigError("refused during setup")

    monkeypatch.setattr(pretrain, "probe_for_run", warned_then_refused)
    mine = signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # what the process had before
    try:
        with _command_state(tmp_path, None), pytest.raises(SystemExit) as refused:
            try:
                main(["train", *TINY, f"paths.cache_dir={cache_dir}", f"hydra.run.dir={tmp_path}"])
            finally:  # before _command_state puts this process's handlers back
                after = signal.getsignal(signal.SIGUSR1), held._held
    finally:
        signal.signal(signal.SIGUSR1, mine)
        held._held = None
    assert refused.value.code == 2
    assert after == (signal.SIG_IGN, None)
