"""The prepared GPU check (benchmarks/gpu_check.py) in its CPU mode, so that it cannot rot, and
its wheel step's commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from runs import ROOT, TEST_ENV, fork_python


@pytest.mark.slow
def test_the_gpu_check_runs_every_step_in_its_cpu_mode(tmp_path):
    out = tmp_path / "results"
    # its commands start through the fork server too (runs.fork_python)
    proc = subprocess.run([fork_python(), str(ROOT / "benchmarks" / "gpu_check.py"), "run", "--cpu", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, env={**os.environ, **TEST_ENV}, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + (out / "log.txt").read_text()[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["steps"]) == ["gpu-tests", "doctor-bert", "doctor-modernbert", "gpu-bert"]
    assert all(step["status"] == "ok" for step in summary["steps"].values()), summary
    log = (out / "log.txt").read_text()
    assert "needs a CUDA GPU (none here)" in log  # the GPU tests were collected, and skipped with the reason
    for name in ("doctor-bert", "doctor-modernbert"):
        report = summary["steps"][name]["figures"]
        assert report["rehearsal"]["tokens_per_s"] > 0 and report["parity"]["checks"]
        assert isinstance(report["findings"], list)
    runs = summary["steps"]["gpu-bert"]["figures"]["runs"]
    assert runs["Trainer, bf16=True"]["tokens_per_s"] > 0 and runs["mlmkit"]["ratio_to_trainer"] > 0


def test_the_wheel_step_pins_what_this_checkout_is_tested_with(tmp_path):
    import importlib.metadata

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from gpu_check import BUILT, OPTIONAL, WHEELS, wheel_commands
    finally:
        sys.path.pop(0)
    download, built, own = wheel_commands(tmp_path / ".whl")
    for name in WHEELS:
        assert f"{name}=={importlib.metadata.version(name)}" in download
    assert download[download.index("--python-version") + 1] == "3.12" and "--no-deps" in download
    assert "--only-binary=:all:" in download and "manylinux_2_17_x86_64" in download
    assert [a for a in built if "==" in a] == [f"{n}=={importlib.metadata.version(n)}" for n in BUILT]
    assert own[-1] == str(ROOT) and "--no-build-isolation" in own  # mlmkit itself, so pkg://mlmkit.conf resolves
    assert not any(n in " ".join(download) for n in OPTIONAL)
    assert f"pyarrow=={importlib.metadata.version('pyarrow')}" in wheel_commands(tmp_path, with_pyarrow=True)[0]
