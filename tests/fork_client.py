"""``python`` for shell scripts under test: each command runs as a child of the test process's
fork server (tests/fork_server.py) instead of a fresh interpreter that imports torch again.

    python tests/fork_client.py CONFIG.json [python's arguments]

CONFIG.json (written by the ``bin_dir`` fixture of tests/e2e/test_examples.py) names the
server's socket, the variables its imports read (``runs.IMPORT_TIME``) with the values the
server has, the real interpreter and this client's own executable. The client behaves as the interpreter
would for the script that started it: the child's output comes out on the client's stdout and
stderr, the client exits with the child's status, and the signals it gets go on to the child's
process group. The child's ``sys.executable`` is this client's executable, so the commands
it starts (accelerate's ranks, submitit's jobs) are forked too. A signal the client inherited
as ignored is ignored in the child, as a fresh interpreter inherits it. Where the server
cannot run the command as python would (other variables at import, an option other than
``-u`` or ``-B``), the client becomes the real interpreter.

Only the standard library: the client starts in milliseconds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading

# run in the forked child (whose __main__ is tests/fork_server.py): the inherited ignored
# signals, sys.executable, the PYTHONPATH entries the server lacks (after the script's folder,
# where an interpreter puts them), then the command as ``python <argv>`` runs it
PRELUDE = """
import json, signal, sys

spec = json.loads(sys.argv.pop(1))
for name in spec["ignore"]:
    signal.signal(getattr(signal, name), signal.SIG_IGN)
sys.executable = spec["executable"]
sys.path[1:1] = [p for p in spec["pythonpath"] if p not in sys.path]
sys.modules["__main__"]._run_argv(spec["argv"])  # the fork server's, as for any command
"""

FORWARDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
INHERITED = ("SIGINT", "SIGQUIT", "SIGHUP", "SIGTERM", "SIGUSR1", "SIGUSR2")


def command(args: list[str]) -> list[str] | None:
    """``args`` without the options the server need not know of; None where it cannot run them."""
    while args and args[0] in ("-u", "-B"):
        args = args[1:]
    if not args or (args[0].startswith("-") and args[0] not in ("-m", "-c")):
        return None
    if args[0] in ("-m", "-c") and len(args) < 2:
        return None
    return args


def stable(env: dict, config: dict) -> dict:
    """The variables of ``env`` that imports read (those the server compares)."""
    prefixes, runtime, ignore = tuple(config["prefixes"]), tuple(config["runtime"]), set(config["ignore"])
    return {k: v for k, v in env.items()
            if k.startswith(prefixes) and not k.startswith(runtime) and k not in ignore}


def fresh(config: dict, args: list[str], why: str) -> None:
    if config.get("log"):
        with open(config["log"], "a") as f:
            f.write(f"{args[:3]}: {why}\n")
    os.execv(config["python"], [config["python"], *args])


def relay(path: str, fd: int) -> None:
    """Copy what the child writes into the FIFO ``path`` to this process's ``fd``."""
    with open(path, "rb", buffering=0) as fifo:
        while chunk := fifo.read(65536):
            os.write(fd, chunk)


def main() -> None:
    with open(sys.argv[1]) as f:
        config = json.load(f)
    args = sys.argv[2:]
    argv = command(args)
    if argv is None:
        fresh(config, args, "options the fork server does not take")
    # PYTHONPATH (accelerate's DeepSpeed launcher adds the working folder) only adds folders
    # to sys.path, which the child can do too: it does not keep a command from the server
    here, served = stable(dict(os.environ), config), dict(config["env"])
    pythonpath = [p for p in here.pop("PYTHONPATH", "").split(os.pathsep) if p]
    served.pop("PYTHONPATH", None)
    if here != served:
        differ = sorted(k for k in here.keys() | served.keys() if here.get(k) != served.get(k))
        fresh(config, args, f"other variables at import: {', '.join(differ)}")
    if not os.path.exists(config["socket"]):
        fresh(config, args, "no fork server")
    ignored = [name for name in INHERITED if signal.getsignal(getattr(signal, name)) == signal.SIG_IGN]
    spec = {"argv": argv, "ignore": ignored, "executable": config["executable"], "pythonpath": pythonpath}
    folder = tempfile.mkdtemp(prefix="mlmkit-client-")
    out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
    os.mkfifo(out)
    os.mkfifo(err)
    relays = [threading.Thread(target=relay, args=(path, fd), daemon=True) for path, fd in ((out, 1), (err, 2))]
    for thread in relays:
        thread.start()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(config["socket"])
    request = {"argv": ["-c", PRELUDE, json.dumps(spec)], "cwd": os.getcwd(), "env": dict(os.environ),
               "stdout": out, "stderr": err, "file_size_limit": None, "new_session": True}
    conn.sendall(json.dumps(request).encode() + b"\n")
    reader = conn.makefile("rb")
    pid = json.loads(reader.readline())["pid"]

    def forward(signum, frame):
        try:
            os.killpg(pid, signum)
        except OSError:
            pass

    for name in FORWARDED:
        signal.signal(getattr(signal, name), forward)
    line = reader.readline()  # the child's exit status, when it ends
    returncode = json.loads(line)["returncode"] if line else 1
    for path in (out, err):  # a child that never opened its FIFO: end the relay
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    for thread in relays:
        thread.join(timeout=30)
    shutil.rmtree(folder, ignore_errors=True)
    if returncode < 0:  # killed by a signal: end as the interpreter would have
        for name in FORWARDED:
            signal.signal(getattr(signal, name), signal.SIG_DFL)
        os.kill(os.getpid(), -returncode)
    sys.exit(returncode)


if __name__ == "__main__":
    main()
