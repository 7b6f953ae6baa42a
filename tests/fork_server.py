"""Start ``python train.py ...`` and ``python -m mlmkit ...`` for the tests without paying for
Python's start and the imports of torch, transformers and datasets each time.

    python tests/fork_server.py SOCKET

The server imports what the commands import, then listens on a Unix socket. Each request (one
JSON line: argv, cwd, env, an optional file-size limit, whether to start a new session) is
answered by forking a child that runs the command as a fresh interpreter would (``runpy``, with
``sys.argv`` set, stdout and stderr in the request's files, exit status as ``python`` gives it).
The server replies with the child's pid at once and with its exit status when it ends.

The server only imports: it never runs a torch operation, so no OpenMP thread pool exists when
it forks. The client sends only requests whose environment agrees with the server's in the
variables that libraries read at import (``runs.IMPORT_TIME``); the child takes the request's
whole environment.

A second server, forked after the libraries' imports and before mlmkit's, answers on
``SOCKET.plain``: its children have never imported mlmkit, for the checks that an export loads
with transformers or sentence-transformers alone.
"""

from __future__ import annotations

import json
import os
import resource
import runpy
import selectors
import signal
import socket
import sys
import threading
import traceback


def preload_libraries() -> None:
    """What the commands import besides mlmkit: the model classes and pipelines, the trackers,
    sentence-transformers, and DeepSpeed (accelerate's unwrap_model imports it, and with it
    MLflow, where it is installed: over 2 s)."""
    import importlib.util

    import matplotlib

    matplotlib.use("Agg")
    import accelerate  # noqa: F401
    import datasets  # noqa: F401
    import hydra  # noqa: F401
    import matplotlib.pyplot  # noqa: F401
    import torch  # noqa: F401
    import torch.utils.tensorboard  # noqa: F401
    import transformers  # noqa: F401
    from transformers import (  # noqa: F401
        AutoConfig,
        AutoModelForMaskedLM,
        AutoTokenizer,
        BertForMaskedLM,
        BertForSequenceClassification,
        BertTokenizerFast,
        ModernBertForMaskedLM,
        ModernBertForSequenceClassification,
        pipeline,
    )
    from transformers.pipelines import fill_mask  # noqa: F401

    try:  # transformers' table of checkpoint renamings (a thousand regular expressions), built at
        # a process's first save or load of a model: built here once, for every child
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping

        get_checkpoint_conversion_mapping("bert")
    except ImportError:  # a transformers without it
        pass
    for optional in ("deepspeed", "sentence_transformers", "hydra_plugins.hydra_submitit_launcher"):
        if importlib.util.find_spec(optional.split(".")[0]) is not None:
            importlib.import_module(optional)
    if importlib.util.find_spec("deepspeed") is not None:
        # DeepSpeed's collectives on a CPU go through gloo, as on any host without its shared-memory
        # kernels: those are DeepSpeed's own C++ extension, compiled at the first use on a machine
        # (over a minute on two cores, in every fresh CI run), and not what the tests check
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def preload_mlmkit() -> None:
    """mlmkit's commands, the built-in corpus, the schemas and one composed config."""
    import importlib

    import mlmkit.cli
    for module, _, _ in mlmkit.cli.COMMANDS.values():
        importlib.import_module(module)
    import mlmkit.export.run  # noqa: F401
    from mlmkit.data.sources import builtin_documents

    builtin_documents()  # parsed once here (a few seconds), read from memory by every child
    from mlmkit.config.compose import register_configs

    register_configs()  # the schemas stored with Hydra once here, not by every command
    from mlmkit.cli.train import compose

    compose(["model=bert-mini", "train.max_steps=3", "optim.lr=1e-3"])  # the parsers' tables built once


def run_child(request: dict) -> None:
    """In the forked process: the command as ``python <argv>`` runs it (never returns)."""
    status = 1
    try:
        if request.get("new_session"):
            os.setsid()
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(target, fd)
            os.close(target)
        if request.get("file_size_limit"):
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG
            hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
            resource.setrlimit(resource.RLIMIT_FSIZE, (request["file_size_limit"], hard))
        os.environ.clear()  # the request's own (it agrees with the server's where imports read)
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        status = _run_argv(request["argv"])
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            status = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        try:  # what the interpreter does at its end: wait for threads, run atexit, flush
            threading._shutdown()
            import atexit

            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)


def _run_argv(argv: list[str]) -> int:
    """``argv`` without the interpreter: ``script.py args``, ``-m module args`` or ``-c code args``."""
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
    elif argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")
    return 0


def serve(path: str) -> None:
    """Import, then answer requests on ``path`` until the test process that started the server
    ends. After the libraries and before mlmkit, a second server forks off and answers on
    ``path + PLAIN``: its children have torch, transformers and sentence-transformers loaded
    and nothing of mlmkit, for the checks that an export loads without mlmkit."""
    parent = os.getppid()  # read before the imports: a test process may end while they run
    preload_libraries()
    server = os.getpid()  # read before the fork: the server may end before the child reads it
    if os.fork() == 0:
        _listen(path + PLAIN, server)  # ends with the server it forked from
    else:
        preload_mlmkit()
        _listen(path, parent)


PLAIN = ".plain"


def _listen(path: str, parent: int) -> None:
    """Fork a child for each request on the socket ``path`` while ``parent`` lives; never returns."""
    sys.stdout.flush()
    sys.stderr.flush()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(16)
    os.rename(path + ".tmp", path)  # the path appears once connections are taken
    listener.setblocking(False)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    while os.getppid() == parent:
        for key, _ in selector.select(timeout=0.02):
            conn, _ = key.fileobj.accept()
            conn.setblocking(True)
            request = json.loads(conn.makefile().readline())
            pid = os.fork()
            if pid == 0:
                listener.close()
                run_child(request)
            children[pid] = conn
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        while children:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                reply = {"returncode": os.waitstatus_to_exitcode(wait_status)}
                try:
                    conn.sendall(json.dumps(reply).encode() + b"\n")
                except OSError:
                    pass
                conn.close()
    os._exit(0)


if __name__ == "__main__":
    serve(sys.argv[1])
