"""benchmarks/quality.py end to end on the built-in corpus with a tiny budget: both sides
train, both final models are scored, and the table says whether mlmkit reached the
Trainer's held-out loss."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest
from runs import ROOT, TEST_ENV

ROW = re.compile(
    r"^(mlmkit|Trainer) \(.*?\)\s+(\d\.\d+) ± (\d\.\d+)\s+(\S+)\s+([\d,]+)\s+([\d,]+)\s+(\S+)$"
)
REACH = re.compile(
    r"^time to reach the Trainer's final held-out loss \((\S+)\): "
    r"(?:(\d+\.\d) s \(\d+% of the budget\)|not reached within the budget)"
)


@pytest.mark.slow
def test_quality_benchmark_runs_both_sides_and_reports_the_time_to_reach(tmp_path, zygote_python):
    out = tmp_path / "bench"
    cmd = [
        zygote_python,
        str(ROOT / "benchmarks" / "quality.py"),
        "--budget",
        "3",
        "--preset",
        "bert-tiny",
        "--builtin",
        "--eval-every",
        "10",
        "--calibration-steps",
        "2",
        "--out",
        str(out),
    ]
    env = {**os.environ, **TEST_ENV}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()

    rows = {m.group(1): m for m in map(ROW.match, lines) if m}
    assert set(rows) == {"mlmkit", "Trainer"}, proc.stdout[-3000:]
    for row in rows.values():
        loss, accuracy = float(row.group(4)), float(row.group(2))
        assert math.isfinite(loss) and loss > 0 and 0 <= accuracy <= 1
        assert int(row.group(6).replace(",", "")) >= 1  # steps done

    reach = [m for m in map(REACH.match, lines) if m]
    assert len(reach) == 1, proc.stdout[-3000:]
    assert float(reach[0].group(1)) == pytest.approx(float(rows["Trainer"].group(4)), abs=1e-4)
    if reach[0].group(2) is not None:
        assert float(reach[0].group(2)) > 0

    held_out = next(line for line in lines if line.startswith("held-out text:"))
    assert "validation split" in held_out  # --builtin: the built-in corpus's held-out documents
    assert (out / "bert-tiny" / "trainer" / "final" / "model.safetensors").is_file()
    summary = json.loads((out / "summary.json").read_text())["presets"][0]
    assert summary["mlmkit"]["blocks"] == summary["trainer"]["blocks"]  # scored on the same blocks
    assert summary["mlmkit"]["tokens"] == summary["trainer"]["tokens"]  # and the same masks


def load_quality():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "bench_quality", ROOT / "benchmarks" / "quality.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_curve_maps_evaluations_to_seconds_of_the_run_with_and_without_evaluations(capsys):
    quality = load_quality()
    # 1 s of training per 10 steps; the evaluation at step 10 took 5 s of the run's clock
    events = [{"event": "baseline", "step": 0}]
    for step, elapsed, loss in ((10, 1.0, 5.0), (20, 7.0, 4.0), (30, 8.0, 3.5)):
        events.append(
            {
                "event": "train",
                "step": step,
                "elapsed_s": elapsed,
                "tokens_seen": 4096 * step,
                "tokens_per_s": 40960.0,
            }
        )
        events.append({"event": "eval", "step": step, "eval_loss": loss})
    curve = quality.Curve.read(events)
    assert curve.at(15, curve.wall) == pytest.approx(4.0)
    assert curve.at(15, curve.training) == pytest.approx(1.5)
    assert curve.at(5, curve.wall) == pytest.approx(0.5)
    assert curve.first_at_or_below(4.2) == 20 and curve.first_at_or_below(4.0) == 20
    assert curve.first_at_or_below(3.0) is None

    scores = {"loss": 4.2, "accuracy": 0.2, "accuracy_stderr": 0.01, "blocks": 10, "tokens": 200}
    summary = {
        "preset": "bert-tiny",
        "budget_s": 8.0,
        "order": "mlmkit first",
        "vocab": 100,
        "batch_size": 32,
        "seq": 128,
        "peak_lr": 3e-3,
        "mlmkit_precision": "no",
        "eval_every": 10,
        "mlmkit": {
            **scores,
            "loss": 3.5,
            "steps": 30,
            "wall_s": 8.0,
            "training_s": 3.0,
            "tokens_per_s": 40960.0,
            "curve": [
                {
                    "step": s,
                    "wall_s": curve.at(s, curve.wall),
                    "training_s": curve.at(s, curve.training),
                    "eval_loss": v,
                }
                for s, v in curve.evals
            ],
        },
        "trainer": {
            **scores,
            "steps": 12,
            "planned_steps": 12,
            "training_s": 8.0,
            "tokens_per_s": 6000.0,
            "calibrated_s_per_step": 0.6,
        },
        "reached_step": 20,
        "reached_wall_s": 7.0,
        "reached_training_s": 2.0,
    }
    quality.print_table(summary, quality.choose_data(builtin=True))
    lines = capsys.readouterr().out.splitlines()
    reach = [m for m in map(REACH.match, lines) if m]
    assert len(reach) == 1 and reach[0].group(2) == "7.0"
    assert "(88% of the budget), at step 20" in reach[0].string and "2.0 s (25%)" in reach[0].string
    rows = {m.group(1): m for m in map(ROW.match, lines) if m}
    assert set(rows) == {"mlmkit", "Trainer"} and rows["mlmkit"].group(4) == "3.5000"
