"""The SLURM examples on a real cluster (``slurm_cluster.py``: munged, slurmctld and two slurmd on
this machine): ``bash examples/slurm/train.sbatch`` submitted as the README says, warned by SLURM's
own timer (``--time=1 --signal=USR1@5``), requeued and resumed to an uninterrupted run's
weights; ``scancel`` of a running job (SIGTERM, then KillWait) leaving a checkpoint; two nodes,
one rank each, through the multi-node accelerate config (gloo on CPU); and a two-job sweep of
Hydra's submitit_slurm launcher (``examples/slurm/submitit.sh``). Every job's log holds the
run's lines once, one ending sentence, and no traceback or re-print from a launcher.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runs import TINY as BASE_TINY
from runs import process_tree

from .slurm_cluster import cluster

ROOT = Path(__file__).resolve().parents[2]
TRAIN_SBATCH, SUBMITIT = (
    ROOT / "examples" / "slurm/train.sbatch",
    ROOT / "examples" / "slurm/submitit.sh",
)
# a tiny model on the built-in corpus, fp32, quiet
TINY = [
    *BASE_TINY,
    "train.eval_every=0",
    "train.save_every=0",
    "train.precision=no",
    "logger=none",
    "train.log_every=10",
]
# sbatch options the test nodes can meet (the script asks for 2 nodes of 8 GPUs and 64 CPUs)
ONE_NODE = ["--nodes=1", "--gpus-per-node=0", "--cpus-per-task=1"]
NOISE = (
    "Traceback",
    "RuntimeError",
    "The above exception",
    "ChildFailedError",
    "torch/distributed/elastic",
)


@pytest.fixture(scope="session")
def slurm():
    """The cluster, started once for the session (skipped with the reason where SLURM cannot
    start; under CI=true, failed)."""
    yield from cluster()


def free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def job_env(**extra: str) -> dict[str, str]:
    """The environment a job is submitted with (SLURM passes it on): this interpreter, one
    process per node on the CPU, no Hub."""
    return {
        **os.environ,
        "PYTHON": sys.executable,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "ACCELERATE_USE_CPU": "1",
        "GPUS_PER_NODE": "1",
        "ACCELERATE_CONFIG": "cpu_multi_process",
        "MAIN_PORT": free_port(),
        **extra,
    }


def submit(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """``bash examples/slurm/train.sbatch <args>`` from ``cwd``: the job id it was given."""
    proc = subprocess.run(
        ["bash", str(TRAIN_SBATCH), *args],
        cwd=cwd,
        env=env or job_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    found = re.fullmatch(r"Submitted batch job (\d+)\n", proc.stdout)
    assert found, proc.stdout + proc.stderr
    return found[1]


def events(run: Path, kind: str = "train") -> list[dict]:
    path = run / "metrics.jsonl"
    found = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line being written
        if event.get("event") == kind:
            found.append(event)
    return found


def wait_for_training(slurm, job: str, run: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not events(run):
        state = slurm.job(job).get("JobState")
        assert state in ("PENDING", "RUNNING", "CONFIGURING"), f"job {job} is {state}"
        assert time.monotonic() < deadline, f"job {job} logged no training step in {timeout} s"
        time.sleep(0.5)


def assert_clean(log: str, runs: int = 1) -> None:
    """The job log of ``runs`` runs of the job (a requeue runs it again): no traceback, no
    exception chain, no re-print; each of the run's lines once per run."""
    assert not [noise for noise in NOISE if noise in log], log[-5000:]
    for line in ("Batch: ", "Budget: ", "Model bert-tiny"):
        assert log.count(line) == runs, (line, log[-5000:])


def train_here(run: Path, overrides: list[str]) -> None:
    """``overrides``'s run in this process (one thread, as the job's)."""
    import torch
    from accelerate.state import AcceleratorState

    from mlmkit import compose, train

    AcceleratorState._reset_state(reset_partial_state=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(compose(overrides), run)
    finally:
        torch.set_num_threads(threads)


def weights(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(model_dir / "model.safetensors")


@pytest.mark.slow
def test_train_sbatch_warned_by_slurm_is_requeued_and_ends_as_an_uninterrupted_run(
    slurm, tmp_path, cache_dir
):
    """SLURM's own warning: a 1-minute time limit and ``--signal=USR1@5``. slurmctld sends the
    signal at its first look at time limits 25 s or more into the job (it looks every 30 s);
    the job, submitted just after a look, trains on a 30-s time budget until the next one,
    saves a checkpoint, exits 75 and requeues itself; the requeued job resumes and spends the
    rest of the budget (a job warned again is requeued again). A warning that comes while the
    job is still setting up (a slow machine, a late start) stops it after its first step.
    Its weights equal an uninterrupted run's of as many steps: after its warmup the learning
    rate is constant, so no step's rate depends on the clock."""
    base = [*TINY, f"paths.cache_dir={cache_dir}", "optim.schedule=constant"]
    # a budget the job is still spending at the warning, however fast this machine trains
    overrides = [*base, "train.max_steps=null", "train.max_time=30s"]
    # the tokenizer and the data in the cache first, as a requeued job finds them: the job's
    # setup is then its imports and the model, and the warning comes while it trains
    train_here(tmp_path / "warm", [*base, "train.max_steps=1"])

    slurm.wait_for_time_check()  # the job starts just after one: warned at the next, 30 s on
    job = submit(tmp_path, *ONE_NODE, "--time=1", "--signal=USR1@5", *overrides)
    fields = slurm.wait_for(job, ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"), timeout=400)
    log = (tmp_path / "logs" / f"mlmkit-{job}.out").read_text()
    assert fields["JobState"] == "COMPLETED", log[-5000:]
    stops = log.count("Stopped by SIGUSR1 at step ")
    assert stops >= 1 and int(fields["Restarts"]) == stops, log[-5000:]
    assert f"warning signal 10 to JobId={job}" in slurm.log("slurmctld")  # SLURM's timer sent it
    assert log.count(f"requeueing job {job}") == stops and log.count("Resumed from ") == stops
    assert_clean(log, runs=stops + 1)
    run = tmp_path / "outputs" / f"slurm-{job}"
    logged = [e["step"] for e in events(run)]
    # the uninterrupted run, alone (as the job was): as many steps, on a step budget
    train_here(tmp_path / "reference", [*base, f"train.max_steps={logged[-1]}"])
    assert logged == [e["step"] for e in events(tmp_path / "reference")]  # each step once
    resumed = weights(run / "final")
    for name, tensor in weights(tmp_path / "reference" / "final").items():
        assert resumed[name].allclose(tensor, rtol=1e-5, atol=1e-7), name


@pytest.mark.slow
def test_scancel_of_a_running_job_leaves_a_checkpoint(slurm, tmp_path, cache_dir):
    """``scancel``: SIGTERM to every process of the job, SIGKILL KillWait later; the run saves a
    checkpoint first and says so once."""
    job = submit(
        tmp_path, *ONE_NODE, *TINY, f"paths.cache_dir={cache_dir}", "train.max_steps=100000"
    )
    run = tmp_path / "outputs" / f"slurm-{job}"
    wait_for_training(slurm, job, run)
    slurm.run("scancel", job)
    fields = slurm.wait_for(job, ("CANCELLED", "COMPLETED", "FAILED"), timeout=60)
    log = (tmp_path / "logs" / f"mlmkit-{job}.out").read_text()
    assert fields["JobState"] == "CANCELLED" and fields["Restarts"] == "0", log[-5000:]
    (checkpoint,) = (run / "checkpoints").glob("step_*")
    stopped = [line for line in log.splitlines() if line.startswith("Stopped by")]
    assert stopped == [
        f"Stopped by SIGTERM at step {int(checkpoint.name[5:])} after saving a checkpoint; "
        "continue with train.resume=auto in the same hydra.run.dir."
    ], log[-5000:]
    assert "requeueing" not in log
    assert_clean(log)


@pytest.mark.slow
def test_train_sbatch_trains_on_two_nodes_through_the_multi_node_config(slurm, tmp_path, cache_dir):
    """The script's own layout: ``--nodes=2``, one launcher per node (srun), the packaged
    multi_node accelerate config, one rank per node, the first node's name as the rendezvous."""
    if len(slurm.nodes) < 2:
        slurm.not_here(
            "this machine's name does not resolve to an address of its own, so the cluster has one "
            "node"
        )
    env = job_env(ACCELERATE_CONFIG="multi_node")
    job = submit(
        tmp_path,
        "--nodes=2",
        "--gpus-per-node=0",
        "--cpus-per-task=1",
        *TINY,
        f"paths.cache_dir={cache_dir}",
        "train.max_steps=30",
        env=env,
    )
    fields = slurm.wait_for(job, ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"), timeout=300)
    log = (tmp_path / "logs" / f"mlmkit-{job}.out").read_text()
    assert fields["JobState"] == "COMPLETED" and fields["NumNodes"] == "2", log[-5000:]
    run = tmp_path / "outputs" / f"slurm-{job}"
    assert "| 2 process(es) on cpu |" in (run / "train.log").read_text()
    assert [e["step"] for e in events(run)] == [10, 20, 30]
    assert (run / "final" / "model.safetensors").is_file()
    assert (run / "accelerate.yaml").read_text() == (
        ROOT / "conf" / "accelerate" / "multi_node.yaml"
    ).read_text()
    assert_clean(log)


@pytest.mark.slow
def test_a_job_requeued_onto_fewer_nodes_goes_on_from_its_checkpoint(slurm, tmp_path, cache_dir):
    """A job of two nodes (one rank each) stopped with a checkpoint and requeued held
    (``scontrol requeuehold``: SIGTERM to its processes), changed to one node while it waits
    and released, comes back on one process: it resumes from the two ranks' checkpoint, reads
    on at the epoch's next sample, and finishes the run."""
    if len(slurm.nodes) < 2:
        slurm.not_here(
            "this machine's name does not resolve to an address of its own, so the cluster has one "
            "node"
        )
    job = submit(
        tmp_path, "--nodes=2", "--gpus-per-node=0", "--cpus-per-task=1", *TINY,
        f"paths.cache_dir={cache_dir}", "train.max_steps=600", "train.save_every=20",
        env=job_env(ACCELERATE_CONFIG="multi_node"),
    )  # fmt: skip
    run = tmp_path / "outputs" / f"slurm-{job}"
    wait_for_training(slurm, job, run)
    slurm.run("scontrol", "requeuehold", job)
    slurm.wait_for(job, ("PENDING",), timeout=60)
    slurm.run("scontrol", "update", f"JobId={job}", "NumTasks=1")
    slurm.run("scontrol", "update", f"JobId={job}", "NumNodes=1")
    slurm.run("scontrol", "release", job)
    fields = slurm.wait_for(job, ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"), timeout=300)
    log = (tmp_path / "logs" / f"mlmkit-{job}.out").read_text()
    assert fields["JobState"] == "COMPLETED" and fields["NumNodes"] == "1", log[-5000:]
    text = (run / "train.log").read_text()
    assert "| 2 process(es) on cpu |" in text and "| 1 process(es) on cpu |" in text
    assert "Stopped by SIGTERM at step " in log
    assert re.search(r"written with 2 x 8: the epoch goes on at its sample \d+", text), text
    logged = [e["step"] for e in events(run)]
    assert logged == sorted(set(logged)) and logged[-1] == 600  # each step once, to the end
    assert (run / "final" / "model.safetensors").is_file()


def _node_launchers(job: str) -> dict[str, int]:
    """SLURM_NODEID -> the pid of that node's ``mlmkit launch`` in the job."""
    found = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            env = dict(
                kv.split(b"=", 1)
                for kv in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
                if b"=" in kv
            )
        except OSError:
            continue
        if cmd[1:4] == [b"-m", b"mlmkit", b"launch"] and env.get(b"SLURM_JOB_ID") == job.encode():
            found[env[b"SLURM_NODEID"].decode()] = int(entry)
    return found


def _listener(port: int) -> int | None:
    """The pid listening on ``port`` (the elastic agents' rendezvous store)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            parts = line.split()
            if parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(parts[9])
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{entry}/fd"):
                link = os.readlink(f"/proc/{entry}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return int(entry)
        except OSError:
            continue
    return None


@pytest.mark.slow
def test_an_elastic_job_goes_on_without_a_node_it_loses(slurm, tmp_path, cache_dir):
    """``MIN_NODES=1`` and two nodes: the script runs torchrun's elastic agent on each node; one
    node's launcher, agent and rank killed (the node lost), the other agent restarts its rank
    alone from the last checkpoint and the job completes."""
    if len(slurm.nodes) < 2:
        slurm.not_here(
            "this machine's name does not resolve to an address of its own, so the cluster has one "
            "node"
        )
    # the survivor's agent waits 2 s, not 30, for more nodes before it restarts
    env = job_env(MIN_NODES="1", ELASTIC_OPTIONS="--rdzv_conf last_call_timeout=2")
    job = submit(
        tmp_path, "--nodes=2", "--gpus-per-node=0", "--cpus-per-task=1", *TINY,
        f"paths.cache_dir={cache_dir}", "train.max_steps=300", "train.save_every=20", env=env,
    )  # fmt: skip
    run = tmp_path / "outputs" / f"slurm-{job}"
    wait_for_training(slurm, job, run)
    deadline = time.monotonic() + 120
    while not list((run / "checkpoints").glob("step_*")):  # the two nodes' first checkpoint
        assert time.monotonic() < deadline, "no checkpoint in 120 s"
        time.sleep(0.2)
    launchers = _node_launchers(job)
    assert sorted(launchers) == ["0", "1"], launchers
    host = _listener(int(env["MAIN_PORT"]))
    # the node that does not hold the rendezvous store is lost (torch's agents cannot outlive
    # the node that holds it)
    lost = next(n for n, pid in launchers.items() if host not in process_tree(pid))
    for pid in process_tree(launchers[lost]):
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    fields = slurm.wait_for(job, ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED"), timeout=300)
    log = (tmp_path / "logs" / f"mlmkit-{job}.out").read_text()
    assert fields["JobState"] == "COMPLETED", log[-5000:]
    text = (run / "train.log").read_text()
    assert "| 2 process(es) on cpu |" in text and "| 1 process(es) on cpu |" in text, text
    assert "from a checkpoint written with 2 x 8: the epoch goes on at its sample" in text
    logged = [e["step"] for e in events(run)]
    assert logged == sorted(set(logged)) and logged[-1] == 300
    assert (run / "final" / "model.safetensors").is_file()


@pytest.mark.slow
def test_submitit_script_runs_a_two_job_sweep_on_slurm(slurm, tmp_path, cache_dir):
    """``bash examples/slurm/submitit.sh optim.lr=1e-3,3e-3``: Hydra's submitit_slurm launcher
    submits a job per value (an array), waits for them, and each trains in its run dir."""
    sweep = tmp_path / "sweep"
    fit = [
        "hydra.launcher.gpus_per_node=0",
        "hydra.launcher.cpus_per_task=1",
        "hydra.launcher.timeout_min=10",
    ]
    proc = subprocess.run(
        [
            "bash",
            str(SUBMITIT),
            "optim.lr=1e-3,3e-3",
            *TINY,
            *fit,
            f"paths.cache_dir={cache_dir}",
            "train.max_steps=20",
            f"hydra.sweep.dir={sweep}",
        ],
        cwd=tmp_path,
        env=job_env(PARTITION="test"),
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    for num, lr in enumerate(("0.001", "0.003")):  # as the sweeper writes them
        run = sweep / str(num)
        assert f"optim.lr={lr}" in (run / ".hydra" / "overrides.yaml").read_text()
        assert [e["step"] for e in events(run)] == [10, 20]
        assert (run / "final" / "model.safetensors").is_file()
    logs = sorted((sweep / ".submitit").glob("*/*_log.err"))
    assert len(logs) == 2, logs
    jobs = {p.parent.name for p in logs}  # <array job>_<task>, as SLURM numbered them
    for job in jobs:  # the result is written before the job's own end
        fields = slurm.wait_for(job, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=60)
        assert fields["JobState"] == "COMPLETED" and fields["Partition"] == "test", fields
    for path in logs:
        assert_clean(path.read_text())


@pytest.mark.slow
def test_a_mistake_and_a_killed_rank_each_end_a_job_log_with_one_sentence(
    slurm, tmp_path, cache_dir
):
    """Two jobs at once: one with a setting that does not exist (refused by every rank before
    any work) and one whose rank is killed with SIGKILL while it trains (as the kernel's
    out-of-memory killer does). Each log: the run's lines once, one sentence, no traceback."""
    run_args = [*ONE_NODE, *TINY, f"paths.cache_dir={cache_dir}"]
    mistake = submit(tmp_path, *run_args, "train.bach_size=4")
    killed = submit(tmp_path, *run_args, "train.max_steps=100000", env=job_env())
    run = tmp_path / "outputs" / f"slurm-{killed}"
    wait_for_training(slurm, killed, run)
    os.kill(int((run / ".lock").read_text().split()[0]), 9)  # the rank: it holds the run dir
    for job, last in (
        (mistake, "Error: Could not override 'train.bach_size'"),
        (killed, "Rank 0 (pid "),
    ):
        fields = slurm.wait_for(job, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=120)
        log = (tmp_path / "logs" / f"mlmkit-{job}.out").read_text()
        assert fields["JobState"] == "FAILED" and fields["Restarts"] == "0", log[-5000:]
        own = [line for line in log.splitlines() if not line.startswith(("srun:", "slurmstepd"))]
        assert own[-1].startswith(last), log[-5000:]  # the ending sentence, last of mlmkit's lines
        assert sum(line.startswith(("Error:", "Rank ", "Stopped by")) for line in own) == 1, log[
            -5000:
        ]
        assert not [noise for noise in NOISE if noise in log], log[-5000:]
    assert fields["ExitCode"] == "137:0" and "was killed by SIGKILL" in own[-1], (fields, own[-1])
    assert own.count(next(line for line in own if "Budget: " in line)) == 1  # the run's lines once
