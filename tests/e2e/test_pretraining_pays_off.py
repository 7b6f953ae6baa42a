"""Pretraining must pay off downstream: the long test (make test-long, run by CI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import shared_file
from runs import ROOT, run_finetune

# The long test's pretraining: bert-mini, 128 blocks of 16 tokens per step, 2,400 steps. A step
# budget, so that every machine trains the same model (a 15-minute budget ended an AVX2-only
# CPU's run at about 1,450 steps, before zero-shot STS-B turns: docs/benchmarks.md); about 26
# minutes on 2 cores without bf16 hardware (fp32), about 7 with AMX (bf16). The 35-minute cap only
# guards against a far slower machine. Many short rows leave the unigram plateau far sooner than
# fewer long ones (bert-mini, 2,048 tokens per step: 29.6% masked-token accuracy at step 1,000
# with 128 x 16, 16.5% with 64 x 32, 14.4% at step 2,500 with 32 x 32). The recipe is pinned
# (40% masking, lr 1e-3, 200 warmup steps, BERT's attention init), the one the figures were
# measured with.
PRETRAIN_STEPS, PRETRAIN_CAP, BLOCK, ROWS = 2400, "35m", 16, 128
SEEDS = (0, 1, 2)


def _pretrain(tmp_path, corpus):
    run = tmp_path / "pretrain"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "model=bert-mini", "masking=mask40", "optim.lr=1e-3",
         "optim.warmup_steps=200", "model.attention_init=normal", "data=files", f"data.train_files=[{corpus}]", "data.txt_sample_by=line",
         f"data.max_seq_length={BLOCK}", f"train.batch_size={ROWS}", f"train.max_steps={PRETRAIN_STEPS}",
         f"train.max_time={PRETRAIN_CAP}", "train.eval_every=500", "train.save_every=0",
         "tokenizer.vocab_size=8192",
         "train.progress=false", "logger=none", f"paths.cache_dir={tmp_path / 'cache'}",
         f"hydra.run.dir={run}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run


def _sts(run, init: str, sts_dir, out) -> float:
    """Zero-shot STS-B dev Spearman of the run's mean-pooled embeddings (``mlmkit eval-sts``)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-m", "mlmkit", "eval-sts", f"checkpoint={run}", f"data_dir={sts_dir}",
                           f"init={init}", f"output={out}"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())["spearman"]


@pytest.mark.slow
@pytest.mark.long
def test_pretraining_beats_random_init_on_sst2_dev_and_sts_b(tmp_path):
    """Task-adaptive pretraining (Gururangan et al., 2020): bert-mini pretrained by mlmkit on
    the text of SST-2's training phrases, labels unused, for 2,400 steps. Probed linearly (the
    encoder frozen, its mean-pooled states fed to the pooler and a classifier trained on 2,000
    labelled phrases), it scores higher on GLUE's SST-2 dev sentences (test.tsv here) than the
    same architecture at a random init, on average over three seeds; and its mean-pooled
    embeddings rank STS-B dev pairs better (Spearman, zero-shot).

    Why a probe: fully fine-tuned, such a short pretraining is not reliably ahead (a 2,400-step
    model: 0.6946 against 0.6892 at lr 3e-4, and a random init reaches 0.70 at lr 1e-3): the
    full fine-tuning of 2,000 phrases relearns what minutes of pretraining give, while a probe
    measures what the pretraining learned. Figures: docs/benchmarks.md.
    """
    sst = shared_file("glue/SST-2/train.tsv")
    sts = shared_file("glue/STS-B/dev.tsv")
    import csv

    with open(sst, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    corpus = tmp_path / "sst2_train_text.txt"
    corpus.write_text("\n".join(dict.fromkeys(r[0].strip() for r in rows)) + "\n", encoding="utf-8")
    run = _pretrain(tmp_path, corpus)
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    mlm_accuracy = [e["eval_accuracy"] for e in events if e.get("event") == "eval"][-1]
    # below this the model is still on the unigram plateau, and no gain is expected
    assert mlm_accuracy > 0.30, f"pretraining ended at {mlm_accuracy:.3f} masked-token accuracy"
    accuracy = {"pretrained": [], "random": []}
    for seed in SEEDS:
        for init in accuracy:
            out = tmp_path / f"{init}-{seed}"
            run_finetune(f"checkpoint={run}", "task=sst2", f"task.data_dir={sst.parent}",
                         "task.eval_file=test.tsv", f"init={init}", f"seed={seed}", "pooling=mean",
                         "freeze_encoder=true", "max_train_samples=2000", "epochs=5", "lr=1e-3",
                         "max_seq_length=64", f"hydra.run.dir={out}")
            result = json.loads((out / "results.json").read_text())
            assert result["eval_examples"] == 872
            accuracy[init].append(result["eval_accuracy"])
    mean = {init: sum(values) / len(values) for init, values in accuracy.items()}
    assert mean["pretrained"] > mean["random"], accuracy
    spearman = {init: _sts(run, init, sts.parent, tmp_path / f"sts-{init}.json") for init in ("pretrained", "random")}
    assert spearman["pretrained"] > spearman["random"], spearman
