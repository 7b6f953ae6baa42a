"""Pretraining must pay off downstream: the long test (make test-long alone; CI runs it among
the others, make test LONG=1)."""

from __future__ import annotations

import csv
import json
import random

import pytest
from conftest import shared_file
from runs import run_cli

# The long test's pretraining: bert-mini's sizes and defaults with 2 of its 4 layers, 128 blocks of
# 16 tokens per step, 300 steps. A step budget, so that every machine trains the same model; the
# 30-minute cap only guards against a far slower machine. Many short rows leave the unigram plateau
# far sooner than fewer long ones; the word order of minimal pairs pays off by 300 steps: with 4
# layers 0.78 to 0.83 of the pairs against a random init's 0.48-0.50 (0.83 at 400 and 1,000
# steps), with 2 layers 0.8054 against 0.4664 (bf16, alone: 91 s) at 60% of the training's work
# and half of the scoring's, long before zero-shot STS-B turns (about 2,000 steps).
# docs/benchmarks.md, "Pretraining pays off downstream", has the figures and why the test asserts
# word order rather than an SST-2 probe.
PRETRAIN_STEPS, PRETRAIN_CAP, BLOCK, ROWS, LAYERS = 300, "30m", 16, 128, 2
# the unigram plateau is about 13% masked-token accuracy; seven 300-step runs of 4 layers ended at
# 19.8-21.0%, the 2-layer run of docs/benchmarks.md at 20.5%
LEFT_PLATEAU = 0.18
# The pairs made from the first 300 of the 872 dev sentences: with the 30-point gap measured
# between pretrained and random models on all 869 pairs, one standard error of an accuracy on 300
# pairs is at most 2.9 points (the gap's 3.6), so the thresholds below sit 2.8 or more standard
# errors from the figures measured at 300 steps (0.78 or more of the pairs against the 0.70 asked,
# a gap of 28 points or more against 15), and scoring takes a third of the time of all pairs.
SENTENCES = 300


def _pretrain(tmp_path, corpus):
    run = tmp_path / "pretrain"
    proc = run_cli(
        "train",
        "model=bert-mini",
        f"model.num_hidden_layers={LAYERS}",
        "data=files",
        f"data.train_files=[{corpus}]",
        "data.txt_sample_by=line",
        f"data.max_seq_length={BLOCK}",
        f"train.batch_size={ROWS}",
        f"train.max_steps={PRETRAIN_STEPS}",
        f"train.max_time={PRETRAIN_CAP}",
        "train.eval_every=500",
        "train.save_every=0",
        "tokenizer.vocab_size=8192",
        "train.progress=false",
        "logger=none",
        f"paths.cache_dir={tmp_path / 'cache'}",
        f"hydra.run.dir={run}",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run


def bigram_shift_pairs(sentences: list[str], seed: int = 0) -> list[dict[str, str]]:
    """Minimal pairs of word order (SentEval's bigram shift, Conneau et al., 2018): each sentence
    of four words or more, and the same sentence with one pair of neighbouring words, different
    from each other, swapped at random. The two hold the same words: a bag of words cannot tell
    them apart, so a random encoder scores about 50%."""
    rng, pairs = random.Random(seed), []
    for sentence in sentences:
        words = sentence.split()
        swappable = [i for i in range(len(words) - 1) if words[i] != words[i + 1]]
        if len(words) < 4 or not swappable:
            continue
        i = rng.choice(swappable)
        shifted = words[:i] + [words[i + 1], words[i]] + words[i + 2 :]
        pairs.append({"sentence_good": " ".join(words), "sentence_bad": " ".join(shifted)})
    return pairs


def _read_sentences(path) -> list[str]:
    with open(path, encoding="utf-8", newline="") as f:
        return [
            row[0].strip()
            for row in list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
        ]


@pytest.mark.slow
@pytest.mark.long
def test_pretraining_teaches_the_word_order_a_random_init_lacks(tmp_path):
    """Task-adaptive pretraining (Gururangan et al., 2020): a 2-layer bert-mini pretrained by
    mlmkit on the text of SST-2's training phrases for 300 steps, then judged zero-shot on minimal
    pairs of word order made from sentences it never saw (the first 300 of GLUE's 872 SST-2 dev
    sentences, test.tsv here): ``mlmkit eval-pairs`` scores each sentence by its
    pseudo-log-likelihood (Salazar et al., 2020) and counts the pairs whose original sentence
    scores higher, as BLiMP's acceptability judgements are scored (Warstadt et al., 2020). The
    pretrained model must prefer the original in at least 70% of the pairs and beat the same
    architecture at a random init by 15 points.

    Why not the SST-2 linear probe this test asserted before: at 1,000 steps its gain over a
    random encoder (whose mean-pooled states are a strong bag of words on SST-2) came from how
    a briefly trained pooler meets unstandardised states, not from what the encoder learned: a
    standardised logistic regression found no gain at 250 to 10,000 labelled phrases, and on
    another CPU the frozen-encoder probe put one pretrained model below its random init (0.561
    against 0.573). Word order is what a masked LM learns first and a bag of words cannot
    hold: three pretrainings scored 0.80 to 0.84 where random inits scored 0.50 to 0.51.
    Figures: docs/benchmarks.md.
    """
    train = shared_file("glue/SST-2/train.tsv")
    corpus = tmp_path / "sst2_train_text.txt"
    corpus.write_text("\n".join(dict.fromkeys(_read_sentences(train))) + "\n", encoding="utf-8")
    pairs = bigram_shift_pairs(_read_sentences(shared_file("glue/SST-2/test.tsv"))[:SENTENCES])
    pairs_file = tmp_path / "bigram_shift.jsonl"
    pairs_file.write_text("".join(json.dumps(p) + "\n" for p in pairs), encoding="utf-8")
    run = _pretrain(tmp_path, corpus)
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e.get("event") == "train"][-1] == PRETRAIN_STEPS
    mlm_accuracy = [e["eval_accuracy"] for e in events if e.get("event") == "eval"][-1]
    # below LEFT_PLATEAU the model has not left the unigram plateau, and no gain is expected
    assert mlm_accuracy > LEFT_PLATEAU, (
        f"pretraining ended at {mlm_accuracy:.3f} masked-token accuracy"
    )
    accuracy = {}
    for init in ("pretrained", "random"):
        out = tmp_path / f"pairs-{init}.json"
        proc = run_cli(
            "eval-pairs",
            f"checkpoint={run}",
            f"files=[{pairs_file}]",
            f"init={init}",
            f"output={out}",
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(out.read_text())
        assert result["pairs"] == len(pairs) > 280
        accuracy[init] = result["accuracy"]
    print(
        f"bigram-shift pairs of SST-2 dev sentences: {accuracy}; masked-token accuracy "
        f"{mlm_accuracy:.4f}"
    )
    assert accuracy["pretrained"] >= 0.70 and accuracy["pretrained"] - accuracy["random"] >= 0.15, (
        accuracy
    )
