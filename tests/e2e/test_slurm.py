"""Clusters: Hydra's submitit launcher (SLURM) and the sbatch example."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from runs import ROOT, TINY, events, python_popen

from mlmkit.config import register_configs


def test_submitit_slurm_launcher_composes_with_the_training_config():
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            config_name="config",
            return_hydra_config=True,
            overrides=[
                "hydra/launcher=submitit_slurm",
                "hydra.launcher.partition=gpu",
                "hydra.launcher.gpus_per_node=8",
                "train.resume=auto",
            ],
        )
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
    assert cfg.hydra.launcher.partition == "gpu" and cfg.hydra.launcher.gpus_per_node == 8
    assert cfg.train.resume == "auto"


def test_sbatch_examples_are_valid_bash():
    for script in ("train.sbatch", "submitit.sh"):
        proc = subprocess.run(
            ["bash", "-n", str(ROOT / "examples" / "slurm" / script)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr


def _wait_for_train_steps(run: Path, count: int, proc, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while len(events_or_none(run)) < count:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline, "the job logged no training steps"
        time.sleep(0.1)


def events_or_none(run: Path) -> list[dict]:
    try:
        return events(run, "train")
    except (FileNotFoundError, ValueError):  # not written yet, or a line being written
        return []


@pytest.mark.slow
def test_submitit_requeues_a_preempted_job_after_mlmkits_checkpoint(tmp_path, cache_dir):
    """submitit_local runs the job the way submitit_slurm does on a cluster node, signals and
    all: submitit's SIGUSR2 makes mlmkit save a checkpoint, then submitit requeues the job
    (here: starts it again), and train.resume=auto continues it to the end, in the same run
    dir of the default sweep dir (multirun/<date>/<time>, named once at submission)."""
    proc = python_popen(
        ROOT / "train.py",
        "-m",
        "hydra/launcher=submitit_local",
        *TINY,
        f"paths.cache_dir={cache_dir}",
        "train.max_steps=150",
        "train.log_every=1",
        "train.eval_every=0",
        "train.save_every=0",
        "train.precision=no",
        "train.resume=auto",
        "logger=none",
        "hydra.launcher.timeout_min=10",
        cwd=tmp_path,
    )
    deadline = time.time() + 180
    while not (runs := list(tmp_path.glob("multirun/*/*/0"))):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.1)
    (run,) = runs
    sweep = run.parent
    _wait_for_train_steps(run, 3, proc)
    job_pid = int((run / ".lock").read_text().split()[0])  # the job's process holds the run dir
    os.kill(job_pid, signal.SIGUSR2)  # what submitit has SLURM send before the time limit
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    logs = "".join(p.read_text() for p in (sweep / ".submitit").glob("*/*_log.*"))
    assert "Stopped by SIGUSR2" in logs, logs[-3000:]
    assert "Requeued job" in logs  # submitit's own handler ran after the checkpoint
    assert "Resumed from" in logs and "Traceback" not in logs
    assert list(tmp_path.glob("multirun/*/*/0")) == [run]  # the requeued job ran in the same dir
    steps = [e["step"] for e in events(run, "train")]
    assert steps == list(range(1, 151))  # every step once: the requeued job resumed, not restarted
    assert (run / "final" / "config.json").is_file()
    assert list((sweep / ".submitit").glob("*/*_result.pkl"))  # submitit stored the result
