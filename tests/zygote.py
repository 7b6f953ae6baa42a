"""A zygote for the tests' interpreters: one process imports torch, transformers, datasets,
accelerate and mlmkit once; each command is then a process forked from it, with the caller's
argv, working dir, environment and standard streams, exit status and signals, instead of a new
interpreter that spends about 4.5 s importing the same modules.

    python zygote.py serve <socket>        the server (conftest.py's ``zygote`` starts it)
    python -S zygote.py <args>             the client: the ``python`` an example script finds
                                           first on its PATH (``write_client``)

The client runs ``python [-u] -m <module> | <script> | -c <code> | - ...`` in a child of the
server, in a process group of its own, whose ``sys.executable`` is the client again (so the
processes a command starts, a benchmark's runs or accelerate's ranks, are forked too). The real
interpreter runs instead for any other flag, a script that is not there, a caller started with
file descriptors above 2 (a spawned worker, a resource tracker), and an environment that differs
from the server's in what is read at start-up or import (``STARTUP_PREFIXES``: PYTHON*, HF_*,
OMP_*, ...), beyond what the child sets itself (a thread count, added PYTHONPATH dirs, the
progress-bar switches). The caller killed, the command's group is killed. ``MLMKIT_ZYGOTE=0`` in the
environment (or no server) makes every command a new interpreter, as a user's shell starts it.
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import struct
import sys

# the modules every mlmkit command imports, whichever it is (the server's start, once)
PRELOAD = (
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "datasets",
    "accelerate",
    "mlmkit.cli",
    "mlmkit.pretrain",
    "mlmkit.finetune.loop",
    "mlmkit.evaluation.mlm",
)
ENV_SOCKET, ENV_PYTHON, ENV_CLIENT = (
    "MLMKIT_ZYGOTE_SOCKET",
    "MLMKIT_ZYGOTE_PYTHON",
    "MLMKIT_ZYGOTE_CLIENT",
)
_HEADER = struct.Struct("!I")


def _send(sock: socket.socket, obj, fds: list[int] = ()) -> None:
    data = json.dumps(obj).encode()
    payload = _HEADER.pack(len(data)) + data
    if fds:
        sock.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.sendall(payload)


def _exactly(sock: socket.socket, size: int, data: bytes = b"") -> bytes | None:
    """``data`` read on to ``size`` bytes; None where the peer has gone first."""
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            return None
        data += more
    return data


def _receive(sock: socket.socket, with_fds: bool = False):
    """One message, read to its end and no further (and the file descriptors sent with it);
    None where the peer has gone."""
    fds: list[int] = []
    if with_fds:  # the header's first bytes carry the descriptors
        data, ancillary, _, _ = sock.recvmsg(_HEADER.size, socket.CMSG_LEN(16 * 4))
        for level, kind, raw in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", raw[: len(raw) - len(raw) % 4]))
    else:
        data = b""
    header = _exactly(sock, _HEADER.size, data) if data or not with_fds else None
    body = _exactly(sock, _HEADER.unpack(header)[0]) if header else None
    obj = json.loads(body) if body is not None else None
    return (obj, fds) if with_fds else obj


# ---- the server -------------------------------------------------------------------------------


def serve(path: str) -> None:
    """Import the modules once, then fork a child per connection and report its end."""
    import importlib

    _STARTED_WITH.update(os.environ)  # before the imports (torch sets TORCHINDUCTOR_CACHE_DIR)
    for name in PRELOAD:
        importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        if os.fork() == 0:  # a watcher per command: forks the command, waits for it, reports
            listener.close()
            _watch(conn)
        conn.close()
        _reap()


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


# what an interpreter or a library reads at start or import: a command whose environment differs
# from the server's in one of these runs in a new interpreter instead
STARTUP_PREFIXES = ("PYTHON", "HF_", "TRANSFORMERS_", "TORCH", "OMP_", "MKL_", "TOKENIZERS_")
_STARTED_WITH: dict[str, str] = {}  # the server's environment as it started


def _thread_count(env: dict[str, str]) -> int | None:
    """OMP_NUM_THREADS where it is a count, which a forked child gives torch with set_num_threads
    (the server has run no parallel region, so the child's first one starts that many threads)."""
    value = env.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def _added_path(env: dict[str, str]) -> list[str] | None:
    """PYTHONPATH's entries beyond the server's (accelerate adds its working dir for the ranks),
    which the child puts on sys.path; None where the server's are not all there or an added one
    holds a module the server has imported already, which only a new interpreter would take."""

    def entries(e):
        return [p for p in e.get("PYTHONPATH", "").split(os.pathsep) if p]

    mine, theirs = entries(_STARTED_WITH), entries(env)
    if [p for p in theirs if p in mine] != mine:
        return None
    added = [p for p in theirs if p not in mine]
    loaded = {name.partition(".")[0] for name in sys.modules}
    for entry in added:
        try:
            names = os.listdir(entry)
        except OSError:
            continue
        if any(name.partition(".")[0] in loaded for name in names):
            return None
    return added


PROGRESS_BARS = ("HF_DATASETS_DISABLE_PROGRESS_BARS", "HF_HUB_DISABLE_PROGRESS_BARS")


def _progress_bars(env: dict[str, str], name: str) -> bool:
    """Whether ``env`` turns progress bars off with ``name`` (one of PROGRESS_BARS, which the
    libraries read at import and the child sets through their own switches)."""
    return env.get(name, "").upper() in ("1", "ON", "YES", "TRUE")


def _startup_differences(env: dict[str, str]) -> list[str]:
    """The names in which ``env`` differs from what the server started with of STARTUP_PREFIXES
    (not ``PYTHON``, an example's name for its interpreter, TORCHINDUCTOR_CACHE_DIR, which
    importing torch sets to its default, torchrun's per-rank TORCHELASTIC_* and TORCH_NCCL_*, read
    later, nor a thread count, added PYTHONPATH entries or the progress-bar switches, which the
    child sets)."""

    def startup(e):
        return {
            k: v
            for k, v in e.items()
            if k.startswith(STARTUP_PREFIXES)
            and k not in ("PYTHON", "TORCHINDUCTOR_CACHE_DIR")
            and not k.startswith(("TORCHELASTIC_", "TORCH_NCCL_"))
        }

    mine, theirs = startup(_STARTED_WITH), startup(env)
    honoured = [  # bars the server's start turned off stay off for good
        name
        for name in PROGRESS_BARS
        if _progress_bars(env, name) or not _progress_bars(_STARTED_WITH, name)
    ]
    honoured += [
        name
        for name, found in (("OMP_NUM_THREADS", _thread_count), ("PYTHONPATH", _added_path))
        if found(env) is not None
    ]
    for name in honoured:  # which the child sets itself
        mine.pop(name, None)
        theirs.pop(name, None)
    return sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))


def _watch(conn: socket.socket) -> None:
    import threading

    request, fds = _receive(conn, with_fds=True)
    if request is None or len(fds) != 3:
        os._exit(1)
    differences = _startup_differences(request["env"])
    if differences:
        _send(conn, {"exec": differences})
        os._exit(0)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run_command(request, fds)
    for fd in fds:
        os.close(fd)
    _send(conn, {"pid": pid})
    ended = threading.Event()

    def caller_gone():  # the caller killed (with its process group): the command's group too
        try:
            while conn.recv(64):
                pass
        except OSError:
            pass
        if not ended.is_set():
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    threading.Thread(target=caller_gone, daemon=True).start()
    _, status = os.waitpid(pid, 0)
    ended.set()
    try:
        _send(conn, {"status": status})
    except OSError:
        pass
    os._exit(0)


def _set_progress_bars(env: dict[str, str]) -> None:
    """The datasets and huggingface_hub progress bars on or off as ``env`` asks."""
    import datasets
    import huggingface_hub.utils

    switches = {
        "HF_DATASETS_DISABLE_PROGRESS_BARS": datasets,
        "HF_HUB_DISABLE_PROGRESS_BARS": huggingface_hub.utils,
    }
    for name, library in switches.items():
        if _progress_bars(env, name):
            library.disable_progress_bars()
        elif not _progress_bars(_STARTED_WITH, name):
            library.enable_progress_bars()


def _run_command(request: dict, fds: list[int]) -> None:
    """In the forked child: become ``python <args>`` as started by the caller."""
    import atexit
    import traceback

    os.setsid()  # a group of its own, which the watcher ends with everything it started
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[1:1] = _added_path(request["env"]) or []
    threads = _thread_count(request["env"])
    if threads and _STARTED_WITH.get("OMP_NUM_THREADS") != str(threads):
        import torch

        torch.set_num_threads(threads)
    _set_progress_bars(request["env"])
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.executable = request["python"]  # what the command starts goes through the client too
    if request["unbuffered"]:
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    code = 0
    try:
        _run_main(request["args"], request["cwd"])
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:  # the interpreter prints any other object and ends with 1
            print(exc.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:  # the interpreter ends by SIGINT itself
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        import threading

        threading._shutdown()  # non-daemon threads joined, as at an interpreter's end
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        if code == -signal.SIGINT:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            code = 128 + signal.SIGINT
        os._exit(code)


def _run_main(args: list[str], cwd: str) -> None:
    """``-m module``, ``-c code``, ``-`` (the code on stdin) or a script, with sys.argv and
    sys.path[0] as the interpreter sets them."""
    import runpy

    kind, rest = args[0], args[1:]
    if kind == "-m":
        sys.path[0], sys.argv = cwd, ["-m", *rest[1:]]
        runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
    elif kind in ("-c", "-"):
        import types

        code = rest[0] if kind == "-c" else sys.stdin.read()
        sys.path[0], sys.argv = "", ["-c" if kind == "-c" else "-", *rest[kind == "-c" :]]
        main = sys.modules["__main__"] = types.ModuleType("__main__")
        exec(compile(code, "<string>" if kind == "-c" else "<stdin>", "exec"), main.__dict__)
    else:
        script = os.path.join(cwd, kind)
        sys.path[0], sys.argv = os.path.dirname(os.path.realpath(script)), [kind, *rest]
        runpy.run_path(script, run_name="__main__")


# ---- the client -------------------------------------------------------------------------------


def _forkable(args: list[str]) -> tuple[bool, list[str]] | None:
    """``(unbuffered, the rest)`` of an invocation the server runs: ``[-u] -m <module> ...``,
    ``-c <code> ...``, ``- ...`` or ``<script> ...``; None for any other flag or none."""
    unbuffered = args[:1] == ["-u"]
    rest = args[unbuffered:]
    if not rest or (rest[0] in ("-m", "-c") and len(rest) < 2):
        return None
    if rest[0].startswith("-") and rest[0] not in ("-m", "-c", "-"):
        return None
    if not rest[0].startswith("-") and not os.path.isfile(rest[0]):
        return None  # the interpreter's own message and status for a script that is not there
    if _inherited_descriptors():  # a spawned worker, a resource tracker: fds it cannot pass
        return None
    return unbuffered, rest


def _inherited_descriptors() -> list[int]:
    """The open file descriptors above 2 this process was started with."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                os.fstat(fd)
            except OSError:  # the listing's own, closed by now
                continue
            found.append(fd)
    return found


def _log(how: str, args: list[str]) -> None:
    """A line per invocation in the file MLMKIT_ZYGOTE_LOG names, if it names one."""
    if os.environ.get("MLMKIT_ZYGOTE_LOG"):
        with open(os.environ["MLMKIT_ZYGOTE_LOG"], "a") as f:
            f.write(f"{how}: {' '.join(args)[:200]}\n")


def client(args: list[str]) -> None:
    """``python <args>``: through the server where it can run them, else the interpreter."""
    python, path = os.environ[ENV_PYTHON], os.environ.get(ENV_SOCKET, "")
    forkable = _forkable(args) if os.environ.get("MLMKIT_ZYGOTE", "1") != "0" else None
    if forkable is None or not os.path.exists(path):
        _log("interpreter", args)
        os.execv(python, [python, *args])
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        os.execv(python, [python, *args])
    env = {k: v for k, v in os.environ.items() if k not in (ENV_SOCKET, ENV_PYTHON, ENV_CLIENT)}
    request = {"args": forkable[1], "unbuffered": forkable[0], "cwd": os.getcwd(), "env": env}
    _send(sock, {**request, "python": os.environ[ENV_CLIENT]}, [0, 1, 2])
    reply = _receive(sock)
    if reply is None:
        sys.exit("zygote: the server ended before the command started")
    if reply.get("exec"):  # an environment that differs from the server's at start-up
        sock.close()
        _log(f"interpreter (environment: {' '.join(reply['exec'])})", args)
        os.execv(python, [python, *args])
    pid = reply["pid"]
    _log("forked", args)

    def forward(sig, _frame):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
        signal.signal(sig, forward)
    end = _receive(sock)
    if end is None:
        sys.exit("zygote: the server ended during the command")
    status = end["status"]
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status))


def write_client(folder, socket_path, python: str = sys.executable):
    """``<folder>/python``: the client, for the front of PATH or in place of sys.executable."""
    from pathlib import Path

    shim = Path(folder) / "python"
    here = Path(__file__).resolve()
    shim.write_text(
        f'#!/bin/sh\n{ENV_SOCKET}="{socket_path}" {ENV_PYTHON}="{python}" {ENV_CLIENT}="{shim}" '
        f'exec "{python}" -S "{here}" "$@"\n'
    )
    shim.chmod(0o755)
    return shim


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2])
    else:
        client(sys.argv[1:])
