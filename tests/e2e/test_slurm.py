"""Clusters: Hydra's submitit launcher (SLURM) and the sbatch example."""

from __future__ import annotations

import subprocess

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from runs import ROOT, TINY, events, python_run

from mlmkit.config import register_configs


def test_submitit_slurm_launcher_composes_with_the_training_config():
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", return_hydra_config=True,
                      overrides=["hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu",
                                 "hydra.launcher.gpus_per_node=8", "train.resume=auto"])
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")
    assert cfg.hydra.launcher.partition == "gpu" and cfg.hydra.launcher.gpus_per_node == 8
    assert cfg.train.resume == "auto"


def test_sbatch_examples_are_valid_bash():
    for script in ("train.sbatch", "submitit.sh"):
        proc = subprocess.run(["bash", "-n", str(ROOT / "examples" / "slurm" / script)],
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_a_job_runs_through_the_submitit_launcher(tmp_path, cache_dir):
    """submitit_local runs the job the way submitit_slurm does on a cluster node."""
    sweep = tmp_path / "sweep"
    proc = python_run(ROOT / "train.py", "-m", "hydra/launcher=submitit_local", *TINY,
                      f"paths.cache_dir={cache_dir}", f"hydra.sweep.dir={sweep}", "train.max_steps=10",
                      "train.resume=auto", "logger=none", "hydra.launcher.timeout_min=10")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = sweep / "0"
    assert [e["step"] for e in events(run, "train")] == [5, 10]
    assert (run / "final" / "config.json").is_file()
    assert list((sweep / ".submitit").glob("*/*_result.pkl"))  # submitit ran it and stored the result
