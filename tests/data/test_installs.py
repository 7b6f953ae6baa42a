"""The data path where users install it: the GPU image's Python and versions (torchvision 0.26
among them) with each carried wheel set installed by ``pip --target`` (as the GPU check
installs it there, and as vendored folders and container images do), every source read,
packed and fetched (``data_path_check.py``).

What broke on the first GPU run, each caught here: datasets' torch formatter importing
``torchvision.io.VideoReader`` (datasets below 4.8.4, the floor set), and datasets' dill hashing
of an in-memory table failing on ``pyarrow.MonthDayNano`` (datasets 5.0.1 on, pyarrow outside
site-packages: the newest set)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from runs import ROOT

FLOOR_PYTHON = ROOT / ".venv-floor" / "bin" / "python"
WHEEL_SETS = {"floor": ROOT / ".whl", "newest": ROOT / ".whl-newest"}
CASES = ["builtin", "files", "mix", "streaming", "eval files"]


def _inputs(wheels) -> None:
    """Skip (fail under CI) where the floor environment or the wheel set is not built."""
    missing = [str(p) for p in (FLOOR_PYTHON, wheels / ".fetched") if not p.exists()]
    if missing:
        reason = (
            f"{', '.join(missing)} absent: make floor-env gpu-wheels builds them (.ci/run does)"
        )
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.mark.slow
@pytest.mark.parametrize("wheel_set", list(WHEEL_SETS))
def test_every_source_reads_packs_and_fetches_from_a_pip_target_install(
    tmp_path, tokenizer, wheel_set
):
    wheels = WHEEL_SETS[wheel_set]
    _inputs(wheels)
    site = tmp_path / "site"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    install = subprocess.run(
        [str(FLOOR_PYTHON), str(ROOT / "benchmarks" / "gpu_check.py"), "install"]
        + ["--wheels", str(wheels), "--site", str(site)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert install.returncode == 0, install.stdout[-3000:]
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    proc = subprocess.run(
        [str(FLOOR_PYTHON), str(ROOT / "tests" / "data" / "data_path_check.py")]
        + [str(tmp_path / "tokenizer"), str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
        cwd=tmp_path,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    found = {line["case"]: line for line in lines if "case" in line}
    assert proc.returncode == 0 and list(found) == CASES, proc.stdout + proc.stderr[-3000:]
    versions = lines[0]["versions"]
    [datasets_wheel] = wheels.glob("datasets-*.whl")
    assert versions["datasets"] == datasets_wheel.name.split("-")[1]
    assert versions["torchvision"], "the GPU image holds torchvision (.ci/gpu-image.txt)"
    assert lines[1]["pyarrow"].startswith(str(site))  # the carried pyarrow, outside site-packages
    for name, case in found.items():
        assert case["train"] > 0 and case["validation"] > 0 and case["eval_batches"] > 0, name
        assert len(set(case["batch"])) == 1 and case["batch"][0] in (64, 128), name
    assert lines[-1] == {"datasets_warnings": []}  # nothing hashed with a random fingerprint
