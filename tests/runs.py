"""Helpers for tests that run train.py end to end."""

from __future__ import annotations

import atexit
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from fork_server import PLAIN  # the second server's socket: the first's path + PLAIN

ROOT = Path(__file__).resolve().parents[1]
# DS_ACCELERATOR: DeepSpeed's CPU accelerator, in the fork server and every command alike (a
# command whose import-time variables differ from the server's starts a fresh interpreter)
TEST_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "DS_ACCELERATOR": "cpu"}

TINY = [
    "model.num_hidden_layers=1", "model.hidden_size=32", "model.num_attention_heads=2",
    "model.intermediate_size=64", "tokenizer.vocab_size=1000", "tokenizer.max_train_chars=300000",
    "data.max_seq_length=64", "data.max_eval_samples=64", "train.batch_size=8", "train.progress=false",
    "train.log_every=5", "optim.warmup_steps=5",
]


def free_port() -> str:
    """A TCP port free now, for a launch's rendezvous (tests may run in parallel workers,
    each launching its own process group)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


# --- Python commands through the fork server (tests/fork_server.py) ---------------------------
# A command such as ``python train.py ...`` spends seconds importing torch, transformers and
# datasets before it does anything. The fork server imports them once per test process and forks
# a child per command: a process of its own (its own pid, exit status, signals, files), as a
# fresh interpreter runs it. MLMKIT_TEST_FORK=0 starts every command as a real process instead,
# as on any platform but Linux.

_server: dict = {}
_server_lock = threading.Lock()


def _server_path(env: dict | None = None) -> str | None:
    """The socket of this test process's fork server, started on first use with ``env`` (this
    process's, by default); None when off."""
    # Linux only: elsewhere forking a process that has loaded torch is not safe (macOS's
    # Objective-C runtime aborts such children), and every command starts a fresh interpreter
    if os.environ.get("MLMKIT_TEST_FORK", "1") == "0" or not sys.platform.startswith("linux"):
        return None
    with _server_lock:
        proc = _server.get("proc")
        if proc is None or proc.poll() is not None:
            path = os.path.join(tempfile.mkdtemp(prefix="mlmkit-fork-"), "socket")
            env = {**os.environ, **TEST_ENV} if env is None else env
            proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fork_server.py"), path],
                                    cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL)
            atexit.register(proc.kill)
            _server.update(proc=proc, path=path, env=env)
    return _listening(_server["path"], proc)


def _listening(path: str, server: subprocess.Popen) -> str | None:
    """``path`` once a server listens there (after its imports); None if the fork server ended
    or took over 5 minutes."""
    deadline = time.time() + 300
    while not os.path.exists(path):
        if server.poll() is not None or time.time() > deadline:
            return None
        time.sleep(0.05)
    return path


# Variables that torch, its math libraries, transformers, tokenizers, datasets or DeepSpeed read
# when they are imported: a command whose environment differs from the server's in one of
# these starts as a real process. Others (what a test or an in-process run sets, such as
# MLFLOW_ALLOW_FILE_STORE; TORCHINDUCTOR_CACHE_DIR, which inductor sets when it first compiles;
# PYTORCH_NVML_BASED_CUDA_CHECK, which accelerate sets; KMP_DUPLICATE_LIB_OK and
# KMP_INIT_AT_FORK, which an import sets for an OpenMP runtime the server has loaded already)
# are read at run time or no more, and the child takes the command's own.
IMPORT_TIME = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "TORCH", "PYTORCH_", "OMP_",
               "MKL_", "KMP_", "ONEDNN_", "DNNL_", "ATEN_", "OPENBLAS_", "CUDA_", "NCCL_", "DS_",
               "PYTHON", "LD_", "MLMKIT_TEST")
RUN_TIME = ("TORCHINDUCTOR_", "PYTORCH_NVML_BASED_CUDA_CHECK", "KMP_DUPLICATE_LIB_OK",
            "KMP_INIT_AT_FORK")


def write_fork_python(folder: Path) -> Path:
    """``folder/python``: an interpreter for commands that start python themselves (shell
    scripts, ``accelerate launch`` and its ranks, benchmarks): each command it runs is a child
    of the fork server (tests/fork_client.py), and so are the commands that one starts with
    ``sys.executable``; without a fork server, the real interpreter."""
    python = folder / "python"
    socket_path = _server_path()
    if socket_path is None:  # no fork server (MLMKIT_TEST_FORK=0, or not Linux): the interpreter
        python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    else:
        config = folder / "fork_client.json"
        prefixes, runtime = list(IMPORT_TIME), [*RUN_TIME, "TORCHELASTIC_", "TORCH_NCCL_"]
        # PYTHON (the scripts' interpreter setting) is no variable Python itself reads
        env = {k: v for k, v in _server["env"].items()
               if k.startswith(tuple(prefixes)) and not k.startswith(tuple(runtime)) and k != "PYTHON"}
        config.write_text(json.dumps({
            "socket": socket_path, "env": env, "prefixes": prefixes, "runtime": runtime,
            "ignore": ["PYTHON"], "python": sys.executable, "executable": str(python),
            "log": os.environ.get("MLMKIT_TEST_FORK_LOG")}))
        client = ROOT / "tests" / "fork_client.py"
        python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -E -S "{client}" "{config}" "$@"\n')
    python.chmod(0o755)
    return python


_fork_python: dict = {}


def fork_python() -> str:
    """This test process's ``write_fork_python`` interpreter (written on first use)."""
    if "path" not in _fork_python:
        _fork_python["path"] = str(write_fork_python(Path(tempfile.mkdtemp(prefix="mlmkit-python-"))))
    return _fork_python["path"]


def _stable(env: dict) -> dict:
    """The variables of ``env`` that imports read."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME) and not k.startswith(RUN_TIME)}


def _log_fresh(args: list[str], why) -> None:
    """With MLMKIT_TEST_FORK_LOG set, a line in that file for each command started as a fresh
    interpreter, and why (the variables that differ from the server's)."""
    if path := os.environ.get("MLMKIT_TEST_FORK_LOG"):
        why = "no fork server" if isinstance(why, dict) else why
        with open(path, "a") as f:
            f.write(f"{os.environ.get('PYTEST_CURRENT_TEST')}: {args[:2]}: {why}\n")


def start_fork_server() -> None:
    """Start this test process's fork server now, so that its imports overlap other tests."""
    env = {**os.environ, **TEST_ENV}
    threading.Thread(target=_server_path, args=(env,), daemon=True).start()


class ForkedProcess:
    """The part of ``subprocess.Popen`` the tests use, for a child of the fork server."""

    def __init__(self, args: list[str], conn: socket.socket, pid: int, out: str, err: str):
        self.args, self.pid, self.returncode = args, pid, None
        self._conn, self._out, self._err, self._buffer = conn, out, err, b""

    def _reply(self, timeout: float | None) -> dict | None:
        self._conn.settimeout(timeout)
        try:
            while b"\n" not in self._buffer:
                chunk = self._conn.recv(4096)
                if not chunk:
                    raise RuntimeError("the fork server stopped before the command ended")
                self._buffer += chunk
        except (TimeoutError, BlockingIOError):
            return None
        return json.loads(self._buffer.split(b"\n", 1)[0])

    def poll(self) -> int | None:
        if self.returncode is None and (reply := self._reply(0.0)) is not None:
            self.returncode = reply["returncode"]
            self._conn.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            reply = self._reply(timeout)
            if reply is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode = reply["returncode"]
            self._conn.close()
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        return tuple(Path(p).read_text(errors="replace") for p in (self._out, self._err))

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def _forked(args: list[str], cwd: Path, env: dict, file_size_limit: int | None,
            new_session: bool, plain: bool = False) -> ForkedProcess | None:
    """``python *args`` as a child of the fork server (with ``plain``, of its server that has
    never imported mlmkit), or None where it cannot run there."""
    path = _server_path()
    if path is not None and plain:
        path = _listening(path + PLAIN, _server["proc"])
    if path is None or _stable(env) != _stable(_server["env"]):  # some are read at import
        _log_fresh(args, env if path is None else
                   sorted(set(_stable(env).items()) ^ set(_stable(_server["env"]).items())))
        return None
    folder = tempfile.mkdtemp(prefix="mlmkit-run-")
    out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
    request = {"argv": args, "cwd": str(cwd), "env": env, "stdout": out, "stderr": err,
               "file_size_limit": file_size_limit, "new_session": new_session}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    conn.sendall(json.dumps(request).encode() + b"\n")
    proc = ForkedProcess([sys.executable, *args], conn, 0, out, err)
    reply = proc._reply(None)
    if "pid" not in reply:
        conn.close()
        return None
    proc.pid, proc._buffer = reply["pid"], proc._buffer.split(b"\n", 1)[1]
    return proc


def python_popen(*args: str, cwd: Path = ROOT, env: dict | None = None,
                 new_session: bool = False):
    """``python *args`` started (a ForkedProcess, or a Popen with text pipes)."""
    env = {**os.environ, **TEST_ENV} if env is None else env
    args = [str(a) for a in args]
    if (proc := _forked(args, cwd, env, None, new_session)) is not None:
        return proc
    return subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=new_session)


def python_run(*args: str, cwd: Path = ROOT, env: dict | None = None, timeout: float = 600,
               file_size_limit: int | None = None, check: bool = False,
               plain: bool = False) -> subprocess.CompletedProcess:
    """``python *args`` to its end, as ``subprocess.run(..., capture_output=True, text=True)``;
    ``file_size_limit``: a file cannot grow past that many bytes (the write fails with EFBIG,
    as on a full disk); ``plain``: in a process that has never imported mlmkit (a child of the
    fork server's second server, or a fresh interpreter)."""
    env = {**os.environ, **TEST_ENV} if env is None else env
    args = [str(a) for a in args]
    proc = _forked(args, cwd, env, file_size_limit, False, plain)
    if proc is None:
        limit = (lambda: _limit_file_size(file_size_limit)) if file_size_limit else None
        return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout, preexec_fn=limit, check=check)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    if check and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, out, err)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_train(run_dir: Path, cache_dir: Path, *overrides: str, check: bool = True,
              file_size_limit: int | None = None):
    """train.py with the tiny settings; ``file_size_limit``: a file cannot grow past that many
    bytes (the write fails with EFBIG, as on a full disk)."""
    proc = python_run(ROOT / "train.py", *TINY, f"paths.cache_dir={cache_dir}",
                      f"hydra.run.dir={run_dir}", *overrides, file_size_limit=file_size_limit)
    if check and proc.returncode != 0:
        raise AssertionError(f"train.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def _limit_file_size(nbytes: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of killing the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


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
    proc = python_run("-m", "mlmkit", "finetune", *overrides, timeout=900)
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
    good, bad = ["wonderful", "moving", "superb", "delightful"], ["dreadful", "tedious", "awful", "clumsy"]
    frames = ["the film is {}", "a {} story about a family", "{} acting from the whole cast", "it was {} to watch"]
    for name, n, offset in (("train.tsv", n_train, 0), ("dev.tsv", n_dev, 1)):
        lines = ["sentence\tlabel"]
        for i in range(n):
            label = i % 2
            word = (good if label else bad)[(i // 2 + offset) % 4]
            lines.append(f"{frames[(i // 8 + offset) % 4].format(word)}\t{label}")
        (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder
