"""Preemption, damaged checkpoints, full disks, numerical guards, bad inputs, SIGKILL."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from runs import (
    ROOT,
    TINY,
    assert_same_weights,
    events,
    python_popen,
    run_train,
    train_steps,
)

from mlmkit.training.checkpoint_files import list_checkpoints


def _start(run: Path, cache_dir: Path, *overrides: str) -> subprocess.Popen:
    return python_popen(
        ROOT / "train.py", *TINY, f"paths.cache_dir={cache_dir}", f"hydra.run.dir={run}", *overrides
    )


def _weights(path: Path):
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2], ids=lambda sig: sig.name
)
def test_signal_saves_a_checkpoint_and_exits_75(tmp_path, cache_dir, sig):
    run = tmp_path / "run"
    args = [
        "train.max_steps=150",
        "train.log_every=1",
        "train.save_every=0",
        "train.eval_every=0",
        "train.precision=no",
    ]
    proc = _start(run, cache_dir, *args)
    deadline = time.time() + 120
    while len(train_steps(run)) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err[-3000:]
    assert f"Stopped by {signal.Signals(sig).name}" in err and "Traceback" not in err
    # said at once, before the step ends
    assert f"Got {signal.Signals(sig).name}: stopping after this step, with a checkpoint" in err
    ckpts = list_checkpoints(run / "checkpoints")
    assert len(ckpts) == 1
    stopped_at = int(ckpts[0].name.split("_")[1])
    assert 3 <= stopped_at < 150
    # continue to the end: every step logged exactly once
    run_train(run, cache_dir, *args, "train.resume=auto")
    assert train_steps(run) == list(range(1, 151))


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_in_one_sentence(tmp_path, cache_dir):
    """The second Ctrl-C comes once the first is acknowledged, within the same step: steps of
    most of a second (a wider model), so that the step cannot end first. (Two signals sent
    together may reach Python's handler as one.)"""
    run = tmp_path / "run"
    proc = _start(
        run,
        cache_dir,
        "model.num_hidden_layers=4",
        "model.hidden_size=256",
        "model.intermediate_size=1024",
        "model.num_attention_heads=4",
        "train.max_steps=500",
        "train.log_every=1",
        "train.save_every=0",
        "train.eval_every=0",
        "train.precision=no",
        "train.batch_size=64",
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    deadline = time.time() + 120
    while len(train_steps(run)) < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    while not any("press Ctrl-C again" in line for line in lines) and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    reader.join(timeout=30)
    err = "".join(lines)
    assert proc.returncode == 130, err[-3000:]
    assert "press Ctrl-C again to stop at once" in err and "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        "Stopped at once by a second Ctrl-C, without a checkpoint of this "
        "step; train.resume=auto continues from the last one saved."
    )


@pytest.mark.slow
def test_damaged_latest_checkpoint_falls_back_to_the_previous(tmp_path, cache_dir):
    run = tmp_path / "run"
    args = ["train.max_steps=20", "train.save_every=10", "train.eval_every=0", "train.precision=no"]
    run_train(run, cache_dir, *args)
    full = _weights(run / "final")
    shutil.rmtree(run / "final")
    weights = run / "checkpoints" / "step_0000020" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a save cut short
    proc = run_train(run, cache_dir, *args, "train.resume=auto")
    assert "Trying the previous checkpoint" in proc.stderr
    assert "Resumed from" in proc.stderr and "step_0000010" in proc.stderr
    assert_same_weights(_weights(run / "final"), full)


@pytest.mark.slow
def test_full_disk_while_training_stops_with_one_sentence_and_resume_finishes(tmp_path, cache_dir):
    run = tmp_path / "run"
    args = [
        "train.save_every=2",
        "train.eval_every=0",
        "train.precision=no",
        "train.export=false",
        "logger=none",
    ]
    run_train(run, cache_dir, *args, "train.max_steps=2")
    good = run / "checkpoints" / "step_0000002"
    before = {p.name: p.read_bytes() for p in good.iterdir()}
    # A file cannot grow past 300 kB: the weights (240 kB) fit, the optimizer state (480 kB)
    # fails in torch.save as on a full disk.
    proc = run_train(
        run,
        cache_dir,
        *args,
        "train.max_steps=4",
        "train.resume=auto",
        check=False,
        file_size_limit=300_000,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Error: Could not write the step-4 checkpoint" in proc.stderr
    assert "(from step_0000002, which is intact)." in proc.stderr and "Traceback" not in proc.stderr
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_0000002"]
    assert {p.name: p.read_bytes() for p in good.iterdir()} == before
    run_train(run, cache_dir, *args, "train.max_steps=4", "train.resume=auto")
    assert train_steps(run) == [2, 4]
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == [
        "step_0000002",
        "step_0000004",
    ]


def _files(run: Path) -> dict[str, bytes]:
    """Every file mlmkit wrote into the run dir (Hydra's own .hydra/ record aside)."""
    return {
        str(p.relative_to(run)): p.read_bytes()
        for p in sorted(run.rglob("*"))
        if p.is_file() and ".hydra" not in p.parts
    }


@pytest.mark.slow
def test_a_second_run_into_the_same_run_dir_is_refused_and_writes_nothing(tmp_path, cache_dir):
    run = tmp_path / "run"
    args = [
        "train.log_every=1",
        "train.save_every=0",
        "train.eval_every=0",
        "train.precision=no",
        "logger=none",
    ]
    first = _start(run, cache_dir, *args, "train.max_steps=400")
    try:
        deadline = time.time() + 120
        while len(train_steps(run)) < 2 and time.time() < deadline and first.poll() is None:
            time.sleep(0.1)
        assert first.poll() is None, first.communicate()[1][-3000:]
        first.send_signal(
            signal.SIGSTOP
        )  # frozen: the run dir changes only if the second run writes
        before = _files(run)
        second = run_train(
            run, cache_dir, *args, "train.max_steps=400", "train.resume=auto", check=False
        )
        assert second.returncode == 2, second.stderr[-3000:]
        error = second.stderr.strip().splitlines()[-1]
        assert error.startswith(
            f"Error: The run dir {str(run)!r} is in use by another run (pid {first.pid} on host "
        )
        assert error.endswith("; wait for it to end or choose a new hydra.run.dir.")
        assert "Traceback" not in second.stderr
        assert _files(run) == before  # metrics.jsonl, train.log, ... untouched
    finally:
        first.send_signal(signal.SIGKILL)  # a crash: its lock goes with it
        first.communicate()
    run_train(run, cache_dir, *args, "train.max_steps=3", "train.resume=auto")
    assert train_steps(run) == [1, 2, 3]


@pytest.mark.slow
def test_diverging_run_stops_with_one_sentence(tmp_path, cache_dir):
    proc = run_train(
        tmp_path / "run",
        cache_dir,
        "optim.lr=1e20",
        "optim.warmup_steps=0",
        "optim.max_grad_norm=null",
        "train.max_steps=50",
        "train.max_bad_steps=3",
        check=False,
    )
    assert proc.returncode == 2
    assert re.search(
        r"\d+ steps in a row \(train.max_bad_steps is 3\) had a non-finite loss", proc.stderr
    )
    assert "updates were skipped" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_bad_inputs_each_one_sentence(tmp_path, cache_dir):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    empty = tmp_path / "empty.txt"
    empty.write_text("")
    binary = tmp_path / "blob.txt"
    binary.write_bytes(bytes(range(256)) * 50)
    backend = Tokenizer(
        models.WordLevel(
            {"[UNK]": 0, "[PAD]": 1, "[CLS]": 2, "[SEP]": 3, "a": 4}, unk_token="[UNK]"
        )
    )
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
    ).save_pretrained(tmp_path / "nomask")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cases = [
        (["data=files", f"data.train_files=[{tmp_path / 'missing.txt'}]"], "data.train_files"),
        (["data=files", f"data.train_files=[{empty}]"], "data.train_files"),
        (["data=files", f"data.train_files=[{binary}]"], "binary"),
        (["model=bert-huge"], "bert-huge"),
        (["train.bach_size=3"], "bach_size"),
        (["optim.lrr=0.1"], "lrr"),
        (["data.max_seq_length=1024"], "data.max_seq_length"),
        ([f"tokenizer.name_or_path={tmp_path / 'nomask'}"], "MASK"),
        (["masking.mlm_probability=1.5"], "masking.mlm_probability"),
        (["masking.mask_replace_prob=0.9", "masking.random_replace_prob=0.2"], "must not exceed 1"),
        (["train.batch_size=0"], "train.batch_size"),
        (["train.resume=/nonexistent/ckpt"], "train.resume"),
    ]
    for overrides, needle in cases:
        proc = run_train(tmp_path / "err", cache_dir, *overrides, check=False)
        assert proc.returncode != 0, overrides
        assert needle in proc.stderr, (overrides, proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr, (overrides, proc.stderr[-2000:])
    proc = run_train(blocker / "run", cache_dir, check=False)
    assert proc.returncode == 2 and "hydra.run.dir" in proc.stderr


def _last_logged_step(run: Path) -> int:
    """The step of the run's last train event in metrics.jsonl (0: none yet); a line still
    being written is skipped."""
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    for line in reversed(lines):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "train":
            return event["step"]
    return 0


def _starts(run: Path) -> int:
    """How many times a run in ``run`` has begun its steps (its metrics.jsonl then holds only
    what the checkpoint it resumed from had seen)."""
    try:
        log = (run / "train.log").read_text()
    except FileNotFoundError:
        return 0
    return log.count("Resumed from ") + log.count("Baseline: ")


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_gives_the_same_weights(tmp_path, cache_dir):
    """5 kills during steps and saves; every restart resumes; the end matches a clean run.

    Each kill waits for a step drawn from those the restarted run has still to take (its
    metrics show it), then a random fraction of the time a step and a save take: so it lands
    in a step or a save, however far the run had come before."""
    steps = 36
    args = [
        f"train.max_steps={steps}",
        "train.save_every=3",
        "train.eval_every=12",
        "train.log_every=1",
        "train.precision=no",
        "train.keep_last=2",
    ]
    clean = tmp_path / "clean"
    run_train(clean, cache_dir, *args)
    expected = _weights(clean / "final")

    run = tmp_path / "killed"
    rng = random.Random(0)
    kills = 0
    while kills < 5:
        done = list_checkpoints(run / "checkpoints") if (run / "checkpoints").is_dir() else []
        resumed_at = int(done[-1].name.split("_")[-1]) if done else 0
        # killed in its export after the last checkpoint, a restart has no step left to take
        target = rng.randint(resumed_at + 1, steps - 1) if resumed_at < steps - 1 else steps
        starts = _starts(run)
        proc = _start(run, cache_dir, *args, "train.resume=auto")
        while proc.poll() is None and (_starts(run) == starts or _last_logged_step(run) < target):
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.15))  # into the next step, or the save after a multiple of 3
        if proc.poll() is not None:
            out, err = proc.communicate()
            assert proc.returncode == 0, err[-3000:]
            if (run / "final").is_dir():
                shutil.rmtree(run / "final")  # finished before the kill: roll back to keep killing
                shutil.rmtree(list_checkpoints(run / "checkpoints")[-1])
            continue
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        kills += 1
    run_train(run, cache_dir, *args, "train.resume=auto")
    assert_same_weights(_weights(run / "final"), expected)
    assert [e["step"] for e in events(run, "train")] == [e["step"] for e in events(clean, "train")]


@pytest.mark.slow
def test_pickled_state_is_loaded_with_weights_only(tmp_path, cache_dir):
    """A checkpoint whose pickle would run code is refused, and the code never runs."""
    import pickle

    run = tmp_path / "run"
    args = ["train.max_steps=4", "train.save_every=2", "train.eval_every=0", "train.precision=no"]
    run_train(run, cache_dir, *args)
    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    ckpt = run / "checkpoints" / "step_0000004"
    (ckpt / "random_states_0.pkl").write_bytes(pickle.dumps(Exploit()))
    proc = run_train(run, cache_dir, *args, f"train.resume={ckpt}", check=False)
    assert proc.returncode == 2 and "Could not load checkpoint" in proc.stderr
    assert not marker.exists()


@pytest.mark.slow
def test_sigusr1_goes_on_to_the_launchers_handler_after_the_checkpoint(tmp_path, cache_dir):
    """Under Hydra's submitit launcher, submitit's SIGUSR1 handler requeues the SLURM job: it
    must still run, after mlmkit has saved its checkpoint."""
    run, marker = tmp_path / "run", tmp_path / "requeued"
    wrapper = tmp_path / "launcher.py"
    wrapper.write_text(
        "import pathlib, runpy, signal, sys\n"
        "marker, run = sys.argv[1], sys.argv[2]\n"
        "def requeue(signum, frame):\n"
        "    ckpts = sorted(pathlib.Path(run, 'checkpoints').glob('step_*'))\n"
        "    pathlib.Path(marker).write_text(ckpts[-1].name if ckpts else 'none')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGUSR1, requeue)\n"
        "sys.argv = [sys.argv[3]] + sys.argv[4:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    proc = python_popen(
        wrapper,
        marker,
        run,
        ROOT / "train.py",
        *TINY,
        f"paths.cache_dir={cache_dir}",
        f"hydra.run.dir={run}",
        "train.max_steps=400",
        "train.log_every=1",
        "train.save_every=0",
        "train.eval_every=0",
        "logger=none",
    )
    deadline = time.time() + 120
    while len(train_steps(run)) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]  # the launcher's handler ended the process
    assert "Stopped by SIGUSR1" in err
    ckpts = list_checkpoints(run / "checkpoints")
    assert len(ckpts) == 1 and marker.read_text() == ckpts[0].name  # saved before the hand-back
