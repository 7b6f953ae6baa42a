"""AdamW without decay on biases and LayerNorm, and warmup-then-decay schedules (linear,
cosine, constant, warmup-stable-decay)."""

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


def build_optimizer(
    model: nn.Module, cfg: OptimConfig, device_type: str = "cpu"
) -> torch.optim.Optimizer:
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


def schedule_multiplier(cfg: OptimConfig, progress: float, warm_end: float) -> float:
    """Return the multiplier of ``cfg.lr`` after warmup, at ``progress`` (the used share of the
    budget, 0..1) when warmup ended at ``warm_end``.

    linear and cosine decay from the end of warmup to the end of the budget; ``wsd``
    (warmup-stable-decay) holds the peak and decays only in the last ``decay_fraction`` of
    the budget, by ``decay_shape`` (1-sqrt, as Hägele et al. (2024) found best, or linear),
    so a run can be extended from a checkpoint of its stable phase.
    """
    if cfg.schedule == "constant":
        return 1.0
    start = max(warm_end, 1.0 - cfg.decay_fraction) if cfg.schedule == "wsd" else warm_end
    d = min(1.0, max(0.0, (progress - start) / max(1e-9, 1.0 - start)))
    if cfg.schedule == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * d))
    elif cfg.schedule == "wsd" and cfg.decay_shape == "1-sqrt":
        shape = 1.0 - math.sqrt(d)
    else:  # linear, or wsd with a linear decay
        shape = 1.0 - d
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def lr_lambda(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """Return the multiplier of ``cfg.lr`` after ``step`` optimizer steps of ``total_steps``."""
    warmup = min(cfg.warmup_steps, total_steps)
    if warmup and step < warmup:
        return (step + 1) / warmup
    total = max(1, total_steps)
    return schedule_multiplier(cfg, step / total, warmup / total)


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int | None, factor=None
):
    """LambdaLR over ``lr_lambda``, or over ``factor(step)`` (a budget's schedule) when given."""
    if factor is None:
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_lambda(step, cfg, total_steps)
        )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
