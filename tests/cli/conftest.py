"""The fixtures the command tests share: a small sweep of two runs."""

from __future__ import annotations

import pytest
from runs import TINY, run_cli


@pytest.fixture(scope="session")
def sweep(tmp_path_factory, cache_dir):
    """A two-run learning-rate sweep: python train.py -m optim.lr=1e-4,3e-3."""
    sweep_dir = tmp_path_factory.mktemp("sweep") / "lr"
    proc = run_cli(
        "train",
        "-m",
        *TINY,
        f"paths.cache_dir={cache_dir}",
        f"hydra.sweep.dir={sweep_dir}",
        "train.max_steps=20",
        "train.eval_every=10",
        "logger=none",
        "model.output_bias_init=zero",
        "optim.lr=1e-4,3e-3",
    )  # zero: 20 steps tell the rates apart
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sweep_dir
