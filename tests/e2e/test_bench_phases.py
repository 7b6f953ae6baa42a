"""benchmarks/phases.py end to end on the built-in corpus with a tiny budget: each run trains its
tokens, the phased one exports its first phase, and every model is scored at both lengths."""

from __future__ import annotations

import json
import math
import os
import subprocess

import pytest
from runs import ROOT, TEST_ENV


@pytest.mark.slow
def test_phases_benchmark_scores_each_run_at_both_lengths(tmp_path, zygote_python):
    out = tmp_path / "bench"
    cmd = [
        zygote_python,
        str(ROOT / "benchmarks" / "phases.py"),
        "--tokens",
        "40960",
        "--corpus",
        "builtin",
        "--only",
        "bert",
        "--eval-min-masked",
        "500",
        "--size",
        "tiny",
        "--out",
        str(out),
    ]
    env = {**os.environ, **TEST_ENV}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((out / "summary.json").read_text())["tables"]["bert"]
    assert [r["run"] for r in rows] == [
        "128",
        "128 -> 512 (90/10), after phase 1 (short)",
        "128 -> 512 (90/10)",
        "512",
    ]
    assert [r["tokens"] for r in rows] == [40960] * 4 and [r["steps"] for r in rows] == [10] * 4
    assert all(math.isfinite(r[f"eval_loss_{n}"]) for r in rows for n in (128, 512))
    assert (
        rows[1]["eval_loss_128"] != rows[2]["eval_loss_128"]
    )  # the export before the long phase differs
    assert "| 128 -> 512 (90/10) | 10 |" in proc.stdout
