"""Pretraining must pay off downstream: the long test (make test-long, run by CI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import shared_file
from runs import ROOT, run_finetune

# The long test's pretraining: 4,000 steps (about 23 minutes on 2 cores with bf16 hardware),
# capped in wall-clock time so that a CPU without bf16 hardware (about an hour for the steps in
# fp32) ends within CI's limit; there the cut run does not reach the accuracy that pays off.
PRETRAIN_STEPS, PRETRAIN_CAP = 4000, "26m"


@pytest.mark.slow
@pytest.mark.long
def test_pretraining_beats_random_init_on_sst2_dev(tmp_path):
    """Task-adaptive pretraining (Gururangan et al., 2020): bert-mini pretrained by mlmkit on
    the text of SST-2's training phrases, labels unused, then fine-tuned on 2,000 labelled
    phrases, scores higher on GLUE's SST-2 dev sentences (test.tsv here) than the same
    fine-tuning from a random init, on average over three fine-tuning seeds. About 27 minutes
    on 2 CPU cores with bf16 hardware.

    Measured while the recipe was chosen (2 CPU cores): at lr 2e-3 with 15% masking,
    bert-mini was still on the unigram plateau after 3,000 steps (12% accuracy) and
    fine-tuned worse than a random init; at lr 1e-3 with 40% masking it leaves the plateau
    after 1,000-1,500 steps. Three runs of this recipe reached 51-54% masked-token accuracy
    and fine-tuned to means of 0.7412, 0.7209 and 0.7225 against 0.6923, 0.6988 and 0.6961
    from a random init. A shorter recipe for CPUs without bf16 hardware (14 minutes of 64
    blocks of 32 tokens, about 1,950 steps in fp32) reached 25.5% and fine-tuned worse than a
    random init (0.6858 against 0.6988): pretraining pays off downstream only well past the
    plateau.
    """
    sst = shared_file("glue/SST-2/train.tsv")
    import csv

    with open(sst, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    corpus = tmp_path / "sst2_train_text.txt"
    corpus.write_text("\n".join(dict.fromkeys(r[0].strip() for r in rows)) + "\n", encoding="utf-8")
    run = tmp_path / "pretrain"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "model=bert-mini", "masking=mask40", "optim.lr=1e-3",
         "optim.warmup_steps=200", "data=files", f"data.train_files=[{corpus}]", "data.txt_sample_by=line",
         "data.max_seq_length=64", "train.batch_size=64", f"train.max_steps={PRETRAIN_STEPS}",
         f"train.max_time={PRETRAIN_CAP}", "train.eval_every=1000", "train.save_every=0",
         "tokenizer.vocab_size=8192",
         "train.progress=false", "logger=none", f"paths.cache_dir={tmp_path / 'cache'}",
         f"hydra.run.dir={run}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    mlm_accuracy = [e["eval_accuracy"] for e in events if e.get("event") == "eval"][-1]
    # below this the model is still on the unigram plateau, and no fine-tuning gain is expected
    assert mlm_accuracy > 0.30, f"pretraining ended at {mlm_accuracy:.3f} masked-token accuracy"
    accuracy = {"pretrained": [], "random": []}
    for seed in (0, 1, 2):
        for init in accuracy:
            out = tmp_path / f"{init}-{seed}"
            run_finetune(f"checkpoint={run}", "task=sst2", f"task.data_dir={sst.parent}",
                         "task.eval_file=test.tsv", f"init={init}", f"seed={seed}", "pooling=mean",
                         "max_train_samples=2000", "epochs=3", "lr=3e-4", "max_seq_length=64",
                         f"hydra.run.dir={out}")
            result = json.loads((out / "results.json").read_text())
            assert result["eval_examples"] == 872
            accuracy[init].append(result["eval_accuracy"])
    mean = {init: sum(values) / len(values) for init, values in accuracy.items()}
    assert mean["pretrained"] > mean["random"], accuracy
