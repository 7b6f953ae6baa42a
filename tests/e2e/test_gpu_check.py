"""The prepared GPU check (benchmarks/gpu_check.py): its CPU rehearsal in a bare environment with
the GPU image's versions and the carried wheels, run as the GPU machine runs it; the runner's
budget and files; the wheel list; and the declared floors, which are what that environment
tests."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLOOR_PYTHON = ROOT / ".venv-floor" / "bin" / "python"
WHEELS = ROOT / ".whl"

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402

sys.path.remove(str(ROOT / "benchmarks"))


def pins(name: str) -> dict[str, str]:
    """``{package: version}`` of a ``.ci`` list's ``name==version`` lines."""
    found = {}
    for line in gpu_check.carried(ROOT / ".ci" / name):
        if "==" in line:
            package, version = line.split("==")
            found[package.lower()] = version
    return found


def floors() -> dict[str, str]:
    """``{package: lowest version}`` of pyproject.toml's dependencies that declare one."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["embeddings"]
    return {m[1].lower(): m[2] for d in declared if (m := re.fullmatch(r"([\w.-]+)>=([\w.]+)", d))}


def test_every_declared_floor_is_a_version_the_floor_environment_installs():
    tested = {**pins("gpu-image.txt"), **pins("gpu-carry.txt")}
    declared = floors()
    assert {"torch", "transformers", "accelerate", "datasets", "hydra-core"} <= set(declared)
    assert {name: declared[name] for name in declared} == {
        name: tested.get(name) for name in declared
    }


def rehearsal_inputs() -> None:
    """Skip (fail under CI) where the floor environment or the wheels are not built."""
    missing = [str(p) for p in (FLOOR_PYTHON, WHEELS / ".fetched") if not p.exists()]
    if missing:
        reason = (
            f"{', '.join(missing)} absent: make floor-env gpu-wheels builds them (.ci/run does)"
        )
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.mark.slow
def test_the_gpu_check_rehearses_on_a_bare_image_with_the_carried_wheels(tmp_path):
    rehearsal_inputs()
    out = tmp_path / "results"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    proc = subprocess.run(
        [
            str(FLOOR_PYTHON),
            str(ROOT / "benchmarks" / "gpu_check.py"),
            "run",
            "--cpu",
            "--wheels",
            str(WHEELS),
            "--out",
            str(out),
            "--work",
            str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
        cwd=ROOT,
    )
    log = (out / "log.txt").read_text() if (out / "log.txt").exists() else ""
    assert proc.returncode == 0, proc.stdout[-2000:] + log[-6000:]
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["steps"]) == [
        "install",
        "gpu-tests",
        "doctor-bert",
        "gpu-bert",
        "doctor-modernbert",
    ]
    software, image, carry = summary["software"], pins("gpu-image.txt"), pins("gpu-carry.txt")
    for name in ("torch", "transformers", "accelerate"):
        assert software[name].split("+")[0] == image[name]
    assert (
        software["datasets"] == carry["datasets"] and software["hydra-core"] == carry["hydra-core"]
    )
    assert software["python"].startswith("3.12") and software["mlmkit"]
    assert (
        "needs a CUDA GPU (none here)" in log
    )  # the GPU tests were collected, and skipped with the reason
    for name in ("doctor-bert", "doctor-modernbert"):
        report = summary["steps"][name]["figures"]
        assert report["rehearsal"]["tokens_per_s"] > 0 and report["parity"]["checks"]
    runs = summary["steps"]["gpu-bert"]["figures"]["runs"]
    assert runs["Trainer, bf16=True"]["tokens_per_s"] > 0 and runs["mlmkit"]["ratio_to_trainer"] > 0
    assert len(list(out.iterdir())) <= 8  # what a lent machine returns


def test_each_step_writes_its_figures_as_it_ends_and_the_budget_stops_the_rest(
    tmp_path, monkeypatch, capsys
):
    def plan(out, cache, cpu):
        write = f"import json; json.dump({{'rate': 1}}, open({str(out / 'first.json')!r}, 'w'))"
        return [
            ("first", [sys.executable, "-c", write], 30, out / "first.json"),
            ("slow", [sys.executable, "-c", "import time; time.sleep(60)"], 3, out / "slow.json"),
            ("late", [sys.executable, "-c", "pass"], 30, None),
        ]

    monkeypatch.setattr(gpu_check, "plan", plan)
    monkeypatch.setattr(gpu_check, "software", lambda env: {})
    out = tmp_path / "out"
    args = gpu_check.argparse.Namespace(
        out=str(out), wheels=None, work=str(tmp_path / "work"), budget=22.5, cpu=True
    )
    assert gpu_check.run(args) == 1
    steps = json.loads((out / "summary.json").read_text())["steps"]
    assert steps["first"] == {
        "status": "ok",
        "seconds": steps["first"]["seconds"],
        "figures": {"rate": 1},
    }
    assert steps["slow"]["status"] == "timeout after 3 s"
    assert steps["late"]["status"] == "skipped (the budget ran out)"
    assert "1 of 3 steps ok" in capsys.readouterr().out


def test_the_gpu_plan_fits_a_lent_machine(tmp_path):
    steps = gpu_check.plan(tmp_path, tmp_path / "cache", cpu=False)
    files = {"summary.json", "log.txt"} | {figures.name for _, _, _, figures in steps if figures}
    assert len(files) <= 8 and all(
        tmp_path / "cache" != figures.parent for *_, figures in steps if figures
    )
    # 6.5 minutes of steps: with a fresh machine's start and the install, 8 in all
    assert gpu_check.GPU_BUDGET <= 390 and steps[0][0] == "gpu-tests"
    for _, command, _, _ in steps:
        assert "pip" not in command  # no step needs the package index


def test_the_wheel_step_fetches_the_carried_list_for_the_gpu_images_python(tmp_path):
    download, built = gpu_check.wheel_commands(tmp_path / ".whl")
    carry = gpu_check.carried(gpu_check.CARRY)
    assert sorted(a for a in download + built if "==" in a) == sorted(carry)
    assert download[download.index("--python-version") + 1] == "3.12" and "--no-deps" in download
    assert "--only-binary=:all:" in download and "manylinux_2_17_x86_64" in download
    assert [a for a in built if "==" in a] == ["antlr4-python3-runtime==4.9.3"]
