"""The GPU check: one command, under 8 minutes on one H200, that runs what a CPU cannot show and
writes every figure to files.

Here, with PyPI reachable (``make gpu-wheels``): the wheels a bare GPU image lacks, for Python
3.12 on x86-64 Linux, at the versions this checkout is tested with, and mlmkit's own wheel (so
that ``pkg://mlmkit.conf`` resolves), into ``.whl/``:

    python benchmarks/gpu_check.py wheels [--dest .whl] [--dry-run]

There, from the checkout's root (no network, no ``pip install --upgrade pip``):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
    python3 benchmarks/gpu_check.py run --out results/

``run`` does, each step with a time limit and its output kept:
  1. the GPU-marked tests (``pytest -m gpu``): SDPA against eager in bf16, fp16 with its scaler,
     compiled layers, the documents mask, exact resume of on-device masks, flash-attn's where
     installed;
  2. ``mlmkit doctor`` for bert-base and modernbert-base (kernels, a rehearsal, parity, findings);
  3. bert-base at 128 tokens in bf16: mlmkit against ``Trainer(bf16=True)``, and mlmkit with
     ``train.compile=true`` (``benchmarks/gpu.py``);
  4. modernbert-base at 1,024 tokens (mlmkit; ModernBERT's published rate is about 304k tokens/s
     per H100: 1.7T tokens in 194 h on 8 GPUs, Warner et al., 2024).
``--cpu`` runs the same steps with tiny models on a CPU in about a minute (``make test`` runs it,
so the check cannot rot). Files in ``--out``: ``summary.json`` (each step's status, seconds and
figures), ``log.txt`` (every step's output), ``doctor-*.json``, ``gpu-*.json``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What mlmkit needs that the GPU image lacks (its other needs are there: torch, transformers,
# accelerate, tokenizers, safetensors, pandas, xxhash, fsspec, huggingface-hub, tensorboard,
# matplotlib, sentence-transformers, pytest): datasets and evaluate with their dill and
# multiprocess, Hydra with OmegaConf and its ANTLR runtime (published only as a source archive:
# built into a wheel here, pure Python): 1.6 MB. With --with-pyarrow also pyarrow at the version
# datasets needs, where the image's is older (53 MB more, of the 64 MiB a call carries).
WHEELS = ("datasets", "evaluate", "dill", "multiprocess", "hydra-core", "omegaconf")
OPTIONAL = ("pyarrow",)  # --with-pyarrow
BUILT = ("antlr4-python3-runtime",)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def wheel_commands(dest: Path, with_pyarrow: bool = False) -> list[list[str]]:
    """The pip commands that fill ``dest``: each package at the version installed here."""
    pip = [sys.executable, "-m", "pip"]
    names = WHEELS + (OPTIONAL if with_pyarrow else ())
    pinned = [f"{name}=={importlib.metadata.version(name)}" for name in names]
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    download = [*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
                "--implementation", "cp", *platforms, "-d", str(dest), *pinned]
    built = [*pip, "wheel", "--no-deps", "-w", str(dest),
             *[f"{name}=={importlib.metadata.version(name)}" for name in BUILT]]
    own = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dest), str(ROOT)]
    return [download, built, own]


def wheels(args) -> int:
    dest = Path(args.dest)
    commands = wheel_commands(dest, args.with_pyarrow)
    for command in commands:
        print(" ".join(command))
        if not args.dry_run and subprocess.run(command).returncode != 0:
            print(f"Error: {command[3]} failed; see pip's message above.", file=sys.stderr)
            return 1
    if not args.dry_run:
        print(f"{len(list(dest.glob('*.whl')))} wheels in {dest}; carry it to the GPU machine.")
    return 0


# ---- the check ---------------------------------------------------------------------------------

def plan(out: Path, cpu: bool) -> list[tuple[str, list[str], int, Path | None]]:
    """(name, command, time limit in seconds, the figures' file) of each step."""
    py, cache = sys.executable, out / "cache"
    tiny = ["model.num_hidden_layers=2", "model.hidden_size=64", "model.num_attention_heads=2",
            "model.intermediate_size=128", "tokenizer.vocab_size=2000", "data.max_seq_length=64",
            "data.max_eval_samples=32", "train.batch_size=8"]
    doctor = [py, "-m", "mlmkit", "doctor", "data=builtin", f"paths.cache_dir={cache}"]
    gpu = [py, str(ROOT / "benchmarks" / "gpu.py")]
    steps = [("gpu-tests", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "-rs",
                            str(ROOT / "tests")], 240, None)]
    if cpu:  # limits with room for a slow CPU (these steps check the script, not the speed)
        steps += [
            ("doctor-bert", [*doctor, "model=bert-tiny", *tiny, "--steps", "4", "--out", str(out / "doctor-bert.json")],
             240, out / "doctor-bert.json"),
            ("doctor-modernbert", [*doctor, "model=modernbert-tiny", *tiny, "model.local_attention=32",
                                   "--steps", "4", "--out", str(out / "doctor-modernbert.json")],
             240, out / "doctor-modernbert.json"),
            ("gpu-bert", [*gpu, "--tiny", "--corpus", "builtin", "--steps", "2", "--warmup", "1",
                          "--out", str(out / "gpu-bert.json")],
             360, out / "gpu-bert.json"),
        ]
        return steps
    return steps + [
        ("doctor-bert-base", [*doctor, "model=bert-base", "train.batch_size=128", "data.max_seq_length=128",
                              "--out", str(out / "doctor-bert-base.json")], 120, out / "doctor-bert-base.json"),
        ("doctor-modernbert-base", [*doctor, "model=modernbert-base", "train.batch_size=32",
                                    "data.max_seq_length=1024", "--out", str(out / "doctor-modernbert-base.json")],
         120, out / "doctor-modernbert-base.json"),
        ("gpu-bert-base", [*gpu, "--steps", "300", "--warmup", "50", "--compile",
                           "--out", str(out / "gpu-bert-base.json")], 240, out / "gpu-bert-base.json"),
        ("gpu-modernbert-base", [*gpu, "--preset", "modernbert-base", "--seq", "1024", "--batch", "32",
                                 "--steps", "100", "--warmup", "50", "--out", str(out / "gpu-modernbert-base.json")],
         150, out / "gpu-modernbert-base.json"),
    ]


def software() -> dict[str, str | None]:
    """The versions the figures depend on (None: not installed), and the GPU."""
    versions = {}
    for name in ("torch", "transformers", "accelerate", "datasets", "pyarrow", "flash-attn", "mlmkit"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    import torch

    versions["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return versions


def run(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p)
    summary, failed = {"cpu": args.cpu, "software": software(), "steps": {}}, 0
    with open(out / "log.txt", "w", encoding="utf-8") as log:
        for name, command, limit, figures in plan(out, args.cpu):
            log.write(f"\n==== {name}: {' '.join(command)}\n")
            log.flush()
            started = time.perf_counter()
            try:
                code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                      timeout=limit).returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
            seconds = round(time.perf_counter() - started, 1)
            step = {"status": "ok" if code == 0 else f"failed ({code})", "seconds": seconds}
            if figures is not None and figures.is_file():
                step["figures"] = json.loads(figures.read_text())
            summary["steps"][name] = step
            failed += code != 0
            print(f"{name}: {step['status']} in {seconds} s", flush=True)
            (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print(f"{len(summary['steps']) - failed} of {len(summary['steps'])} steps ok; figures in {out}")
    return 1 if failed else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("wheels", help="download and build the wheels the GPU image lacks (needs PyPI)")
    w.add_argument("--dest", default=str(ROOT / ".whl"))
    w.add_argument("--dry-run", action="store_true", help="print the pip commands only")
    w.add_argument("--with-pyarrow", action="store_true",
                   help="also pyarrow, where the GPU image's is older than datasets needs")
    r = sub.add_parser("run", help="run the check and write its figures")
    r.add_argument("--out", required=True)
    r.add_argument("--cpu", action="store_true", help="tiny models on a CPU: checks the script")
    args = p.parse_args()
    return wheels(args) if args.command == "wheels" else run(args)


if __name__ == "__main__":
    sys.exit(main())
