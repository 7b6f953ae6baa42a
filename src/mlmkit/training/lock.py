"""The run dir's lock: one run at a time writes into a ``hydra.run.dir``.

The main process takes an exclusive ``flock`` on ``<run>/.lock`` before mlmkit writes
anything there, and holds it until the run ends (``release``) or the process does. The
kernel drops the lock of a process that ends however it ends (an error, SIGKILL, a crash),
so a lock is never stale. The file names its holder (pid and host) for the message another
run gets; it is never deleted, as deleting a lock file would let two runs lock two files.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
from pathlib import Path

from mlmkit.errors import ConfigError

log = logging.getLogger("mlmkit")

LOCK_FILE = ".lock"
_held: dict[Path, int] = {}  # run dir -> its lock file, open and locked by this process


def acquire(run_dir: Path) -> None:
    """Lock ``run_dir`` for this process (again: nothing to do), or fail with one sentence
    naming the run that holds it."""
    key = Path(run_dir).resolve()
    if key in _held:
        return
    fd = os.open(key / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise ConfigError(
            f"The run dir {str(run_dir)!r} is in use by another run ({holder}); wait for it to "
            "end or choose a new hydra.run.dir."
        ) from None
    except OSError as exc:  # a filesystem without locks
        os.close(fd)
        log.warning("Could not lock the run dir %s (%s); make sure no other run writes into it.",
                    run_dir, exc.strerror)
        return
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    _held[key] = fd


def release(run_dir: Path | None = None) -> None:
    """Unlock ``run_dir``, or every run dir this process holds."""
    keys = list(_held) if run_dir is None else [Path(run_dir).resolve()]
    for key in keys:
        fd = _held.pop(key, None)
        if fd is not None:
            os.close(fd)  # closing the only descriptor drops the flock


def _holder(fd: int) -> str:
    """The holder as it wrote itself ("pid N on host H"), or "pid unknown" before it has."""
    fields = os.pread(fd, 512, 0).decode(errors="replace").split()
    if len(fields) != 2:
        return "pid unknown"
    return f"pid {fields[0]} on host {fields[1]}"
