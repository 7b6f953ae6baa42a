"""mlmkit eval (the training loop's own evaluation) and the metric modules shipped for offline
use."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from runs import ROOT, TEST_ENV, events, free_port, run_cli

from mlmkit.finetune.metric_modules import load_metric

EVAL_ARGS = ["data.max_seq_length=64", "data.max_eval_samples=64", "batch_size=8"]


def run_eval(*overrides: str, check: bool = True):
    proc = run_cli("eval", *EVAL_ARGS, *overrides)
    if check and proc.returncode != 0:
        raise AssertionError(f"evaluate failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def test_metric_modules_load_offline_and_compute(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    acc = load_metric("accuracy")
    assert acc.compute(predictions=[1, 0, 1, 1], references=[1, 0, 0, 1]) == {"accuracy": 0.75}
    mcc = load_metric("matthews_correlation")
    # TP=2 TN=1 FP=1 FN=0: (2*1 - 1*0) / sqrt(3*2*2*1)
    got = mcc.compute(predictions=[1, 0, 1, 1], references=[1, 0, 0, 1])["matthews_correlation"]
    assert got == pytest.approx(2 / math.sqrt(12))
    assert mcc.compute(predictions=[1, 1, 1], references=[1, 0, 1])["matthews_correlation"] == 0.0
    assert mcc.compute(predictions=[0, 1, 2], references=[0, 1, 2])[
        "matthews_correlation"
    ] == pytest.approx(1.0)
    assert mcc.compute(predictions=[1, 0], references=[0, 1])[
        "matthews_correlation"
    ] == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="ships"):
        load_metric("bleu")


@pytest.mark.slow
def test_evaluate_reproduces_the_runs_eval_events(trained_run, cache_dir, tmp_path):
    """The final export and a mid-run checkpoint give the figures the run logged at those steps."""
    by_step = {e["step"]: e for e in events(trained_run, "eval")}
    for target, step in [(trained_run, 30), (trained_run / "checkpoints" / "step_0000015", 15)]:
        out = tmp_path / f"eval-{step}.json"
        proc = run_eval(
            f"checkpoint={target}",
            f"paths.cache_dir={cache_dir}",
            f"output={out}",
            "precision=bf16",
        )
        result = json.loads(out.read_text())
        logged = by_step[step]
        assert result["tokens"] == logged["eval_tokens"]
        assert result["loss"] == pytest.approx(logged["eval_loss"], rel=1e-4)
        assert result["accuracy"] == pytest.approx(
            logged["eval_accuracy"], abs=2 / result["tokens"]
        )
        assert result["top5_accuracy"] == pytest.approx(
            logged["eval_top5_accuracy"], abs=2 / result["tokens"]
        )
        assert "perplexity" in proc.stdout and "top5_accuracy" in proc.stdout


@pytest.mark.slow
def test_evaluate_any_files_on_one_and_two_processes(trained_run, cache_dir, tmp_path):
    text = tmp_path / "other.txt"
    text.write_text(
        "\n\n".join(
            f"The function number {i} returns the value of its argument "
            f"and raises an error when the argument is missing."
            for i in range(300)
        )
    )
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    run_eval(
        f"checkpoint={trained_run}",
        f"files=[{text}]",
        f"paths.cache_dir={cache_dir}",
        f"output={one}",
        "precision=no",
    )
    launcher = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--main_process_port",
        free_port(),
        "--multi_gpu",
        "--num_processes",
        "2",
    ]
    proc = subprocess.run(
        launcher
        + [
            "-m",
            "mlmkit",
            "eval",
            *EVAL_ARGS,
            f"checkpoint={trained_run}",
            f"files=[{text}]",
            f"paths.cache_dir={cache_dir}",
            f"output={two}",
            "precision=no",
        ],
        cwd=ROOT,
        env={**os.environ, **TEST_ENV, "ACCELERATE_USE_CPU": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    assert a["blocks"] > 8 and a["tokens"] == b["tokens"]
    for key in ("loss", "accuracy", "top5_accuracy"):
        assert a[key] == pytest.approx(b[key], rel=1e-5)


def test_evaluate_user_errors_are_one_sentence(tmp_path):
    proc = run_eval(check=False)
    assert proc.returncode == 2 and "checkpoint=" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_eval(f"checkpoint={tmp_path}", check=False)
    assert proc.returncode == 2 and "is not a model dir" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_document_isolated_run_and_its_evaluation(tmp_path, cache_dir):
    """data.packing=documents trains (the same cached blocks as concatenate), and mlmkit eval
    of the run, given no data settings, scores the run's own data (its files, its packing)
    with the figures the run logged; read with plain packing, the same model scores
    differently (its attention then crosses documents)."""
    from pydoc_data.topics import topics

    from runs import run_train

    corpus = tmp_path / "own.txt"  # the run's own corpus, not the built-in one eval defaults to
    corpus.write_text("\n\n".join(topics[key].strip() for key in sorted(topics)[:60]))
    run = tmp_path / "run"
    run_train(
        run,
        cache_dir,
        "data=files",
        f"data.train_files=[{corpus}]",
        "data.packing=documents",
        "train.max_steps=20",
        "train.eval_every=20",
        "train.save_every=0",
    )
    logged = events(run, "eval")[-1]
    assert logged["step"] == 20 and math.isfinite(logged["eval_loss"])
    figures = {}
    for packing in ("the run's", "documents", "concatenate"):
        out = tmp_path / f"eval-{packing.replace(chr(39), '')}.json".replace(" ", "-")
        proc = run_eval(
            f"checkpoint={run / 'final'}",
            f"paths.cache_dir={cache_dir}",
            f"output={out}",
            *([] if packing == "the run's" else [f"data.packing={packing}"]),
        )
        figures[packing] = json.loads(out.read_text())
        scored = next(line for line in proc.stdout.splitlines() if line.startswith("Scored "))
        assert scored.startswith(
            f"Scored the run's validation split (data.train_files=['{corpus}']"
        ), scored
    assert figures["the run's"]["tokens"] == logged["eval_tokens"]
    assert figures["the run's"]["loss"] == pytest.approx(logged["eval_loss"], rel=1e-6)
    assert "data.packing=documents" in figures["the run's"]["data"]
    assert "data.packing=concatenate" in figures["concatenate"]["data"]
    # the same tokens under the same masks: scoring is deterministic (the run's packing named
    # or left out gives the same loss to the bit), and reading across documents changes it,
    # however little a 20-step model uses its context (4e-7 to 6e-6 relative has been seen)
    assert figures["documents"]["loss"] == figures["the run's"]["loss"]
    assert figures["concatenate"]["tokens"] == figures["the run's"]["tokens"]
    assert figures["concatenate"]["loss"] != figures["the run's"]["loss"]
