"""The GPU check: one command that runs, on one GPU, what a CPU cannot show, and writes each
step's figures to its output folder as that step ends.

Here, with PyPI reachable, fetch the wheels a bare GPU image lacks (``make gpu-wheels`` fetches
both sets): the packages of ``.ci/gpu-carry.txt`` (mlmkit's lowest declared datasets, evaluate,
hydra-core and omegaconf, and what they need at versions they accept), or of
``.ci/gpu-carry-newest.txt`` (the newest releases of the same), for Python 3.12 on x86-64 Linux:

    python benchmarks/gpu_check.py wheels [--list .ci/gpu-carry.txt] [--dest .whl] [--dry-run]

There, from the checkout's root, with no network and nothing else installed first:

    python3 benchmarks/gpu_check.py run --wheels .whl --out results/
    python3 benchmarks/gpu_check.py run --wheels .whl --out results/ --only gpu-tests   # a rerun

``run --wheels`` installs the wheels and this checkout's mlmkit into a folder of its own with
``pip --target`` (never into the image's Python), then runs each step with a time limit inside an
overall budget (``--budget``; on a GPU the sum of the limits, 7.25 minutes, so that a fresh
machine's start and the install fit in 8):
  1. smoke (30 s): bert-tiny for 5 steps with 2 dataloader workers started by spawn, and the
     attention kernels SDPA takes for the later steps' shapes (``benchmarks/gpu_smoke.py``); when
     it fails the other steps are skipped (``--keep-going`` runs them), not when it runs out of
     time;
  2. the GPU-marked tests (``pytest -m gpu``): SDPA against eager in bf16, fp16 with its scaler,
     compiled layers, the documents mask, exact resume of on-device masks, flash-attn's where
     installed;
  3. bert-base at 128 tokens in bf16: mlmkit against ``Trainer(bf16=True)``, and mlmkit with
     ``train.compile=true`` (``benchmarks/gpu.py``);
  4. 20 steps of bert-base under ``torch.profiler``: the 15 CUDA kernels that take the most time
     and the share of the steps' time the GPU sat idle (``benchmarks/gpu_profile.py``);
  5. ``mlmkit doctor`` for bert-base (kernels, a rehearsal, parity, findings);
  6. modernbert-base at 1,024 tokens (mlmkit; ModernBERT's published rate is about 304k tokens/s
     per H100: 1.7T tokens in 194 h on 8 GPUs, Warner et al., 2024);
  7. ``mlmkit doctor`` for modernbert-base.
``--cpu`` runs the same steps with tiny models on a CPU, their training with 2 dataloader
workers (``make test`` rehearses it so, in a bare environment with the GPU image's versions,
``.ci/gpu-image.txt``, with each wheel set). Files in ``--out`` (at most eight, as a lent machine
returns): ``summary.json`` (each step's status, seconds and figures, rewritten as each step
ends), ``log.txt`` (every step's output), and one JSON file a step (``smoke.json``,
``gpu-*.json``, ``profile-*.json``, ``doctor-*.json``). Caches (tokenizers, packed data, the
site) go to ``--work``, a temporary folder by default.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CARRY = ROOT / ".ci" / "gpu-carry.txt"  # the floor set: mlmkit's lowest declared versions
NEWEST = ROOT / ".ci" / "gpu-carry-newest.txt"  # the newest releases of the same packages
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# published only as a source archive: built into a (pure Python) wheel here
BUILT = ("antlr4-python3-runtime",)
# Seconds for all steps together: on a GPU the sum of the steps' limits, so that a fresh machine's
# start (about 30 s) and the install (5 s) bring the command to under 8 minutes, and a rerun of
# the steps that failed (--only) fits the 15 minutes a session may hold the machine
GPU_BUDGET, CPU_BUDGET = 435, 900
MACHINE_START, INSTALL = 30, 5


def carried(path: Path = CARRY) -> list[str]:
    """The ``name==version`` lines of the carried packages' list."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def wheel_commands(dest: Path, pins: list[str] | None = None) -> list[list[str]]:
    """The pip commands that fill ``dest`` with ``pins`` (default: ``.ci/gpu-carry.txt``), each
    as pip resolves them for the GPU image's Python (3.12) on x86-64 Linux."""
    pins = carried() if pins is None else pins
    pip = [sys.executable, "-m", "pip"]
    binary = [p for p in pins if p.split("==")[0] not in BUILT]
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    download = [
        *pip,
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        *platforms,
        "-d",
        str(dest),
        *binary,
    ]
    built = [
        *pip,
        "wheel",
        "--no-deps",
        "-w",
        str(dest),
        *[p for p in pins if p.split("==")[0] in BUILT],
    ]
    return [download, built]


def wheels(args) -> int:
    dest = Path(args.dest)
    for command in wheel_commands(dest, carried(Path(args.list))):
        print(" ".join(command))
        if not args.dry_run and subprocess.run(command).returncode != 0:
            print(f"Error: pip {command[3]} failed; see pip's message above.", file=sys.stderr)
            return 1
    if not args.dry_run:
        print(f"{len(list(dest.glob('*.whl')))} wheels in {dest}; carry it to the GPU machine.")
    return 0


# ---- the check ---------------------------------------------------------------------------------

TINY = [
    "model.num_hidden_layers=2",
    "model.hidden_size=64",
    "model.num_attention_heads=2",
    "model.intermediate_size=128",
    "tokenizer.vocab_size=2000",
    "data.max_seq_length=64",
    "data.max_eval_samples=32",
    "train.batch_size=8",
]
SMOKE = "smoke"  # the first step: when it fails (not when it runs out of time), the rest is skipped
# The rehearsal's training runs take 2 dataloader workers, as a run on CUDA does by default
WORKERS = 2


def gpu_test_files() -> list[Path]:
    """The test files that hold tests marked ``gpu``: collecting the whole suite to run those
    imported every test module (seconds of a lent machine's time, and of the rehearsal's)."""
    return sorted(p for p in (ROOT / "tests").rglob("test_*.py") if "mark.gpu" in p.read_text())


def plan(out: Path, cache: Path, cpu: bool) -> list[tuple[str, list[str], int, Path | None]]:
    """(name, command, time limit in seconds, the figures' file) of each step: the smoke step
    first, then the most telling (a budget that runs out drops the last)."""
    py = sys.executable
    doctor = [py, "-m", "mlmkit", "doctor", "data=builtin", f"paths.cache_dir={cache}"]
    bench = ROOT / "benchmarks"
    smoke = [py, str(bench / "gpu_smoke.py"), "--cache", str(cache)]
    gpu = [py, str(bench / "gpu.py")]
    profile = [py, str(bench / "gpu_profile.py"), "--cache", str(cache)]
    tests = [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "-rs"]
    tests += [str(path) for path in gpu_test_files()]

    def step(name, command, limit):
        figures = out / f"{name}.json"
        return name, [*command, "--out", str(figures)], limit, figures

    if cpu:  # limits with room for a slow CPU (these steps check the script, not the speed)
        workers = f"train.num_workers={WORKERS}"
        return [
            step(SMOKE, [*smoke, "--tiny"], 180),
            ("gpu-tests", tests, 240, None),
            step(
                "gpu-bert",
                [
                    *gpu,
                    "--tiny",
                    "--corpus",
                    "builtin",
                    "--steps",
                    "2",
                    "--warmup",
                    "1",
                    "--workers",
                    str(WORKERS),
                ],
                360,
            ),
            step(
                "profile-bert",
                [*profile, "--tiny", "--steps", "4", "--warmup", "1", "--workers", str(WORKERS)],
                180,
            ),
            step("doctor-bert", [*doctor, "model=bert-tiny", *TINY, workers, "--steps", "4"], 240),
            step(
                "doctor-modernbert",
                [
                    *doctor,
                    "model=modernbert-tiny",
                    *TINY,
                    "model.local_attention=32",
                    workers,
                    "--steps",
                    "4",
                ],
                240,
            ),
        ]
    return [
        step(SMOKE, smoke, 30),
        ("gpu-tests", tests, 75, None),
        step(
            "gpu-bert-base",
            [*gpu, "--corpus", "builtin", "--steps", "150", "--warmup", "50", "--compile"],
            120,
        ),
        step("profile-bert-base", [*profile, "--steps", "20", "--warmup", "5"], 45),
        step(
            "doctor-bert-base",
            [*doctor, "model=bert-base", "train.batch_size=128", "data.max_seq_length=128"],
            60,
        ),
        step(
            "gpu-modernbert-base",
            [
                *gpu,
                "--corpus",
                "builtin",
                "--preset",
                "modernbert-base",
                "--seq",
                "1024",
                "--batch",
                "32",
                "--steps",
                "100",
                "--warmup",
                "50",
            ],
            60,
        ),
        step(
            "doctor-modernbert-base",
            [*doctor, "model=modernbert-base", "train.batch_size=32", "data.max_seq_length=1024"],
            45,
        ),
    ]


def install(wheel_dir: Path, site: Path, log) -> int:
    """Install the carried wheels and this checkout's mlmkit (built from a copy of its sources,
    with the Python's own setuptools: no index, no build isolation) into ``site``."""
    pip = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--no-cache-dir",
        "--upgrade",
        "--target",
        str(site),
    ]
    found = sorted(str(p) for p in wheel_dir.glob("*.whl"))
    if not found:
        log.write(f"no wheels in {wheel_dir}: make gpu-wheels fills it\n")
        return 1
    source = site.parent / "mlmkit-source"
    shutil.rmtree(source, ignore_errors=True)
    for part in ("src", "conf"):
        shutil.copytree(
            ROOT / part, source / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
        )
    for part in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / part, source / part)
    for command in ([*pip, *found], [*pip, "--no-build-isolation", str(source)]):
        log.write(f"\n==== install: {' '.join(command)}\n")
        log.flush()
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
        if code:
            return code
    return 0


def software(env: dict) -> dict[str, str | None]:
    """The versions the figures depend on (None: not installed) and the GPU, as the steps see
    them (with ``env``'s PYTHONPATH)."""
    code = (
        "import importlib.metadata as m, json, torch\n"
        "def v(n):\n"
        "    try: return m.version(n)\n"
        "    except m.PackageNotFoundError: return None\n"
        "names = ('torch', 'torchvision', 'transformers', 'accelerate', 'datasets', 'pyarrow', "
        "'dill', 'multiprocess', 'fsspec', 'evaluate', 'hydra-core', 'numpy', 'flash-attn', "
        "'mlmkit')\n"
        "found = {n: v(n) for n in names}\n"
        "found['python'] = '.'.join(map(str, __import__('sys').version_info[:3]))\n"
        "found['gpu'] = torch.cuda.get_device_name() if torch.cuda.is_available() else None\n"
        "print(json.dumps(found))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT
    )
    return json.loads(proc.stdout) if proc.returncode == 0 else {"error": proc.stderr[-500:]}


class Summary:
    """``summary.json``, rewritten whole after every step."""

    def __init__(self, out: Path, cpu: bool) -> None:
        self.path, self.data = out / "summary.json", {"cpu": cpu, "software": None, "steps": {}}

    def record(self, name: str, status: str, seconds: float, figures: Path | None = None) -> None:
        step = {"status": status, "seconds": round(seconds, 1)}
        if figures is not None and figures.is_file():
            step["figures"] = json.loads(figures.read_text())
        self.data["steps"][name] = step
        self.write()
        print(f"{name}: {status} in {step['seconds']} s", flush=True)

    def write(self) -> None:
        partial = self.path.with_name("summary.json.partial")
        partial.write_text(json.dumps(self.data, indent=1, default=str))
        partial.replace(self.path)


def run_step(command: list[str], limit: float, env: dict, log) -> str:
    """Run one step with its output in ``log``; its status."""
    try:
        code = subprocess.run(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, timeout=limit
        ).returncode
    except subprocess.TimeoutExpired:
        return f"timeout after {limit:.0f} s"
    return "ok" if code == 0 else f"failed ({code})"


def chosen_steps(steps: list, args) -> list:
    """The plan's steps that ``--only`` names (all by default), in the plan's order."""
    if not getattr(args, "only", None):
        return steps
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(names) - {s[0] for s in steps})
    if unknown:
        raise SystemExit(
            f"--only: no step {', '.join(unknown)}; the steps: {', '.join(s[0] for s in steps)}"
        )
    return [s for s in steps if s[0] in names]


def run(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work or tempfile.mkdtemp(prefix="mlmkit-gpu-check-"))
    steps = chosen_steps(plan(out, work / "cache", args.cpu), args)  # --only checked first
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    summary, budget = (
        Summary(out, args.cpu),
        args.budget or (CPU_BUDGET if args.cpu else GPU_BUDGET),
    )
    deadline = time.monotonic() + budget
    with open(out / "log.txt", "w", encoding="utf-8") as log:
        if args.wheels:
            site, started = work / "site", time.monotonic()
            code = install(Path(args.wheels), site, log)
            summary.record(
                "install", "ok" if code == 0 else f"failed ({code})", time.monotonic() - started
            )
            if code:
                return 1
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
        summary.data["software"] = software(env)
        smoke_failed = False
        for name, command, limit, figures in steps:
            left = deadline - time.monotonic()
            if smoke_failed:
                summary.record(name, f"skipped (the {SMOKE} step failed)", 0.0)
                continue
            if left < 20:
                summary.record(name, "skipped (the budget ran out)", 0.0)
                continue
            log.write(f"\n==== {name}: {' '.join(command)}\n")
            log.flush()
            started = time.monotonic()
            status = run_step(command, min(limit, left), env, log)
            summary.record(name, status, time.monotonic() - started, figures)
            # a smoke step that failed: the environment cannot train, and every other step would
            # fail on the same; one that ran out of time may only be slow, and the others run
            smoke_failed = (
                name == SMOKE
                and status.startswith("failed")
                and not getattr(args, "keep_going", False)
            )
    done = summary.data["steps"].values()
    ok = sum(step["status"] == "ok" for step in done)
    print(f"{ok} of {len(done)} steps ok; figures in {out}")
    return 0 if ok == len(done) else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser(
        "wheels", help="download and build the wheels the GPU image lacks (needs PyPI)"
    )
    w.add_argument("--dest", default=str(ROOT / ".whl"))
    w.add_argument(
        "--list",
        default=str(CARRY),
        help=f"the name==version list (default {CARRY.relative_to(ROOT)}; the newest set: "
        f"{NEWEST.relative_to(ROOT)})",
    )
    w.add_argument("--dry-run", action="store_true", help="print the pip commands only")
    r = sub.add_parser("run", help="run the check and write its figures")
    r.add_argument("--out", required=True, help="the figures' folder (at most eight files)")
    r.add_argument(
        "--wheels",
        default=None,
        help="install these wheels and this checkout into --work first (a bare GPU image)",
    )
    r.add_argument(
        "--work", default=None, help="caches and the installed site (default: a temporary folder)"
    )
    r.add_argument(
        "--budget",
        type=float,
        default=None,
        help=f"seconds for all steps (default {GPU_BUDGET}; {CPU_BUDGET} with --cpu)",
    )
    r.add_argument("--cpu", action="store_true", help="tiny models on a CPU: checks the script")
    r.add_argument(
        "--only",
        default=None,
        help=f"run only these steps (comma-separated names, e.g. {SMOKE},gpu-tests: a rerun)",
    )
    r.add_argument(
        "--keep-going",
        action="store_true",
        help=f"run the other steps even when the {SMOKE} step fails",
    )
    i = sub.add_parser(
        "install", help="only install the wheels and this checkout into a site (make test-floor)"
    )
    i.add_argument("--wheels", required=True)
    i.add_argument("--site", required=True)
    args = p.parse_args()
    if args.command == "install":
        return install(Path(args.wheels), Path(args.site).resolve(), sys.stdout)
    return wheels(args) if args.command == "wheels" else run(args)


if __name__ == "__main__":
    sys.exit(main())
