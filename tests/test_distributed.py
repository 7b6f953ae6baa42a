"""Several processes (gloo on CPU): the same optimisation as one process, and resume."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from runs import ROOT, TINY, events, run_train

COMMON = ["train.max_steps=10", "train.save_every=5", "train.eval_every=10", "train.log_every=1",
          "train.precision=no", "logger=none"]


def launch_two(run_dir: Path, cache_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    accelerate = Path(sys.executable).with_name("accelerate")
    cmd = [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", str(ROOT / "train.py"), *TINY,
           f"paths.cache_dir={cache_dir}", f"hydra.run.dir={run_dir}", *overrides]
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.mark.slow
def test_two_processes_follow_one_process_with_the_same_global_batch(tmp_path, cache_dir):
    """2 processes x batch 8 = 1 process x batch 16: same rows, masks and normalisation."""
    one, two = tmp_path / "one", tmp_path / "two"
    run_train(one, cache_dir, *COMMON, "train.batch_size=16")
    launch_two(two, cache_dir, *COMMON, "train.batch_size=8")
    a, b = events(one, "train"), events(two, "train")
    assert [e["step"] for e in a] == [e["step"] for e in b] == list(range(1, 11))
    for x, y in zip(a, b):
        assert x["tokens_seen"] == y["tokens_seen"] and x["global_batch_size"] == y["global_batch_size"] == 16
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-4), (x["step"], x["loss"], y["loss"])
        assert x["grad_norm"] == pytest.approx(y["grad_norm"], rel=1e-3)
    ea, eb = events(one, "eval")[-1], events(two, "eval")[-1]
    assert ea["eval_loss"] == pytest.approx(eb["eval_loss"], rel=1e-4)

    # The 2-process run resumes from its step-5 checkpoint to the same end.
    resumed = tmp_path / "resumed"
    shutil.copytree(two, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_0000010")
    shutil.rmtree(resumed / "final")
    launch_two(resumed, cache_dir, *COMMON, "train.batch_size=8", "train.resume=auto")
    assert "Resumed from" in (resumed / "train.log").read_text()
    c = events(resumed, "train")
    assert [e["step"] for e in c] == list(range(1, 11))
    for x, y in zip(b, c):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-6)
    assert events(resumed, "eval")[-1]["eval_loss"] == pytest.approx(eb["eval_loss"], rel=1e-6)
