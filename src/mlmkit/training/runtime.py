"""Speed settings that change nothing but speed, applied in one place.

In the order the loop applies them (``trainer.train``):

1. ``apply_speed_settings``: TF32 matmuls on Ampere and newer CUDA GPUs; on a CPU, freed
   memory kept for reuse (``reuse_freed_memory``, ``train.reuse_cpu_memory``);
2. mixed precision: ``train.precision=auto`` picks bf16 where the hardware has it (CUDA
   with bf16, or a CPU with AVX512-BF16/AMX), fp16 on older CUDA GPUs, else fp32
   (``resolve_precision``; accelerate's autocast);
3. the model: vocabulary rows padded to a multiple of ``model.pad_vocab_multiple`` (64;
   the tokenizer unchanged), attention through SDPA, or flash-attn's variable-length
   kernel on CUDA with flash-attn installed, or on a CPU in bf16 the fused bf16 forward
   with the faster fp32 fused backward (``model.resolve_attn_implementation``,
   ``kernels.cpu_sdpa_attention_forward``);
4. the vocabulary projection only at the chosen positions, whose indices the dataloader
   computes on the CPU (``model.MaskedLM``, ``model.prediction_positions``), and on a CPU
   the loss over those logits a block of rows at a time (``kernels.cross_entropy_sum``);
5. ``checkpoint_activations``: each encoder layer's activations recomputed in the backward
   instead of kept when ``train.gradient_checkpointing=true`` (memory for compute);
6. ``compile_encoder``: ``torch.compile`` of each encoder layer when ``train.compile=true``
   (it compiles the checkpointed layers);
7. fused AdamW on CUDA and CPU (``optim.build_optimizer``);
8. the dataloader (``trainer.train``): batches with padding padded to a multiple of
   ``data.pad_to_multiple_of`` (8), no
   attention mask for batches without padding (``data.loader.DropFullAttentionMask``; SDPA
   then takes its fused kernels, and with padding it gets the boolean mask they accept),
   pinned memory and prefetching workers (``train.num_workers``) on CUDA;
9. no host-device synchronisation in a step: figures are fetched at log steps only. One
   remains per optimizer step: the check that the gradient is finite before the update
   (a non-finite step is skipped; see Reliability in the README).

Recipe choices that change results (dropout, masking) are config settings, not here.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from contextlib import contextmanager

import torch

from mlmkit.errors import ConfigError

log = logging.getLogger("mlmkit")


@functools.cache
def cpu_has_bf16() -> bool:
    """Return True where bf16 matmuls run on bf16 hardware (AVX512-BF16 or AMX) and torch's CPU
    kernels use it: the CPU has the units, and torch's kernels are not held below AVX512
    (``ATEN_CPU_CAPABILITY=avx2`` makes an AMX machine compute as an AVX2-only one does)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    if "avx512_bf16" not in flags and "amx_bf16" not in flags:
        return False
    return torch.backends.cpu.get_cpu_capability().startswith(("AVX512", "AMX"))


def runs_on_cpu() -> bool:
    """Return True where this process trains on the CPU: ``ACCELERATE_USE_CPU`` is set (as
    ``accelerate launch --cpu`` and CPU multi-process runs set it), or no CUDA or MPS device
    is there. Several CPU processes then talk over gloo."""
    from accelerate.utils import parse_flag_from_env

    return parse_flag_from_env("ACCELERATE_USE_CPU") or not (
        torch.cuda.is_available() or torch.backends.mps.is_available()
    )


def resolve_precision(
    precision: str, use_cpu: bool | None = None, setting: str = "train.precision"
) -> str:
    """Return the accelerate ``mixed_precision`` value for ``train.precision`` (``setting`` names
    it in messages)."""
    on_cuda = torch.cuda.is_available() and not use_cpu
    if precision == "auto":
        if on_cuda:
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        if torch.backends.mps.is_available() and not use_cpu:
            return "no"
        return "bf16" if cpu_has_bf16() else "no"
    if precision == "fp16" and not on_cuda:
        raise ConfigError(f"{setting}=fp16 needs a CUDA GPU; use bf16 or no on this machine.")
    if (
        precision == "bf16"
        and not on_cuda
        and not torch.backends.mps.is_available()
        and not cpu_has_bf16()
    ):
        log.warning(
            "bf16 emulated on this CPU (it has no AVX512-BF16 or AMX); fp32 is faster here: "
            "set %s=auto or no.",
            setting,
        )
    return precision


def autocast_dtype(precision: str) -> torch.dtype | None:
    """Return the autocast dtype of a resolved precision (``resolve_precision``): bf16 or fp16, None
    for no (full precision)."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


def apply_speed_settings(device_type: str, reuse_cpu_memory: bool) -> None:
    """Process-wide settings that leave results unchanged up to float rounding."""
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if device_type == "cpu" and reuse_cpu_memory:
        reuse_freed_memory()


def reuse_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory in the process and hand it out again.

    torch allocates CPU tensors with malloc and caches none of them. glibc serves each
    block over its mmap threshold (at most 32 MB) with a new mapping and unmaps it when
    freed, so a tensor of that size made every step (the head's logits and their gradient:
    640 x 30,528 bf16 is 39 MB on bert-mini) faults in every page anew, about 8 ms per
    40 MB on a 2-core CPU. Served from the heap, and the heap not trimmed, the same memory
    is reused; a training step's allocations repeat, so the heap stops growing after the
    first steps. The cost: memory freed at the peak stays with the process. Returns
    whether it applied (Linux with glibc).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    applied = mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
    if applied:
        log.debug("malloc: heap only, freed memory kept (train.reuse_cpu_memory=true)")
    return applied


def checkpoint_activations(model, accelerator=None) -> None:
    """Recompute each encoder layer's activations in the backward instead of keeping them from
    the forward (``train.gradient_checkpointing``): transformers' own activation checkpointing,
    non-reentrant, on the masked-LM model's layers.

    A layer then keeps only its input for the backward, and runs its forward again there: the
    activations' memory falls from every layer's to one layer's, for about a third more
    compute. The flag is on the layers, so the sparse head's path (the encoder called directly)
    checkpoints as the model's own forward does; dropout's draws are replayed (torch keeps the
    RNG state), so the loss and gradients are those of the plain model. Evaluation runs without
    gradients, and so without recomputing. One sentence where it cannot apply: a family whose
    transformers classes have no checkpointing (ALBERT), or FSDP's own activation checkpointing
    set as well (each would recompute the layers).
    """
    if not model.supports_gradient_checkpointing:
        raise ConfigError(
            f"train.gradient_checkpointing=true, but transformers cannot checkpoint the layers of "
            f"a {model.config.model_type} model ({type(model).__name__}); set "
            "train.gradient_checkpointing=false."
        )
    plugin = getattr(getattr(accelerator, "state", None), "fsdp_plugin", None)
    if plugin is not None and plugin.activation_checkpointing:
        raise ConfigError(
            "train.gradient_checkpointing=true and the accelerate config's "
            "fsdp_activation_checkpointing would both recompute the encoder layers; set "
            "train.gradient_checkpointing=false or fsdp_activation_checkpointing: false."
        )
    if getattr(model.config, "use_cache", False):  # an encoder keeps no cache; left on,
        model.config.use_cache = False  # transformers warns that checkpointing turns it off
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:  # transformers 5's name
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:  # the lowest supported transformers calls it gradient checkpointing
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    log.info(
        "Gradient checkpointing: the encoder layers' activations are recomputed in the backward "
        "(train.gradient_checkpointing=true)"
    )


def compile_encoder(model, backend: str = "inductor") -> None:
    """``torch.compile`` the encoder layers of a masked-LM model in place (``train.compile``).

    Each layer compiles, not the encoder as a whole: the attention mask is then built outside
    the traced code, where transformers can leave out a mask that hides nothing (under
    tracing it cannot, and an all-True (B, 1, S, S) mask would rule out SDPA's flash kernel).
    The layers share one compiled graph (torch inlines the modules' parameters). The modules
    compile in place (``nn.Module.compile``), so parameter names, checkpoints and the
    exported model are those of the plain model. The embeddings and the head stay eager: the
    head's row count changes with the number of chosen positions.
    """
    from mlmkit.model.architectures import parts_of

    for layer in parts_of(model).layers(model):
        layer.compile(backend=backend)


def unwrap(accelerator, module):
    """``accelerator.unwrap_model(module)``, without importing DeepSpeed where the run does not
    use it: accelerate's unwrapping imports DeepSpeed wherever it is installed (about a second
    of every command's start). Under DeepSpeed or FSDP, or for a module accelerate compiled,
    accelerate unwraps; else the module is at most inside DDP or DataParallel."""
    from accelerate.utils import DistributedType, is_compiled_module

    if accelerator.distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP) or (
        is_compiled_module(module)
    ):
        return accelerator.unwrap_model(module)
    while isinstance(module, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
        module = module.module
    return module


@contextmanager
def deepspeed_left_unimported():
    """Within it, accelerate's unwrapping leaves DeepSpeed unimported where no DeepSpeed is
    loaded: transformers' ``save_pretrained`` unwraps the model through accelerate, which imports
    DeepSpeed wherever it is installed (1.4 s, most of it MLflow, which DeepSpeed imports) only
    to ask whether the model is a ``DeepSpeedEngine``; no model is one before DeepSpeed is
    imported, so the question is then answered as if it were absent. Every command that saves a
    model (each run's export) started that much later."""
    import sys

    from accelerate.utils import other

    if "deepspeed" in sys.modules:
        yield
        return
    available = other.is_deepspeed_available
    other.is_deepspeed_available = lambda: False
    try:
        yield
    finally:
        other.is_deepspeed_available = available


def save_model(model, path, **kwargs) -> None:
    """``model.save_pretrained(path, **kwargs)``, without importing DeepSpeed where the run
    does not use it (``deepspeed_left_unimported``)."""
    with deepspeed_left_unimported():
        model.save_pretrained(str(path), **kwargs)


def full_state_dict(accelerator, module) -> dict:
    """``accelerator.get_state_dict(module)``: the full weights (gathered under FSDP and
    ZeRO-3, on every rank), without importing DeepSpeed where the run does not use it."""
    from accelerate.utils import DistributedType

    if accelerator.distributed_type in (DistributedType.DEEPSPEED, DistributedType.FSDP):
        return accelerator.get_state_dict(module)
    return unwrap(accelerator, module).state_dict()


def cpu_name() -> str:
    """Return the CPU's model name (``/proc/cpuinfo``), or what ``platform`` knows elsewhere."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            return next(
                line.split(":", 1)[1].strip() for line in f if line.startswith("model name")
            )
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def describe_cpu() -> str:
    """One line: the CPU, its cores, and whether bf16 runs on hardware here."""
    import os

    name = cpu_name()
    kind = (
        "bf16 hardware (AVX512-BF16/AMX): precision=auto trains in bf16"
        if cpu_has_bf16()
        else "no bf16 hardware in use (AVX2-class): precision=auto trains in fp32, bf16 is emulated"
    )
    return (
        f"{name}, {os.cpu_count()} cores, torch kernels {torch.backends.cpu.get_cpu_capability()}; "
        f"{kind}"
    )


if __name__ == "__main__":
    print(describe_cpu())
