"""Jobs side by side: a pool of worker processes, each pinned to one device, for evaluations
made of independent fine-tunings (``mlmkit glue`` runs one task per worker).

With CUDA each worker sees one GPU (``CUDA_VISIBLE_DEVICES`` set before it touches CUDA), the
GPUs dealt round-robin, so ``parallel`` may exceed the GPU count (several small fine-tunings
share one large GPU); on a CPU the workers split the cores. Workers are started by ``spawn``
(a fork would copy the parent's CUDA and OpenMP state), all of them before any job runs, so
jobs submitted together start together.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from typing import Any

from mlmkit.errors import ConfigError

log = logging.getLogger("mlmkit")

WORKER: dict[str, str | None] = {"device": None}  # a worker's device (None: not a worker)


def visible_gpus() -> list[str]:
    """List the GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them (ids or UUIDs)."""
    import torch

    if not torch.cuda.is_available():
        return []
    named = os.environ.get("CUDA_VISIBLE_DEVICES")
    if named:
        return [d.strip() for d in named.split(",") if d.strip()][: torch.cuda.device_count()]
    return [str(i) for i in range(torch.cuda.device_count())]


def worker_count(parallel: int | None, gpus: list[str]) -> int:
    """How many jobs run at once: ``parallel``, or one per GPU (one on a CPU or under a
    distributed launch, whose ranks share each job instead)."""
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if parallel is None:
        return 1 if launched else max(len(gpus), 1)
    if parallel > 1 and launched:
        raise ConfigError(
            f"parallel={parallel} runs jobs in processes of their own, which a distributed launch "
            "(accelerate launch with several processes) cannot; set parallel=1 there, or run the "
            "command without accelerate launch to give each job its own GPU."
        )
    return parallel


def slot_devices(count: int, gpus: list[str]) -> list[str | None]:
    """Each worker's ``CUDA_VISIBLE_DEVICES`` (the GPUs dealt round-robin; None on a CPU)."""
    return [gpus[i % len(gpus)] if gpus else None for i in range(count)]


def _start_worker(slots: Any, ready: Any, threads: int) -> None:
    """Start a worker: claim a device, split the CPU, log with the device named, and wait
    until every worker has started."""
    device = slots.get()
    WORKER["device"] = "cpu" if device is None else f"cuda:{device}"
    if device is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = device
    import torch

    torch.set_num_threads(threads)
    logging.basicConfig(
        level=logging.INFO,
        format=f"[%(asctime)s] [{WORKER['device']} pid {os.getpid()}] %(message)s",
        datefmt="%H:%M:%S",
    )
    ready.wait(timeout=600)


class InProcess(Executor):
    """The executor of one worker: each job runs in this process when it is submitted, and its
    error is raised there, as a loop's would be (no later job starts)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def pool(parallel: int | None) -> Executor:
    """Return an executor running ``parallel`` jobs at once (see ``worker_count``): this process
    when that is one, otherwise workers pinned to the devices."""
    import multiprocessing

    gpus = visible_gpus()
    count = worker_count(parallel, gpus)
    if count == 1:
        return InProcess()
    context = multiprocessing.get_context("spawn")
    slots, ready = context.Queue(), context.Barrier(count)
    for device in slot_devices(count, gpus):
        slots.put(device)
    threads = max(1, (os.cpu_count() or 1) // count)
    log.info(
        "%d jobs side by side: %s",
        count,
        ", ".join(f"GPU {d}" for d in slot_devices(count, gpus))
        if gpus
        else f"on the CPU, {threads} thread(s) each",
    )
    return ProcessPoolExecutor(
        count, mp_context=context, initializer=_start_worker, initargs=(slots, ready, threads)
    )


def job_place() -> dict[str, Any]:
    """Where the calling job runs: its device and process."""
    device = WORKER["device"]
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return {"device": device, "process": os.getpid()}
