"""``mlmkit launch``'s output (``cli.launch``): the ranks' lines once, what accelerate and torch
add when a process fails held back, and one sentence for an ending the ranks could not explain.
The launches themselves: tests/e2e/test_launch.py and the SLURM jobs of tests/slurm/."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from mlmkit.cli.launch import Relay, unexplained_ending

RANK = [
    "[10:00:01] Run dir out/run | 1 process(es) on cpu | precision no\n",
    "[10:00:05] Saved checkpoint out/run/checkpoints/step_0000012\n",
]
ONE_PROCESS_FAILURE = [  # accelerate's one-process launcher: the rank's stderr re-printed, chained
    "RuntimeError: " + RANK[0],
    RANK[1],
    "\n",
    "The above exception was the direct cause of the following exception:\n",
    "\n",
    "Traceback (most recent call last):\n",
    '  File "accelerate/commands/launch.py", line 1049, in _run_subprocess\n',
    "subprocess.CalledProcessError: Command '['python', '-m', 'mlmkit', 'train']' {}.\n",
]
TORCHRUN_FAILURE = [
    "W1204 00:08:11.632000 22386 torch/distributed/elastic/multiprocessing/api.py:1028] Sending "
    "process 22392 closing signal SIGTERM\n",
    "Traceback (most recent call last):\n",
    '  File "torch/distributed/launcher/api.py", line 383\n',
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n",
    "=" * 60 + "\n",
    "mlmkit FAILED\n",
    "Failures:\n",
    "[1]:\n",
    "  rank      : 1 (local_rank: 1)\n",
    "  exitcode  : 3 (pid: 22392)\n",
    "Root Cause (first observed failure):\n",
    "[0]:\n",
    "  host      : localhost\n",
    "  rank      : 0 (local_rank: 0)\n",
    "  exitcode  : -9 (pid: 22391)  (SIGKILL)\n",
    "=" * 60 + "\n",
]


def relayed(lines: list[str], capsys) -> tuple[Relay, str]:
    relay = Relay()
    for line in lines:
        relay.feed(line)
    return relay, capsys.readouterr().err


def test_a_one_process_launch_never_re_prints_the_ranks_log(capsys):
    lines = [*RANK, *ONE_PROCESS_FAILURE]
    lines[-1] = lines[-1].format("returned non-zero exit status 75")
    relay, err = relayed(lines, capsys)
    assert err == "".join(RANK)  # each line once; no RuntimeError:, no chain, no traceback
    assert relay.ranks_lines() == [] and relay.launcher_lines() == lines[2:]


def test_a_killed_rank_is_one_sentence_and_the_status_of_a_kill(capsys):
    lines = [*RANK, *ONE_PROCESS_FAILURE]
    lines[-1] = lines[-1].format("died with <Signals.SIGKILL: 9>")
    relay, err = relayed(lines, capsys)
    assert err == "".join(RANK)
    sentence, status = unexplained_ending(relay.launcher_lines(), 1, "train", pids={0: "4321"})
    assert status == 128 + 9 and sentence.startswith("Rank 0 (pid 4321) was killed by SIGKILL")
    assert sentence.endswith("train.resume=auto continues the run from its last checkpoint.")
    relay, err = relayed([*RANK, *TORCHRUN_FAILURE], capsys)  # torchrun: its report's root cause
    assert err == "".join(RANK) and relay.ranks_lines() == []
    sentence, status = unexplained_ending(relay.launcher_lines(), 1, "eval")
    assert status == 137 and sentence.startswith("Rank 0 (pid 22391) was killed by SIGKILL")
    assert "train.resume" not in sentence


def test_a_crash_keeps_the_ranks_own_traceback_and_drops_the_launchers(capsys):
    crash = [
        "Traceback (most recent call last):\n",
        '  File "mlmkit/training/step.py", line 9\n',
        "ZeroDivisionError: division by zero\n",
    ]
    lines = [*RANK, *crash, *ONE_PROCESS_FAILURE]
    lines[-1] = lines[-1].format("returned non-zero exit status 1")
    relay, err = relayed(lines, capsys)
    assert err == "".join(RANK)  # the traceback is held until the launch ends
    assert relay.ranks_lines() == crash and relay.launcher_lines() == lines[5:]
    assert unexplained_ending(relay.launcher_lines(), 1, "train") == (
        "Rank 0 crashed with exit status 1; its traceback is above.",
        1,
    )


def test_the_re_print_of_a_rank_that_wrote_nothing_is_held(capsys):
    """A mistake every rank tells the launcher (not stderr): accelerate re-prints an empty
    stderr."""
    lines = [
        "The following values were not passed to `accelerate launch`\n",
        *ONE_PROCESS_FAILURE[3:],
    ]
    lines.insert(1, "RuntimeError\n")
    lines[-1] = lines[-1].format("returned non-zero exit status 2")
    relay, err = relayed(lines, capsys)
    assert err == lines[0] and relay.launcher_lines() == lines[1:]


def test_a_line_that_only_looks_like_a_re_print_passes(capsys):
    relay, err = relayed([*RANK, "RuntimeError: not anything printed before\n"], capsys)
    assert err.endswith("RuntimeError: not anything printed before\n") and relay.held == []
    assert unexplained_ending([], 1, "train")[1] == 1  # nothing to go by: the launcher's status


def test_the_ending_of_each_launcher_of_a_job(capsys):
    """What a launcher prints last and the status it returns: nothing for a finished run; the
    main machine's launcher says a preemption, the others (one job log for all) leave it; a
    launcher whose ranks only stopped because a process elsewhere ended leaves it to that one's."""
    from mlmkit.cli.launch import ending, machine_rank

    stopped = (
        "Stopped by SIGUSR1 at step 12 after saving a checkpoint; continue with train.resume=auto."
    )
    assert ending({}, Relay(), 0, "train") == 0 and capsys.readouterr().err == ""
    assert ending({0: {"status": 75, "line": stopped}}, Relay(), 1, "train") == 75
    assert capsys.readouterr().err == stopped + "\n"
    assert (
        ending({1: {"status": 75, "line": stopped}}, Relay(), 1, "train", main_machine=False) == 75
    )
    assert capsys.readouterr().err == ""
    relay, _ = relayed(
        TORCHRUN_FAILURE[:-5] + ["  rank      : 1 (local_rank: 0)\n", "  exitcode  : 3 (pid: 7)\n"],
        capsys,
    )
    assert ending({1: {"status": 3, "line": None}}, relay, 1, "train", main_machine=False) == 3
    assert capsys.readouterr().err == ""
    assert [
        machine_rank(o)
        for o in (["--machine_rank", "1"], ["--machine_rank=2"], ["--num_processes", "2"])
    ] == [1, 2, 0]


def test_a_rank_says_how_it_ended_before_it_leaves_the_process_group(monkeypatch, capsys):
    """Leaving the group ends the other ranks' collectives; torchrun, seeing them exit, may
    terminate this rank at once, so its sentence must be out by then."""
    from mlmkit.cli import errors
    from mlmkit.errors import ConfigError

    said_when_leaving = []
    monkeypatch.setattr(
        errors, "leave_process_group", lambda: said_when_leaving.append(capsys.readouterr().err)
    )

    def refused():
        raise ConfigError("set train.batch_size to a positive number")

    def interrupted():
        raise KeyboardInterrupt("Stopped at once by a second Ctrl-C.")

    assert errors.report_errors(refused) == 2
    assert errors.report_errors(interrupted) == errors.INTERRUPTED
    assert said_when_leaving == [
        "Error: set train.batch_size to a positive number\n",
        "Stopped at once by a second Ctrl-C.\n",
    ]


@pytest.mark.parametrize("world_size", ["2", "1"])
def test_a_rank_of_several_ends_with_its_status_and_its_log_but_no_teardown(tmp_path, world_size):
    """A rank of several (``WORLD_SIZE`` 2, torch.distributed imported) exits at once with its
    status: what its log handlers hold is written and its stdout flushed, but the interpreter's
    teardown, where gloo's leftover threads can abort a finished run, is not reached (an atexit
    hook stands for it). One process returns the status and tears down as before."""
    log = tmp_path / "train.log"
    script = tmp_path / "rank.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import atexit, logging, logging.handlers, sys
            import torch.distributed
            from mlmkit.cli.errors import end_rank

            held = logging.handlers.MemoryHandler(100, target=logging.FileHandler({str(log)!r}))
            logging.getLogger("run").addHandler(held)
            logging.getLogger("run").warning("Done: 10 steps")  # held until the handler closes
            atexit.register(lambda: print("teardown", flush=True))
            sys.stdout.write("said ")  # not flushed yet
            sys.exit(end_rank(7))
            """
        )
    )
    env = {**os.environ, "WORLD_SIZE": world_size}
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 7, proc.stderr
    assert log.read_text() == "Done: 10 steps\n"
    assert proc.stdout == ("said " if world_size == "2" else "said teardown\n")


def test_an_elastic_launch_is_torchruns_and_says_what_a_restart_needs(tmp_path, monkeypatch):
    """``--nnodes MIN:MAX`` is torchrun's elastic agent (a c10d rendezvous and restarts unless
    given); a training command that could not continue after a restart is one sentence, before
    any process starts; the ranks of each attempt report in a folder of their own, and the
    launcher reads the last one."""
    from mlmkit.cli import errors
    from mlmkit.cli.launch import elastic, last_attempt, main, outcomes, torchrun_options
    from mlmkit.errors import ConfigError

    assert elastic(["--nnodes", "1:2"]) and elastic(["--nnodes=2:4", "--nproc_per_node", "8"])
    assert not elastic(["--num_machines", "2"]) and not elastic(["--nnodes", "2"])
    train = ["train", "train.resume=auto", "hydra.run.dir=/shared/run"]
    assert torchrun_options(["--nnodes", "1:2"], train) == [
        "--nnodes", "1:2", "--rdzv_backend", "c10d", "--max_restarts", "3",
    ]  # fmt: skip
    mine = ["--nnodes=1:2", "--rdzv_backend=static", "--max_restarts", "9"]
    assert torchrun_options(mine, train) == mine
    for command in (["train"], ["train", "train.resume=auto"], ["train", "hydra.run.dir=x"]):
        with pytest.raises(ConfigError, match="add train.resume=auto and hydra.run.dir="):
            main(["--nnodes", "1:2", *command])

    monkeypatch.setenv(errors.LAUNCH_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "0")
    for attempt, status in ((0, 3), (1, 0)):  # a peer lost, then the restart that finished
        monkeypatch.setenv(errors.ATTEMPT_ENV, str(attempt))
        errors.tell(status, None)
    assert last_attempt(tmp_path).name == "attempt-0001"
    assert outcomes(tmp_path) == {0: {"status": 0, "line": None, "pid": os.getpid()}}
