"""benchmarks/modern.py end to end on the built-in corpus with a tiny budget: each variant
trains for the budget and its held-out loss lands in the table and summary.json."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess

import pytest
from runs import ROOT, TEST_ENV

ROW = re.compile(
    r"^\| (bert-mini|modernbert-mini)(, documents)? \| ([\d,]+) \| [\d.]+ M \| (\d+\.\d+) \| "
)


@pytest.mark.slow
def test_modern_benchmark_trains_each_variant_for_the_budget(tmp_path, zygote_python):
    out = tmp_path / "bench"
    cmd = [
        zygote_python,
        str(ROOT / "benchmarks" / "modern.py"),
        "--budget",
        "2",
        "--corpus",
        "builtin",
        "--variant",
        "bert-mini, documents",
        "modernbert-mini",
        "--eval-min-masked",
        "0",
        "--out",
        str(out),
    ]
    env = {**os.environ, **TEST_ENV}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [m for m in map(ROW.match, proc.stdout.splitlines()) if m]
    assert [(m.group(1), m.group(2)) for m in rows] == [
        ("bert-mini", ", documents"),
        ("modernbert-mini", None),
    ]
    for m in rows:
        assert int(m.group(3).replace(",", "")) >= 1 and math.isfinite(float(m.group(4)))
    table = json.loads((out / "summary.json").read_text())["tables"]["builtin"]["rows"]
    assert [r["variant"] for r in table] == ["bert-mini, documents", "modernbert-mini"]
    assert all(r["train_s"] >= 2 for r in table)  # each ran for its budget
    # the documents run trained with document isolation
    overrides = (out / "builtin" / "bert-mini-documents" / ".hydra" / "overrides.yaml").read_text()
    assert "data.packing=documents" in overrides
    assert "masking.eval_min_masked_tokens=0" in overrides  # one mask draw (--eval-min-masked 0)
