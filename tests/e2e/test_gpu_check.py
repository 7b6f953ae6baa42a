"""The prepared GPU check (benchmarks/gpu_check.py): its CPU rehearsal in a bare environment with
the GPU image's versions (torchvision among them) and each set of carried wheels, run as the GPU
machine runs it, its training with dataloader workers; the runner's plan, budget and files; the
wheel lists; and the declared floors, which are what that environment tests."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLOOR = ROOT / ".venv-floor"
FLOOR_PYTHON = FLOOR / "bin" / "python"

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402

sys.path.remove(str(ROOT / "benchmarks"))

# each wheel set: its folder (make gpu-wheels), its list, and the steps its rehearsal runs. The
# newest set runs the smoke step alone: mlmkit's training from a spawned process with 2 workers
# started by spawn, on the built-in corpus made a dataset and packed (datasets 5's fingerprinting
# of in-memory tables), where that set broke; make gpu-rehearsal runs every step with both sets.
REHEARSALS = {
    "floor": (ROOT / ".whl", gpu_check.CARRY, None),
    "newest": (ROOT / ".whl-newest", gpu_check.NEWEST, ["smoke"]),
}
CARRIED = ("datasets", "dill", "multiprocess", "fsspec", "pyarrow", "evaluate", "hydra-core")


def pins(path: Path) -> dict[str, str]:
    """``{package: version}`` of a ``.ci`` list's ``name==version`` lines."""
    found = {}
    for line in gpu_check.carried(path):
        if "==" in line:
            package, version = line.split("==")
            found[package.lower()] = version
    return found


IMAGE = pins(ROOT / ".ci" / "gpu-image.txt")


def floors() -> dict[str, str]:
    """``{package: lowest version}`` of pyproject.toml's dependencies that declare one."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["embeddings"]
    return {m[1].lower(): m[2] for d in declared if (m := re.fullmatch(r"([\w.-]+)>=([\w.]+)", d))}


def test_every_declared_floor_is_a_version_the_floor_environment_installs():
    tested = {**IMAGE, **pins(gpu_check.CARRY)}
    declared = floors()
    assert {"torch", "transformers", "accelerate", "datasets", "hydra-core"} <= set(declared)
    assert {name: declared[name] for name in declared} == {
        name: tested.get(name) for name in declared
    }


def test_the_newest_wheel_set_is_what_the_dev_environment_resolves():
    """The newest set holds the releases a fresh install takes today, as this environment has."""
    newest = pins(gpu_check.NEWEST)
    assert set(CARRIED) <= set(newest)
    assert newest == {name: importlib.metadata.version(name) for name in newest}


def test_the_image_list_holds_what_the_libraries_probe_for():
    """torchvision (whose 0.26 has no io.VideoReader, which datasets' formatters import wherever
    torchvision is imported) and torchaudio, paired with the image's torch."""
    assert IMAGE["torch"] == "2.11.0"
    assert IMAGE["torchvision"] == "0.26.0" and IMAGE["torchaudio"] == "2.11.0"
    unpinned = set(gpu_check.carried(ROOT / ".ci" / "gpu-image.txt"))
    assert {"pillow", "pandas", "scipy", "scikit-learn", "timm", "peft"} <= unpinned


def rehearsal_inputs(wheels: Path) -> None:
    """Skip (fail under CI) where the floor environment (with the image's torchvision) or the
    wheels are not built."""
    missing = [str(p) for p in (FLOOR_PYTHON, wheels / ".fetched") if not p.exists()]
    if not missing and not list(FLOOR.glob("lib/python3*/site-packages/torchvision-*.dist-info")):
        missing.append(f"torchvision in {FLOOR}")
    if missing:
        reason = (
            f"{', '.join(missing)} absent: make floor-env gpu-wheels builds them (.ci/run does)"
        )
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.mark.slow
@pytest.mark.parametrize("wheel_set", list(REHEARSALS))
def test_the_gpu_check_rehearses_on_a_bare_image_with_each_wheel_set(tmp_path, wheel_set):
    wheels, listed, only = REHEARSALS[wheel_set]
    rehearsal_inputs(wheels)
    out = tmp_path / "results"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    command = [
        str(FLOOR_PYTHON),
        str(ROOT / "benchmarks" / "gpu_check.py"),
        "run",
        "--cpu",
        "--wheels",
        str(wheels),
        "--out",
        str(out),
        "--work",
        str(tmp_path / "work"),
    ]
    started = time.monotonic()
    proc = subprocess.run(
        [*command, *(["--only", ",".join(only)] if only else [])],
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
        cwd=ROOT,
    )
    seconds = time.monotonic() - started
    log = (out / "log.txt").read_text() if (out / "log.txt").exists() else ""
    assert proc.returncode == 0, proc.stdout[-2000:] + log[-8000:]
    print(f"{wheel_set} rehearsal: {seconds:.0f} s; {proc.stdout.strip()}")
    summary = json.loads((out / "summary.json").read_text())
    names = only or ["smoke", "gpu-tests", "gpu-bert", "profile-bert", "doctor-bert"]
    assert list(summary["steps"]) == ["install", *names, *([] if only else ["doctor-modernbert"])]
    software, carry = summary["software"], pins(listed)
    for name in ("torch", "torchvision", "transformers", "accelerate", "numpy"):
        assert software[name].split("+")[0] == IMAGE[name]
    assert {name: software[name] for name in CARRIED} == {name: carry[name] for name in CARRIED}
    assert software["python"].startswith("3.12") and software["mlmkit"]
    steps = {name: step.get("figures") for name, step in summary["steps"].items()}

    # the smoke step: its run trained with 2 workers started by spawn; the kernels were reported
    smoke = steps["smoke"]
    assert smoke["train"]["steps"] == 5 and smoke["train"]["finite"]
    assert smoke["train"]["workers"] == {"started": 2, "start_method": "spawn"}
    assert all(a["kernels"] for a in smoke["kernels"]["attention"].values())
    if not only:
        # the benchmark: the Trainer with 2 workers, mlmkit from a spawned process with 2 of its own
        gpu = steps["gpu-bert"]
        assert gpu["workers"] == 2 and gpu["runs"]["Trainer, bf16=True"]["tokens_per_s"] > 0
        assert gpu["runs"]["mlmkit"]["workers"] == {"started": 2, "start_method": "spawn"}
        assert gpu["runs"]["mlmkit"]["ratio_to_trainer"] > 0
        # the GPU tests were collected, and skipped with the reason
        assert "needs a CUDA GPU (none here)" in log
        profile = steps["profile-bert"]
        assert profile["steps"] == 4 and profile["workers"]["started"] == 2
        assert 0 < len(profile["kernels"]) <= 15
        assert 0 < profile["busy_seconds"] <= profile["wall_seconds"]
        assert 0 <= profile["idle_share"] < 1
        for name in ("doctor-bert", "doctor-modernbert"):
            report = steps[name]
            assert report["rehearsal"]["tokens_per_s"] > 0 and report["parity"]["checks"]
    assert len(list(out.iterdir())) <= 8  # what a lent machine returns


def fake_plan(steps):
    """A ``gpu_check.plan`` of the given (name, Python code, limit) steps, each writing nothing."""

    def plan(out, cache, cpu):
        return [(name, [sys.executable, "-c", code], limit, None) for name, code, limit in steps]

    return plan


def run_args(tmp_path, **kwargs):
    return gpu_check.argparse.Namespace(
        **{
            "out": str(tmp_path / "out"),
            "wheels": None,
            "work": str(tmp_path / "work"),
            "budget": None,
            "cpu": True,
            "only": None,
            "keep_going": False,
            **kwargs,
        }
    )


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
    assert gpu_check.run(run_args(tmp_path, budget=22.5)) == 1
    steps = json.loads((out / "summary.json").read_text())["steps"]
    assert steps["first"] == {
        "status": "ok",
        "seconds": steps["first"]["seconds"],
        "figures": {"rate": 1},
    }
    assert steps["slow"]["status"] == "timeout after 3 s"
    assert steps["late"]["status"] == "skipped (the budget ran out)"
    assert "1 of 3 steps ok" in capsys.readouterr().out


def test_a_failed_smoke_step_skips_the_rest_and_only_reruns_the_named_steps(tmp_path, monkeypatch):
    monkeypatch.setattr(
        gpu_check,
        "plan",
        fake_plan([("smoke", "raise SystemExit(3)", 30), ("a", "pass", 30), ("b", "pass", 30)]),
    )
    monkeypatch.setattr(gpu_check, "software", lambda env: {})
    summary = tmp_path / "out" / "summary.json"
    assert gpu_check.run(run_args(tmp_path)) == 1
    steps = json.loads(summary.read_text())["steps"]
    assert steps["smoke"]["status"] == "failed (3)"
    assert [steps[n]["status"] for n in "ab"] == ["skipped (the smoke step failed)"] * 2
    assert gpu_check.run(run_args(tmp_path, keep_going=True)) == 1
    steps = json.loads(summary.read_text())["steps"]
    assert [steps[n]["status"] for n in "ab"] == ["ok", "ok"]
    assert gpu_check.run(run_args(tmp_path, only="b,a")) == 0  # a rerun: the plan's order
    assert list(json.loads(summary.read_text())["steps"]) == ["a", "b"]
    with pytest.raises(SystemExit, match="no step c"):
        gpu_check.run(run_args(tmp_path, only="a,c"))
    # a smoke step that runs out of time may only be slow: the others run
    monkeypatch.setattr(
        gpu_check,
        "plan",
        fake_plan([("smoke", "import time; time.sleep(30)", 1), ("a", "pass", 30)]),
    )
    assert gpu_check.run(run_args(tmp_path)) == 1
    steps = json.loads(summary.read_text())["steps"]
    assert steps["smoke"]["status"] == "timeout after 1 s" and steps["a"]["status"] == "ok"


def test_the_gpu_plan_fits_a_lent_machine(tmp_path):
    steps = gpu_check.plan(tmp_path, tmp_path / "cache", cpu=False)
    names = [name for name, *_ in steps]
    files = {"summary.json", "log.txt"} | {figures.name for *_, figures in steps if figures}
    assert len(files) <= 8 and all(
        tmp_path / "cache" != figures.parent for *_, figures in steps if figures
    )
    # the smoke step first, within 30 s; then the GPU tests; a profile of bert-base's steps
    assert names[:2] == ["smoke", "gpu-tests"] and steps[0][2] <= 30
    # the GPU tests' step collects only the files holding tests marked gpu
    listed = {Path(arg).relative_to(ROOT).as_posix() for arg in steps[1][1] if arg.endswith(".py")}
    assert {"tests/gpu/test_cuda.py", "tests/model/test_modernbert.py"} <= listed
    assert "tests/e2e/test_examples.py" not in listed
    profile = steps[names.index("profile-bert-base")][1]
    assert profile[profile.index("--steps") + 1] == "20"
    # every step gets its whole limit; with a fresh machine's start and the install, the command
    # ends within 8 minutes, which leaves a rerun of a few steps room in a session's 15
    assert sum(limit for _, _, limit, _ in steps) <= gpu_check.GPU_BUDGET
    assert gpu_check.MACHINE_START + gpu_check.INSTALL + gpu_check.GPU_BUDGET <= 8 * 60
    for _, command, _, _ in steps:
        assert "pip" not in command  # no step needs the package index


def test_the_rehearsal_plan_mirrors_the_gpu_plan_with_workers(tmp_path):
    gpu = gpu_check.plan(tmp_path, tmp_path / "cache", cpu=False)
    cpu = gpu_check.plan(tmp_path, tmp_path / "cache", cpu=True)
    assert [n.removesuffix("-base") for n, *_ in gpu if "modernbert-base" not in n] == [
        n for n, *_ in cpu if n != "doctor-modernbert"
    ]
    for name, command, _, _ in cpu:
        if name == "gpu-tests":
            continue
        takes = command[command.index("--workers") + 1] if "--workers" in command else None
        assert takes == "2" or "train.num_workers=2" in command or name == "smoke"


@pytest.mark.parametrize("listed", [gpu_check.CARRY, gpu_check.NEWEST], ids=["floor", "newest"])
def test_the_wheel_step_fetches_a_list_for_the_gpu_images_python(tmp_path, listed):
    download, built = gpu_check.wheel_commands(tmp_path / ".whl", gpu_check.carried(listed))
    carry = gpu_check.carried(listed)
    assert sorted(a for a in download + built if "==" in a) == sorted(carry)
    assert download[download.index("--python-version") + 1] == "3.12" and "--no-deps" in download
    assert "--only-binary=:all:" in download and "manylinux_2_17_x86_64" in download
    assert [a for a in built if "==" in a] == ["antlr4-python3-runtime==4.9.3"]
