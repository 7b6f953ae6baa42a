"""Shared fixtures: a small WordPiece tokenizer and paths to the reference data."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# the shared helpers beside this file (runs.py, batches.py) import as top-level modules
# from the test files in the subfolders too
sys.path.insert(0, str(Path(__file__).resolve().parent))
from runs import TEST_ENV, run_train  # noqa: E402
from zygote import write_client  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the Hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["DS_ACCELERATOR"] = "cpu"  # DeepSpeed's CPU accelerator, as in runs.TEST_ENV


# The files that take minutes, the longest first: run first, so that under pytest-xdist
# (``--dist loadfile``: a file's tests on one worker) no worker is left alone with one at the end.
# make test passes --no-loadscope-reorder: else xdist hands out the files with the most tests first.
LONGEST_FILES = [
    "tests/e2e/test_pretraining_pays_off.py",  # under make test LONG=1 (CI)
    "tests/e2e/test_examples.py",
    "tests/slurm/test_slurm_jobs.py",
    "tests/e2e/test_distributed.py",
    "tests/e2e/test_elastic.py",
    "tests/e2e/test_reliability.py",
    "tests/e2e/test_gpu_check.py",
    "tests/data/test_installs.py",
    "tests/e2e/test_train.py",
    "tests/e2e/test_bench_phases.py",
    "tests/e2e/test_bench_quality.py",
    "tests/e2e/test_launch.py",
    "tests/cli/test_malformed_inputs.py",
    "tests/training/test_speed_settings.py",
    "tests/e2e/test_packaging.py",
    "tests/e2e/test_bench_modern.py",
    "tests/cli/test_refusals.py",
]


def pytest_collection_modifyitems(config, items):
    """Run the longest files first; tests marked ``gpu`` skip, with the reason, where no CUDA
    GPU is present."""
    import torch

    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none here)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def shared_file(relative: str) -> Path:
    """A file of ../shared/data, or skip the test with the reason."""
    path = SHARED_DATA / relative
    if not path.exists():
        pytest.skip(f"reference data {path} is absent (../shared/data is laid beside the project)")
    return path


@pytest.fixture(autouse=True)
def fresh_process_state():
    """After each test, the loggers' handlers are as they were and accelerate's process-wide
    state is reset, so that the next test's ``Accelerator`` may take another mixed precision
    (accelerate refuses a changed one)."""
    import logging

    loggers = [logging.getLogger(), logging.getLogger("mlmkit")]
    saved = [(lg, list(lg.handlers), lg.level, lg.propagate) for lg in loggers]
    yield
    for lg, handlers, level, propagate in saved:
        for handler in set(lg.handlers) - set(handlers):
            handler.close()
        lg.handlers[:], lg.level, lg.propagate = handlers, level, propagate
    if "accelerate.state" in sys.modules:
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture(scope="session")
def zygote(tmp_path_factory):
    """The zygote's server (tests/zygote.py), started with the tests' environment, once per
    worker: the commands of the examples and benchmarks are processes forked from it, without
    an interpreter's imports each. MLMKIT_ZYGOTE=0 starts none: every command a new
    interpreter."""
    if os.environ.get("MLMKIT_ZYGOTE") == "0":
        yield None
        return
    socket_path = tmp_path_factory.mktemp("zygote") / "socket"
    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "zygote.py"), "serve", str(socket_path)],
        cwd=ROOT, env={**os.environ, **TEST_ENV}, stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert server.stdout.readline().strip() == "ready", "the zygote did not start"
        yield socket_path
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


@pytest.fixture(scope="session")
def zygote_python(tmp_path_factory, zygote) -> str:
    """The interpreter for a test's ``python <script>`` or ``python -m mlmkit``: the zygote's
    client where the zygote runs, else this interpreter."""
    if zygote is None:
        return sys.executable
    return str(write_client(tmp_path_factory.mktemp("zygote-client"), zygote))


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One tokenizer/dataset cache for the whole session (trained once, reused), shared by the
    session's xdist workers: an entry either worker prepares first serves both (the cache
    writes each entry whole, under a lock, and renames it into place)."""
    base = tmp_path_factory.getbasetemp()
    # under xdist each worker's base is a folder of the session's own (pytest-N/popen-gwK)
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "mlmkit-cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tokenizer():
    """A WordPiece tokenizer trained on the built-in corpus (a few seconds)."""
    from mlmkit.config import TokenizerConfig
    from mlmkit.data.sources import builtin_documents
    from mlmkit.data.tokenizer import train_tokenizer

    return train_tokenizer(
        TokenizerConfig(vocab_size=2000, max_train_chars=2_000_000), builtin_documents()
    )


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, cache_dir) -> Path:
    run = tmp_path_factory.mktemp("trained") / "run"
    # BERT's zero output bias: in 30 steps a unigram start (the default) leaves the loss
    # little room to fall, and the tests check that the loss does fall
    run_train(
        run,
        cache_dir,
        "train.max_steps=30",
        "train.eval_every=15",
        "train.save_every=15",
        "train.precision=bf16",
        "model.output_bias_init=zero",
    )
    return run
