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

ModernBERT (``model_type`` modernbert) differs in two terms. Its GeGLU FFN has three
matrices' worth of products (the input matrix is 2i wide: value and gate; then i x h):
6hi per layer, not 4hi. Its local layers attend within a window of w = local_attention
tokens: their scores and weighted sums count 4 * min(s, w) * h, the work a sliding-window
kernel (flash-attn) does; SDPA and eager compute all s x s scores and mask them, which
is not counted, as a full head is not. The window is taken as w keys for every token
(tokens near the ends of a block have fewer, the kernel's window has w + 1): within
about 1% of the exact count for blocks of a few windows.

The head is counted only where the objective needs it (the chosen positions), whether
or not an implementation computes it everywhere: MFU measures useful work, so a full
head over every position does not raise it. For the same reason only real tokens count,
and s is the length of the block a token attends within: its row without the padding
(``data.packing=line_by_line``), or its document where documents are isolated
(``data.packing=documents``). A run's window is counted block by block
(``model_train_flops``): a block of n tokens scores n x n pairs per layer.

MFU = achieved model FLOPs/s / the rate the hardware can reach. On a known GPU that rate
is the chip's dense bf16 peak from its datasheet (``CHIP_BF16_PEAK``); elsewhere, and on
every CPU, it is measured here: the best rate of large square products and of the model's
own products, in the dtype the run's matmuls take (``reference_rate``). A measured rate
can only fall short of the true peak, so where a run goes faster than it, the run's rate
becomes the reference (``ThroughputMeter``): MFU never reads above 100%. A measured rate
far below what this machine reached before (a busy machine) is not kept for later runs
(``stored_reference_rate``), and the run is told its MFU is unreliable.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import resource
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from mlmkit.model.architectures import ffn_size
from mlmkit.training.runtime import cpu_has_bf16, cpu_name

log = logging.getLogger("mlmkit")

# Dense (no sparsity) bf16 tensor-core peak in FLOP/s, from the vendors' datasheets (a datasheet
# that gives the rate with sparsity only: half of it).
CHIP_BF16_PEAK = {
    "H200": 989e12,
    "H200 NVL": 835e12,  # NVIDIA H200 datasheet: BF16 1,671 TFLOPS with sparsity (NVL)
    "H100 SXM": 989e12,  # also "H100 80GB HBM3"
    "H100 NVL": 835e12,
    "H100 PCIe": 756e12,
    "GH200": 989e12,
    "B200": 2250e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "L40": 181e12,  # NVIDIA L40 datasheet: BF16 181.05 TFLOPS (362.1 with sparsity)
    "L4": 121e12,
    "A10G": 70e12,  # AWS's A10G
    "A10": 125e12,
    # GeForce cards run bf16 (which accumulates in fp32) at half their fp16-accumulate rate; these
    # are the "Peak BF16 Tensor TFLOPS with FP32 Accumulate" dense figures: NVIDIA Ada GPU
    # Architecture whitepaper, RTX 4090: 165.2 (330.4 with sparsity; fp16 with fp16 accumulate
    # 330.3); NVIDIA Ampere GA102 GPU Architecture whitepaper, RTX 3090: 71 (142 with sparsity;
    # fp16 with fp16 accumulate 142).
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
}


def train_flops(
    num_layers: int,
    hidden: int,
    intermediate: int,
    vocab: int,
    tokens: float,
    predicted: float,
    pairs: float,
    ffn_matrices: int = 2,
    local_layers: int = 0,
    local_pairs: float | None = None,
) -> float:
    """Training FLOPs (the formula in the module docstring, summed) of ``tokens`` tokens, of which
    ``predicted`` are predicted, whose attention scores ``pairs`` (query, key) pairs in each
    layer, ``local_pairs`` in each of the ``local_layers`` that attend within a window.
    ``ffn_matrices``: 2 for BERT's FFN, 3 for a GeGLU."""
    h, i = hidden, intermediate
    local_pairs = pairs if local_pairs is None else local_pairs
    encoder = tokens * num_layers * (8 * h * h + ffn_matrices * 2 * h * i) + 4 * h * (
        (num_layers - local_layers) * pairs + local_layers * local_pairs
    )
    head = predicted * (2 * h * h + 2 * h * vocab)
    return 3.0 * (encoder + head)


def train_flops_per_token(
    num_layers: int,
    hidden: int,
    intermediate: int,
    vocab: int,
    seq_len: int,
    predicted_share: float,
    ffn_matrices: int = 2,
    local_layers: int = 0,
    local_window: int | None = None,
) -> float:
    """Training FLOPs per token of full rows of ``seq_len`` tokens (the formula in the module
    docstring). ``ffn_matrices``: 2 for BERT's FFN, 3 for a GeGLU; ``local_layers`` of the
    layers attend within ``local_window`` tokens."""
    s = seq_len
    return train_flops(
        num_layers,
        hidden,
        intermediate,
        vocab,
        1,
        predicted_share,
        s,
        ffn_matrices,
        local_layers,
        min(s, local_window or s),
    )


def model_flops_per_token(config, seq_len: int, predicted_share: float) -> float:
    """``train_flops_per_token`` for a transformers ``BertConfig`` or ``ModernBertConfig``."""
    return model_train_flops(config, {seq_len: 1}, predicted_share * seq_len) / seq_len


def model_train_flops(config, blocks: Mapping[int, int], predicted: float) -> float:
    """Training FLOPs of a transformers ``BertConfig`` or ``ModernBertConfig`` model over the
    attended blocks ``blocks`` (``{length: how many}``, real tokens only), ``predicted`` tokens
    of them predicted: each token attends to the tokens of its own block (its row, or its
    document where documents are isolated), so a block of ``n`` tokens scores ``n * n`` pairs
    per layer (ModernBERT's local layers ``n * min(n, local_attention)``), not ``n`` times the
    longest row."""
    tokens = sum(n * count for n, count in blocks.items())
    pairs = sum(n * n * count for n, count in blocks.items())
    shape = (
        config.num_hidden_layers,
        config.hidden_size,
        ffn_size(config),
        config.vocab_size,
    )
    if config.model_type != "modernbert":
        return train_flops(*shape, tokens, predicted, pairs)
    local = sum(kind == "sliding_attention" for kind in config.layer_types)
    window = config.local_attention
    local_pairs = sum(n * min(n, window) * count for n, count in blocks.items())
    return train_flops(
        *shape,
        tokens,
        predicted,
        pairs,
        ffn_matrices=3,
        local_layers=local,
        local_pairs=local_pairs,
    )


def rtd_train_flops(config, generator_config, blocks: Mapping[int, int], predicted: float) -> float:
    """Training FLOPs of replaced-token detection (``objective=rtd``) over ``blocks``: the
    discriminator's encoder at every token with its head (dense h x h, then one logit: 2h^2 + 2h a
    token) in place of the MLM head, plus the generator (an ``ElectraConfig``: width g, its own
    layers) with its projections from and to the shared embeddings' width e (2eg a token in, 2ge at
    each predicted token) and its output layer at the predicted tokens (2eV)."""
    tokens = sum(n * count for n, count in blocks.items())
    h, g, e = config.hidden_size, generator_config.hidden_size, generator_config.embedding_size
    discriminator = model_train_flops(config, blocks, 0.0) + 3.0 * tokens * (2 * h * h + 2 * h)
    generator = train_flops(
        generator_config.num_hidden_layers,
        g,
        generator_config.intermediate_size,
        0,
        tokens,
        0.0,
        sum(n * n * count for n, count in blocks.items()),
    )
    projections = 3.0 * (tokens * 2 * e * g + predicted * (2 * g * e + 2 * e * config.vocab_size))
    return discriminator + generator + projections


def chip_peak(name: str) -> float | None:
    """Return the dense bf16 peak FLOP/s (``CHIP_BF16_PEAK``) of the GPU that CUDA names ``name``
    (``"NVIDIA H100 80GB HBM3"``), else None."""
    words = name.replace("-", " ").split()  # "NVIDIA A100-SXM4-80GB": NVIDIA, A100, SXM4, 80GB
    if "H100" in words and not any(k in words for k in ("PCIe", "NVL")):
        return CHIP_BF16_PEAK["H100 SXM"]
    # a key matches whole words ("L4" is not "L40"), the longest first ("H200 NVL" before "H200")
    for key in sorted(CHIP_BF16_PEAK, key=len, reverse=True):
        size = len(key.split())
        if any(words[i : i + size] == key.split() for i in range(len(words))):
            return CHIP_BF16_PEAK[key]
    return None


def chip_bf16_peak(device: torch.device | str | None = None) -> tuple[float, str] | None:
    """(dense bf16 peak FLOP/s, chip name) for a known CUDA GPU, else None."""
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    peak = chip_peak(name)
    return (peak, name) if peak is not None else None


def _best_rate(
    products,
    device: torch.device,
    min_seconds: float,
    repeats: int,
    max_seconds: float | None = None,
) -> float:
    """Measure the best FLOP/s of ``products`` (a list of ``(flops, fn)``), each timed ``repeats``
    times for at least ``min_seconds`` (and at least one call) after a warm-up call; after
    ``max_seconds`` (a busy machine can slow the products tenfold) nothing more is timed."""

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    best, begin = 0.0, time.perf_counter()

    def out_of_time() -> bool:
        return max_seconds is not None and best > 0 and time.perf_counter() - begin > max_seconds

    for flops, fn in products:
        if out_of_time():
            break
        fn()  # warm-up (kernel selection, page faults)
        sync()
        for _ in range(repeats):
            if out_of_time():
                break
            count, start = 0, time.perf_counter()
            while True:
                fn()
                count += 1
                if count % 4 == 0 or device.type != "cuda":
                    sync()
                    elapsed = time.perf_counter() - start
                    if elapsed >= min_seconds:
                        break
            best = max(best, flops * count / elapsed)
    return best


def measure_matmul_rate(
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    n: int | None = None,
    min_seconds: float = 0.5,
    repeats: int = 3,
) -> float:
    """Measure the machine's best matmul rate (FLOP/s) for ``n x n`` products in ``dtype``.

    Best of ``repeats`` timings, each at least ``min_seconds`` long. Without ``n``: the best
    of 1024 and 2048 on a CPU (which of them runs the matrix units fastest depends on the
    caches), and 8192 on a GPU. On a CPU without bf16 hardware a bf16 product is emulated
    (a 2,048-square one can take most of a minute): time it only where that is the question.
    """
    device = torch.device(device)
    if n is None:
        return _best_rate(square_products(dtype, device), device, min_seconds, repeats)
    return _best_rate(square_products(dtype, device, (n,)), device, min_seconds, repeats)


def square_products(dtype: torch.dtype, device: torch.device, sizes: tuple[int, ...] | None = None):
    """``(flops, fn)`` of square products: by default 2,048 and 1,024 on a CPU (which of them
    runs the matrix units fastest depends on the caches), 8,192 on a GPU."""
    sizes = sizes or ((8192,) if device.type == "cuda" else (2048, 1024))
    products = []
    for n in sizes:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        products.append((2.0 * n**3, lambda a=a, b=b: torch.mm(a, b)))
    return products


def model_matmul_shapes(config, tokens: int, predicted: int) -> tuple[tuple[int, int, int], ...]:
    """``(m, k, n)`` of the weight products of one training micro-batch of a BERT (or
    ModernBERT: fused QKV, GeGLU) encoder with its MLM head: ``tokens`` rows through the
    encoder's projections, ``predicted`` rows through the head (the sparse head's row count)."""
    h, i, v = config.hidden_size, ffn_size(config), config.vocab_size
    shapes = {(tokens, h, h), (tokens, h, i), (tokens, i, h), (predicted, h, h), (predicted, h, v)}
    if config.model_type == "modernbert":
        shapes = {
            (tokens, h, 3 * h),
            (tokens, h, h),
            (tokens, h, 2 * i),
            (tokens, i, h),
            (predicted, h, h),
            (predicted, h, v),
        }
    return tuple(sorted(s for s in shapes if min(s) > 0))


def measure_shapes_rate(
    shapes,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    min_seconds: float = 0.02,
    repeats: int = 3,
    max_seconds: float | None = None,
) -> float:
    """Measure the best rate (FLOP/s) over the products a training step makes of each ``(m, k, n)``:
    the forward ``x @ W^T`` (as ``F.linear``), the input gradient ``g @ W`` and the weight
    gradient ``g^T @ x``. Smallest first; none is started after ``max_seconds`` (the largest
    behave as the large squares of ``measure_matmul_rate`` do)."""
    device = torch.device(device)
    return _best_rate(
        shape_products(shapes, dtype, device), device, min_seconds, repeats, max_seconds
    )


def shape_products(shapes, dtype: torch.dtype, device: torch.device):
    """``(flops, fn)`` of the three products of each ``(m, k, n)``, smallest first."""
    products = []
    for m, k, n in sorted(shapes, key=lambda s: s[0] * s[1] * s[2]):
        x = torch.randn(m, k, device=device).to(dtype)
        w = torch.randn(n, k, device=device).to(dtype)
        g = torch.randn(m, n, device=device).to(dtype)
        flops = 2.0 * m * k * n
        products += [
            (flops, lambda x=x, w=w: torch.mm(x, w.t())),
            (flops, lambda g=g, w=w: torch.mm(g, w)),
            (flops, lambda g=g, x=x: torch.mm(g.t(), x)),
        ]
    return products


def compute_dtype(device: torch.device, precision: str) -> torch.dtype:
    """Return the dtype a run's matmuls take: bf16/fp16 under mixed precision, except bf16 on a
    CPU without bf16 hardware, which is emulated (no faster than fp32: fp32 is the bound)."""
    if device.type == "cuda" and precision in ("bf16", "fp16"):
        return torch.bfloat16 if precision == "bf16" else torch.float16
    if device.type == "cpu" and precision == "bf16" and cpu_has_bf16():
        return torch.bfloat16
    return torch.float32


@functools.cache
def reference_rate(
    device: torch.device, precision: str, shapes: tuple[tuple[int, int, int], ...] = ()
) -> tuple[float, str]:
    """(FLOP/s, how it was found) that MFU is taken against for a run on ``device``.

    ``precision`` is the accelerate value (``bf16``, ``fp16``, ``no``). A known GPU in
    bf16/fp16: its datasheet dense peak. Otherwise the best matmul rate measured now in
    the run's compute dtype (``compute_dtype``), over the squares the benchmarks use and
    the model's own products (``shapes``, from ``model_matmul_shapes``), so that it bounds
    every matmul the run makes: on some CPUs a small product of the model's shape runs
    faster than any large square. About 1.5 s on a CPU.
    """
    if device.type == "cuda" and precision in ("bf16", "fp16"):
        known = chip_bf16_peak(device)
        if known is not None:
            return known[0], f"{known[1]} dense bf16 peak (datasheet)"
    dtype = compute_dtype(device, precision) if device.type in ("cuda", "cpu") else torch.float32
    # the squares of the benchmarks (on a CPU a 1,024-square product can run at about half
    # the 2,048-square rate) and the model's own products; many short timings (a shared CPU
    # is noisy), squares first, within about 1.5 s in all
    products = square_products(dtype, device) + shape_products(shapes, dtype, device)
    rate = _best_rate(products, device, min_seconds=0.03, repeats=4, max_seconds=1.5)
    name = str(dtype).replace("torch.", "")
    how = f"measured {name} matmul rate on this {device.type}"
    if device.type == "cpu" and precision == "bf16" and dtype == torch.float32:
        how += "; bf16 is emulated on this CPU"
    return rate, how


# what a measured rate depends on besides the products: the ISA torch's kernels, oneDNN and MKL
# may use (.ci/as-avx2 holds them to AVX2)
_ISA_VARIABLES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


# A measured rate that prints as 0.0 TFLOP/s is no machine's that mlmkit trains on: the machine
# was busy. Nor is one under a tenth of the best stored for the same machine and settings (with
# other products): the products a model adds move the rate far less than that.
IMPLAUSIBLE_RATE = 0.05e12
IMPLAUSIBLE_SHARE = 0.1


def stored_reference_rate(
    cache_dir: Path | None,
    device: torch.device,
    precision: str,
    shapes: tuple[tuple[int, int, int], ...] = (),
    measure=None,
) -> tuple[float, str, bool]:
    """``(rate, how it was found, reliable)``: ``reference_rate``, measured once for this machine,
    software, thread count and set of products and kept under ``cache_dir/matmul_rates/`` (about
    1.5 s saved at each later start on a CPU). A datasheet peak is never stored; an unwritable
    cache only costs the saving.

    A rate that is not plausible (``IMPLAUSIBLE_RATE``, ``IMPLAUSIBLE_SHARE`` of the best stored
    for this machine) is measured once more; one that stays implausible is never stored (a stored
    one is measured again), and ``reliable`` is False: MFU taken against it means little.
    ``measure``: ``reference_rate`` unless given (tests)."""
    measure = measure or reference_rate
    if device.type == "cuda" and precision in ("bf16", "fp16") and chip_bf16_peak(device):
        return (*measure(device, precision, shapes), True)
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    settings = [
        machine,
        device.type,
        torch.__version__,
        torch.get_num_threads(),
        precision,
        str(compute_dtype(device, precision)),
        [os.environ.get(v) for v in _ISA_VARIABLES],
    ]
    key = json.dumps([*settings[:6], sorted(shapes), settings[6]])
    folder = Path(cache_dir) / "matmul_rates" if cache_dir is not None else None
    path = folder / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json" if folder else None
    stored, others = _stored_rates(folder, key, json.dumps(settings))
    floor = max(IMPLAUSIBLE_RATE, IMPLAUSIBLE_SHARE * max(others, default=0.0))
    if stored is not None and stored[0] >= floor:
        return stored[0], f"{stored[1]}, stored in {folder}", True
    for _ in range(2):  # a busy moment may have passed
        rate, how = measure(device, precision, shapes)
        if rate >= floor:
            break
        if hasattr(measure, "cache_clear"):
            measure.cache_clear()  # nor kept in memory for a later start in this process
    if rate < floor:
        return (
            rate,
            f"{how}; implausibly low for this machine (at least {floor / 1e12:.2g} "
            "TFLOP/s expected), not stored",
            False,
        )
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".{path.name}.{os.getpid()}")
            partial.write_text(
                json.dumps({"key": key, "settings": json.dumps(settings), "rate": rate, "how": how})
            )
            partial.replace(path)  # whole or absent for a reader
        except OSError:
            pass
    return rate, how, True


def _stored_rates(
    folder: Path | None, key: str, settings: str
) -> tuple[tuple[float, str] | None, list[float]]:
    """Return (the ``(rate, how)`` stored under ``key``, or None; the rates stored for the same
    ``settings`` with other products) in ``folder``; a damaged file counts as none."""
    stored, others = None, []
    for file in sorted(folder.glob("*.json")) if folder is not None and folder.is_dir() else []:
        try:
            entry = json.loads(file.read_text())
            rate = float(entry["rate"])
            if entry.get("key") == key and rate > 0:
                stored = (rate, str(entry["how"]))
            elif entry.get("settings") == settings:
                others.append(rate)
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            continue
    return stored, others


def peak_memory_gb(device: torch.device) -> float:
    """Peak memory of this process: allocated CUDA memory on a GPU, else resident host memory."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return kb / (2**30 if sys.platform == "darwin" else 2**20)


class ThroughputMeter:
    """Turns the counts of one log window into tokens/s, masked tokens/s, model TFLOP/s and MFU.

    ``tokens_per_s`` counts real tokens: padding (``data.packing=line_by_line``) is no token,
    whether the model computed it (SDPA) or not (flash-attn's variable-length kernel). The model
    FLOPs are those of the real tokens, each attending within its own block
    (``model_train_flops``): a short padded row or an isolated document costs the square of its
    length, not its length times ``data.max_seq_length``.
    """

    def __init__(self, model_config, reference_flops: float, generator_config=None) -> None:
        """``generator_config``: replaced-token detection's generator, whose FLOPs count too
        (``rtd_train_flops``)."""
        self.model_config = model_config
        self.reference_flops = reference_flops
        self.generator_config = generator_config

    def figures(
        self, blocks: Mapping[int, int], masked: float, seconds: float, world: int = 1
    ) -> dict[str, float]:
        """Return the window's figures: ``blocks``, this process's attended blocks by length (each
        of the ``world`` processes taken to have fed as many); ``masked``, the chosen tokens of all
        processes; ``seconds``, the window's training time."""
        seconds = max(seconds, 1e-9)
        tokens = world * sum(n * count for n, count in blocks.items())
        predicted = masked / max(world, 1)
        if self.generator_config is None:
            flops = world * model_train_flops(self.model_config, blocks, predicted)
        else:
            flops = world * rtd_train_flops(
                self.model_config, self.generator_config, blocks, predicted
            )
        rate = flops / seconds
        if self.reference_flops and rate > self.reference_flops:
            # A measured reference is a lower bound of the true peak, and so is a rate the
            # run reached: take the larger, so that MFU never reads above 100%.
            log.warning(
                "The run reached %.3g TFLOP/s, above the measured matmul rate MFU was "
                "taken against (%.3g); MFU is taken against the run's rate from here on.",
                rate / 1e12,
                self.reference_flops / 1e12,
            )
            self.reference_flops = rate
        return {
            "tokens_per_s": tokens / seconds,
            "masked_tokens_per_s": masked / seconds,
            "model_tflops_per_s": rate / 1e12,
            "mfu": rate / self.reference_flops if self.reference_flops else 0.0,
        }
