"""Under torchrun's elastic agent (``mlmkit launch --nnodes MIN:MAX``), two agents on this
machine stand for two nodes: a node that joins is used at the agent's next restart, a node that
is lost ends the others' step, and each restart continues the run from its last checkpoint on
the processes there are. The process tree is what is tested, so the agents are real launches."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runs import ROOT, TEST_ENV, TINY, events, free_port, process_tree

pytestmark = pytest.mark.slow


def wait_for(what: str, check, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"waited {timeout} s for {what}")
        time.sleep(0.2)


def test_a_node_that_joins_and_a_node_that_is_lost_each_restart_the_run_from_its_checkpoint(
    tmp_path, cache_dir
):
    run, port = tmp_path / "run", free_port()
    env = {**os.environ, **TEST_ENV, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable, "-m", "mlmkit", "launch",
        "--nnodes", "1:2", "--nproc_per_node", "1", "--rdzv_endpoint", f"localhost:{port}",
        "--rdzv_conf", "last_call_timeout=2", "--monitor_interval", "0.5",
        "train", *TINY, f"paths.cache_dir={cache_dir}", f"hydra.run.dir={run}",
        "train.resume=auto", "train.max_steps=1200", "train.save_every=20",
        "train.eval_every=1000", "train.log_every=20", "train.precision=no", "logger=none",
    ]  # fmt: skip
    log = run / "train.log"

    def started(n: int) -> int:  # attempts that started with n processes so far
        text = log.read_text() if log.exists() else ""
        return len(re.findall(rf"Run dir .* \| {n} process\(es\)", text))

    def agent(name: str) -> subprocess.Popen:
        out = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
        return subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    first = agent("first")
    try:
        # alone (the rendezvous needs one node), it trains and checkpoints on one process
        wait_for("a checkpoint of the first node", lambda: (run / "checkpoints").is_dir() and any(
            (run / "checkpoints").glob("step_*")))  # fmt: skip
        second = agent("second")
        # the agents restart on the two nodes: from the first one's checkpoint, on 2 processes
        wait_for("the restart on two nodes", lambda: started(2) == 1 and "Resumed from" in (
            log.read_text()))  # fmt: skip
        steps = train_steps(run)
        wait_for("a checkpoint of the two nodes", lambda: len(train_steps(run)) > len(steps) + 2)
        for pid in process_tree(second.pid):  # the second node is lost: its agent and its rank
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        second.wait()
        assert first.wait(timeout=300) == 0, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        for proc in (first,):
            if proc.poll() is None:
                for pid in process_tree(proc.pid):
                    os.kill(pid, signal.SIGKILL)
    text = log.read_text()
    assert started(1) == 2 and started(2) == 1, text  # 1, then 2, then 1 process(es)
    assert len(re.findall(r"Resumed from \S+ at step \d+", text)) == 2
    assert "from a checkpoint written with 2 x 8: the epoch goes on at its sample" in text
    assert (run / "final" / "model.safetensors").is_file()
    logged = [e["step"] for e in events(run, "train")]
    assert logged == sorted(set(logged)) and logged[-1] == 1200  # each step once, to the end
    # the launcher's own output: the ranks' lines, none of torch's failure reports
    out = (tmp_path / "first.log").read_text()
    assert "Traceback" not in out and "ChildFailedError" not in out, out[-3000:]


def train_steps(run: Path) -> list[int]:
    return [e["step"] for e in events(run, "train")] if (run / "metrics.jsonl").exists() else []


def test_a_schedulers_warning_stops_an_elastic_launch_without_a_restart(tmp_path, cache_dir):
    """SIGUSR1 (SLURM's warning) to ``mlmkit launch --nnodes 1:2``: the rank saves a checkpoint,
    ends its agent (which would otherwise restart it) and the launch exits 75, for the job to be
    requeued."""
    run = tmp_path / "run"
    env = {**os.environ, **TEST_ENV, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable, "-m", "mlmkit", "launch", "--nnodes", "1:2", "--nproc_per_node", "1",
        "--rdzv_endpoint", f"localhost:{free_port()}", "--rdzv_conf", "last_call_timeout=1",
        "train", *TINY, f"paths.cache_dir={cache_dir}", f"hydra.run.dir={run}",
        "train.resume=auto", "train.max_steps=100000", "train.save_every=100000",
        "train.eval_every=100000", "train.precision=no", "logger=none",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        wait_for("a training step", lambda: bool(train_steps(run)))
        os.kill(proc.pid, signal.SIGUSR1)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            for pid in process_tree(proc.pid):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 75, out[-3000:]
    (checkpoint,) = (run / "checkpoints").glob("step_*")
    assert out.strip().splitlines()[-1] == (
        f"Stopped by SIGUSR1 at step {int(checkpoint.name[5:])} after saving a checkpoint; "
        "continue with train.resume=auto in the same hydra.run.dir."
    )
    assert (run / "train.log").read_text().count("Run dir ") == 1  # not restarted
