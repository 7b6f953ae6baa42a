"""Helpers for tests that run commands: in this process, or as real processes where the process
is the point."""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the environment of the tests' real processes (DS_ACCELERATOR: DeepSpeed's CPU accelerator)
TEST_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "DS_ACCELERATOR": "cpu"}

TINY = [
    "model.num_hidden_layers=1",
    "model.hidden_size=32",
    "model.num_attention_heads=2",
    "model.intermediate_size=64",
    "tokenizer.vocab_size=1000",
    "tokenizer.max_train_chars=300000",
    "data.max_seq_length=64",
    "data.max_eval_samples=64",
    "train.batch_size=8",
    "train.progress=false",
    "train.log_every=5",
    "optim.warmup_steps=5",
]


# accelerate launch's options for two processes on one machine, full precision, no compiler
def processes(n: int) -> list[str]:
    """``accelerate launch`` options for ``n`` CPU processes on this machine (gloo)."""
    return [
        "--multi_gpu",
        "--num_processes",
        str(n),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
    ]


TWO_PROCESSES = processes(2)

# the smallest run that trains, evaluates, checkpoints and exports (4 steps of 4 blocks of 32)
SMALLEST = [
    "model.num_hidden_layers=1",
    "model.hidden_size=32",
    "model.num_attention_heads=2",
    "model.intermediate_size=64",
    "tokenizer.vocab_size=300",
    "data.max_seq_length=32",
    "data.max_eval_samples=16",
    "train.batch_size=4",
    "train.progress=false",
    "train.log_every=2",
    "train.save_every=2",
    "train.max_steps=4",
    "train.precision=no",
    "logger=none",
]


def free_port() -> str:
    """A TCP port free now, for a launch's rendezvous (tests may run in parallel workers,
    each launching its own process group)."""

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


# --- Commands ----------------------------------------------------------------------------------
# A command runs in this process (``run_cli``: ``mlmkit.cli.main(argv)``), as litgpt's tests run
# theirs; a real process (``python_run``, ``python_popen``) only where the process is the point:
# signals, kills, launches of several processes, packaging, a process that never imported mlmkit.


@contextmanager
def _command_state(cwd: Path, env: dict | None):
    """Around an in-process command: its working dir and environment, then this process as it
    was: cwd, environment, sys.argv, signal handlers, logging, warnings filters, torch's
    threads and flags, Hydra's and accelerate's process-wide state."""
    import logging
    import warnings

    import torch

    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), list(sys.argv)
    signals = {
        s: signal.getsignal(s)
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
    }
    loggers = [logging.getLogger(), logging.getLogger("mlmkit")]
    logging_state = [(lg, list(lg.handlers), lg.level, lg.propagate, lg.disabled) for lg in loggers]
    # mlmkit's logger as a new process has it, whatever an earlier test left
    mlmkit_log = loggers[1]
    mlmkit_log.handlers[:], mlmkit_log.level, mlmkit_log.propagate = [], logging.NOTSET, True
    mlmkit_log.disabled = False
    torch_state = (
        torch.get_num_threads(),
        torch.are_deterministic_algorithms_enabled(),
        torch.get_float32_matmul_precision(),
    )
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    os.chdir(cwd)
    try:
        with warnings.catch_warnings():
            yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv[:] = saved_argv
        for sig, handler in signals.items():
            signal.signal(sig, handler)
        for lg, handlers, level, propagate, disabled in logging_state:
            for handler in set(lg.handlers) - set(handlers):
                handler.close()
            lg.handlers[:], lg.level, lg.propagate, lg.disabled = (
                handlers,
                level,
                propagate,
                disabled,
            )
        torch.set_num_threads(torch_state[0])
        torch.use_deterministic_algorithms(torch_state[1])
        torch.set_float32_matmul_precision(torch_state[2])
        _reset_libraries()


def _reset_libraries() -> None:
    """Forget Hydra's and accelerate's process-wide state, as a new process would have none."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    GlobalHydra.instance().clear()
    HydraConfig.instance().cfg = None
    if "accelerate.state" in sys.modules:
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)


def run_cli(
    *args,
    cwd: Path = ROOT,
    env: dict | None = None,
    file_size_limit: int | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess:
    """``mlmkit *args`` in this process, as a command line runs it: its exit status and what it
    wrote to stdout and stderr (an exception a process would die of is a traceback on stderr and
    status 1). ``env``: the command's whole environment (read at run time; what a library reads
    at import is this process's); ``file_size_limit``: a file cannot grow past that many bytes
    (the write fails with EFBIG, as on a full disk)."""
    import io
    import traceback
    from contextlib import nullcontext, redirect_stderr, redirect_stdout

    from mlmkit.cli import main

    args = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    limit = limited_file_size(file_size_limit) if file_size_limit else nullcontext()
    with _command_state(cwd, env), redirect_stdout(out), redirect_stderr(err), limit:
        try:
            code = main(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
        except Exception:
            traceback.print_exc()
            code = 1
    proc = subprocess.CompletedProcess(["mlmkit", *args], code or 0, out.getvalue(), err.getvalue())
    if check and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, proc.stdout, proc.stderr)
    return proc


def python_popen(
    *args: str, cwd: Path = ROOT, env: dict | None = None, new_session: bool = False
) -> subprocess.Popen:
    """``python *args`` started as a real process, with text pipes."""
    env = {**os.environ, **TEST_ENV} if env is None else env
    return subprocess.Popen(
        [sys.executable, *map(str, args)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=new_session,
    )


def python_run(
    *args: str, cwd: Path = ROOT, env: dict | None = None, timeout: float = 600, check: bool = False
) -> subprocess.CompletedProcess:
    """``python *args`` to its end in a real process, as ``subprocess.run(...,
    capture_output=True, text=True)``."""
    env = {**os.environ, **TEST_ENV} if env is None else env
    return subprocess.run(
        [sys.executable, *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=check,
    )


def run_train(
    run_dir: Path,
    cache_dir: Path,
    *overrides: str,
    check: bool = True,
    file_size_limit: int | None = None,
):
    """``mlmkit train`` (in this process) with the tiny settings; ``file_size_limit``: a file
    cannot grow past that many bytes (the write fails with EFBIG, as on a full disk)."""
    proc = run_cli(
        "train",
        *TINY,
        f"paths.cache_dir={cache_dir}",
        f"hydra.run.dir={run_dir}",
        *overrides,
        file_size_limit=file_size_limit,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"mlmkit train failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def _limit_file_size(nbytes: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of killing the process
    resource.setrlimit(
        resource.RLIMIT_FSIZE, (nbytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1])
    )


@contextmanager
def limited_file_size(nbytes: int):
    """In this process: writing a file past ``nbytes`` fails with EFBIG, as on a full disk."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.getsignal(signal.SIGXFSZ)
    _limit_file_size(nbytes)
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def events(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


# A resumed run repeats the uninterrupted one up to float rounding. Bit-equality is not
# asserted: on one machine an fp32 run with dataloader workers differed by 3.5e-7 relative in
# a logged loss, as a kernel's summation order can. A real resume fault is far larger: a
# scheduler one step ahead after the resume moves the next logged loss by 2e-4 relative.
RESUME_RTOL = 1e-6


def assert_same_losses(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> None:
    """The same logged steps, and losses within ``RESUME_RTOL``."""
    import pytest

    assert [s for s, _ in a] == [s for s, _ in b]  # none duplicated or lost
    for (step, x), (_, y) in zip(a, b):
        assert x == pytest.approx(y, rel=RESUME_RTOL), step


def assert_same_weights(a: dict, b: dict) -> None:
    """The same tensors, each within ``RESUME_RTOL`` of its largest magnitude."""
    assert a.keys() == b.keys()
    for name, tensor in b.items():
        diff = (a[name].float() - tensor.float()).abs().max()
        assert diff <= RESUME_RTOL * tensor.float().abs().max() + 1e-12, name


def run_finetune(*overrides: str, check: bool = True):
    """``mlmkit finetune`` with ``overrides``, from the checkout."""
    proc = run_cli("finetune", *overrides)
    if check and proc.returncode != 0:
        raise AssertionError(f"finetune failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def train_steps(run: Path) -> list[int]:
    """The steps of the run's train events so far (a line being written is left out)."""
    path, steps = Path(run) / "metrics.jsonl", []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if event.get("event") == "train":
            steps.append(event["step"])
    return steps


def write_probe_task(folder: Path, n_train: int = 80, n_dev: int = 40) -> Path:
    """A sentiment task any encoder can learn from its words: a positive or a negative word
    in otherwise shared sentences (GLUE's SST-2 layout)."""
    folder.mkdir(parents=True, exist_ok=True)
    good, bad = (
        ["wonderful", "moving", "superb", "delightful"],
        ["dreadful", "tedious", "awful", "clumsy"],
    )
    frames = [
        "the film is {}",
        "a {} story about a family",
        "{} acting from the whole cast",
        "it was {} to watch",
    ]
    for name, n, offset in (("train.tsv", n_train, 0), ("dev.tsv", n_dev, 1)):
        lines = ["sentence\tlabel"]
        for i in range(n):
            label = i % 2
            word = (good if label else bad)[(i // 2 + offset) % 4]
            lines.append(f"{frames[(i // 8 + offset) % 4].format(word)}\t{label}")
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch"]  # this interpreter's


def run_launch(cmd: list[str], timeout: int, check: bool = True) -> subprocess.CompletedProcess:
    """Run an ``accelerate launch`` command; on a timeout kill its workers too, then fail."""
    # TEST_ENV's DS_ACCELERATOR: DeepSpeed's CPU accelerator, also where a GPU is present
    env = {**os.environ, **TEST_ENV, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}
    what = "the launch (a rank left waiting in a collective?)"
    proc = ended_or_killed(cmd, timeout, what, cwd=ROOT, env=env)
    assert proc.returncode == 0 or not check, proc.stderr[-4000:]
    return proc


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def ended_or_killed(
    cmd: list[str], timeout: float, what: str, cwd: Path, env: dict
) -> subprocess.CompletedProcess:
    """Run ``cmd`` in a session of its own to its end; past ``timeout`` kill it and every process
    it started, then fail naming ``what``."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(
            f"{what} did not end within {timeout} s:\n{out[-2000:]}\n{err[-4000:]}"
        ) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def launch_engine(
    config: str,
    run_dir: Path,
    cache_dir: Path,
    *overrides: str,
    model: tuple = tuple(TINY),
    python: str = sys.executable,
    n: int = 2,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """Two CPU processes under accelerate's FSDP or DeepSpeed engine, as
    conf/accelerate/<config>.yaml sets it; ``model``: the settings before ``overrides``
    (TINY's model from scratch by default); ``python``: the interpreter that launches (the
    zygote's client: conftest.py's ``zygote_python``)."""
    cmd = [
        python,
        *ACCELERATE[1:],
        "--main_process_port",
        free_port(),
        "--config_file",
        str(ROOT / "conf" / "accelerate" / f"{config}.yaml"),
        "--num_processes",
        str(n),
        "--mixed_precision",
        "no",
        str(ROOT / "tests" / "engine_on_cpu.py"),
        *model,
        f"paths.cache_dir={cache_dir}",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]
    return run_launch(cmd, timeout=300, check=check)
