"""The built wheel is the whole toolkit: configs inside, and the installed `mlmkit`
command works from any folder, without the checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from runs import ROOT, TINY


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    had_build = (ROOT / "build").exists()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "-w",
            str(out),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if not had_build:  # setuptools builds in the checkout's build/
        shutil.rmtree(ROOT / "build", ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path,) = out.glob("mlmkit-*.whl")
    return path


def test_wheel_holds_every_config_and_every_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = sorted(
        p.relative_to(ROOT / "conf").as_posix() for p in (ROOT / "conf").rglob("*.yaml")
    )
    assert len(configs) > 30
    missing = [c for c in configs if f"mlmkit/conf/{c}" not in names]
    assert not missing, f"configs not shipped: {missing}"
    src = ROOT / "src"
    modules = sorted(
        p.relative_to(src).as_posix() for p in src.rglob("*.py") if "__pycache__" not in p.parts
    )
    missing = [m for m in modules if m not in names]
    assert not missing, f"modules not shipped (list their package in pyproject.toml): {missing}"
    assert any(n.endswith("entry_points.txt") for n in names)
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "mlmkit = mlmkit.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


@pytest.mark.slow
def test_installed_wheel_trains_and_evaluates_from_outside_the_checkout(wheel, tmp_path):
    """Installed from the wheel (not editable) and run from a folder with no conf/:
    `mlmkit train` trains on the built-in corpus and exports, `mlmkit eval` and
    `mlmkit tokenizer` find their configs."""
    site = tmp_path / "site"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--quiet",
            "--target",
            str(site),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(site),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }

    def mlmkit(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "mlmkit", *args],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    where = subprocess.run(
        [sys.executable, "-c", "import mlmkit; print(mlmkit.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.stdout.startswith(str(site)), where.stdout + where.stderr  # the wheel's copy runs
    run = work / "run"
    train = mlmkit(
        "train",
        *TINY,
        "train.max_steps=20",
        "train.eval_every=20",
        "logger=none",
        f"hydra.run.dir={run}",
    )
    assert train.returncode == 0, train.stderr[-3000:]
    assert (run / "final" / "model.safetensors").is_file() and (work / ".cache" / "mlmkit").is_dir()
    result = work / "eval.json"
    evaluation = mlmkit("eval", f"checkpoint={run}", "data.max_eval_samples=16", f"output={result}")
    assert evaluation.returncode == 0, evaluation.stderr[-3000:]
    assert json.loads(result.read_text())["tokens"] > 0
    tok = mlmkit(
        "tokenizer",
        "tokenizer.vocab_size=500",
        "tokenizer.max_train_chars=100000",
        f"out={work / 'tok'}",
    )
    assert tok.returncode == 0, tok.stderr[-3000:]
    assert (work / "tok" / "tokenizer.json").is_file()
    finetune = mlmkit("finetune", "--cfg", "job")  # composes conf/finetune.yaml
    assert finetune.returncode == 0 and "task:" in finetune.stdout, finetune.stderr[-3000:]
    accelerate_config = mlmkit("accelerate-config", "multi_node", "--out", "multi_node.yaml")
    assert accelerate_config.returncode == 0, accelerate_config.stderr[-3000:]
    assert accelerate_config.stdout.strip() == "multi_node.yaml"  # for --config_file "$(...)"
    assert (work / "multi_node.yaml").read_text() == (
        ROOT / "conf" / "accelerate" / "multi_node.yaml"
    ).read_text()
    assert not (work / "conf").exists()


def test_flash_attn_is_an_extra_of_its_own_for_linux_and_not_in_dev(wheel):
    with zipfile.ZipFile(wheel) as z:
        metadata = z.read(
            next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        ).decode()
    requires = [
        line.split(":", 1)[1].strip()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    assert "Provides-Extra: flash" in metadata.splitlines()
    flash = [r for r in requires if r.startswith("flash-attn")]
    assert flash == ['flash-attn>=2.6; platform_system == "Linux" and extra == "flash"']
    dev = [r for r in requires if 'extra == "dev"' in r]
    assert dev and not any(
        r.startswith(("flash-attn", "mlmkit")) for r in dev
    )  # dev stays buildable anywhere
