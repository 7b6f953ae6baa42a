"""The run dir's lock: one run at a time writes into a ``hydra.run.dir``.

The main process takes an exclusive ``flock`` on ``<run>/.lock`` before mlmkit writes
anything there, and holds it until the run ends (``release``) or the process does. The
kernel drops the lock of a process that ends however it ends (an error, SIGKILL, a crash),
so a lock is never stale. The file names its holder (pid and host) for the message another
run gets.

A command refused after it took the lock (``release`` before ``commit``) leaves every byte of
the run dir as it was: the file gets back what it held, or goes again if the command created
it. A run that locks a file checks that it is still the one at the path (not one removed
meanwhile), so a removed file never lets two runs in.
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
# run dir -> what its lock file held before this process took it (None: the file was made
# here), until the run commits
_before: dict[Path, bytes | None] = {}


def acquire(run_dir: Path) -> None:
    """Lock ``run_dir`` for this process (again: nothing to do), or fail with one sentence
    naming the run that holds it."""
    key = Path(run_dir).resolve()
    if key in _held:
        return
    path = key / LOCK_FILE
    while True:
        made = not path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
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
            log.warning(
                "Could not lock the run dir %s (%s); make sure no other run writes into it.",
                run_dir,
                exc.strerror,
            )
            return
        if _is_at(fd, path):
            break
        os.close(fd)  # a refused command removed the file after it was opened here: again
    _before[key] = None if made else os.pread(fd, 4096, 0)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
    _held[key] = fd


def commit(run_dir: Path) -> None:
    """Commit ``run_dir``: the run writes there from now on, its lock file naming this process."""
    _before.pop(Path(run_dir).resolve(), None)


def release(run_dir: Path | None = None) -> None:
    """Unlock ``run_dir``, or every run dir this process holds; one never committed gets its
    lock file back as it was."""
    keys = list(_held) if run_dir is None else [Path(run_dir).resolve()]
    for key in keys:
        fd = _held.pop(key, None)
        if fd is None:
            continue
        if key in _before:  # never committed
            before = _before.pop(key)
            if before is None:
                (key / LOCK_FILE).unlink(missing_ok=True)  # still locked: whoever opened it retries
            else:
                os.ftruncate(fd, 0)
                os.pwrite(fd, before, 0)
        os.close(fd)  # closing the only descriptor drops the flock


def _is_at(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is the one at ``path``."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _holder(fd: int) -> str:
    """Return the holder as it wrote itself ("pid N on host H"), or "pid unknown" before it has."""
    fields = os.pread(fd, 512, 0).decode(errors="replace").split()
    if len(fields) != 2:
        return "pid unknown"
    return f"pid {fields[0]} on host {fields[1]}"
