"""Helpers for tests that run train.py end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TINY = [
    "model.num_hidden_layers=1", "model.hidden_size=32", "model.num_attention_heads=2",
    "model.intermediate_size=64", "tokenizer.vocab_size=1000", "tokenizer.max_train_chars=300000",
    "data.max_seq_length=64", "data.max_eval_samples=64", "train.batch_size=8", "train.progress=false",
    "train.log_every=5", "optim.warmup_steps=5",
]


def run_train(run_dir: Path, cache_dir: Path, *overrides: str, check: bool = True):
    cmd = [sys.executable, str(ROOT / "train.py"), *TINY, f"paths.cache_dir={cache_dir}",
           f"hydra.run.dir={run_dir}", *overrides]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"train.py failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def events(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]
