"""A zygote for the examples' ``python -m mlmkit ...`` commands: one process imports torch,
transformers, datasets, accelerate and mlmkit once; each command is then a process forked from
it, with the caller's argv, working dir, environment and standard streams, exit status and
signals, instead of a new interpreter that spends about 4.5 s importing the same modules.

    python zygote.py serve <socket>        the server (tests/e2e/test_examples.py starts it)
    python -S zygote.py <args>             the client: the ``python`` an example script finds
                                           first on its PATH

The client runs ``-m mlmkit`` commands in a child of the server and execs the real interpreter
for anything else (``python - <<EOF``, a script, ``-c``). Only what is read at import time is
the server's: the server starts with the tests' environment, which the examples' commands share
(HF_HUB_OFFLINE, TOKENIZERS_PARALLELISM, OMP_NUM_THREADS). ``MLMKIT_ZYGOTE=0`` in the
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
ENV_SOCKET, ENV_PYTHON = "MLMKIT_ZYGOTE_SOCKET", "MLMKIT_ZYGOTE_PYTHON"
_HEADER = struct.Struct("!I")


def _send(sock: socket.socket, obj, fds: list[int] = ()) -> None:
    data = json.dumps(obj).encode()
    payload = _HEADER.pack(len(data)) + data
    if fds:
        sock.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.sendall(payload)


def _receive(sock: socket.socket, with_fds: bool = False):
    """One message (and the file descriptors sent with it); None where the peer has gone."""
    fds: list[int] = []
    if with_fds:
        data, ancillary, _, _ = sock.recvmsg(1 << 20, socket.CMSG_LEN(16 * 4))
        for level, kind, raw in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.extend(array.array("i", raw[: len(raw) - len(raw) % 4]))
    else:
        data = sock.recv(1 << 20)
    if not data:
        return (None, fds) if with_fds else None
    while len(data) < _HEADER.size or len(data) < _HEADER.size + _HEADER.unpack(data[:4])[0]:
        more = sock.recv(1 << 20)
        if not more:
            return (None, fds) if with_fds else None
        data += more
    obj = json.loads(data[_HEADER.size : _HEADER.size + _HEADER.unpack(data[:4])[0]])
    return (obj, fds) if with_fds else obj


# ---- the server -------------------------------------------------------------------------------


def serve(path: str) -> None:
    """Import the modules once, then fork a child per connection and report its end."""
    import importlib

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


def _watch(conn: socket.socket) -> None:
    request, fds = _receive(conn, with_fds=True)
    if request is None or len(fds) != 3:
        os._exit(1)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run_command(request, fds)
    for fd in fds:
        os.close(fd)
    _send(conn, {"pid": pid})
    # the caller gone (killed with its process group) ends the command too
    import threading

    def caller_gone():
        try:
            while conn.recv(64):
                pass
        except OSError:
            pass
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    threading.Thread(target=caller_gone, daemon=True).start()
    _, status = os.waitpid(pid, 0)
    try:
        _send(conn, {"status": status})
    except OSError:
        pass
    os._exit(0)


def _run_command(request: dict, fds: list[int]) -> None:
    """In the forked child: become ``python -m mlmkit <args>`` as started by the caller."""
    import atexit
    import runpy
    import traceback

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path[0] = request["cwd"]  # what -m puts first
    sys.argv = ["-m", *request["args"]]
    code = 0
    try:
        runpy.run_module("mlmkit", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            code = 1
        else:
            code = exc.code or 0
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


# ---- the client -------------------------------------------------------------------------------


def client(args: list[str]) -> None:
    """``python <args>``: a ``-m mlmkit`` command through the server, anything else exec'd."""
    python, path = os.environ[ENV_PYTHON], os.environ.get(ENV_SOCKET, "")
    use = args[:2] == ["-m", "mlmkit"] and os.environ.get("MLMKIT_ZYGOTE", "1") != "0"
    if not use or not os.path.exists(path):
        os.execv(python, [python, *args])
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        os.execv(python, [python, *args])
    env = {k: v for k, v in os.environ.items() if k not in (ENV_SOCKET, ENV_PYTHON)}
    _send(sock, {"args": args[2:], "cwd": os.getcwd(), "env": env}, [0, 1, 2])
    reply = _receive(sock)
    if reply is None:
        sys.exit("zygote: the server ended before the command started")
    pid = reply["pid"]

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


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2])
    else:
        client(sys.argv[1:])
