"""One optimizer step, top to bottom (``train_step``, as torchtitan's): the masking rate, the
micro-batches, forward and backward through the objective (``model.objective``: each loss term
normalised by its global count of tokens in the step), clip, and update unless the gradient is
not finite; then the scheduler, the gradients cleared, and the step counted."""

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
from mlmkit.model.documents import flatten_rows
from mlmkit.training.runtime import unwrap

log = logging.getLogger("mlmkit")


def forward_backward(
    accelerator, objective, micro: list[dict[str, torch.Tensor]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and backward every micro-batch of one optimizer step.

    The gradient left in the parameters is that of sum_k weight_k x (term k's loss summed over
    the whole step) / (term k's tokens in the whole step, over all micro-batches and ranks):
    the counts are summed first (``Objective.counts``), then each micro-batch's summed losses
    are divided by them. For MLM, the one term is the cross-entropy at the chosen positions.
    Returns this rank's sums for the log (``Objective.stats``) and the global counts (device
    tensors; no host sync).
    """
    world = accelerator.num_processes
    spec = unwrap(accelerator, objective)  # what the objective asks (no parameters used)
    n_local = sum(spec.counts(b) for b in micro)
    n_global = accelerator.reduce(n_local.float(), reduction="sum")
    # DDP averages gradients over ranks; multiplying by world undoes that average.
    scale = world / n_global.clamp(min=1.0)
    sums = None
    for i, batch in enumerate(micro):
        last = i == len(micro) - 1
        with nullcontext() if last else accelerator.no_sync(objective):
            out = objective(**batch)
            terms = (spec.losses(out) * scale).unbind()  # each over its tokens in the step
            accelerator.backward(sum(w * t for w, t in zip(spec.loss_weights, terms)))
        stats = spec.stats(out)
        sums = stats if sums is None else sums + stats
    return sums, n_global


@dataclass
class StepResult:
    """What one optimizer step leaves for the log (device tensors until a log step)."""

    sums: torch.Tensor  # this rank's sums for the log (``Objective.stats``; MLM: the token loss)
    counts: torch.Tensor  # tokens each loss term averaged over, all ranks (MLM: the chosen)
    grad_norm: torch.Tensor
    lr: float  # the rate this step used
    tokens: int  # positions fed, all ranks (padding included: the budget's count)
    ok: torch.Tensor | bool  # the update was applied (a device tensor until a log step)
    mlm_probability: float = 0.0  # the masking rate of the step's batches
    data_wait: float = 0.0  # seconds the host waited for the step's batches
    # this rank's attended blocks of the step by length (rows, or documents where they are
    # isolated; real tokens only): what the throughput meter counts
    blocks: Counter = field(default_factory=Counter)

    @property
    def loss_sum(self) -> torch.Tensor:
        """This rank's summed loss of the first term (MLM: the cross-entropy)."""
        return self.sums[0]

    @property
    def n_masked(self) -> torch.Tensor:
        """The chosen tokens of the step, all ranks."""
        return self.counts[0]


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
            if collator.draws:
                batch["draws"] = collator.draw_in_step(batch["input_ids"])
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
    """Forward/backward ``micro``, clip, and update if the gradient is finite
    (``forward_backward``, then ``clip_and_update``; the scheduler and the gradients are left to
    the caller); ``layouts``: the loader's ``BatchLayout`` of each micro-batch, for the counts."""
    engine = deepspeed_engine(accelerator)
    skipped_before = engine.skipped_steps if engine is not None else 0
    sums, counts = forward_backward(accelerator, objective, micro)
    grad_norm, ok = clip_and_update(
        accelerator, objective, optimizer, max_grad_norm, sums, engine, skipped_before
    )
    tokens, blocks = step_tokens(accelerator, micro, layouts), step_blocks(micro, layouts)
    return StepResult(sums, counts, grad_norm, lr, tokens, ok, blocks=blocks)


def clip_and_update(
    accelerator, objective, optimizer, max_grad_norm: float | None, sums, engine, skipped_before
) -> tuple[torch.Tensor, torch.Tensor | bool]:
    """Clip the gradient and update if it is finite; return (gradient norm, update applied).

    A NaN/Inf gradient skips the update. With fused AdamW (mlmkit's optimizer on CUDA and
    CPU) the skip happens on the device, through the optimizer's ``found_inf``, and the host
    never waits for the step: ``ok`` stays a device tensor until a log step reads it
    (``SkipCount``). With fp16 the gradient scaler finds overflows itself (skips the step and
    lowers its scale), so there only a non-finite loss (``sums``) counts. Another optimizer
    costs one host wait per step for the check. Under DeepSpeed (``engine``) the engine has
    already clipped and stepped inside the backward: ``ok`` is what the engine did
    (``deepspeed_step``; ``skipped_before``: its count of skipped steps before this one).
    """
    if engine is not None:
        return deepspeed_step(engine, skipped_before)
    max_norm = max_grad_norm if max_grad_norm is not None else math.inf
    grad_norm = local_norm(accelerator.clip_grad_norm_(objective.parameters(), max_norm))
    finite = torch.isfinite(grad_norm)
    if accelerator.scaler is not None:
        optimizer.step()  # the scaler skips an overflowing step itself
        ok = torch.isfinite(accelerator.reduce(sums, reduction="sum")).all()
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
    return grad_norm, ok


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


def masking_rate(cfg, state) -> float:
    """Return the masking rate at the state's step: ``masking.mlm_probability``, or where it is
    scheduled, its value at the share of the budget used (of the steps, for a step budget)."""
    m = cfg.masking
    if state.budget.step_only:
        return m.probability_at(state.step, cfg.train.max_steps)
    return m.rate_at(state.budget.progress(state.step))


def train_step(trainer) -> StepResult:
    """One optimizer step of a run (a ``Trainer``), top to bottom: the step's masking rate and
    micro-batches, forward and backward through the objective, clip and update, the learning
    rate moved on and the gradients cleared, then the step counted (the log window, the skips,
    the state and its budget's clock) and shown."""
    cfg, state, acc = trainer.cfg, trainer.state, trainer.accelerator
    # the masking rate the schedule gives, set before the step's batches are collated
    mlm_probability = masking_rate(cfg, state)
    trainer.collator.set_mlm_probability(mlm_probability)
    # the step's micro-batches (more of them while a batch-size warmup grows the batch)
    ramp = trainer.ramp
    trainer.step_accum = ramp.accum(state.tokens_seen) if ramp is not None else trainer.accum
    micro, waited, layouts = next_micro_batches(
        state.stream, trainer.collator, trainer.step_accum, cfg.masking.on_device
    )
    # forward and backward, each loss term over its tokens in the whole step, all ranks
    lr = trainer.scheduler.get_last_lr()[0]
    engine = deepspeed_engine(acc)
    skipped_before = engine.skipped_steps if engine is not None else 0
    sums, counts = forward_backward(acc, trainer.objective, micro)
    # clip, and update unless the gradient is not finite (skipped on the device)
    grad_norm, ok = clip_and_update(
        acc,
        trainer.objective,
        trainer.optimizer,
        cfg.optim.max_grad_norm,
        sums,
        engine,
        skipped_before,
    )
    result = StepResult(
        sums,
        counts,
        grad_norm,
        lr,
        step_tokens(acc, micro, layouts),
        ok,
        mlm_probability,
        waited,
        step_blocks(micro, layouts),
    )
    # the step counted: the log window and the skips on the device, the state and its budget
    trainer.window.add(result)
    trainer.skips.add(result.ok)  # read at log and checkpoint steps
    trainer.last_grad_norm = result.grad_norm
    state.finish_step(result.tokens)
    # the rate of the next step, from the budget used so far; the gradients cleared
    trainer.scheduler.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    # the main process's clock: read at every step where one process trains (free), at log
    # steps where several must agree (a collective); between readings the budget extrapolates
    if state.budget.max_time and (acc.num_processes == 1 or state.step % cfg.train.log_every == 0):
        state.budget.sync(state.step, trainer.shared_clock())
    trainer.progress.update(state.step)
    return result
