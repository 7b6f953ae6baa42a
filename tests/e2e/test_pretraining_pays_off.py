"""Pretraining must pay off downstream: the long test (make test-long, run by CI)."""

from __future__ import annotations

import json

import pytest
from conftest import shared_file
from runs import ROOT, python_run, run_finetune

# The long test's pretraining: bert-mini with its defaults, 128 blocks of 16 tokens per step, 1,000
# steps. A step budget, so that every machine trains the same model; the 30-minute cap only
# guards against a far slower machine. Many short rows leave the unigram plateau far sooner than
# fewer long ones, and the linear probe pays off long before zero-shot STS-B turns (about 2,000
# steps), which is why the probe is what this test asserts (docs/benchmarks.md, "Pretraining pays
# off downstream", has both curves).
PRETRAIN_STEPS, PRETRAIN_CAP, BLOCK, ROWS = 1000, "30m", 16, 128
SEEDS = (0, 1, 2)


def _pretrain(tmp_path, corpus):
    run = tmp_path / "pretrain"
    proc = python_run(
        ROOT / "train.py", "model=bert-mini", "data=files", f"data.train_files=[{corpus}]",
        "data.txt_sample_by=line", f"data.max_seq_length={BLOCK}", f"train.batch_size={ROWS}",
        f"train.max_steps={PRETRAIN_STEPS}", f"train.max_time={PRETRAIN_CAP}", "train.eval_every=500",
        "train.save_every=0", "tokenizer.vocab_size=8192", "train.progress=false", "logger=none",
        f"paths.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={run}", timeout=3600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run


@pytest.mark.slow
@pytest.mark.long
def test_pretraining_beats_random_init_on_sst2_dev(tmp_path):
    """Task-adaptive pretraining (Gururangan et al., 2020): bert-mini pretrained by mlmkit on
    the text of SST-2's training phrases, labels unused, for 1,000 steps. Probed linearly (the
    encoder frozen, its mean-pooled states fed to the pooler and a classifier trained on 2,000
    labelled phrases), it scores higher on GLUE's SST-2 dev sentences (test.tsv here) than the
    same architecture at a random init, on average over three seeds.

    Why a probe: fully fine-tuned, such a short pretraining is not reliably ahead (a 2,400-step
    model: 0.6946 against 0.6892 at lr 3e-4, and a random init reaches 0.70 at lr 1e-3): the
    full fine-tuning of 2,000 phrases relearns what minutes of pretraining give, while a probe
    measures what the pretraining learned. Why not zero-shot STS-B: until about 2,000 steps of
    this recipe the mean-pooled states rank STS-B pairs worse than a random encoder's, so it is
    a figure in docs/benchmarks.md, not an assertion. Figures: docs/benchmarks.md.
    """
    sst = shared_file("glue/SST-2/train.tsv")
    import csv

    with open(sst, encoding="utf-8", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    corpus = tmp_path / "sst2_train_text.txt"
    corpus.write_text("\n".join(dict.fromkeys(r[0].strip() for r in rows)) + "\n", encoding="utf-8")
    run = _pretrain(tmp_path, corpus)
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e.get("event") == "train"][-1] == PRETRAIN_STEPS
    mlm_accuracy = [e["eval_accuracy"] for e in events if e.get("event") == "eval"][-1]
    # the unigram plateau is about 13%: below 20% the model has not left it, and no gain is expected
    assert mlm_accuracy > 0.20, f"pretraining ended at {mlm_accuracy:.3f} masked-token accuracy"
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
    print(f"SST-2 dev, linear probe: {accuracy} (means {mean}); masked-token accuracy {mlm_accuracy:.4f}")
    assert mean["pretrained"] > mean["random"], accuracy
