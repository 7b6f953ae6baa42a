"""Shared helpers: a small model and MLM batches (packed or padded) to train a few steps on."""

from __future__ import annotations

import torch

from mlmkit.config import ModelConfig
from mlmkit.data.loader import DropFullAttentionMask
from mlmkit.masking.collator import MLMCollator
from mlmkit.model.bert import build_model

SMALL = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=256)


def _model(tokenizer, seed=0, attn_implementation=None, **kw):
    torch.manual_seed(seed)
    return build_model(
        ModelConfig(**{**SMALL, **kw}), tokenizer, attn_implementation=attn_implementation
    )


def _packed(tokenizer, n=8, length=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, len(tokenizer), (n, length), generator=g)
    ids[:, 0], ids[:, -1] = tokenizer.cls_token_id, tokenizer.sep_token_id
    return [{"input_ids": r.tolist()} for r in ids]


def _ragged(tokenizer, lengths=(9, 20, 31, 14), seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        ids = torch.randint(10, len(tokenizer), (n,), generator=g).tolist()
        rows.append({"input_ids": [tokenizer.cls_token_id, *ids, tokenizer.sep_token_id]})
    return rows


def _train(objective, batches, steps=5, autocast=False, lr=1e-3, fused=False):
    """A few AdamW steps; the per-step mean losses."""
    opt = torch.optim.AdamW(objective.parameters(), lr=lr, foreach=False, fused=fused)
    losses = []
    for i in range(steps):
        batch = batches[i % len(batches)]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = objective(**batch)
        loss = out["loss_sum"] / out["n_tokens"]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _batches(tokenizer, examples_fn, n=3, pad8=False, drop_mask=True):
    collator = MLMCollator(
        tokenizer, mlm_probability=0.3, seed=0, pad_to_multiple_of=8 if pad8 else None
    )
    wrap = DropFullAttentionMask(collator) if drop_mask else collator
    return [wrap(examples_fn(tokenizer, seed=i)) for i in range(n)]
