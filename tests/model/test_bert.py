"""The encoder and its objective: SDPA, bidirectional, sparse head == full head."""

from __future__ import annotations

import dataclasses
import json

import torch

from mlmkit.config import ModelConfig
from mlmkit.masking.collator import MLMCollator
from mlmkit.model.bert import MaskedLM, build_model

SMALL = ModelConfig(
    num_hidden_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    intermediate_size=256,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


def _batch(tokenizer, n=4, length=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, len(tokenizer), (n, length), generator=g)
    ids[:, 0], ids[:, -1] = tokenizer.cls_token_id, tokenizer.sep_token_id
    return MLMCollator(tokenizer, mlm_probability=0.3, seed=seed)([{"input_ids": r} for r in ids])


def test_model_uses_sdpa_and_is_a_plain_bert(tokenizer):
    from transformers import BertForMaskedLM

    model = build_model(SMALL, tokenizer)
    assert type(model) is BertForMaskedLM
    assert model.config._attn_implementation == "sdpa"
    assert model.config.is_decoder is False
    # the vocabulary dimension padded to a multiple of 64; the tokenizer unchanged
    assert model.config.vocab_size % 64 == 0
    assert len(tokenizer) <= model.config.vocab_size < len(tokenizer) + 64


def test_attention_is_bidirectional(tokenizer):
    """Changing the last token changes the first position's output: no causal mask."""
    model = build_model(SMALL, tokenizer).eval()
    batch = _batch(tokenizer, n=1)
    ids = batch["input_ids"]
    other = ids.clone()
    other[0, -2] = (other[0, -2] + 1) % len(tokenizer)
    with torch.no_grad():
        h1 = model.bert(input_ids=ids).last_hidden_state
        h2 = model.bert(input_ids=other).last_hidden_state
    assert not torch.allclose(h1[0, 1], h2[0, 1])


def test_no_mask_equals_all_ones_mask(tokenizer):
    model = build_model(SMALL, tokenizer).eval()
    ids = _batch(tokenizer)["input_ids"]
    with torch.no_grad():
        a = model.bert(input_ids=ids).last_hidden_state
        b = model.bert(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
    torch.testing.assert_close(a, b)


def test_padding_is_masked_out(tokenizer):
    """A padded row gives the same outputs at its real positions as the unpadded row."""
    model = build_model(SMALL, tokenizer).eval()
    ids = _batch(tokenizer, n=1)["input_ids"]
    padded = torch.cat([ids, torch.full((1, 8), tokenizer.pad_token_id)], dim=1)
    mask = torch.cat([torch.ones_like(ids), torch.zeros(1, 8, dtype=torch.long)], dim=1)
    with torch.no_grad():
        a = model.bert(input_ids=ids).last_hidden_state
        b = model.bert(input_ids=padded, attention_mask=mask).last_hidden_state[:, : ids.size(1)]
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_sparse_head_matches_full_head_loss_and_gradients(tokenizer):
    torch.manual_seed(0)
    model = build_model(SMALL, tokenizer)
    batch = _batch(tokenizer)
    results = []
    for sparse in (True, False):
        model.zero_grad()
        out = MaskedLM(model, sparse_prediction=sparse).eval()(**batch)
        loss = out["loss_sum"] / out["n_tokens"]
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        valid = out["targets"] != -100  # the sparse head's rows are the chosen positions (bucketed)
        correct = int((out["logits"].argmax(-1) == out["targets"])[valid].sum())
        results.append((loss.detach(), correct, grads))
    (l1, c1, g1), (l2, c2, g2) = results
    torch.testing.assert_close(l1, l2)
    assert c1 == c2
    assert g1.keys() == g2.keys()
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], rtol=1e-4, atol=1e-6, msg=name)
    # and it equals transformers' own mean cross-entropy over the labels
    with torch.no_grad():
        hf = model(**batch).loss
    torch.testing.assert_close(l1, hf)


def test_accumulated_step_equals_one_big_batch(tokenizer):
    """Micro-batches with unequal masked counts: the gradient is per chosen token of the step."""
    from accelerate import Accelerator

    from mlmkit.training.step import forward_backward

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    objective = MaskedLM(build_model(SMALL, tokenizer))
    a = _batch(tokenizer, n=2, seed=1)
    b = _batch(tokenizer, n=6, seed=2)
    assert (a["labels"] != -100).sum() != (b["labels"] != -100).sum()
    both = {k: torch.cat([a[k], b[k]]) for k in a}

    grads = []
    for micro in ([a, b], [both]):
        objective.zero_grad()
        loss_sum, n = forward_backward(accelerator, objective, micro)
        grads.append(
            {k: p.grad.clone() for k, p in objective.named_parameters() if p.grad is not None}
        )
        assert int(n) == int((both["labels"] != -100).sum())
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-7, msg=name)
    # a mean of per-micro-batch means would differ here
    objective.zero_grad()
    for m in (a, b):
        out = objective(**m)
        (out["loss_sum"] / out["n_tokens"] / 2).backward()
    naive = objective.model.bert.embeddings.word_embeddings.weight.grad
    assert not torch.allclose(
        naive, grads[1]["model.bert.embeddings.word_embeddings.weight"], rtol=1e-3
    )


def test_cpu_bf16_attention_masks_padding_as_sdpa_does(tokenizer):
    """``mlmkit_cpu_sdpa`` gets SDPA's masks: a padded batch gives SDPA's outputs."""
    from mlmkit.model.kernels import register_cpu_attention

    model = build_model(SMALL, tokenizer).eval()
    ids = _batch(tokenizer, n=2)["input_ids"]
    mask = torch.ones_like(ids)
    mask[0, 20:] = 0
    outputs = []
    for attn in ("sdpa", register_cpu_attention()):
        model.set_attn_implementation(attn)
        with torch.no_grad():
            outputs.append(model.bert(input_ids=ids, attention_mask=mask).last_hidden_state)
    torch.testing.assert_close(outputs[0], outputs[1])


def test_sinusoidal_position_init_starts_neighbours_alike(tokenizer):
    """model.position_init=sinusoidal (the default): the learned table starts as scaled sines
    and cosines, at the std of the other embeddings; normal: BERT's own init."""
    small = dict(num_hidden_layers=1, hidden_size=64, num_attention_heads=2, intermediate_size=128)
    tables = {}
    for how in ("sinusoidal", "normal"):
        torch.manual_seed(0)
        model = build_model(
            ModelConfig(position_init=how, attention_init="normal", **small), tokenizer
        )
        tables[how] = model.bert.embeddings.position_embeddings.weight.detach()
    sin = tables["sinusoidal"]
    assert abs(sin.std().item() - 0.02) < 1e-4
    cos = torch.nn.functional.cosine_similarity
    assert cos(sin[10], sin[11], dim=0) > 0.9 > cos(sin[10], sin[200], dim=0) + 0.3
    normal = tables["normal"]
    assert abs(cos(normal[10], normal[11], dim=0)) < 0.5  # unrelated rows
    assert not torch.allclose(sin, normal)


def test_unigram_output_bias_starts_the_model_at_the_corpus_frequencies(tokenizer):
    """model.output_bias_init=unigram: softmax(bias) is the add-half-smoothed frequency of
    each real token, the padding ids stay silenced, and the untrained model's loss on text
    drawn from those frequencies is near their entropy (zero bias: near log of the vocabulary)."""
    from mlmkit.model.bert import PADDED_VOCAB_BIAS, init_output_bias

    n = len(tokenizer)
    torch.manual_seed(0)  # the Dirichlet draw and the model's init
    g = torch.Generator().manual_seed(0)
    freq = torch.distributions.Dirichlet(torch.full((n,), 0.1)).sample()
    freq[torch.tensor(tokenizer.all_special_ids)] = 0
    freq /= freq.sum()
    text = torch.multinomial(freq, 8 * 64, replacement=True, generator=g).reshape(8, 64)
    counts = torch.bincount(text.reshape(-1), minlength=n)
    model = build_model(SMALL, tokenizer)
    zero_bias = model.cls.predictions.bias.detach().clone()
    init_output_bias(model, counts)
    bias = model.cls.predictions.bias.detach()
    smoothed = (counts.double() + 0.5) / (counts.double() + 0.5).sum()
    torch.testing.assert_close(torch.softmax(bias[:n].double(), 0), smoothed, rtol=1e-4, atol=1e-9)
    assert (bias[n:] == PADDED_VOCAB_BIAS).all() and (zero_bias[n:] == PADDED_VOCAB_BIAS).all()
    assert (
        model.get_output_embeddings().bias is model.cls.predictions.bias
    )  # the decoder's bias too

    labels = torch.full_like(text, -100)
    labels[:, 1::3] = text[:, 1::3]
    ids = text.clone()
    ids[:, 1::3] = tokenizer.mask_token_id
    with torch.no_grad():
        loss = model(input_ids=ids, labels=labels).loss.item()
        model.cls.predictions.bias.copy_(zero_bias)
        loss_zero = model(input_ids=ids, labels=labels).loss.item()
    entropy = -(freq[freq > 0] * freq[freq > 0].log()).sum().item()
    assert abs(loss - entropy) < 0.5 < loss_zero - loss


def test_local_attention_init_starts_heads_on_the_neighbours(tokenizer):
    """model.attention_init=local (the default): in every layer, heads 0 and 1 of a
    four-head model start attending to the previous and the next token whatever the words
    are (more than to the token itself, the most likely other place); heads 2 and 3, and
    every head with normal, start near uniform."""
    cfg = dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=4, intermediate_size=256)
    length = 64
    ids = torch.randint(10, len(tokenizer), (4, length), generator=torch.Generator().manual_seed(0))
    inside = torch.arange(1, length - 1)
    for how in ("local", "normal"):
        torch.manual_seed(0)
        config = ModelConfig(attention_init=how, attn_implementation="eager", **cfg)
        model = build_model(config, tokenizer).eval()
        with torch.no_grad():
            attentions = model.bert(input_ids=ids, output_attentions=True).attentions
        for probs in attentions:  # (batch, head, query, key), one per layer
            if how == "local":
                for head, shift in ((0, -1), (1, 1)):
                    on = probs[:, head, inside]
                    assert (on.argmax(-1) == inside + shift).float().mean() > 0.6
                    neighbour, itself = (
                        on[:, range(len(inside)), inside + shift],
                        on[:, range(len(inside)), inside],
                    )
                    assert neighbour.mean() > 0.3 and neighbour.mean() > itself.mean() + 0.1
            untouched = probs[:, 2:] if how == "local" else probs
            assert untouched.max() < 3.0 / length  # BERT's init: near uniform


def test_local_attention_init_keeps_the_other_heads_and_trains(tokenizer):
    """Only the local heads' query and key weights, and the word and token-type embeddings
    in the dims those heads read, differ from BERT's init; and they are trained like the
    others: the loss gives them a gradient."""
    models = {}
    for how in ("local", "normal"):
        torch.manual_seed(0)
        models[how] = build_model(dataclasses.replace(SMALL, attention_init=how), tokenizer)
    dh = SMALL.hidden_size // SMALL.num_attention_heads  # two local heads reading dims 0 .. dh - 1
    for (name, a), (_, b) in zip(
        models["local"].named_parameters(), models["normal"].named_parameters()
    ):
        if ".attention.self.query." in name or ".attention.self.key." in name:
            torch.testing.assert_close(a[2 * dh :], b[2 * dh :])  # heads 2 and 3
            if name.endswith("weight"):  # the biases start at zero in both
                assert not torch.allclose(a[: 2 * dh], b[: 2 * dh])
        elif "word_embeddings" in name or "token_type_embeddings" in name:
            assert not a[:, :dh].any() and b[:, :dh].abs().sum() > 0
            torch.testing.assert_close(a[:, dh:], b[:, dh:])
        else:
            torch.testing.assert_close(a, b)
    MaskedLM(models["local"])(**_batch(tokenizer))["loss_sum"].backward()
    for layer in models["local"].bert.encoder.layer:
        assert layer.attention.self.query.weight.grad[: 2 * dh].abs().sum() > 0
    assert models["local"].bert.embeddings.word_embeddings.weight.grad[:, :dh].abs().sum() > 0


def test_a_model_saved_in_bf16_continues_in_fp32(tokenizer, tmp_path):
    """model.init_from of a bf16 model dir (a DeepSpeed bf16 final/, a Hub model stored in bf16)
    trains fp32 master weights under the run's autocast, not pure bf16."""
    saved = build_model(SMALL, tokenizer).to(torch.bfloat16)
    saved.save_pretrained(tmp_path / "bf16")
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    model = build_model(dataclasses.replace(SMALL, init_from=str(tmp_path / "bf16")), tokenizer)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    for name, p in saved.named_parameters():  # the same values, widened
        assert torch.equal(model.get_parameter(name), p.float()), name


def test_a_training_step_returns_no_logits(tokenizer):
    """In training the objective returns the loss and the count alone: logits returned would
    stay alive through the backward, and mixed precision converts outputs to fp32 (a copy of
    batch x vocabulary floats every step); evaluation gets them, with their targets."""
    objective, batch = MaskedLM(build_model(SMALL, tokenizer)), _batch(tokenizer)
    assert set(objective.train()(**batch)) == {"loss_sum", "n_tokens"}
    out = objective.eval()(**batch)
    assert set(out) == {"loss_sum", "n_tokens", "logits", "targets"}
    assert out["logits"].shape == (out["targets"].numel(), objective.model.config.vocab_size)


def test_a_loaded_bert_extends_its_position_table_by_copying_the_learned_rows(tokenizer, tmp_path):
    """model.extend_positions_to: 64 learned positions grown to 160, rows 64-127 and 128-159
    copies of rows 0-63 and 0-31; the model then reads 160-token inputs and saves the longer
    table."""
    import pytest

    from mlmkit.errors import ConfigError

    short = build_model(dataclasses.replace(SMALL, max_position_embeddings=64), tokenizer)
    short.save_pretrained(tmp_path / "short")
    table = short.bert.embeddings.position_embeddings.weight
    model = build_model(
        dataclasses.replace(SMALL, init_from=str(tmp_path / "short"), extend_positions_to=160),
        tokenizer,
        max_seq_length=160,
    )
    grown = model.bert.embeddings.position_embeddings.weight
    assert grown.shape == (160, 64) and model.config.max_position_embeddings == 160
    assert (
        torch.equal(grown[:64], table)
        and torch.equal(grown[64:128], table)
        and torch.equal(grown[128:], table[:32])
    )
    ids = _batch(tokenizer, n=2, length=160)["input_ids"]
    assert model(input_ids=ids).logits.shape[:2] == (2, 160)
    model.save_pretrained(tmp_path / "long")
    assert (
        json.loads((tmp_path / "long" / "config.json").read_text())["max_position_embeddings"]
        == 160
    )
    with pytest.raises(ConfigError, match="model.extend_positions_to"):  # a length beyond the table
        build_model(
            dataclasses.replace(SMALL, init_from=str(tmp_path / "short")),
            tokenizer,
            max_seq_length=128,
        )
    with pytest.raises(
        ConfigError, match=r"model.extend_positions_to \(32\) is below the 64 positions"
    ):
        build_model(
            dataclasses.replace(SMALL, init_from=str(tmp_path / "short"), extend_positions_to=32),
            tokenizer,
        )
