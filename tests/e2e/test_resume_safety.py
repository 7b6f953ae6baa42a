"""A resume cannot mix two runs: refused changes write nothing, applied changes take effect,
and going back to an older checkpoint retires the abandoned continuation."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from runs import events, run_train

from mlmkit.training.checkpoint_files import list_checkpoints


def _snapshot(run: Path) -> dict[str, str]:
    """A hash of every file in the run dir but the log a refused start appends to and the lock."""
    return {
        str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run.rglob("*"))
        if p.is_file() and p.name not in ("train.log", ".lock") and ".hydra" not in p.parts
    }


def _text(tmp_path: Path, name: str, words: str) -> Path:
    path = tmp_path / name
    path.write_text(
        "\n\n".join(
            f"{words} number {i} of the corpus, said the {words} again." for i in range(600)
        )
    )
    return path


@pytest.fixture(scope="module")
def run_on_files(tmp_path_factory, cache_dir):
    """A finished 10-step run on a text file, checkpoints at steps 5 and 10 (each refused
    resume must leave it as it is)."""
    tmp_path = tmp_path_factory.mktemp("run-on-files")
    corpus = _text(tmp_path, "a.txt", "apple")
    run = tmp_path / "run"
    args = [
        "data=files",
        f"data.train_files=[{corpus}]",
        "train.max_steps=10",
        "train.save_every=5",
        "train.eval_every=0",
    ]
    run_train(run, cache_dir, *args)
    return run, args


@pytest.mark.slow
@pytest.mark.parametrize(
    "change,setting",
    [
        ("data.train_files", "data.train_files"),
        ("tokenizer.vocab_size=600", "tokenizer.vocab_size"),
        ("model.hidden_size=64", "model.hidden_size"),
        ("data.max_seq_length=32", "data.max_seq_length"),
    ],
)
def test_a_resume_that_changes_the_run_is_refused_before_writing(
    run_on_files, tmp_path, cache_dir, change, setting
):
    run, args = run_on_files
    if change == "data.train_files":
        change = f"data.train_files=[{_text(tmp_path, 'b.txt', 'pear')}]"
    before = _snapshot(run)
    proc = run_train(
        run, cache_dir, *args, "train.max_steps=20", "train.resume=auto", change, check=False
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and setting in error[0] and "Traceback" not in proc.stderr
    assert _snapshot(run) == before  # model/config.json, the tokenizer, metrics, checkpoints


@pytest.mark.slow
def test_a_resume_keeps_the_runs_own_tokenizer(tmp_path):
    """With the tokenizer cache gone the run's model/ tokenizer is used, not a new one."""
    import shutil

    run, cache = tmp_path / "run", tmp_path / "own-cache"
    args = ["train.save_every=5", "train.eval_every=0"]
    run_train(run, cache, *args, "train.max_steps=10")
    tokenizer = (run / "model" / "tokenizer.json").read_bytes()
    shutil.rmtree(cache / "tokenizers")
    proc = run_train(run, cache, *args, "train.max_steps=15", "train.resume=auto")
    assert "Training a" not in proc.stderr and "Resumed from" in proc.stderr
    assert (run / "model" / "tokenizer.json").read_bytes() == tokenizer
    assert events(run, "train")[-1]["step"] == 15


@pytest.mark.slow
def test_a_changed_learning_rate_takes_effect_on_resume(tmp_path, cache_dir):
    run = tmp_path / "run"
    args = [
        "optim.schedule=constant",
        "optim.warmup_steps=0",
        "train.save_every=10",
        "train.eval_every=0",
        "train.log_every=1",
    ]
    run_train(run, cache_dir, *args, "train.max_steps=10", "optim.lr=1e-3")
    proc = run_train(
        run, cache_dir, *args, "train.max_steps=14", "optim.lr=2e-4", "train.resume=auto"
    )
    assert "optim.lr 0.001 -> 0.0002" in proc.stderr and "train.max_steps 10 -> 14" in proc.stderr
    lrs = {e["step"]: e["lr"] for e in events(run, "train")}
    assert lrs[10] == pytest.approx(1e-3)
    assert [lrs[s] for s in (11, 12, 13, 14)] == pytest.approx([2e-4] * 4)


@pytest.mark.slow
def test_resuming_an_older_checkpoint_retires_the_later_ones(tmp_path, cache_dir):
    run = tmp_path / "run"
    args = ["train.save_every=2", "train.keep_last=10", "train.eval_every=0", "train.log_every=1"]
    run_train(run, cache_dir, *args, "train.max_steps=8")
    older = run / "checkpoints" / "step_0000004"
    proc = run_train(run, cache_dir, *args, "train.max_steps=6", f"train.resume={older}")
    assert "moved the abandoned continuation" in proc.stderr
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == [
        "step_0000002",
        "step_0000004",
        "step_0000006",
    ]
    [retired] = list((run / "retired").iterdir())
    assert sorted(p.name for p in (retired / "checkpoints").iterdir()) == [
        "step_0000006",
        "step_0000008",
    ]
    assert (retired / "final" / "model.safetensors").is_file()
    assert [
        json.loads(line)["step"]
        for line in (retired / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["event"] == "train"
    ] == [5, 6, 7, 8]
    # a later auto resume continues the new branch (step 6), not the abandoned step 8
    proc = run_train(run, cache_dir, *args, "train.max_steps=7", "train.resume=auto")
    assert "step_0000006 at step 6" in proc.stderr
    assert [e["step"] for e in events(run, "train")] == [1, 2, 3, 4, 5, 6, 7]


@pytest.mark.slow
def test_no_checkpoint_is_saved_while_steps_are_skipped(tmp_path, cache_dir):
    run = tmp_path / "run"
    proc = run_train(
        run,
        cache_dir,
        "optim.lr=1e20",
        "optim.warmup_steps=0",
        "optim.max_grad_norm=null",
        "train.max_steps=50",
        "train.max_bad_steps=4",
        "train.save_every=1",
        "train.log_every=1",
        "train.eval_every=0",
        check=False,
    )
    assert proc.returncode == 2 and "no checkpoint while steps are skipped" in proc.stderr
    skipped = {e["step"]: e["skipped_steps"] for e in events(run, "train")}
    first_bad = min(s for s, n in skipped.items() if n > 0)
    saved = [int(p.name.split("_")[1]) for p in list_checkpoints(run / "checkpoints")]
    assert saved and max(saved) < first_bad


@pytest.mark.slow
def test_a_checkpoint_continues_into_a_new_run_dir_with_its_runs_tokenizer(tmp_path):
    import shutil

    first, cache = tmp_path / "first", tmp_path / "own-cache"
    args = ["train.save_every=5", "train.eval_every=0"]
    run_train(first, cache, *args, "train.max_steps=10")
    shutil.rmtree(cache / "tokenizers")
    second = tmp_path / "second"
    proc = run_train(
        second,
        cache,
        *args,
        "train.max_steps=15",
        f"train.resume={first / 'checkpoints' / 'step_0000010'}",
    )
    assert "Training a" not in proc.stderr and "Resumed from" in proc.stderr
    assert (second / "model" / "tokenizer.json").read_bytes() == (
        first / "model" / "tokenizer.json"
    ).read_bytes()
    assert (second / "model" / "config.json").is_file()  # its own checkpoints load too
    assert [e["step"] for e in events(second, "train")] == [15]
