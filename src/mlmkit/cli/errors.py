"""The one error handler of every command: a user's error is one sentence and exit status 2."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from mlmkit.errors import ConfigError, MLMKitError, Preempted, first_line

# Under ``mlmkit launch`` each rank reports how it ended (status, sentence) in a file of this
# folder, and the launcher prints each distinct sentence once and exits with the status.
LAUNCH_DIR_ENV = "MLMKIT_LAUNCH_DIR"
# torchrun's elastic agent restarts the ranks (another attempt): each attempt reports in a
# folder of its own, and the launcher reads the last one
ATTEMPT_ENV = "TORCHELASTIC_RESTART_COUNT"
PEER_GONE = 3  # the exit status of a rank that stopped because another process ended
INTERRUPTED = 130  # the shell's status for a process ended by Ctrl-C
# how torch.distributed's collectives fail when another process has ended (gloo, NCCL); not
# "Connection refused", which a rank that cannot reach the rendezvous gets (its traceback stays)
_PEER_GONE_TEXT = (
    "closed by peer",
    "reset by peer",
    "Broken pipe",
    "remote process exited",
    "communicator was aborted",
)


def report_errors(fn: Callable[[], int | None]) -> int:
    """Run ``fn``; a user's error becomes one sentence on stderr and exit status 2, a
    preemption the message and ``Preempted.exit_code`` (after the checkpoint). A rank of
    several whose collective fails because another rank ended (its error is that rank's to
    tell) exits with ``PEER_GONE`` and no traceback of its own. The sentence is said before
    the process group closes: the other ranks then stop, and a launcher that sees them end
    may terminate this one at once."""
    try:
        status = fn() or 0
        leave_process_group()
        return status
    except Preempted as exc:
        tell(Preempted.exit_code, str(exc), every_rank=False)
        leave_process_group()
        _end_elastic_agent(exc.signum)
        _hand_back_signal(exc.signum)
        return Preempted.exit_code
    except MLMKitError as exc:
        tell(2, f"Error: {exc}")
        leave_process_group()
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C where nothing stops cleanly, or a second one
        tell(INTERRUPTED, str(exc) or "Interrupted.", every_rank=False)
        leave_process_group()
        return INTERRUPTED
    except Exception as exc:
        if not peer_gone(exc):
            raise
        tell(PEER_GONE, None)
        # at once: the collective's threads would abort the interpreter's exit with a message
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(PEER_GONE)


def leave_process_group() -> None:
    """Close this rank's process group, if it has one, before the process ends: left to the
    interpreter's exit, gloo's threads can abort it with a C++ message ("terminate called
    without an active exception", exit status -6, even after a run that finished). After an
    error the other ranks' next collective then fails, and they stop without a traceback
    (``peer_gone``)."""
    dist = sys.modules.get("torch.distributed")  # never imported here: a command without torch
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # the group is already broken: nothing to close
        pass


def end_rank(status: int) -> int:
    """End a rank of several (``torchrun`` or ``accelerate launch``) at once with ``status``, its
    process group closed, its log flushed and its data-loading workers let go, without the
    interpreter's teardown: there the C++ objects that gloo's collectives leave (their threads,
    pending work holding tensors) are destroyed after Python's own state, and now and then a run
    that finished aborts there with "terminate called without an active exception" (exit status
    -6), which the launcher reports as the job's failure. A process
    that is no rank of several returns ``status`` to its caller as before."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2 or "torch.distributed" not in sys.modules:
        return status
    import gc
    import logging

    leave_process_group()
    gc.collect()  # iterators of DataLoaders with workers stop them as they go
    logging.shutdown()  # train.log and the console handlers, flushed and closed
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing left to say there
            pass
    os._exit(status)


def peer_gone(exc: BaseException) -> bool:
    """Return True for the error of a collective whose other processes have ended."""
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return False
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(part in text for part in _PEER_GONE_TEXT)


def launched_rank() -> str | None:
    """Return this process's rank: torchrun's ``RANK``, or "0" for the one process that accelerate's
    simple launcher starts under ``mlmkit launch`` (it sets no rank)."""
    rank = os.environ.get("RANK")
    if rank is None and os.environ.get(LAUNCH_DIR_ENV):
        return "0"
    return rank


def attempt_folder() -> Path | None:
    """Return the folder of this attempt's ranks under ``mlmkit launch`` (None without it)."""
    folder = os.environ.get(LAUNCH_DIR_ENV)
    if not folder:
        return None
    path = Path(folder) / f"attempt-{int(os.environ.get(ATTEMPT_ENV) or 0):04d}"
    path.mkdir(exist_ok=True)
    return path


def tell(status: int, line: str | None, every_rank: bool = True) -> None:
    """How this process ends: ``line`` on stderr, or, under ``mlmkit launch``, both in this
    rank's file for the launcher to print once. Without the launcher ``every_rank=False``
    keeps a line all ranks would print alike (a preemption) to the main process."""
    rank = launched_rank()
    if rank is not None and os.environ.get(LAUNCH_DIR_ENV):
        try:
            path = attempt_folder() / f"rank-{rank}.json"
            path.write_text(json.dumps({"status": status, "line": line, "pid": os.getpid()}))
            return
        except OSError:
            pass  # the launcher's folder is gone: say it here
    if line is not None and (every_rank or rank in (None, "0")):
        print(line, file=sys.stderr, flush=True)


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
        tell(2, f"Error: {hydra_error_sentence(exc)}")
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
        return (
            f"Cannot parse the setting {override!r} ({first_line(exc)}); write it as "
            "key=value, with lists as key=[a,b] quoted for the shell."
        )
    text = first_line(exc)
    if text.startswith("Ambiguous value for argument"):  # a, b without --multirun
        return (
            f"{text}; write key=[a,b] for a list, quote 'a,b' for a text, or add --multirun "
            "to sweep over the values."
        )
    text = text.replace("Error merging override", "Cannot apply the setting", 1)
    if exc.__cause__ is not None:
        text = f"{text}: {first_line(exc.__cause__)}"
    return text + "."


def _end_elastic_agent(signum: int | None) -> None:
    """After the checkpoint of a scheduler's stop (SIGUSR1, SIGUSR2), end the torchrun agent
    that started this rank where it would restart it (``--max_restarts``): the job is to stop
    and be requeued, not to go on until it is killed. The agent's own SIGTERM (a node joined or
    was lost) is left to the agent, which restarts the ranks."""
    user_signals = {getattr(signal, name, None) for name in ("SIGUSR1", "SIGUSR2")} - {None}
    if signum not in user_signals or int(os.environ.get("TORCHELASTIC_MAX_RESTARTS") or 0) < 1:
        return
    try:
        os.kill(os.getppid(), signal.SIGTERM)
    except OSError:
        pass


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
