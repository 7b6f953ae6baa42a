"""Two CPU paths that compute what torch computes, with less memory traffic.

Both were found by profiling a bf16 bert-mini step on a CPU (``benchmarks/cpu_kernels.py``
measures them against the plain ops, side by side):

* ``cross_entropy_sum``: the loss over the head's logits. ``F.cross_entropy(logits.float())``
  walks the (chosen positions x vocabulary) matrix six times in fp32 (the cast, log-softmax,
  a zero-filled gradient, the log-softmax backward, the cast back); here the rows are taken
  a few at a time, so each block of logits is read from memory once per pass and processed
  in cache. The arithmetic is the same fp32 log-sum-exp, so the loss and gradient match
  ``F.cross_entropy`` to float rounding.
* ``bf16 attention with an fp32 backward``: on a CPU, torch's fused (flash) attention
  backward runs several times slower in bf16 than in fp32. The forward stays the fused bf16
  kernel; the backward casts to fp32 and runs the fp32 fused backward, which is faster and
  more exact. Registered for transformers as the attention implementation
  ``mlmkit_cpu_sdpa`` (``register_cpu_attention``); anything else (a mask, dropout, a GPU)
  goes to transformers' own SDPA path unchanged.
"""

from __future__ import annotations

import torch

from mlmkit.masking.collator import IGNORE_INDEX

CE_ROWS = 16  # rows of logits per block: 16 x 30,522 fp32 values is about 2 MB, one core's L2


class _CrossEntropySum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        n = logits.size(0)
        lse = torch.empty(n, dtype=torch.float32, device=logits.device)
        for i in range(0, n, CE_ROWS):
            lse[i : i + CE_ROWS] = torch.logsumexp(logits[i : i + CE_ROWS].float(), dim=-1)
        valid = targets != IGNORE_INDEX
        safe = torch.where(valid, targets, torch.zeros_like(targets))
        picked = logits.gather(1, safe.unsqueeze(1)).squeeze(1).float()
        ctx.save_for_backward(logits, safe, valid, lse)
        return ((lse - picked) * valid).sum()

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        logits, safe, valid, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        scale = valid.float() * grad_out.float()
        for i in range(0, logits.size(0), CE_ROWS):
            rows = slice(i, i + CE_ROWS)
            p = logits[rows].float().sub_(lse[rows].unsqueeze(1)).exp_()  # softmax
            p[torch.arange(p.size(0), device=p.device), safe[rows]] -= 1.0
            grad[rows] = p.mul_(scale[rows].unsqueeze(1))
        return grad, None


def cross_entropy_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``F.cross_entropy(logits.float(), targets, ignore_index=-100, reduction="sum")``.

    On a CPU the blockwise path above; elsewhere torch's own kernel.
    """
    if logits.device.type != "cpu" or logits.dim() != 2:
        import torch.nn.functional as F

        return F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="sum")
    return _CrossEntropySum.apply(logits, targets)


class _Bf16AttentionFp32Backward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, scale):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, 0.0, False, attn_mask=None, scale=scale
        )
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, out, lse = ctx.saved_tensors
        f32 = torch.float32
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out.to(f32),
            query.to(f32),
            key.to(f32),
            value.to(f32),
            out.to(f32),
            lse,
            0.0,
            False,
            attn_mask=None,
            scale=ctx.scale,
        )
        return dq.to(query.dtype), dk.to(key.dtype), dv.to(value.dtype), None


CPU_ATTENTION = "mlmkit_cpu_sdpa"


def cpu_sdpa_attention_forward(
    module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs
):
    """Compute attention with transformers' attention-function signature; (batch, seq, heads, dim)
    out, no weights."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if (
        query.device.type != "cpu"
        or query.dtype != torch.bfloat16
        or attention_mask is not None
        or dropout > 0.0
        or kwargs.get("is_causal", getattr(module, "is_causal", False))
        or not torch.is_grad_enabled()
        or query.shape[-1] != value.shape[-1]
        or query.shape[1] != key.shape[1]
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    out = _Bf16AttentionFp32Backward.apply(query, key, value, scaling)
    return out.transpose(1, 2).contiguous(), None


def register_cpu_attention() -> str:
    """Make ``mlmkit_cpu_sdpa`` known to transformers; returns the name.

    Its masks are SDPA's (padding, and ModernBERT's sliding windows): transformers builds
    no mask at all for an attention name without a mask function of its own.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(CPU_ATTENTION, cpu_sdpa_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(CPU_ATTENTION, sdpa_mask)
    return CPU_ATTENTION
