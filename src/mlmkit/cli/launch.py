"""``mlmkit launch [accelerate launch options] <command> [settings]``: ``accelerate launch -m
mlmkit <command>``, with one sentence and a meaningful exit status however the ranks end.

``accelerate launch`` exits with status 1 whenever a process fails, after torch's failure
report and its own traceback, so a script cannot tell a user's error from a preemption
(whose checkpoint a requeued job continues), and a one-process launch re-prints the rank's
whole log behind ``RuntimeError:``. Here each rank writes how it ended (status and sentence,
``cli.errors.tell``) into a folder of this launcher's. The ranks' lines pass through once, as
they come; what accelerate and torch add when a process fails (torch's log lines and failure
report, accelerate's traceback and re-print) is held back and never printed; the launcher
ends with one sentence and a status: each distinct sentence of the ranks once and the main
process's status, 0, 2 (a user's error) or 75 (stopped with a checkpoint); for a crash or a
kill, which the ranks cannot tell, a sentence naming the process and how it ended (a crash's
traceback, the rank's own, stays above it) and that process's status (128 + the signal's
number for a kill).

SIGTERM, SIGUSR1 and SIGUSR2 sent to this launcher (SLURM's warning, submitit's signal) go
on to every rank, which saves a checkpoint and exits with status 75; accelerate's own
launcher ignores SIGUSR1 and SIGUSR2, which would end it (SLURM signals every process of a
job step).

With ``--nnodes MIN:MAX`` (torchrun's elastic options) the launcher is torchrun's elastic agent
instead, ``torchrun ... -m mlmkit <command>``, which restarts the ranks when a node is lost or
joins; each restart's ranks report in a folder of their own and the launcher reads the last.

    mlmkit launch --multi_gpu --num_processes 8 train model=bert-base
    mlmkit launch --config_file ddp.yaml train model=bert-base train.max_time=24h
    mlmkit launch --nnodes 1:4 --nproc_per_node 8 --rdzv_endpoint node0:29400 train \
        model=bert-base train.resume=auto hydra.run.dir=/shared/runs/base
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

from mlmkit.cli.errors import LAUNCH_DIR_ENV, PEER_GONE, attempt_folder, launched_rank
from mlmkit.errors import ConfigError, Preempted

FORWARDED = ("SIGTERM", "SIGUSR1", "SIGUSR2")
# torch.distributed.elastic's log lines about the processes it stops (W1201 22:40:47.911000 ...),
# and the C++ runtime's last words of a rank whose collective threads outlived it
# the exception of accelerate's launcher when a process fails: one-process and torchrun launches
_LAUNCHER_EXCEPTIONS = (
    "subprocess.CalledProcessError",
    "torch.distributed.elastic.multiprocessing.errors.",
)
_ELASTIC_LOG = re.compile(
    r"^[WEI]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ .*torch/distributed/elastic/"
    r"|^terminate called without an active exception$"
)


def split_command(args: list[str], commands) -> tuple[list[str], list[str]]:
    """Split ``args`` at the first mlmkit command: (launcher options, ``<command> [settings]``)."""
    for i, arg in enumerate(args):
        if arg in commands and arg != "launch":
            return args[:i], args[i:]
    raise ConfigError(
        "mlmkit launch: name the command to run after the launcher's options, e.g. "
        "mlmkit launch --multi_gpu --num_processes 2 train model=bert-mini."
    )


def last_attempt(folder: Path) -> Path:
    """Return the folder of the ranks' last attempt (``cli.errors.attempt_folder``)."""
    attempts = sorted(folder.glob("attempt-*"))
    return attempts[-1] if attempts else folder


def outcomes(folder: Path) -> dict[int, dict]:
    """Rank -> how it ended, for the ranks of the last attempt that said so."""
    found = {}
    for path in last_attempt(folder).glob("rank-*.json"):
        try:
            found[int(path.stem.split("-", 1)[1])] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return found


def explained(ended: dict[int, dict]) -> int | None:
    """Return the status for the launcher to exit with when the ranks' endings explain the run's: a
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
        for path in last_attempt(folder).glob("pid-*"):
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
    rank = launched_rank()
    if rank is not None and os.environ.get(LAUNCH_DIR_ENV):
        try:
            (attempt_folder() / f"pid-{rank}").write_text(str(os.getpid()))
        except OSError:
            pass


def elastic(options: list[str]) -> bool:
    """Return whether the options are torchrun's elastic ones (``--nnodes MIN:MAX``)."""
    for i, option in enumerate(options):
        if option == "--nnodes" and ":" in "".join(options[i + 1 : i + 2]):
            return True
        if option.startswith("--nnodes=") and ":" in option:
            return True
    return False


def torchrun_options(options: list[str], command: list[str]) -> list[str]:
    """torchrun's options for an elastic launch: the user's, with a c10d rendezvous and 3
    restarts unless they say otherwise. The restarted processes continue the run from its last
    checkpoint, so a training command must say where and how (one sentence otherwise)."""
    if command[0] == "train":
        settings = " ".join(command[1:])
        if "train.resume=auto" not in settings or "hydra.run.dir=" not in settings:
            raise ConfigError(
                "An elastic launch (--nnodes MIN:MAX) restarts its processes from the run's last "
                "checkpoint: add train.resume=auto and hydra.run.dir=<a folder every node sees>."
            )
    named = {o.split("=", 1)[0] for o in options if o.startswith("--")}
    return [
        *options,
        *([] if "--rdzv_backend" in named else ["--rdzv_backend", "c10d"]),
        *([] if "--max_restarts" in named else ["--max_restarts", "3"]),
    ]


def main(args: list[str]) -> int:
    from mlmkit.cli import COMMANDS

    options, command = split_command(args, COMMANDS)
    if elastic(options):  # torchrun's elastic agent: restarts on the processes there are
        launcher = [sys.executable, "-m", "torch.distributed.run"]
        launcher += [*torchrun_options(options, command), "-m", "mlmkit", *command]
    else:
        launcher = [sys.executable, "-m", "accelerate.commands.launch"]
        launcher += [*options, "-m", "mlmkit", *command]
    with tempfile.TemporaryDirectory(prefix="mlmkit-launch-") as tmp:
        folder = Path(tmp)
        env = {**os.environ, LAUNCH_DIR_ENV: tmp}
        if elastic(options):
            # the agents' shared TCP store: a node that joins a running job waits forever for an
            # address only a new rank 0 writes (pytorch/pytorch#123678); each round its own
            env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        proc = subprocess.Popen(
            launcher,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            bufsize=1,
            preexec_fn=_ignore_user_signals,
        )
        _forward_signals(folder)
        relay = Relay()
        for line in proc.stderr:
            relay.feed(line)
        returncode = proc.wait()
        ended, pids = outcomes(folder), rank_pids(folder)
    return ending(
        ended, relay, returncode, command[0], main_machine=machine_rank(options) == 0, pids=pids
    )


def rank_pids(folder: Path) -> dict[int, str]:
    """Rank -> the pid it wrote (``record_pid``), in the last attempt."""
    found = {}
    for path in last_attempt(folder).glob("pid-*"):
        try:
            found[int(path.name.split("-", 1)[1])] = path.read_text().strip()
        except (OSError, ValueError):
            continue
    return found


def machine_rank(options: list[str]) -> int:
    """Return the machine rank the launcher's options give (0 without one)."""
    for i, option in enumerate(options):
        if option.startswith("--machine_rank"):
            value = option.split("=", 1)[1] if "=" in option else (options[i + 1 :] or ["0"])[0]
            return int(value) if value.isdigit() else 0
    return 0


def ending(
    ended: dict[int, dict],
    relay: Relay,
    returncode: int,
    command: str,
    main_machine: bool = True,
    pids: dict[int, str] | None = None,
) -> int:
    """Print how the launch ended (after the ranks' lines) and return its exit status. On a
    machine other than the main one (several launchers, one per node, write into one job log)
    the sentence of a preemption, the same on every rank, is left to the main machine's
    launcher, and ranks that only stopped because a process elsewhere ended say nothing: that
    process's launcher tells why."""
    status = explained(ended)
    if status is None and returncode == 0:  # every rank finished
        sys.stderr.writelines(relay.ranks_lines())
        return 0
    if status is None:  # a crash or a kill: the ranks' own lines, then one sentence for it
        sys.stderr.writelines(relay.ranks_lines())
        for e in ended.values():
            if e.get("line"):
                print(e["line"], file=sys.stderr)
        sentence, status = unexplained_ending(relay.launcher_lines(), returncode, command, pids)
        told = [e.get("status") for e in ended.values()]
        if not (status == PEER_GONE and told and all(s == PEER_GONE for s in told)):
            print(sentence, file=sys.stderr)
        return status
    lines = [
        e["line"]
        for _, e in sorted(ended.items())
        if e.get("line") and (main_machine or e.get("status") != Preempted.exit_code)
    ]
    for line in dict.fromkeys(lines):  # each distinct sentence once, the main process's first
        print(line, file=sys.stderr)
    return status


class Relay:
    """The launch's stderr, passed on line by line as it comes, but for what the launcher itself
    adds when a process fails: torch.distributed.elastic's log lines, and accelerate's exception
    (its traceback, torch's failure report, and the re-print of the whole of a rank's stderr
    behind ``RuntimeError:`` that accelerate's one-process launcher chains to it). Those are
    held from their first line on, with whatever follows them."""

    REPRINT_WINDOW = 1 << 20  # accelerate re-prints the last 512 KiB of a rank's stderr

    def __init__(self) -> None:
        self.held: list[str] = []
        self.holding = False  # from the first traceback or re-print on, every line is held
        self.launcher_start: int | None = None  # where the re-print starts among the held lines
        self.passed = ""  # the end of what was passed on, to recognise a re-print

    def feed(self, line: str) -> None:
        text = line.rstrip("\n")
        if self.launcher_start is None and self.is_reprint(text):
            self.launcher_start, self.holding = len(self.held), True
        self.holding = self.holding or text.startswith("Traceback (most recent call last):")
        if self.holding or _ELASTIC_LOG.match(text):
            self.held.append(line)
            return
        sys.stderr.write(line)
        self.passed = (self.passed + line)[-self.REPRINT_WINDOW :]

    def is_reprint(self, text: str) -> bool:
        """Return True for a line that starts accelerate's re-print of a rank's stderr:
        ``RuntimeError: `` and the start of the re-printed text (the end of what came before, cut
        anywhere), or a bare ``RuntimeError`` outside a traceback (the re-print of a rank that
        wrote nothing)."""
        if text == "RuntimeError" and not self.holding:
            return True
        if not text.startswith("RuntimeError: "):
            return False
        head = text.removeprefix("RuntimeError: ")
        return bool(self.passed) and (head in self.passed or any(head in h for h in self.held))

    def ranks_lines(self) -> list[str]:
        """Return the held lines the ranks wrote themselves (a crash's traceback), without the
        elastic log lines and accelerate's exception."""
        end = self._launcher_block()
        return [line for line in self.held[:end] if not _ELASTIC_LOG.match(line.rstrip("\n"))]

    def launcher_lines(self) -> list[str]:
        return self.held[self._launcher_block() :]

    def _launcher_block(self) -> int:
        """Where accelerate's exception starts among the held lines: the re-print, else its
        traceback (the last one, ending in the launcher's own exception), else nothing held."""
        if self.launcher_start is not None:
            return self.launcher_start
        starts = [
            i for i, h in enumerate(self.held) if h.startswith("Traceback (most recent call last):")
        ]
        if starts and any(h.startswith(_LAUNCHER_EXCEPTIONS) for h in self.held[starts[-1] :]):
            return starts[-1]
        return len(self.held)


def unexplained_ending(
    launcher_lines: list[str], returncode: int, command: str, pids: dict[int, str] | None = None
) -> tuple[str, int]:
    """(one sentence, the exit status) for a launch whose ranks did not say how they ended (a
    crash, a kill), from what accelerate and torch report about the failed process: torch's
    failure report (its root cause), or accelerate's ``CalledProcessError``; ``pids``: the
    ranks' pids, where the report gives none."""
    text = "".join(launcher_lines)
    rank, pid, code = None, None, None
    root = text.split("Root Cause (first observed failure):", 1)[-1]
    if found := re.search(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+) \(pid: (\d+)\)", root, re.S):
        rank, code, pid = int(found[1]), int(found[2]), found[3]
    elif found := re.search(r"died with <Signals\.\w+: (\d+)>", text):
        rank, code = 0, -int(found[1])
    elif found := re.search(r"returned non-zero exit status (-?\d+)", text):
        rank, code = 0, int(found[1])
    if code is None:
        return (
            f"The launch ended with exit status {returncode} and none of its processes said why; "
            "their last lines are above.",
            returncode or 1,
        )
    pid = pid or (pids or {}).get(rank)
    who = f"Rank {rank}" + (f" (pid {pid})" if pid else "")
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        resume = (
            ", and train.resume=auto continues the run from its last checkpoint"
            if command == "train"
            else ""
        )
        return (
            f"{who} was killed by {name} (out of memory, or from outside); its last lines are "
            f"above{resume}.",
            128 - code,
        )
    return f"{who} crashed with exit status {code}; its traceback is above.", code
