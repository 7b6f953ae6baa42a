"""benchmarks/rtd_plateau.py on a few blocks of the built-in corpus: a row per window, its figures
consistent with each other (the prior is 1 - the replaced share, the entropy that share's)."""

from __future__ import annotations

import math
import os
import subprocess

import pytest
from runs import ROOT, TEST_ENV


@pytest.mark.slow
@pytest.mark.parametrize("replace", ["generator", "shuffled"])
def test_the_plateau_benchmark_prints_each_window_against_its_prior(
    tmp_path, tokenizer, replace, zygote_python
):
    from mlmkit.data.sources import builtin_documents

    tokenizer.save_pretrained(tmp_path / "tokenizer")
    data = tmp_path / "text"
    data.mkdir()
    (data / "a.txt").write_text("\n".join(builtin_documents())[:200_000], encoding="utf-8")
    cmd = [
        zygote_python,
        str(ROOT / "benchmarks" / "rtd_plateau.py"),
        *("--tokenizer", str(tmp_path / "tokenizer"), "--data", str(data)),
        *("--steps", "4", "--every", "2", "--batch", "8", "--replace", replace),
    ]
    env = {**os.environ, **TEST_ENV}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"replacements {replace}; last-state cosine at the start" in proc.stdout
    rows = [line.split(" | ") for line in proc.stdout.splitlines() if line[:1].isdigit()]
    assert [int(r[0]) for r in rows] == [2, 4], proc.stdout
    for _, accuracy, prior, loss, entropy, generator, cosine in rows:
        share = 1 - float(prior)
        assert 0 < share < 0.2  # of about 15% chosen, those whose sample differs
        expected = -(share * math.log(share) + (1 - share) * math.log(1 - share))
        assert float(entropy) == pytest.approx(expected, abs=2e-4)
        assert 0 < float(accuracy) < 1 and float(loss) > 0 and float(generator) > 0
        assert -1 <= float(cosine) <= 1
