"""Several processes, one mistake or one signal: one sentence on the console and an exit
status that says what happened (``mlmkit launch``); the other ranks print no traceback
(also under a bare ``accelerate launch``)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time

import pytest
from runs import ROOT, TINY, TWO_PROCESSES, free_port

from mlmkit.cli import COMMANDS
from mlmkit.cli.launch import explained, split_command
from mlmkit.errors import ConfigError

ENV = {**os.environ, "ACCELERATE_USE_CPU": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
OPTIONS = TWO_PROCESSES


def test_the_command_line_splits_at_the_command():
    assert split_command(
        ["--multi_gpu", "--num_processes", "2", "train", "model=bert-mini"], COMMANDS
    ) == (["--multi_gpu", "--num_processes", "2"], ["train", "model=bert-mini"])
    with pytest.raises(ConfigError, match="name the command"):
        split_command(["--multi_gpu"], COMMANDS)


def test_the_ranks_endings_give_the_status():
    assert (
        explained({0: {"status": 2}, 1: {"status": 3}}) == 2
    )  # a user's error; a rank stopped by it
    assert explained({1: {"status": 2}}) == 2  # rank 0 killed by the launcher before it could say
    assert explained({0: {"status": 75}, 1: {"status": 75}}) == 75
    assert explained({0: {"status": 3}, 1: {"status": 3}}) is None  # who ended first is not known
    assert explained({0: {"status": 2}, 1: {"status": 1}}) is None  # a crash: its traceback stays
    assert explained({}) is None


def _start(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        list(args),
        cwd=ROOT,
        env=env or ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen, timeout: int = 300) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(
            f"the launch did not end within {timeout} s:\n{proc.communicate()[1][-3000:]}"
        ) from None


@pytest.fixture
def locked_run_dir(tmp_path):
    """A run dir whose lock another run holds (this test process, as pid 4242 on host elsewhere)."""
    run = tmp_path / "locked"
    run.mkdir()
    fd = os.open(run / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, b"4242 elsewhere\n", 0)
    yield run
    os.close(fd)


@pytest.mark.slow
def test_a_refused_run_is_one_sentence_from_many_processes(locked_run_dir, cache_dir):
    python = sys.executable
    args = [
        *TINY,
        f"paths.cache_dir={cache_dir}",
        f"hydra.run.dir={locked_run_dir}",
        "train.max_steps=2",
    ]
    launched = _start(
        python,
        "-m",
        "mlmkit",
        "launch",
        "--main_process_port",
        free_port(),
        *OPTIONS,
        "train",
        *args,
    )
    out, err = _finish(launched)
    assert launched.returncode == 2, err[-3000:]
    lines = [
        line
        for line in err.splitlines()
        if line.strip() and not line.startswith(("\t", "The following", "To avoid"))
    ]
    assert lines == [
        "Error: The run dir " + repr(str(locked_run_dir)) + " is in use by another run "
        "(pid 4242 on host elsewhere); wait for it to end or choose a new hydra.run.dir."
    ], err
    # a mistake every rank finds alike (a misspelt key) is said once too
    launched = _start(
        python,
        "-m",
        "mlmkit",
        "launch",
        "--main_process_port",
        free_port(),
        *OPTIONS,
        "train",
        *args,
        "train.bach_size=3",
    )
    out, err = _finish(launched)
    assert launched.returncode == 2, err[-3000:]
    assert [line for line in err.splitlines() if "bach_size" in line] == [
        line for line in err.splitlines() if line.startswith("Error:")
    ], err
    assert err.count("Error:") == 1 and "Traceback" not in err, err
    # a bare accelerate launch: the launcher's own report stays, but no rank adds a traceback
    plain = _start(
        python,
        "-m",
        "accelerate.commands.launch",
        "--main_process_port",
        free_port(),
        *OPTIONS,
        "-m",
        "mlmkit",
        "train",
        *args,
    )
    out, err = _finish(plain)
    assert plain.returncode != 0 and err.count("Error: The run dir") == 1, err[-3000:]
    assert "[rank1]" not in err and "Connection closed by peer" not in err, err[-3000:]


@pytest.mark.slow
def test_a_signal_to_the_launcher_stops_every_rank_with_a_checkpoint(tmp_path, cache_dir):
    run = tmp_path / "run"
    proc = _start(
        sys.executable,
        "-m",
        "mlmkit",
        "launch",
        "--main_process_port",
        free_port(),
        *OPTIONS,
        "train",
        *TINY,
        f"paths.cache_dir={cache_dir}",
        f"hydra.run.dir={run}",
        "train.max_steps=5000",
        "train.eval_every=0",
        "train.save_every=0",
        "logger=none",
        "train.log_every=1",
    )
    deadline = time.monotonic() + 240
    while (
        not (run / "metrics.jsonl").is_file()
        or '"train"' not in (run / "metrics.jsonl").read_text()
    ):
        assert proc.poll() is None and time.monotonic() < deadline, _finish(proc)[1][-3000:]
        time.sleep(0.5)
    proc.send_signal(signal.SIGUSR2)  # submitit's signal, sent to the launcher alone
    out, err = _finish(proc)
    assert proc.returncode == 75, err[-3000:]
    stopped = [line for line in err.splitlines() if line.startswith("Stopped by")]
    assert len(stopped) == 1 and "SIGUSR2" in stopped[0], err[-3000:]
    assert "Traceback" not in err and "ChildFailedError" not in err, err[-3000:]
    assert len(list((run / "checkpoints").glob("step_*"))) == 1
    assert "Budget:" in err and "Saved checkpoint" in err, err[
        -3000:
    ]  # the run's own log comes through


def test_the_one_process_of_accelerates_simple_launcher_is_rank_0(monkeypatch, tmp_path):
    from mlmkit.cli.errors import LAUNCH_DIR_ENV, launched_rank, tell

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv(LAUNCH_DIR_ENV, raising=False)
    assert launched_rank() is None  # not under mlmkit launch
    monkeypatch.setenv(LAUNCH_DIR_ENV, str(tmp_path))
    assert launched_rank() == "0"
    tell(75, "Stopped by SIGUSR1 at step 3 after saving a checkpoint.")
    from mlmkit.cli.launch import outcomes

    assert explained(outcomes(tmp_path)) == 75  # what the launcher reads: rank 0's status


@pytest.mark.slow
def test_a_killed_rank_ends_the_launch_with_one_sentence_and_no_traceback(tmp_path, cache_dir):
    """A rank killed with SIGKILL (as the kernel's out-of-memory killer does): the log's lines
    once, no traceback or re-print from the launcher, one sentence naming the rank and the
    signal, and status 128 + 9."""
    run = tmp_path / "run"
    proc = _start(
        sys.executable,
        "-m",
        "mlmkit",
        "launch",
        "--main_process_port",
        free_port(),
        *OPTIONS,
        "train",
        *TINY,
        f"paths.cache_dir={cache_dir}",
        f"hydra.run.dir={run}",
        "train.max_steps=5000",
        "train.eval_every=0",
        "train.save_every=0",
        "logger=none",
        "train.log_every=1",
    )
    deadline = time.monotonic() + 240
    while (
        not (run / "metrics.jsonl").is_file()
        or '"train"' not in (run / "metrics.jsonl").read_text()
    ):
        assert proc.poll() is None and time.monotonic() < deadline, _finish(proc)[1][-3000:]
        time.sleep(0.5)
    os.kill(int((run / ".lock").read_text().split()[0]), signal.SIGKILL)  # the main process
    out, err = _finish(proc)
    assert proc.returncode == 128 + signal.SIGKILL, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("Rank 0 (pid ") and "was killed by SIGKILL" in last, err[-3000:]
    assert "train.resume=auto" in last
    for noise in (
        "Traceback",
        "RuntimeError:",
        "ChildFailedError",
        "The above exception",
        "torch/distributed",
    ):
        assert noise not in err, err[-3000:]
    assert err.count("Budget:") == 1 and err.count("Baseline:") == 1  # the run's lines, once
