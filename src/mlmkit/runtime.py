"""Speed settings that change nothing but speed, applied in one place.

- mixed precision: ``train.precision=auto`` picks bf16 where the hardware has it (CUDA
  with bf16, or a CPU with AVX512-BF16/AMX), fp16 on older CUDA GPUs, else fp32;
- TF32 matmuls on Ampere and newer CUDA GPUs;
- fused AdamW on CUDA (``optim.build_optimizer``);
- the vocabulary projection only at masked positions (``model.MaskedLM``);
- no attention mask for batches without padding, so SDPA takes its fused kernels
  (``trainer.DropFullAttentionMask``).
"""

from __future__ import annotations

import functools

import torch

from mlmkit.errors import ConfigError


@functools.cache
def cpu_has_bf16() -> bool:
    """True where the CPU has native bf16 matmul units (AVX512-BF16 or AMX)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_precision(precision: str, use_cpu: bool | None = None) -> str:
    """The accelerate ``mixed_precision`` value for ``train.precision``."""
    on_cuda = torch.cuda.is_available() and not use_cpu
    if precision == "auto":
        if on_cuda:
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        if torch.backends.mps.is_available() and not use_cpu:
            return "no"
        return "bf16" if cpu_has_bf16() else "no"
    if precision == "fp16" and not on_cuda:
        raise ConfigError("train.precision=fp16 needs a CUDA GPU; use bf16 or no on this machine.")
    return precision


def apply_speed_settings() -> None:
    """Process-wide settings that leave results unchanged up to float rounding."""
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
