"""Model FLOPs, the hardware's matmul rate, MFU and peak memory.

Training FLOPs per token of a BERT encoder with an MLM head (multiply-add = 2 FLOPs;
backward = 2x forward, so training = 3x forward; embeddings, LayerNorm, softmax, GELU
and the optimizer are left out, as in the usual 6N count)::

    L layers, hidden h, FFN width i, sequence length s, vocabulary V,
    q = share of positions that are predicted (chosen for the loss)

    per layer, per token:  Q, K, V and output projections   4 * 2h^2  =  8h^2
                           FFN (two matrices)                2 * 2hi   =  4hi
                           scores QK^T and weights x V       2 * 2sh   =  4sh
    head, per predicted token:  transform (h x h) + decoder (h x V)  =  2h^2 + 2hV

    flops_per_token = 3 * ( L * (8h^2 + 4hi + 4sh)  +  q * (2h^2 + 2hV) )

The head is counted only where the objective needs it (the chosen positions), whether
or not an implementation computes it everywhere: MFU measures useful work, so a full
head over every position does not raise it.

MFU = achieved model FLOPs/s / the rate the hardware can reach. On a known GPU that rate
is the chip's dense bf16 peak from its datasheet (``CHIP_BF16_PEAK``); elsewhere, and on
every CPU, it is measured here with a large matmul in the run's dtype
(``measure_matmul_rate``), so the figure means the same on any machine.
"""

from __future__ import annotations

import functools
import resource
import sys
import time

import torch

# Dense (no sparsity) bf16 tensor-core peak in FLOP/s, from the vendors' datasheets.
CHIP_BF16_PEAK = {
    "H200": 989e12,
    "H100 SXM": 989e12,  # also "H100 80GB HBM3"
    "H100 NVL": 835e12,
    "H100 PCIe": 756e12,
    "GH200": 989e12,
    "B200": 2250e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10G": 70e12,  # AWS's A10G
    "A10": 125e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
}


def train_flops_per_token(num_layers: int, hidden: int, intermediate: int, vocab: int,
                          seq_len: int, predicted_share: float) -> float:
    """Training FLOPs per token (the formula in the module docstring)."""
    h, i, s = hidden, intermediate, seq_len
    encoder = num_layers * (8 * h * h + 4 * h * i + 4 * s * h)
    head = predicted_share * (2 * h * h + 2 * h * vocab)
    return 3.0 * (encoder + head)


def model_flops_per_token(config, seq_len: int, predicted_share: float) -> float:
    """``train_flops_per_token`` for a transformers ``BertConfig``."""
    return train_flops_per_token(config.num_hidden_layers, config.hidden_size,
                                 config.intermediate_size, config.vocab_size, seq_len, predicted_share)


def chip_bf16_peak(device: torch.device | str | None = None) -> tuple[float, str] | None:
    """(dense bf16 peak FLOP/s, chip name) for a known CUDA GPU, else None."""
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    if "H100" in name and not any(k in name for k in ("PCIe", "NVL")):
        return CHIP_BF16_PEAK["H100 SXM"], name
    # longest key first, so "A100" does not match an "A10" entry and vice versa
    for key in sorted(CHIP_BF16_PEAK, key=len, reverse=True):
        if key in name:
            return CHIP_BF16_PEAK[key], name
    return None


def measure_matmul_rate(dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu",
                        n: int | None = None, min_seconds: float = 0.5, repeats: int = 3) -> float:
    """The best matmul rate (FLOP/s) of this machine for square ``n x n`` products in ``dtype``.

    Best of ``repeats`` timings, each at least ``min_seconds`` long; the reference against
    which MFU is taken where no datasheet peak applies. Without ``n``: the best of 1024 and
    2048 on a CPU (which of them runs the matrix units fastest depends on the caches), and
    8192 on a GPU.
    """
    device = torch.device(device)
    if n is None:
        sizes = (8192,) if device.type == "cuda" else (1024, 2048)
        return max(measure_matmul_rate(dtype, device, k, min_seconds, repeats) for k in sizes)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    torch.mm(a, b)  # warm-up (kernel selection, page faults)
    sync()
    best = 0.0
    for _ in range(repeats):
        count, start = 0, time.perf_counter()
        while True:
            torch.mm(a, b)
            count += 1
            if count % 4 == 0 or device.type != "cuda":
                sync()
                elapsed = time.perf_counter() - start
                if elapsed >= min_seconds:
                    break
        best = max(best, 2.0 * n**3 * count / elapsed)
    return best


@functools.cache
def reference_rate(device: torch.device, precision: str) -> tuple[float, str]:
    """(FLOP/s, how it was found) that MFU is taken against for a run on ``device``.

    ``precision`` is the accelerate value (``bf16``, ``fp16``, ``no``). A known GPU in
    bf16/fp16: its datasheet dense peak. Otherwise: the matmul rate measured now in the
    run's compute dtype, at the sizes ``benchmarks/`` use (a short measurement, about a
    second; the benchmarks time longer).
    """
    if device.type == "cuda" and precision in ("bf16", "fp16"):
        known = chip_bf16_peak(device)
        if known is not None:
            return known[0], f"{known[1]} dense bf16 peak (datasheet)"
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    if device.type not in ("cuda", "cpu"):
        dtype = torch.float32
    # the same sizes as the benchmarks (on a CPU a 1,024-square product can run at about
    # half the 2,048-square rate, which would double the MFU figure), shorter timings
    rate = measure_matmul_rate(dtype, device, min_seconds=0.1, repeats=3)
    name = str(dtype).replace("torch.", "")
    return rate, f"measured {name} matmul rate on this {device.type}"


def peak_memory_gb(device: torch.device) -> float:
    """Peak memory of this process: allocated CUDA memory on a GPU, else resident host memory."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return kb / (2**30 if sys.platform == "darwin" else 2**20)


class ThroughputMeter:
    """Turns the counts of one log window into tokens/s, masked tokens/s and MFU."""

    def __init__(self, model_config, seq_len: int, reference_flops: float) -> None:
        self.model_config = model_config
        self.seq_len = seq_len
        self.reference_flops = reference_flops

    def figures(self, tokens: int, masked: float, seconds: float) -> dict[str, float]:
        seconds = max(seconds, 1e-9)
        share = masked / max(tokens, 1)
        flops = tokens * model_flops_per_token(self.model_config, self.seq_len, share)
        return {
            "tokens_per_s": tokens / seconds,
            "masked_tokens_per_s": masked / seconds,
            "model_tflops_per_s": flops / seconds / 1e12,
            "mfu": flops / seconds / self.reference_flops if self.reference_flops else 0.0,
        }
