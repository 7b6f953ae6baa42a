"""Helpers for tests that run train.py end to end."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TINY = [
    "model.num_hidden_layers=1", "model.hidden_size=32", "model.num_attention_heads=2",
    "model.intermediate_size=64", "tokenizer.vocab_size=1000", "tokenizer.max_train_chars=300000",
    "data.max_seq_length=64", "data.max_eval_samples=64", "train.batch_size=8", "train.progress=false",
    "train.log_every=5", "optim.warmup_steps=5",
]


def free_port() -> str:
    """A TCP port free now, for a launch's rendezvous (tests may run in parallel workers,
    each launching its own process group)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def run_train(run_dir: Path, cache_dir: Path, *overrides: str, check: bool = True,
              file_size_limit: int | None = None):
    """train.py with the tiny settings; ``file_size_limit``: a file cannot grow past that many
    bytes (the write fails with EFBIG, as on a full disk)."""
    cmd = [sys.executable, str(ROOT / "train.py"), *TINY, f"paths.cache_dir={cache_dir}",
           f"hydra.run.dir={run_dir}", *overrides]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    limit = (lambda: _limit_file_size(file_size_limit)) if file_size_limit else None
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                          preexec_fn=limit)
    if check and proc.returncode != 0:
        raise AssertionError(f"train.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def _limit_file_size(nbytes: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of killing the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


@contextmanager
def limited_file_size(nbytes: int):
    """In this process: writing a file past ``nbytes`` fails with EFBIG, as on a full disk."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.getsignal(signal.SIGXFSZ)
    _limit_file_size(nbytes)
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def events(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


# A resumed run repeats the uninterrupted one up to float rounding. Bit-equality is not
# asserted: on one machine an fp32 run with dataloader workers differed by 3.5e-7 relative in
# a logged loss, as a kernel's summation order can. A real resume fault is far larger: a
# scheduler one step ahead after the resume moves the next logged loss by 2e-4 relative.
RESUME_RTOL = 1e-6


def assert_same_losses(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> None:
    """The same logged steps, and losses within ``RESUME_RTOL``."""
    import pytest

    assert [s for s, _ in a] == [s for s, _ in b]  # none duplicated or lost
    for (step, x), (_, y) in zip(a, b):
        assert x == pytest.approx(y, rel=RESUME_RTOL), step


def assert_same_weights(a: dict, b: dict) -> None:
    """The same tensors, each within ``RESUME_RTOL`` of its largest magnitude."""
    assert a.keys() == b.keys()
    for name, tensor in b.items():
        diff = (a[name].float() - tensor.float()).abs().max()
        assert diff <= RESUME_RTOL * tensor.float().abs().max() + 1e-12, name


def run_finetune(*overrides: str, check: bool = True):
    """``mlmkit finetune`` with ``overrides``, from the checkout."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "mlmkit", "finetune", *overrides], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"finetune failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc
