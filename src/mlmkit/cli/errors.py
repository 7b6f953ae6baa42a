"""The one error handler of every command: a user's error is one sentence and exit status 2."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable

from mlmkit.errors import MLMKitError, Preempted


def report_errors(fn: Callable[[], int | None]) -> int:
    """Run ``fn``; a user's error becomes one sentence on stderr and exit status 2, a
    preemption the message and ``Preempted.exit_code`` (after the checkpoint)."""
    try:
        return fn() or 0
    except Preempted as exc:
        print(str(exc), file=sys.stderr)
        _hand_back_signal(exc.signum)
        return Preempted.exit_code
    except MLMKitError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2


def exit_on_error(fn: Callable[[], int | None]) -> None:
    """``report_errors``, then exit with its status when it is not 0 (inside Hydra's main,
    which would print a traceback for an exception)."""
    status = report_errors(fn)
    if status:
        sys.exit(status)


def _hand_back_signal(signum: int | None) -> None:
    """After the checkpoint, pass a SIGUSR1 on to the handler that was there before training.

    Under Hydra's submitit launcher that is submitit's, which requeues the SLURM job; the
    requeued job runs the same overrides, and train.resume=auto continues from the checkpoint.
    """
    if signum is None or signum != getattr(signal, "SIGUSR1", None):
        return
    handler = signal.getsignal(signum)
    if callable(handler):
        handler(signum, None)
