"""The optimizer's parameter groups (no decay on biases and LayerNorm) and the learning-rate
schedules."""

from __future__ import annotations

from mlmkit.config import ModelConfig, OptimConfig
from mlmkit.model.bert import build_model
from mlmkit.training.optim import lr_lambda, param_groups

SMALL = ModelConfig(
    num_hidden_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    intermediate_size=256,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)


def test_no_weight_decay_on_bias_and_layernorm(tokenizer):
    model = build_model(SMALL, tokenizer)
    decay, no_decay = param_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(p.ndim >= 2 for p in decay["params"])
    nd = [names[id(p)] for p in no_decay["params"]]
    assert any("LayerNorm" in n for n in nd) and any(n.endswith("bias") for n in nd)
    assert not any("LayerNorm" in names[id(p)] for p in decay["params"])
    total = sum(p.numel() for p in model.parameters())  # tied weights counted once
    assert sum(p.numel() for g in (decay, no_decay) for p in g["params"]) == total


def test_schedules():
    cfg = OptimConfig(warmup_steps=10, schedule="linear")
    assert lr_lambda(0, cfg, 100) == 0.1 and lr_lambda(9, cfg, 100) == 1.0
    assert abs(lr_lambda(55, cfg, 100) - 0.5) < 1e-9 and lr_lambda(100, cfg, 100) == 0.0
    cos = OptimConfig(warmup_steps=0, schedule="cosine", min_lr_ratio=0.1)
    assert abs(lr_lambda(50, cos, 100) - 0.55) < 1e-9 and abs(lr_lambda(100, cos, 100) - 0.1) < 1e-9
    assert lr_lambda(70, OptimConfig(warmup_steps=5, schedule="constant"), 100) == 1.0
