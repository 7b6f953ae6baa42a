"""ModernBERT (model.architecture=modernbert): the model built, its objective, its attention."""

from __future__ import annotations

import pytest
import torch

from mlmkit.config import ModelConfig
from mlmkit.masking.collator import MLMCollator
from mlmkit.model.bert import MaskedLM, build_model, count_parameters

SMALL = ModelConfig(
    architecture="modernbert",
    num_hidden_layers=3,
    hidden_size=64,
    num_attention_heads=4,
    intermediate_size=96,
    layer_norm_eps=1e-5,
    local_attention=16,
    global_attn_every_n_layers=3,
    max_position_embeddings=1024,
)


def _batch(tokenizer, n=4, length=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, len(tokenizer), (n, length), generator=g)
    ids[:, 0], ids[:, -1] = tokenizer.cls_token_id, tokenizer.sep_token_id
    return MLMCollator(tokenizer, mlm_probability=0.3, seed=seed)([{"input_ids": r} for r in ids])


def test_the_model_is_a_plain_modernbert(tokenizer):
    from transformers import ModernBertForMaskedLM

    torch.manual_seed(0)
    model = build_model(SMALL, tokenizer)
    c = model.config
    assert type(model) is ModernBertForMaskedLM and c.model_type == "modernbert"
    assert c._attn_implementation == "sdpa"
    assert c.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    assert c.local_attention == 16 and c.norm_eps == 1e-5
    assert c.rope_parameters["full_attention"]["rope_theta"] == 160000.0
    assert c.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0
    assert (c.pad_token_id, c.cls_token_id, c.sep_token_id) == (
        tokenizer.pad_token_id,
        tokenizer.cls_token_id,
        tokenizer.sep_token_id,
    )
    # the vocabulary padded to a multiple of 64, the padding ids never predicted
    assert c.vocab_size % 64 == 0 and len(tokenizer) <= c.vocab_size < len(tokenizer) + 64
    assert bool((model.decoder.bias[len(tokenizer) :] < -1e3).all())
    # tied embeddings; no biases but the decoder's; GeGLU (input and gate in one matrix)
    assert model.decoder.weight is model.model.embeddings.tok_embeddings.weight
    biases = [n for n, _ in model.named_parameters() if n.endswith("bias")]
    assert biases == ["decoder.bias"]
    assert model.model.layers[0].mlp.Wi.weight.shape == (2 * 96, 64)
    assert MaskedLM(model)._no_split_modules == ["ModernBertEncoderLayer"]  # FSDP's units
    embeddings = model.model.embeddings.tok_embeddings.weight.numel() + 64  # and its norm
    assert count_parameters(model) - count_parameters(model, embeddings=False) == embeddings


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
        results.append((loss.detach(), grads))
    (l1, g1), (l2, g2) = results
    torch.testing.assert_close(l1, l2)
    assert g1.keys() == g2.keys() and "model.layers.2.mlp.Wi.weight" in g1
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], rtol=1e-4, atol=1e-6, msg=name)
    with torch.no_grad():  # and it equals transformers' own mean cross-entropy over the labels
        hf = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            labels=batch["labels"],
        ).loss
    torch.testing.assert_close(l1, hf)


def test_local_layers_see_only_their_window(tokenizer):
    """The global layer attends everywhere, a local one only within local_attention/2 tokens."""
    torch.manual_seed(0)
    model = build_model(SMALL, tokenizer, attn_implementation="eager").eval()
    ids = _batch(tokenizer, n=1)["input_ids"]
    with torch.no_grad():
        weights = model.model(input_ids=ids, output_attentions=True).attentions
    assert len(weights) == 3  # global, local, local
    distance = (torch.arange(ids.size(1))[:, None] - torch.arange(ids.size(1))[None, :]).abs()
    far = distance > SMALL.local_attention // 2
    assert bool((weights[0][0, :, far] > 0).all())
    for local in weights[1:]:
        assert bool((local[0, :, far] == 0).all())
        assert bool((local[0, :, distance < SMALL.local_attention // 2] > 0).all())


@pytest.mark.parametrize("attn", ["eager", "mlmkit_cpu_sdpa"])
def test_attention_kernels_agree_with_sdpa_on_padded_batches(tokenizer, attn):
    """eager and mlmkit's CPU kernel get the same masks (padding, sliding windows) as SDPA."""
    from mlmkit.model.kernels import register_cpu_attention

    register_cpu_attention()
    torch.manual_seed(0)
    model = build_model(SMALL, tokenizer).eval()
    ids = _batch(tokenizer, n=2)["input_ids"]
    mask = torch.ones_like(ids)
    mask[0, 30:] = 0
    outputs = []
    for name in ("sdpa", attn):
        model.set_attn_implementation(name)
        with torch.no_grad():
            outputs.append(model.model(input_ids=ids, attention_mask=mask).last_hidden_state)
    torch.testing.assert_close(outputs[0][0, :30], outputs[1][0, :30], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(outputs[0][1], outputs[1][1], rtol=1e-4, atol=1e-5)


def test_padding_is_masked_out(tokenizer):
    torch.manual_seed(0)
    model = build_model(SMALL, tokenizer).eval()
    ids = _batch(tokenizer, n=1)["input_ids"]
    padded = torch.cat([ids, torch.full((1, 8), tokenizer.pad_token_id)], dim=1)
    mask = torch.cat([torch.ones_like(ids), torch.zeros(1, 8, dtype=torch.long)], dim=1)
    with torch.no_grad():
        a = model.model(input_ids=ids).last_hidden_state
        b = model.model(input_ids=padded, attention_mask=mask).last_hidden_state[:, : ids.size(1)]
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_bad_modernbert_settings_are_one_sentence():
    from mlmkit.errors import ConfigError

    with pytest.raises(ConfigError, match="model.architecture must be bert or modernbert"):
        ModelConfig(architecture="roberta")
    with pytest.raises(ConfigError, match="model.local_attention must be an even number"):
        ModelConfig(architecture="modernbert", local_attention=127)
    with pytest.raises(ConfigError, match="model.global_attn_every_n_layers"):
        ModelConfig(architecture="modernbert", global_attn_every_n_layers=0)


def test_a_resume_checks_the_modernbert_shape(tokenizer, tmp_path):
    """The run's model/config.json of a ModernBERT is compared field by field on resume."""
    from mlmkit.errors import ConfigError
    from mlmkit.training.resume_checks import check_model_shape

    model = build_model(SMALL, tokenizer)
    model.config.save_pretrained(tmp_path)
    ckpt = tmp_path / "checkpoints" / "step_0000010"
    check_model_shape(tmp_path, build_model(SMALL, tokenizer).config, ckpt)  # the same: accepted
    for change, key in (
        (dict(local_attention=32), "local_attention"),
        (dict(global_attn_every_n_layers=1), "layer_types"),
        (dict(global_rope_theta=10000.0), "rope_parameters"),
        (dict(intermediate_size=128), "intermediate_size"),
        (dict(architecture="bert", layer_norm_eps=1e-12), "model_type"),
    ):
        other = build_model(ModelConfig(**{**SMALL.__dict__, **change}), tokenizer).config
        with pytest.raises(ConfigError, match=f"has {key}="):
            check_model_shape(tmp_path, other, ckpt)


@pytest.mark.gpu
def test_flash_attention_varlen_equals_sdpa_on_padded_batches_with_windows(tokenizer):
    """On CUDA in bf16, flash-attn's unpadded (varlen) kernel with sliding windows gives SDPA's
    loss and gradients on a padded batch whose rows are longer than the window."""
    from mlmkit.model.bert import flash_attn_available

    if not flash_attn_available():
        pytest.skip("needs a CUDA GPU and the flash-attn package")
    from batches import _batches, _ragged

    batch = {k: v.cuda() for k, v in _batches(tokenizer, _ragged, n=1, pad8=True)[0].items()}
    assert (
        batch["attention_mask"] is not None and batch["input_ids"].size(1) > SMALL.local_attention
    )
    results = []
    for attn in ("sdpa", "flash_attention_2"):
        torch.manual_seed(0)
        model = build_model(SMALL, tokenizer, attn_implementation=attn).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = MaskedLM(model)(**batch)
        loss = out["loss_sum"].float() / out["n_tokens"]
        loss.backward()
        results.append((loss.detach(), model.model.layers[1].attn.Wqkv.weight.grad.float()))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=2e-2, atol=1e-2)
    cos = torch.nn.functional.cosine_similarity(
        results[0][1].flatten(), results[1][1].flatten(), dim=0
    )
    assert cos > 0.99


def test_a_new_rope_theta_reaches_the_config_and_the_rotary_frequencies(tokenizer):
    """A context extension raises the global layers' RoPE base (ModernBERT: 10k -> 160k)."""
    from mlmkit.model.architectures import set_rope_theta

    model = build_model(SMALL, tokenizer).eval()
    batch = _batch(tokenizer, n=2, length=200)
    with torch.no_grad():
        before = model(input_ids=batch["input_ids"]).logits
    assert not set_rope_theta(
        model, SMALL.global_rope_theta, SMALL.local_rope_theta
    )  # nothing to change
    assert set_rope_theta(model, 1_000_000.0, SMALL.local_rope_theta)
    assert model.config.rope_parameters["full_attention"]["rope_theta"] == 1_000_000.0
    assert model.config.rope_parameters["sliding_attention"]["rope_theta"] == SMALL.local_rope_theta
    rotary = model.model.rotary_emb
    expected = 1.0 / 1_000_000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16)
    torch.testing.assert_close(rotary.full_attention_inv_freq, expected)
    with torch.no_grad():
        after = model(input_ids=batch["input_ids"]).logits
    assert not torch.allclose(before, after)
    bert = build_model(ModelConfig(), tokenizer)
    assert not set_rope_theta(bert, 1_000_000.0, 10_000.0)  # learned positions: nothing to change
