"""Stop requests: SIGTERM, SIGINT, SIGUSR1 (SLURM's warning) and SIGUSR2 (submitit's) end the
run cleanly. A warning that comes while the run is still setting up (imports, a tokenizer to train,
data to tokenize) is held, and the run stops after its first step: lost, it would leave the job to
its time limit, with no checkpoint and no requeue."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import torch

WARNINGS = ("SIGUSR1", "SIGUSR2")
_held: int | None = None  # a warning that came before training began (``hold_warnings``)
_before_hold: dict[int, Any] = {}  # the handlers ``hold_warnings`` replaced


def _say(signum: int, when: str) -> None:
    if os.environ.get("RANK", "0") == "0":  # said once, not by every rank
        again = "; press Ctrl-C again to stop at once" if signum == signal.SIGINT else ""
        # os.write: a print or a log call here could interrupt one in progress on the same stream
        os.write(
            2,
            f"Got {signal.Signals(signum).name}: stopping after {when}, with a "
            f"checkpoint{again}.\n".encode(),
        )


def _hold(signum, frame) -> None:
    global _held
    if _held is None:
        _say(signum, "the first step")
    _held = signum


def hold_warnings() -> None:
    """Keep a scheduler's warning (SIGUSR1, SIGUSR2) that comes before training begins, for the
    first ``StopSignals`` to act on; called by the commands that train, before their imports.
    Only in the main thread, where Python runs signal handlers. The first ``StopSignals`` puts
    the replaced handlers back when it ends, ``release_warnings`` where none began."""
    if threading.current_thread() is threading.main_thread():
        for name in WARNINGS:
            sig = getattr(signal, name, None)
            if sig is not None and signal.getsignal(sig) is not _hold:
                _before_hold[sig] = signal.signal(sig, _hold)


def release_warnings() -> None:
    """End ``hold_warnings``: put back the handlers it replaced where the hold is still there (a
    command that ended before its run began), and drop a warning no run took. Called as each
    command ends, so that a process which runs commands one after another (a notebook, a test
    suite, a sweep) starts each with the handlers it had and no warning left from the last."""
    global _held
    if threading.current_thread() is threading.main_thread():
        for sig, handler in list(_before_hold.items()):
            if signal.getsignal(sig) is _hold:
                signal.signal(sig, handler)
            del _before_hold[sig]
        _held = None


class StopSignals:
    """Turns SIGTERM, SIGINT, SIGUSR1 (SLURM's warning, ``--signal=USR1@300``) and SIGUSR2
    (what submitit asks SLURM to send before the time limit) into a request to stop cleanly.

    The loop checks ``requested`` after each optimizer step, saves a checkpoint and exits
    with ``Preempted.exit_code``. A second SIGINT interrupts at once. A warning held since
    setup (``hold_warnings``) counts as received on entry.
    """

    SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2")

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt(
                "Stopped at once by a second Ctrl-C, without a checkpoint of this step; "
                "train.resume=auto continues from the last one saved."
            )
        if self.received is None:
            _say(signum, "this step")
        self.received = signum

    def __enter__(self) -> StopSignals:
        global _held
        if threading.current_thread() is threading.main_thread():
            self.received, _held = _held, None
            for name in self.SIGNALS:
                if hasattr(signal, name):
                    sig = getattr(signal, name)
                    previous = signal.signal(sig, self._handle)
                    # what was there before the hold (submitit's handler, or the launcher's
                    # SIG_IGN), for the run's end and ``cli.errors``' hand-back
                    self._previous[sig] = (
                        _before_hold.pop(sig, previous) if previous is _hold else previous
                    )
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def requested(self, accelerator, everywhere: bool = True) -> bool:
        """Return True on every rank once any rank got a signal (ranks must stop at one step).
        With several processes the ranks agree by an all-reduce, which waits for the device, so
        only where ``everywhere`` (the loop's log and checkpoint steps): elsewhere a signal is
        held until then."""
        if accelerator.num_processes == 1:
            return self.received is not None
        if not everywhere:
            return False
        flag = torch.tensor(float(self.received is not None), device=accelerator.device)
        return bool(accelerator.reduce(flag, reduction="sum") > 0)

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else "a signal"
