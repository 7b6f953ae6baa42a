"""``mlmkit launch [accelerate launch options] <command> [settings]``: ``accelerate launch -m
mlmkit <command>``, with one sentence and a meaningful exit status however the ranks end.

``accelerate launch`` exits with status 1 whenever a process fails, after torch's failure
report and its own traceback, so a script cannot tell a user's error from a preemption
(whose checkpoint a requeued job continues). Here each rank writes how it ended (status and
sentence, ``cli.errors.tell``) into a folder of this launcher's; the launcher then prints
each distinct sentence once, drops torch's report for an ending it can explain, and exits
with the main process's status: 0, 2 (a user's error), 75 (stopped with a checkpoint), or
the launcher's own for anything else (a crash, whose traceback is kept).

SIGTERM, SIGUSR1 and SIGUSR2 sent to this launcher (SLURM's warning, submitit's signal) go
on to every rank, which saves a checkpoint and exits with status 75; accelerate's own
launcher ignores SIGUSR1 and SIGUSR2, which would end it (SLURM signals every process of a
job step).

    mlmkit launch --multi_gpu --num_processes 8 train model=bert-base
    mlmkit launch --config_file ddp.yaml train model=bert-base train.max_time=24h
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from mlmkit.cli.errors import LAUNCH_DIR_ENV, PEER_GONE, launched_rank
from mlmkit.errors import ConfigError, Preempted

FORWARDED = ("SIGTERM", "SIGUSR1", "SIGUSR2")
# torch.distributed.elastic's log lines about the processes it stops (W1201 22:40:47.911000 ...),
# and the C++ runtime's last words of a rank whose collective threads outlived it
_ELASTIC_LOG = re.compile(r"^[WEI]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ .*torch/distributed/elastic/"
                          r"|^terminate called without an active exception$")


def split_command(args: list[str], commands) -> tuple[list[str], list[str]]:
    """(the launcher's options, ``<command> [settings]``): split at the first mlmkit command."""
    for i, arg in enumerate(args):
        if arg in commands and arg != "launch":
            return args[:i], args[i:]
    raise ConfigError("mlmkit launch: name the command to run after the launcher's options, e.g. "
                      "mlmkit launch --multi_gpu --num_processes 2 train model=bert-mini.")


def outcomes(folder: Path) -> dict[int, dict]:
    """Rank -> how it ended, for the ranks that said so."""
    found = {}
    for path in folder.glob("rank-*.json"):
        try:
            found[int(path.stem.split("-", 1)[1])] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return found


def explained(ended: dict[int, dict]) -> int | None:
    """The status for the launcher to exit with when the ranks' endings explain the run's: a
    user's error or a preemption (the main process's, else another rank's), the other ranks
    stopped by it or by the launcher. None when they do not (a crash: its traceback stays)."""
    statuses = {rank: e.get("status") for rank, e in ended.items()}
    if any(s not in (2, Preempted.exit_code, PEER_GONE) for s in statuses.values()):
        return None
    causes = [s for _, s in sorted(statuses.items()) if s in (2, Preempted.exit_code)]
    if not causes:
        return None
    return statuses[0] if statuses.get(0) in causes else causes[0]


def _forward_signals(folder: Path) -> None:
    """Send the signals this launcher gets on to every rank that has written its pid."""
    def forward(signum, frame):
        for path in folder.glob("pid-*"):
            try:
                os.kill(int(path.read_text()), signum)
            except (OSError, ValueError):
                continue

    for name in FORWARDED:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), forward)
    # Ctrl-C reaches every process of the terminal's group: the ranks stop (with a
    # checkpoint), and this launcher stays to report how they ended
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _ignore_user_signals() -> None:
    """In the launcher's process, before it starts: SIGUSR1 and SIGUSR2 ignored. torchrun's agent
    does not handle them, and a scheduler that signals every process of the job (SLURM's
    --signal) would kill it; the ranks, which inherit this, set their own handlers when
    training starts (``training.signals``)."""
    for name in ("SIGUSR1", "SIGUSR2"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)


def record_pid() -> None:
    """In a rank under ``mlmkit launch``: write this process's pid for the launcher's signals."""
    folder, rank = os.environ.get(LAUNCH_DIR_ENV), launched_rank()
    if folder and rank is not None:
        try:
            (Path(folder) / f"pid-{rank}").write_text(str(os.getpid()))
        except OSError:
            pass


def main(args: list[str]) -> int:
    from mlmkit.cli import COMMANDS

    options, command = split_command(args, COMMANDS)
    with tempfile.TemporaryDirectory(prefix="mlmkit-launch-") as tmp:
        folder = Path(tmp)
        env = {**os.environ, LAUNCH_DIR_ENV: tmp}
        launcher = [sys.executable, "-m", "accelerate.commands.launch", *options, "-m", "mlmkit", *command]
        proc = subprocess.Popen(launcher, env=env, stderr=subprocess.PIPE, text=True, errors="replace",
                                bufsize=1, preexec_fn=_ignore_user_signals)
        _forward_signals(folder)
        # torch's report of the failed processes and the launcher's traceback (from the first
        # unprefixed traceback on), held back and printed only when the ranks cannot explain it
        held: list[str] = []
        tail = False
        for line in proc.stderr:
            tail = tail or line.startswith("Traceback (most recent call last):")
            if tail or _ELASTIC_LOG.match(line.rstrip("\n")):
                held.append(line)
            else:
                sys.stderr.write(line)
        returncode = proc.wait()
        ended = outcomes(folder)
    status = explained(ended)
    if status is None:
        sys.stderr.writelines(held)
        for e in ended.values():
            if e.get("line"):
                print(e["line"], file=sys.stderr)
        return returncode
    lines = [e["line"] for _, e in sorted(ended.items()) if e.get("line")]
    for line in dict.fromkeys(lines):  # each distinct sentence once, the main process's first
        print(line, file=sys.stderr)
    return status
