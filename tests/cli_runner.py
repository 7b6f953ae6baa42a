"""Run many ``mlmkit`` command lines, each in a process of its own, without paying for
Python's start and the imports of torch, transformers and datasets every time.

    python tests/cli_runner.py jobs.json results.json [parallel]

``jobs.json`` maps names to argument lists (what follows ``mlmkit``). This process imports
mlmkit's commands once, then forks one child per job: the child runs ``mlmkit.cli.main``
as ``python -m mlmkit`` does (an uncaught exception prints its traceback and exits 1), with
stdout and stderr in files of its own. ``results.json`` maps each name to its exit status,
stdout, stderr and wall-clock seconds.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback


def preload() -> None:
    """What the commands import, so that each child finds it loaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401
    import transformers  # noqa: F401
    from transformers import AutoConfig, AutoTokenizer, BertForMaskedLM, pipeline  # noqa: F401
    from transformers.pipelines import fill_mask  # noqa: F401

    import mlmkit.cli.evaluate  # noqa: F401
    import mlmkit.cli.fill_mask  # noqa: F401
    import mlmkit.cli.finetune  # noqa: F401
    import mlmkit.cli.plot  # noqa: F401
    import mlmkit.cli.sweep  # noqa: F401
    import mlmkit.cli.tokenizer  # noqa: F401
    import mlmkit.cli.train  # noqa: F401
    import mlmkit.evaluation.finetune  # noqa: F401
    import mlmkit.evaluation.mlm  # noqa: F401
    import mlmkit.export.run  # noqa: F401


def child(args: list[str], out: str, err: str) -> None:
    """In the forked process: the command, then exit with its status (never returns)."""
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    status = 1
    try:
        from mlmkit.cli import main

        status = main(args) or 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            status = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def run_all(jobs: dict[str, list[str]], parallel: int) -> dict[str, dict]:
    preload()
    sys.stdout.flush()
    sys.stderr.flush()
    folder = tempfile.mkdtemp(prefix="mlmkit-cli-")
    pending = list(jobs.items())
    running: dict[int, tuple[str, str, str, float]] = {}
    results: dict[str, dict] = {}
    while pending or running:
        while pending and len(running) < parallel:
            name, args = pending.pop(0)
            out, err = (os.path.join(folder, f"{len(results) + len(running)}-{n}") for n in ("out", "err"))
            pid = os.fork()
            if pid == 0:
                child(args, out, err)
            running[pid] = (name, out, err, time.perf_counter())
        pid, wait_status = os.wait()
        name, out, err, started = running.pop(pid)
        with open(out, errors="replace") as o, open(err, errors="replace") as e:
            results[name] = {"returncode": os.waitstatus_to_exitcode(wait_status), "stdout": o.read(),
                             "stderr": e.read(), "seconds": round(time.perf_counter() - started, 2)}
    return results


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        todo = json.load(f)
    done = run_all(todo, int(sys.argv[3]) if len(sys.argv) > 3 else 2)
    with open(sys.argv[2], "w") as f:
        json.dump(done, f)
