"""Stop requests: SIGTERM, SIGINT, SIGUSR1 (SLURM's warning) and SIGUSR2 (submitit's) end the
run cleanly."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import torch


class StopSignals:
    """Turns SIGTERM, SIGINT, SIGUSR1 (SLURM's warning, ``--signal=USR1@300``) and SIGUSR2
    (what submitit asks SLURM to send before the time limit) into a request to stop cleanly.

    The loop checks ``requested`` after each optimizer step, saves a checkpoint and exits
    with ``Preempted.exit_code``. A second SIGINT interrupts at once.
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
        if (
            self.received is None and os.environ.get("RANK", "0") == "0"
        ):  # said once, not by every rank
            again = "; press Ctrl-C again to stop at once" if signum == signal.SIGINT else ""
            # os.write: a print or a log call here could interrupt one in progress on the same
            # stream
            os.write(
                2,
                f"Got {signal.Signals(signum).name}: stopping after this step, with a "
                f"checkpoint{again}.\n".encode(),
            )
        self.received = signum

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                if hasattr(signal, name):
                    sig = getattr(signal, name)
                    self._previous[sig] = signal.signal(sig, self._handle)
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
