"""A real SLURM cluster for the tests of this folder: munged, slurmctld and two slurmd (two
nodes, this machine's name and ``localhost``, on this one machine), started once per session
(``cluster``, the fixture test_slurm_jobs.py makes of it) from a slurm.conf and munge key in a
temporary folder, and stopped at its end.

Debian's ``slurm-wlm`` and ``munge`` (``make slurm`` installs them where the machine allows
it) and root are needed; without them the tests skip with the reason, except under ``CI=true``,
where they fail. The settings keep SLURM's timers short: the scheduler runs every second
(``sched_interval=1``), a requeued job may start 6 s after it ends (``cred_expire=5``: SLURM
holds a requeued job back for the lifetime of its launch credential, 20 minutes by default),
and a job's processes get ``KillWait`` (10 s) between SIGTERM and SIGKILL. slurmctld looks at
time limits (and sends ``--signal`` warnings) every 30 s, a period SLURM fixes
(``PERIODIC_TIMEOUT``); ``Cluster.wait_for_time_check`` waits for the next look.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

DAEMONS = (
    "munged",
    "slurmctld",
    "slurmd",
    "sbatch",
    "srun",
    "scontrol",
    "squeue",
    "scancel",
    "sinfo",
)
KILL_WAIT = 10  # seconds between SIGTERM and SIGKILL for a cancelled or timed-out job
TIME_CHECK = 30  # seconds between slurmctld's looks at time limits (SLURM's PERIODIC_TIMEOUT)


def unavailable() -> str | None:
    """Why a SLURM cluster cannot be started here (None: it can)."""
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        return (
            f"SLURM is not installed ({', '.join(missing)} missing); make slurm installs Debian's "
            "slurm-wlm and munge (as root)"
        )
    if os.geteuid() != 0:
        return "slurmd and munged run as root here, and this is not root"
    return None


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def node_names() -> list[str]:
    """This machine's name and ``localhost`` (a second node, where the name resolves to this
    machine); the first node's name is where a job's rendezvous listens. (SLURM reads a node
    named localhost as one named after the machine, so that one comes second.)"""
    host = socket.gethostname().split(".")[0]
    try:
        with socket.socket() as s:  # an address of this machine's own
            s.bind((socket.gethostbyname(host), 0))
    except OSError:
        return ["localhost"]
    return [host, "localhost"] if host != "localhost" else ["localhost"]


def not_here(reason: str):
    """Skip with ``reason``; under ``CI=true``, where every SLURM test must run, fail."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true needs the SLURM tests to run, but {reason}.")
    pytest.skip(reason)


@dataclass
class Cluster:
    """A running single-machine cluster: its folder (slurm.conf, logs, state) and nodes."""

    folder: Path
    nodes: list[str]
    conf: Path = field(init=False)
    started_in: float = 0.0  # seconds from the first daemon's start to every node idle

    def __post_init__(self) -> None:
        self.conf = self.folder / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    not_here = staticmethod(not_here)

    def run(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        """A SLURM command against this cluster."""
        proc = subprocess.run(
            list(args),
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
        return proc

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, Restarts, ExitCode, ...)."""
        text = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait_for(self, job_id: str, states: tuple[str, ...], timeout: float) -> dict[str, str]:
        """The job's fields once its state is one of ``states`` (a failure after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            if fields.get("JobState") in states:
                return fields
            assert time.monotonic() < deadline, (
                f"job {job_id} is {fields.get('JobState')} after {timeout} s, not {states}:\n"
                f"{self.logs()}"
            )
            time.sleep(0.5)

    def wait_for_time_check(self) -> None:
        """Return just after slurmctld's next look at time limits (its log says so)."""

        def looks() -> int:
            return self.log("slurmctld").count("debug2: Testing job time limits")

        seen, deadline = looks(), time.monotonic() + TIME_CHECK + 15
        while looks() == seen:
            assert time.monotonic() < deadline, (
                f"slurmctld did not look at time limits:\n{self.logs()}"
            )
            time.sleep(0.2)

    def log(self, daemon: str) -> str:
        path = self.folder / f"{daemon}.log"
        return path.read_text(errors="replace") if path.is_file() else ""

    def logs(self) -> str:
        """The end of each daemon's log, for a failure's message."""
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
            for p in sorted(self.folder.glob("*.log"))
        )

    def cancel_all(self) -> None:
        jobs = self.run("squeue", "-h", "-o", "%A", check=False).stdout.split()
        if jobs:
            self.run("scancel", *jobs, check=False)
        deadline = time.monotonic() + KILL_WAIT + 10
        while (
            self.run("squeue", "-h", "-o", "%A", check=False).stdout.split()
            and time.monotonic() < deadline
        ):
            time.sleep(0.5)


def write_config(folder: Path, nodes: list[str]) -> None:
    """slurm.conf and the munge key of a cluster in ``folder``."""
    key = folder / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o600)
    ctld_port, *node_ports = free_ports(1 + len(nodes))
    cpus = os.cpu_count() or 1
    node_lines = "\n".join(
        f"NodeName={name} NodeAddr=127.0.0.1 Port={port} CPUs={cpus} RealMemory=1000 State=UNKNOWN"
        for name, port in zip(nodes, node_ports)
    )
    (folder / "slurm.conf").write_text(f"""\
ClusterName=mlmkit-test
SlurmctldHost={nodes[0]}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={folder}/munge.socket,cred_expire=5
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool-%n
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd-%n.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd-%n.log
SlurmctldDebug=debug2
SlurmdDebug=info
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
KillWait={KILL_WAIT}
MinJobAge=600
ReturnToService=2
InactiveLimit=0
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
{node_lines}
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")


def start(cluster: Cluster) -> None:
    """munged, slurmctld and a slurmd per node, until every node is idle."""
    folder = cluster.folder
    write_config(folder, cluster.nodes)
    t0 = time.monotonic()
    subprocess.run(
        [
            "munged",
            f"--key-file={folder}/munge.key",
            f"--socket={folder}/munge.socket",
            f"--pid-file={folder}/munged.pid",
            f"--log-file={folder}/munged.log",
            f"--seed-file={folder}/munged.seed",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    subprocess.run(
        ["slurmctld", "-f", str(cluster.conf)], check=True, capture_output=True, timeout=30
    )
    for node in cluster.nodes:
        subprocess.run(
            ["slurmd", "-f", str(cluster.conf), "-N", node],
            check=True,
            capture_output=True,
            timeout=30,
        )
    deadline = time.monotonic() + 60
    while True:
        states = cluster.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout.split()[1::2]
        if len(states) == len(cluster.nodes) and all(s == "idle" for s in states):
            break
        assert time.monotonic() < deadline, f"the nodes are {states} after 60 s:\n{cluster.logs()}"
        time.sleep(0.1)
    cluster.started_in = time.monotonic() - t0


def stop(cluster: Cluster) -> None:
    """Cancel what runs, then end the daemons this session started (by their pid files)."""
    cluster.cancel_all()
    pids = [cluster.folder / f"slurmd-{n}.pid" for n in cluster.nodes]
    pids += [cluster.folder / "slurmctld.pid", cluster.folder / "munged.pid"]
    running = []
    for path in pids:
        try:
            pid = int(path.read_text().split()[0])
            os.kill(pid, 15)
            running.append(pid)
        except (OSError, ValueError):
            continue
    deadline = time.monotonic() + 10
    while running and time.monotonic() < deadline:  # gone, before their folder is removed
        running = [pid for pid in running if Path(f"/proc/{pid}").exists()]
        time.sleep(0.1)


def cluster():
    """The session's cluster (its SLURM_CONF in this process's environment while it runs), for a
    session-scoped fixture to yield."""
    why = unavailable()
    if why:
        not_here(why)
    folder = Path(tempfile.mkdtemp(prefix="mlmkit-slurm-", dir="/tmp"))
    folder.chmod(0o755)  # munged wants its socket's folder open to all for execution
    running = Cluster(folder, node_names())
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(running.conf)
    try:
        start(running)
        print(
            f"\nSLURM cluster of {len(running.nodes)} node(s) started in {running.started_in:.1f} s"
        )
        yield running
    finally:
        stop(running)
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        shutil.rmtree(folder, ignore_errors=True)
