"""Replaced-token detection's mechanics on a tiny model: the replaced labels (a sample equal to
the original is original), the samples' draws, no gradient through the sampling, one set of
embeddings."""

from __future__ import annotations

import math

import pytest
import torch

from mlmkit.config import ModelConfig, ObjectiveConfig
from mlmkit.masking.collator import IGNORE_INDEX, MLMCollator
from mlmkit.model.bert import build_model
from mlmkit.model.rtd import ReplacedTokenDetection, build_generator, sample_tokens

TINY = ModelConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64)


def _objective(tokenizer):
    torch.manual_seed(0)
    model = build_model(TINY, tokenizer)
    generator = build_generator(model, ObjectiveConfig(name="rtd"), "sdpa")
    return ReplacedTokenDetection(model, generator, discriminator_weight=50.0)


def _batch(tokenizer, lengths=(24, 24, 17)):
    """Rows of random words, the last one padded; masked with draws (row seeds)."""
    g = torch.Generator().manual_seed(0)
    rows = []
    for i, n in enumerate(lengths):
        ids = torch.randint(10, len(tokenizer), (n,), generator=g)
        ids[0], ids[-1] = tokenizer.cls_token_id, tokenizer.sep_token_id
        rows.append({"input_ids": ids, "mask_seed": 100 + i})
    return MLMCollator(tokenizer, mlm_probability=0.4, draws=True)(rows)


def test_the_generator_is_narrower_and_shares_the_embeddings(tokenizer):
    objective = _objective(tokenizer)
    model, generator = objective.model, objective.generator
    assert type(generator).__name__ == "ElectraForMaskedLM"
    c = generator.config
    assert (c.hidden_size, c.num_attention_heads, c.intermediate_size) == (8, 1, 16)
    assert c.num_hidden_layers == 1 and c.embedding_size == 32  # the discriminator's width
    assert generator.electra.embeddings is model.bert.embeddings
    assert generator.generator_lm_head.weight is model.bert.embeddings.word_embeddings.weight
    # one tensor each in the objective's parameters (the optimizer steps each once)
    names = {id(p) for p in objective.parameters()}
    assert len(names) == len(list(objective.parameters()))
    shared = model.bert.embeddings.word_embeddings.weight
    assert sum(p is shared for p in objective.parameters()) == 1


def test_the_samples_follow_the_softmax_and_skip_tokens_of_probability_zero():
    logits = torch.tensor([[0.0, math.log(3.0), -1e4, 0.0]]).repeat(4000, 1)
    draws = (torch.arange(4000) + 0.5) / 4000  # evenly spread: 1/5, 3/5, 0, 1/5
    counts = torch.bincount(sample_tokens(logits, draws), minlength=4).tolist()
    assert counts == [800, 2400, 0, 800]
    # the draw decides: the same draws, the same samples
    assert torch.equal(sample_tokens(logits, draws), sample_tokens(logits.clone(), draws))


def test_replaced_labels_count_a_sample_equal_to_the_original_as_original(tokenizer):
    """A generator that always proposes token t: the discriminator's input holds t at every
    chosen position and the original elsewhere; its labels say replaced except where the
    original was t; the loss is over the real tokens only (padding left out)."""
    objective = _objective(tokenizer).eval()
    batch = _batch(tokenizer)
    chosen = batch["labels"] != IGNORE_INDEX
    t = int(batch["labels"][chosen][0])  # the first chosen token's original: a sample equal to it
    with torch.no_grad():
        objective.generator.generator_lm_head.bias.fill_(-1e4)[t] = 1e4
        b = 0.7  # every token's logit "replaced" is b
        objective.discriminator_head.prediction.weight.zero_()
        objective.discriminator_head.prediction.bias.fill_(b)
    seen = []
    hook = objective.model.bert.embeddings.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["input_ids"].clone()), with_kwargs=True
    )
    with torch.no_grad():
        out = objective(**batch)
    hook.remove()
    original = torch.where(chosen, batch["labels"], batch["input_ids"])
    assert torch.equal(seen[0], batch["input_ids"])  # the generator reads the masked input
    assert torch.equal(seen[1], torch.where(chosen, torch.full_like(original, t), original))
    real = batch["attention_mask"].bool()
    replaced = chosen & (original != t)
    n_replaced, n_original = int(replaced.sum()), int((real & ~replaced).sum())
    assert 0 < int((chosen & (original == t)).sum()) and n_replaced > 0
    hits, counted_replaced, counted_real = out["rtd_sums"].tolist()
    assert (counted_replaced, counted_real) == (n_replaced, int(real.sum()))
    assert hits == n_replaced  # logit b > 0 says "replaced" everywhere
    softplus = torch.nn.functional.softplus
    expected = n_replaced * softplus(torch.tensor(-b)) + n_original * softplus(torch.tensor(b))
    torch.testing.assert_close(out["rtd_loss_sum"], expected, rtol=1e-5, atol=1e-4)
    assert objective.counts(batch).tolist() == [int(chosen.sum()), int(real.sum())]


def test_the_generator_gets_no_gradient_through_the_sampling(tokenizer):
    """The discriminator's loss reaches the generator only through the shared embeddings; the
    generator's loss never reaches the discriminator's own layers or head."""
    objective = _objective(tokenizer).train()
    batch = _batch(tokenizer)
    embeddings = {id(p) for p in objective.model.bert.embeddings.parameters()}

    def grads(term: int) -> dict[str, bool]:
        objective.zero_grad(set_to_none=True)
        objective.losses(objective(**batch))[term].backward()
        return {
            name: p.grad is not None and bool(p.grad.abs().sum() > 0)
            for name, p in objective.named_parameters()
            if id(p) not in embeddings
        }

    discriminator = grads(1)
    assert not any(v for k, v in discriminator.items() if k.startswith("generator."))
    assert all(v for k, v in discriminator.items() if k.startswith("discriminator_head."))
    assert objective.model.bert.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    generator = grads(0)
    assert any(v for k, v in generator.items() if k.startswith("generator.electra.encoder"))
    assert not any(v for k, v in generator.items() if not k.startswith("generator."))


def test_a_new_discriminator_starts_at_the_share_it_expects_replaced(tokenizer):
    """Its logit starts at the log-odds of the masking rate, not at even odds: the mean
    probability "replaced" it gives a batch is that share."""
    torch.manual_seed(0)
    model = build_model(TINY, tokenizer)
    generator = build_generator(model, ObjectiveConfig(name="rtd"), "sdpa")
    batch = _batch(tokenizer)
    for share in (0.15, 0.4):
        objective = ReplacedTokenDetection(model, generator, 50.0, replaced_share=share).eval()
        with torch.no_grad():
            hidden = objective(input_ids=batch["input_ids"])["last_hidden_state"]
            p = torch.sigmoid(objective.discriminator_head(hidden))
        assert p.mean().item() == pytest.approx(share, abs=0.01)


def test_a_discriminator_on_its_plateau_is_warned_of_once(tokenizer):
    """From PLATEAU_STEP on, a train event whose discriminator loss is no better than the
    replaced share alone (its entropy) gets one warning naming what to change; a learning one,
    or an earlier step, gets none."""
    from mlmkit.model import rtd

    objective = _objective(tokenizer)
    share = 0.13
    entropy = -(share * math.log(share) + (1 - share) * math.log(1 - share))  # 0.3864 nats

    def event(step, loss):
        return {"step": step, "rtd_loss": loss, "replaced_share": share}

    assert objective.warning(event(rtd.PLATEAU_STEP - 1, entropy)) is None  # too early to say
    assert objective.warning(event(rtd.PLATEAU_STEP, entropy - 0.05)) is None  # it learns
    warning = objective.warning(event(rtd.PLATEAU_STEP + 100, entropy - 0.001))
    assert f"Step {rtd.PLATEAU_STEP + 100}:" in warning and f"{entropy:.4f}" in warning
    assert "model.init_from" in warning and "optim.lr" in warning
    assert objective.warning(event(rtd.PLATEAU_STEP + 200, entropy)) is None  # once
