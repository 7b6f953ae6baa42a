"""Replaced-token detection end to end (``objective=rtd``): its log, an exact resume (the samples'
draws included), one set of embeddings after a resume and in the export, the discriminator and the
generator exported, and continued pretraining from an exported model."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from runs import RESUME_RTOL, TINY, assert_same_weights, events, run_train

ARGS = [
    "objective=rtd",
    "train.max_steps=10",
    "train.save_every=5",
    "train.eval_every=10",
    "train.log_every=5",
    "train.precision=no",
    "logger=none",
]
FIGURES = ("loss", "mlm_loss", "rtd_loss", "generator_accuracy", "rtd_accuracy", "replaced_share")


def _resumed_objective(run, cache_dir):
    """The objective of a Trainer resumed from the run's latest checkpoint (nothing trained)."""
    from mlmkit.config import compose
    from mlmkit.training import lock, setup
    from mlmkit.training.trainer import Trainer

    cfg = compose([*TINY, *ARGS, "train.resume=auto", f"paths.cache_dir={cache_dir}"])
    trainer = Trainer(cfg, run)
    try:
        trainer.resume()
        return trainer.accelerator.unwrap_model(trainer.objective), trainer.resume_from
    finally:
        setup.stop_logging()
        lock.release()


@pytest.mark.slow
def test_rtd_logs_both_losses_resumes_exactly_and_exports_both_models(
    tmp_path, cache_dir, monkeypatch
):
    from safetensors.torch import load_file
    from transformers import AutoModelForMaskedLM, BertForMaskedLM

    from mlmkit.model import rtd

    monkeypatch.setattr(rtd, "PLATEAU_STEP", 5)  # the plateau's warning from the first event
    run = tmp_path / "run"
    proc = run_train(run, cache_dir, *ARGS)
    full = events(run, "train")
    for e in full:
        assert e["loss"] == pytest.approx(e["mlm_loss"] + 50 * e["rtd_loss"])
        assert 0 < e["replaced_share"] < 0.4 and 0 < e["rtd_accuracy"] < 1  # mask40's 40% at most
        assert 0 <= e["generator_accuracy"] < 1 and 0 < e["mfu"] <= 1
    # the log warns once where an event's discriminator scores no better than its replaced share
    share = [e["replaced_share"] for e in full]
    entropy = [-(p * math.log(p) + (1 - p) * math.log(1 - p)) for p in share]
    stalled = [e["rtd_loss"] >= h - rtd.PLATEAU_NATS for e, h in zip(full, entropy, strict=True)]
    warned = proc.stderr.count("the discriminator has learned next to nothing")
    assert warned == (1 if any(stalled) else 0), (stalled, proc.stderr[-2000:])
    assert {"eval_rtd_loss", "eval_rtd_accuracy", "eval_replaced_share"} <= set(
        events(run, "eval")[-1]
    )
    weights = load_file(run / "final" / "model.safetensors")
    generator = load_file(run / "final" / "generator" / "model.safetensors")

    # rolled back to step 5 and resumed: the same figures and weights, the embeddings one tensor
    shutil.rmtree(run / "checkpoints" / "step_0000010")
    shutil.rmtree(run / "final")
    objective, checkpoint = _resumed_objective(run, cache_dir)
    saved = load_file(checkpoint / "model.safetensors")[
        "model.bert.embeddings.word_embeddings.weight"
    ]
    shared = objective.model.bert.embeddings.word_embeddings.weight
    assert objective.generator.electra.embeddings is objective.model.bert.embeddings
    assert objective.generator.generator_lm_head.weight is shared and torch.equal(shared, saved)
    run_train(run, cache_dir, *ARGS, "train.resume=auto")
    for a, b in zip(full, events(run, "train"), strict=True):
        assert a["step"] == b["step"]
        for key in FIGURES:
            assert a[key] == pytest.approx(b[key], rel=RESUME_RTOL), (a["step"], key)
    assert_same_weights(load_file(run / "final" / "model.safetensors"), weights)
    assert_same_weights(load_file(run / "final" / "generator" / "model.safetensors"), generator)

    # final/ is the discriminator as an MLM run's model; generator/ a fill-mask model of its own
    assert type(BertForMaskedLM.from_pretrained(run / "final")) is BertForMaskedLM
    gen = AutoModelForMaskedLM.from_pretrained(run / "final" / "generator")
    assert type(gen).__name__ == "ElectraForMaskedLM"
    assert gen.generator_lm_head.weight is gen.electra.embeddings.word_embeddings.weight
    word = weights["bert.embeddings.word_embeddings.weight"]
    assert torch.equal(gen.electra.embeddings.word_embeddings.weight, word)
    card = (run / "final" / "README.md").read_text()
    assert "replaced-token detection" in card and "`generator/` in this dir" in card

    # continued pretraining: the discriminator from the export, a new generator, said in the log
    proc = run_train(
        tmp_path / "continued",
        cache_dir,
        *ARGS,
        f"model.init_from={run / 'final'}",
        "train.max_steps=2",
        "train.log_every=1",
    )
    assert "the discriminator starts from model.init_from" in proc.stderr
    assert [e["step"] for e in events(tmp_path / "continued", "train")] == [1, 2]
