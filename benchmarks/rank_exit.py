"""How often a finished two-rank run aborts at its exit: the interpreter's teardown against
``mlmkit.cli.errors.end_rank``.

Each run is ``torchrun --nproc_per_node 2`` of this file on gloo: a four-layer FSDP2 model takes
5 AdamW steps, saves a sharded checkpoint (torch.distributed.checkpoint), gathers the full state
dict and closes its process group, as a finished ``objective=...`` run under ``distributed=fsdp``
does. Then the rank either returns to the interpreter ("teardown") or ends with ``end_rank(0)``.
The two arms alternate, so that both meet the same machine load. A run counts as aborted where
torchrun's status is not 0 or a rank printed "terminate called".

    python benchmarks/rank_exit.py --runs 100     # a Markdown table; about 6 s a run on 2 cores
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ARMS = ("teardown", "end_rank")


def rank_main(arm: str, checkpoint: str) -> int:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch import nn
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(5):
        model(torch.randn(8, 64)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    dcp.save({"model": model.state_dict()}, checkpoint_id=checkpoint)
    get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    dist.barrier()
    if arm == "end_rank":
        from mlmkit.cli.errors import end_rank

        return end_rank(0)  # never returns on a rank of several
    dist.destroy_process_group()
    return 0


def one_run(arm: str) -> tuple[bool, int, float]:
    src = str(Path(__file__).resolve().parents[1] / "src")  # mlmkit, from a checkout too
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1", PYTHONPATH=path)
    with tempfile.TemporaryDirectory() as checkpoint:
        start = time.perf_counter()
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",  # torchrun, wherever its script is installed
                "--nproc_per_node",
                "2",
                "--master_port",
                str(random.randint(20000, 40000)),
                __file__,
                "--rank-arm",
                arm,
                checkpoint,
            ],
            capture_output=True,
            text=True,
            env=env,
        )
    said = done.stdout + done.stderr
    return (
        done.returncode != 0 or "terminate called" in said,
        done.returncode,
        time.perf_counter() - start,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100, help="runs of each arm")
    parser.add_argument("--rank-arm", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("checkpoint", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_arm:
        sys.exit(rank_main(args.rank_arm, args.checkpoint))
    aborted = {arm: 0 for arm in ARMS}
    statuses = {arm: set() for arm in ARMS}
    seconds = {arm: 0.0 for arm in ARMS}
    for i in range(args.runs):
        for arm in ARMS:
            bad, status, took = one_run(arm)
            aborted[arm] += bad
            statuses[arm].add(status)
            seconds[arm] += took
        print(
            f"run {i + 1}/{args.runs}: " + ", ".join(f"{a} {aborted[a]} aborted" for a in ARMS),
            file=sys.stderr,
            flush=True,
        )
    print("| arm | runs | aborted at exit | torchrun's statuses | seconds a run |")
    print("| --- | ---: | ---: | --- | ---: |")
    for arm in ARMS:
        print(
            f"| {arm} | {args.runs} | {aborted[arm]} | {sorted(statuses[arm])} | "
            f"{seconds[arm] / args.runs:.1f} |"
        )


if __name__ == "__main__":
    main()
