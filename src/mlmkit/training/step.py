"""One optimizer step: gather the micro-batches, forward and backward each with the loss
normalised by the step's global count of chosen tokens, clip, and update unless the
gradient is not finite."""

from __future__ import annotations

import logging
import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from mlmkit.errors import TrainingDiverged
from mlmkit.masking.collator import IGNORE_INDEX

log = logging.getLogger("mlmkit")


def forward_backward(accelerator, objective, micro: list[dict[str, torch.Tensor]]
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
    tokens: int  # positions fed, all ranks
    ok: bool  # the update was applied
    mlm_probability: float = 0.0  # the masking rate of the step's batches


def next_micro_batches(stream, collator, accum: int, on_device: bool) -> list[dict[str, torch.Tensor]]:
    """The micro-batches of one optimizer step; with ``masking.on_device`` the dataloader
    only padded them, and they are masked here, on the accelerator."""
    micro = [next(stream) for _ in range(accum)]
    if on_device:
        for batch in micro:
            batch["input_ids"], batch["labels"] = collator.mask(batch["input_ids"],
                                                                batch.get("attention_mask"))
    return micro


def optimizer_step(accelerator, objective, optimizer, lr: float, micro, max_grad_norm: float | None
                   ) -> StepResult:
    """Forward/backward ``micro``, clip, and update if the gradient is finite (the caller
    steps the scheduler and zeroes the gradients once the step is counted).

    A NaN/Inf gradient skips the update. With fp16 the gradient scaler sees overflows
    itself (skips the step and lowers its scale), so there only a non-finite loss counts.
    The finite check is one host sync per step.
    """
    loss_sum, n_global = forward_backward(accelerator, objective, micro)
    max_norm = max_grad_norm if max_grad_norm is not None else math.inf
    grad_norm = accelerator.clip_grad_norm_(objective.parameters(), max_norm)
    # DeepSpeed clips inside its engine and may report no norm
    grad_norm = torch.as_tensor(grad_norm if grad_norm is not None else 0.0)
    finite_grad = bool(torch.isfinite(grad_norm))
    scaler = accelerator.scaler is not None
    if finite_grad or scaler:
        optimizer.step()
    ok = bool(torch.isfinite(accelerator.reduce(loss_sum, reduction="sum"))) if scaler else finite_grad
    tokens = sum(b["input_ids"].numel() for b in micro) * accelerator.num_processes
    return StepResult(loss_sum, n_global, grad_norm, lr, tokens, ok)


def count_bad_step(state, result: StepResult, max_bad_steps: int) -> None:
    """Track consecutive skipped steps; stop with advice after ``max_bad_steps`` of them."""
    if result.ok:
        state.bad_steps = 0
        return
    state.bad_steps += 1
    state.skipped_steps += 1
    step = state.step + 1
    log.warning("Step %d: non-finite loss or gradient (norm %s); update skipped (%d in a row)",
                step, float(result.grad_norm), state.bad_steps)
    if state.bad_steps >= max_bad_steps:
        raise TrainingDiverged(
            f"{state.bad_steps} steps in a row had a non-finite loss or gradient (up to step "
            f"{step}); lower optim.lr, set optim.max_grad_norm, or use train.precision=bf16 "
            "instead of fp16, then resume from the last checkpoint with train.resume=auto."
        )
