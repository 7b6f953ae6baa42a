"""The one error handler of every command: a user's error is one sentence and exit status 2."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

from mlmkit.errors import ConfigError, MLMKitError, Preempted


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


class ArgumentParser(argparse.ArgumentParser):
    """argparse for the commands with plain arguments; a bad command line is one sentence
    (``ConfigError``) instead of argparse's usage and message."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{self.prog}: {message.rstrip('.')}; see {self.prog} --help.")


def run_hydra_main(run: Callable[[], None]) -> None:
    """Run a ``@hydra.main`` function; a config Hydra cannot compose (a misspelt key or
    group option, a value of the wrong type, an override it cannot parse) is one sentence
    and exit status 2 instead of Hydra's report of several lines."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    saved = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises the error instead of printing it
    try:
        run()
    except (HydraException, OmegaConfBaseException) as exc:
        print(f"Error: {hydra_error_sentence(exc)}", file=sys.stderr)
        sys.exit(2)
    finally:
        if saved is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = saved


def hydra_error_sentence(exc: BaseException) -> str:
    """One sentence for an error of Hydra's composition (it names the setting)."""
    options = getattr(exc, "options", None)
    missing = getattr(exc, "missing_cfg_file", None)
    if missing and "/" in missing and options:  # model=bert-huge
        group, name = missing.rsplit("/", 1)
        return f"{group}={name} is not a preset; choose one of {', '.join(options)}."
    override = getattr(exc, "override", None)
    if override:  # an override that does not parse
        return (f"Cannot parse the setting {override!r} ({_first_line(exc)}); write it as "
                "key=value, with lists as key=[a,b] quoted for the shell.")
    text = _first_line(exc)
    if text.startswith("Ambiguous value for argument"):  # a, b without --multirun
        return (f"{text}; write key=[a,b] for a list, quote 'a,b' for a text, or add --multirun "
                "to sweep over the values.")
    text = text.replace("Error merging override", "Cannot apply the setting", 1)
    if exc.__cause__ is not None:
        text = f"{text}: {_first_line(exc.__cause__)}"
    return text + "."


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__).rstrip(".")


def _hand_back_signal(signum: int | None) -> None:
    """After the checkpoint, pass a SIGUSR1 or SIGUSR2 on to the handler that was there before
    training.

    Under Hydra's submitit launcher that is submitit's (SIGUSR2 by default, or the signal of
    ``SUBMITIT_PREEMPT_SIGNAL``), which requeues the SLURM job and exits; the requeued job runs
    the same overrides, and train.resume=auto continues from the checkpoint.
    """
    user_signals = {getattr(signal, name, None) for name in ("SIGUSR1", "SIGUSR2")} - {None}
    if signum is None or signum not in user_signals:
        return
    handler = signal.getsignal(signum)
    if callable(handler):
        handler(signum, None)
