"""One optimizer step: gather the micro-batches, forward and backward each with the loss
normalised by the step's global count of chosen tokens, clip, and update unless the
gradient is not finite."""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from mlmkit.data.loader import BatchLayout
from mlmkit.errors import TrainingDiverged
from mlmkit.masking.collator import IGNORE_INDEX
from mlmkit.model.documents import flatten_rows

log = logging.getLogger("mlmkit")


def forward_backward(
    accelerator, objective, micro: list[dict[str, torch.Tensor]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and backward every micro-batch of one optimizer step.

    The gradient left in the parameters is that of (sum of the token losses of the whole
    step) / (chosen tokens in the whole step, over all micro-batches and ranks): the
    count is summed first, then each micro-batch's summed loss is divided by it. Returns
    this rank's summed loss and the global count (device tensors; no host sync).
    """
    world = accelerator.num_processes
    n_local = sum((b["labels"] != IGNORE_INDEX).sum() for b in micro)
    n_global = accelerator.reduce(n_local.float(), reduction="sum")
    # DDP averages gradients over ranks; multiplying by world undoes that average.
    scale = world / n_global.clamp(min=1.0)
    loss_sum = torch.zeros((), device=n_global.device)
    for i, batch in enumerate(micro):
        last = i == len(micro) - 1
        with nullcontext() if last else accelerator.no_sync(objective):
            out = objective(**batch)
            accelerator.backward(out["loss_sum"] * scale)
        loss_sum += out["loss_sum"].detach()
    return loss_sum, n_global


@dataclass
class StepResult:
    """What one optimizer step leaves for the log (device tensors until a log step)."""

    loss_sum: torch.Tensor  # this rank's summed token loss
    n_masked: torch.Tensor  # chosen tokens of the step, all ranks
    grad_norm: torch.Tensor
    lr: float  # the rate this step used
    tokens: int  # positions fed, all ranks (padding included: the budget's count)
    ok: torch.Tensor | bool  # the update was applied (a device tensor until a log step)
    mlm_probability: float = 0.0  # the masking rate of the step's batches
    data_wait: float = 0.0  # seconds the host waited for the step's batches
    # this rank's attended blocks of the step by length (rows, or documents where they are
    # isolated; real tokens only): what the throughput meter counts
    blocks: Counter = field(default_factory=Counter)


def next_micro_batches(
    stream, collator, accum: int, on_device: bool
) -> tuple[list[dict[str, torch.Tensor]], float, list[BatchLayout | None]]:
    """Return the micro-batches of one optimizer step, the seconds the host waited for them (the
    loader's share of the step: with workers, only what they had not prepared ahead) and the
    layout the loader found of each (``BatchLayout``, taken out of the batch; None where the
    stream gives none); with ``masking.on_device`` the dataloader only padded them, and they
    are masked here, on the accelerator, then flattened where the loader laid them out for
    flash-attn's variable-length kernel (``flatten_rows``)."""
    started = time.perf_counter()
    micro = [next(stream) for _ in range(accum)]
    waited = time.perf_counter() - started
    layouts = [batch.pop("layout", None) for batch in micro]
    if on_device:
        for batch in micro:
            batch["input_ids"], batch["labels"] = collator.mask_in_step(
                batch["input_ids"], batch.get("attention_mask")
            )
            if "flat_index" in batch:
                flatten_rows(batch)
    return micro, waited, layouts


def skips_on_device(optimizer) -> bool:
    """Whether ``optimizer`` (or the one an accelerate wrapper holds) can skip an update on the
    device: torch's fused Adam/AdamW take a ``found_inf`` tensor and leave the weights, the
    moments and the step count as they were when it is 1, with no host wait."""
    inner = getattr(optimizer, "optimizer", optimizer)
    return (
        isinstance(inner, torch.optim.Optimizer)
        and bool(inner.defaults.get("fused"))
        and getattr(inner, "_step_supports_amp_scaling", False)
    )


def local_norm(norm) -> torch.Tensor:
    """Return the gradient norm as a plain tensor of this process. FSDP2 under accelerate before
    1.16 returns it as a DTensor (the norm of sharded gradients), and whatever is computed from one
    stays a DTensor, which the log step cannot read; its ``full_tensor()`` is the whole norm
    (the same on every rank, which all take part). No norm (DeepSpeed may report none) is 0."""
    if norm is None:
        return torch.zeros(())
    if torch.distributed.is_available():
        from torch.distributed.tensor import DTensor

        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
    return torch.as_tensor(norm)


def deepspeed_engine(accelerator):
    """Return the DeepSpeed engine behind ``accelerator`` once ``prepare`` made it, else None."""
    if accelerator.distributed_type.value != "DEEPSPEED":
        return None
    wrapped = getattr(accelerator, "deepspeed_engine_wrapped", None)
    return wrapped.engine if wrapped is not None else None


def step_tokens(accelerator, micro, layouts=None) -> int:
    """Positions fed in the step, all ranks: the batches' rows x widths as collated, padding
    included, also where the loader flattened them (``BatchLayout.positions``)."""
    layouts = layouts or [None] * len(micro)
    return (
        sum(
            layout.positions if layout is not None else batch["input_ids"].numel()
            for batch, layout in zip(micro, layouts)
        )
        * accelerator.num_processes
    )


def step_blocks(micro, layouts=None) -> Counter:
    """Count this rank's attended blocks of the step, by length: the loader's count where it made
    one, else every row of a batch taken as one block of its width."""
    blocks: Counter = Counter()
    for batch, layout in zip(micro, layouts or [None] * len(micro)):
        if layout is not None:
            blocks.update(layout.lengths)
        else:
            rows, width = batch["input_ids"].shape
            blocks[width] += rows
    return blocks


def optimizer_step(
    accelerator, objective, optimizer, lr: float, micro, max_grad_norm: float | None, layouts=None
) -> StepResult:
    """Forward/backward ``micro``, clip, and update if the gradient is finite (the caller
    steps the scheduler and zeroes the gradients once the step is counted); ``layouts``: the
    loader's ``BatchLayout`` of each micro-batch (``next_micro_batches``), for the counts.

    A NaN/Inf gradient skips the update. With fused AdamW (mlmkit's optimizer on CUDA and
    CPU) the skip happens on the device, through the optimizer's ``found_inf``, and the host
    never waits for the step: ``StepResult.ok`` stays a device tensor until a log step reads
    it (``SkipCount``). With fp16 the gradient scaler finds overflows itself (skips the step
    and lowers its scale), so there only a non-finite loss counts. Another optimizer costs
    one host wait per step for the check. Under DeepSpeed the engine has already clipped and
    stepped inside the backward: ``ok`` is what the engine did (``deepspeed_step``).
    """
    engine = deepspeed_engine(accelerator)
    skipped_before = engine.skipped_steps if engine is not None else 0
    loss_sum, n_global = forward_backward(accelerator, objective, micro)
    tokens, blocks = step_tokens(accelerator, micro, layouts), step_blocks(micro, layouts)
    if engine is not None:
        grad_norm, ok = deepspeed_step(engine, skipped_before)
        return StepResult(loss_sum, n_global, grad_norm, lr, tokens, ok, blocks=blocks)
    max_norm = max_grad_norm if max_grad_norm is not None else math.inf
    grad_norm = local_norm(accelerator.clip_grad_norm_(objective.parameters(), max_norm))
    finite = torch.isfinite(grad_norm)
    if accelerator.scaler is not None:
        optimizer.step()  # the scaler skips an overflowing step itself
        ok = torch.isfinite(accelerator.reduce(loss_sum, reduction="sum"))
    elif skips_on_device(optimizer):
        inner = getattr(optimizer, "optimizer", optimizer)
        device = next(p.device for g in inner.param_groups for p in g["params"])
        inner.found_inf = (~finite).to(device=device, dtype=torch.float32)
        try:
            optimizer.step()
        finally:
            del inner.found_inf
        ok = finite
    else:
        ok = finite
        if bool(finite):  # the one host wait of this path
            optimizer.step()
    return StepResult(loss_sum, n_global, grad_norm, lr, tokens, ok, blocks=blocks)


def deepspeed_step(engine, skipped_before: int) -> tuple[torch.Tensor, bool]:
    """(gradient norm, update applied) of the step DeepSpeed's engine took inside the backward
    (accelerate's DeepSpeed ``backward`` steps the engine; its optimizer's ``step`` does nothing,
    so mlmkit can skip nothing here). The engine skips a step whose gradient is not finite where
    it checks (fp16's loss scaler; ZeRO in fp32, and in bf16 unless the DeepSpeed config sets
    ``bf16.check_grad_overflow`` false, as older DeepSpeed's bf16 did not check), counting it in
    ``engine.skipped_steps``: only such a step counts as skipped. A non-finite gradient the engine
    applied is no skip: it is logged, as the weights it left are not finite."""
    grad_norm = local_norm(engine.get_global_grad_norm())
    ok = engine.skipped_steps == skipped_before
    if ok and not bool(torch.isfinite(grad_norm)):  # a host read, as DeepSpeed's norm already is
        log.warning(
            "DeepSpeed applied an update whose gradient norm is %s (this engine does not skip a "
            "non-finite gradient), so the weights are no longer finite; set "
            "bf16.check_grad_overflow to true in the DeepSpeed config or lower optim.lr, then "
            "resume from the last checkpoint with train.resume=auto.",
            float(grad_norm),
        )
    return grad_norm, ok


class SkipCount:
    """Steps skipped for a non-finite loss or gradient, counted on the device: ``add`` costs
    no host wait; ``settle`` reads the counts (at log, checkpoint and last steps) into the
    state, warns, and stops the run once ``max_bad_steps`` steps in a row were skipped."""

    def __init__(self) -> None:
        self.counts: torch.Tensor | None = None  # (skipped, current streak, longest streak)

    def add(self, ok: torch.Tensor | bool) -> None:
        bad = (~torch.as_tensor(ok)).to(torch.int64)
        if self.counts is None:
            self.counts = torch.zeros(3, dtype=torch.int64, device=bad.device)
        skipped, streak, longest = self.counts.unbind()
        streak = (streak + bad) * bad
        self.counts = torch.stack([skipped + bad, streak, torch.maximum(longest, streak)])

    def settle(self, state, max_bad_steps: int, grad_norm) -> None:
        if self.counts is None:
            return
        skipped, streak, longest = (int(v) for v in self.counts.tolist())  # the one host read
        # the streak carries on into the next window; the rest starts again
        self.counts = torch.tensor([0, streak, streak], device=self.counts.device)
        state.bad_steps = streak
        if not skipped:
            return
        state.skipped_steps += skipped
        log.warning(
            "Step %d: %d step(s) since the last log had a non-finite loss or gradient (last "
            "norm %s); their updates were skipped (%d in a row now)",
            state.step,
            skipped,
            float(grad_norm),
            streak,
        )
        if longest >= max_bad_steps:
            raise TrainingDiverged(
                f"{longest} steps in a row (train.max_bad_steps is {max_bad_steps}) had a "
                f"non-finite loss or gradient, up to step {state.step}; lower optim.lr, set "
                "optim.max_grad_norm, or use train.precision=bf16 instead of fp16, then resume "
                "from the last checkpoint with train.resume=auto."
            )


def train_step(trainer) -> StepResult:
    """One optimizer step of a run (a ``Trainer``): the masking rate the schedule gives, the
    step's micro-batches, forward, backward, clip and update, then the step counted and the
    learning rate moved on (``Trainer.finish_step``)."""
    cfg, state = trainer.cfg, trainer.state
    m = cfg.masking
    mlm_probability = (
        m.probability_at(state.step, cfg.train.max_steps)
        if state.budget.step_only
        else m.rate_at(state.budget.progress(state.step))
    )
    trainer.collator.set_mlm_probability(mlm_probability)  # before the step's batches are collated
    trainer.step_accum = (
        trainer.ramp.accum(state.tokens_seen) if trainer.ramp is not None else trainer.accum
    )
    micro, waited, layouts = next_micro_batches(
        state.stream, trainer.collator, trainer.step_accum, m.on_device
    )
    result = optimizer_step(
        trainer.accelerator,
        trainer.objective,
        trainer.optimizer,
        trainer.scheduler.get_last_lr()[0],
        micro,
        cfg.optim.max_grad_norm,
        layouts,
    )
    result.mlm_probability, result.data_wait = mlm_probability, waited
    trainer.finish_step(result)
    return result
