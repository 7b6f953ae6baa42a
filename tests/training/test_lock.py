"""The run dir's lock: one process at a time, never stale after its holder is killed."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest
from runs import ROOT

from mlmkit.errors import ConfigError
from mlmkit.training import lock

HOLD = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from mlmkit.errors import ConfigError\n"
    "from mlmkit.training import lock\n"
    "try:\n"
    "    lock.acquire(Path(sys.argv[1]))\n"
    "except ConfigError as exc:\n"
    "    sys.exit(print('refused', exc, flush=True))\n"
    "print('held', flush=True)\n"
    "time.sleep(120)\n"
)


def _holder(run_dir) -> subprocess.Popen:
    """Another process that holds the run dir's lock until it is killed."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run_dir)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line.strip() == "held", line + proc.communicate()[1][-2000:]
    return proc


def _refused_in_another_process(run_dir) -> bool:
    proc = subprocess.run(
        [sys.executable, "-c", HOLD, str(run_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.stdout.startswith("refused") and "hydra.run.dir" in proc.stdout


def test_a_second_process_is_refused_until_the_holder_is_killed(tmp_path):
    holder = _holder(tmp_path)
    try:
        with pytest.raises(ConfigError) as info:
            lock.acquire(tmp_path)
        message = str(info.value)
        assert (
            f"is in use by another run (pid {holder.pid} on host {socket.gethostname()})" in message
        )
        assert "hydra.run.dir" in message and message.count(". ") == 0  # one sentence
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.communicate()
    lock.acquire(tmp_path)  # the kernel dropped the killed holder's lock
    try:
        lock.acquire(tmp_path)  # this process holds it already: nothing to do
        assert _refused_in_another_process(tmp_path)
    finally:
        lock.release(tmp_path)
    holder = _holder(tmp_path)  # released: free for the next run
    holder.send_signal(signal.SIGKILL)
    holder.communicate()


def test_a_command_refused_after_locking_leaves_the_lock_file_as_it_was(tmp_path):
    """Released before ``commit`` (a refused command): the file it made goes again, one that was
    there gets its bytes back; a committed run's file names it."""
    new, old, kept = tmp_path / "new", tmp_path / "old", tmp_path / "kept"
    for folder in (new, old, kept):
        folder.mkdir()
    (old / lock.LOCK_FILE).write_bytes(b"1234 elsewhere\n")
    for folder in (new, old):
        lock.acquire(folder)
        assert (folder / lock.LOCK_FILE).read_text().split()[0] == str(
            os.getpid()
        )  # named while held
        lock.release(folder)
    assert not (new / lock.LOCK_FILE).exists()
    assert (old / lock.LOCK_FILE).read_bytes() == b"1234 elsewhere\n"
    lock.acquire(kept)
    lock.commit(kept)
    lock.release(kept)
    assert (kept / lock.LOCK_FILE).read_text().split()[0] == str(os.getpid())
    for folder in (new, old, kept):  # a removed or restored file locks as before
        assert _locked_in_another_process(folder)


def _locked_in_another_process(run_dir) -> bool:
    code = (
        "import sys; from pathlib import Path; from mlmkit.training import lock; "
        "lock.acquire(Path(sys.argv[1]))"
    )
    return (
        subprocess.run([sys.executable, "-c", code, str(run_dir)], cwd=ROOT, timeout=60).returncode
        == 0
    )


def test_a_lock_taken_on_a_file_removed_meanwhile_is_taken_again_on_the_new_one(
    tmp_path, monkeypatch
):
    """A process that opened the lock file just before a refused command removed it locks the
    file at the path, never the removed one (two runs would otherwise both hold the dir)."""
    opened = []
    real_open = os.open

    def open_then_remove(path, flags, mode=0o777):
        fd = real_open(path, flags, mode)
        opened.append(path)
        if len(opened) == 1:  # the first open: the file goes before the lock is taken
            os.unlink(path)
        return fd

    monkeypatch.setattr(os, "open", open_then_remove)
    lock.acquire(tmp_path)
    monkeypatch.undo()
    try:
        held = lock._held[tmp_path.resolve()]
        assert len(opened) == 2  # locked the removed file, found it gone, opened the path again
        assert os.fstat(held).st_ino == os.stat(tmp_path / lock.LOCK_FILE).st_ino
        assert _refused_in_another_process(tmp_path)
    finally:
        lock.commit(tmp_path)
        lock.release(tmp_path)
