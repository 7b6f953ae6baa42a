"""The run dir's lock: one process at a time, never stale after its holder is killed."""

from __future__ import annotations

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
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.strip() == "held", line + proc.communicate()[1][-2000:]
    return proc


def _refused_in_another_process(run_dir) -> bool:
    proc = subprocess.run([sys.executable, "-c", HOLD, str(run_dir)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    return proc.stdout.startswith("refused") and "hydra.run.dir" in proc.stdout


def test_a_second_process_is_refused_until_the_holder_is_killed(tmp_path):
    holder = _holder(tmp_path)
    try:
        with pytest.raises(ConfigError) as info:
            lock.acquire(tmp_path)
        message = str(info.value)
        assert f"is in use by another run (pid {holder.pid} on host {socket.gethostname()})" in message
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
