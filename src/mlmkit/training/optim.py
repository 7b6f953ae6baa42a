"""AdamW without decay on biases and LayerNorm, and warmup-then-decay schedules."""

from __future__ import annotations

import math

import torch
from torch import nn

from mlmkit.config import OptimConfig


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: weight matrices and embeddings decay; biases and norm weights do not."""
    decay, no_decay = [], []
    norm_types = (nn.LayerNorm,)
    no_decay_ids = set()
    for module in model.modules():
        if isinstance(module, norm_types):
            no_decay_ids.update(id(p) for p in module.parameters(recurse=False))
    seen = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:  # tied weights appear once
            continue
        seen.add(id(p))
        if id(p) in no_decay_ids or name.endswith("bias") or p.ndim < 2:
            no_decay.append(p)
        else:
            decay.append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, cfg: OptimConfig, device_type: str = "cpu") -> torch.optim.Optimizer:
    kwargs = {}
    if device_type in ("cuda", "cpu"):
        # One kernel for the whole update. On a CPU torch's default is a per-tensor loop
        # (about 15% of a bert-mini step in a profile).
        kwargs["fused"] = True
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        **kwargs,
    )


def lr_lambda(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """The multiplier of ``cfg.lr`` after ``step`` optimizer steps."""
    warmup = min(cfg.warmup_steps, total_steps)
    if warmup and step < warmup:
        return (step + 1) / warmup
    if cfg.schedule == "constant":
        return 1.0
    decay_steps = max(1, total_steps - warmup)
    progress = min(1.0, (step - warmup) / decay_steps)
    if cfg.schedule == "linear":
        shape = 1.0 - progress
    else:  # cosine
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int | None,
                    factor=None):
    """LambdaLR over ``lr_lambda``, or over ``factor(step)`` (a budget's schedule) when given."""
    if factor is None:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_lambda(step, cfg, total_steps))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
