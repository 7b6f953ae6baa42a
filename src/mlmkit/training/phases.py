"""Pretraining in phases (``phases``), and the batch-size warmup (``train.batch_warmup_tokens``).

A phased run splits its budget (steps, tokens or time, whichever ends it) into phases by their
``share``; each phase holds the run's settings with its own ``set`` (and those of the phases
before it) applied: BERT's 90% of the steps at 128 tokens then 10% at 512 (Devlin et al.,
2019), ModernBERT's stable phase, context extension with a larger RoPE theta, then decay
(Warner et al., 2024). The model and the optimizer's moments carry across a boundary; the
loop switches its data stream, masking and batch there (``Trainer.begin_phase``) the way a
resume builds them, so a resume inside any phase is an ordinary resume.

``PhasePlan`` says which phase a step is in and the learning rate there. Where each phase
began (step, tokens, seconds) is recorded in the loop state as it happens: a phase that has
ended keeps its span when the run is resumed with a longer budget and more phases (a context
extension of a finished run), and the phases begun so far must keep their names and settings.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from mlmkit.config import Config
from mlmkit.errors import ConfigError
from mlmkit.training.budget import Budget
from mlmkit.training.optim import schedule_multiplier

log = logging.getLogger("mlmkit")


class PhasePlan:
    """The phases of a run against its budget; ``starts`` records where each phase began."""

    def __init__(self, cfg: Config, budget: Budget) -> None:
        self.phases, self.configs = cfg.phases, cfg.phase_configs()
        self.optim, self.budget = cfg.optim, budget
        self.ends, total = [], 0.0
        for phase in self.phases:
            total += phase.share
            self.ends.append(total)
        self.ends[-1] = 1.0
        self.starts: list[
            dict[str, Any]
        ] = []  # {"name", "set", "step", "tokens", "elapsed"} per phase begun

    @property
    def index(self) -> int:
        return len(self.starts) - 1

    @property
    def name(self) -> str:
        return self.phases[self.index].name

    def config(self, index: int | None = None) -> Config:
        """Return the settings of phase ``index`` (the current one by default)."""
        return self.configs[self.index if index is None else index]

    def begin(self, step: int, tokens: int, elapsed: float) -> int:
        """Record the start of the next phase; returns its index."""
        phase = self.phases[len(self.starts)]
        self.starts.append(
            {
                "name": phase.name,
                "set": phase.set,
                "step": step,
                "tokens": tokens,
                "elapsed": elapsed,
            }
        )
        return self.index

    def due(self, step: int) -> bool:
        """Whether the next phase begins after ``step`` steps: the current phase's share of the
        budget is spent and the run is not over."""
        i = self.index
        return (
            i + 1 < len(self.phases)
            and not self.budget.done(step)
            and self.budget.progress(step) >= self.ends[i] - 1e-12
        )

    def span(self, i: int) -> tuple[float, float]:
        """Phase ``i``'s start and end as shares of the budget (an ended phase keeps its own)."""
        start = (
            self._progress_at(self.starts[i])
            if i < len(self.starts)
            else (self.ends[i - 1] if i else 0.0)
        )
        end = self._progress_at(self.starts[i + 1]) if i + 1 < len(self.starts) else self.ends[i]
        return start, max(end, start)

    def _progress_at(self, mark: dict[str, Any]) -> float:
        return self.budget.progress_at(mark["step"], mark["tokens"], mark["elapsed"])

    def lr_factor(self, step: int) -> float:
        """Return the ``optim.lr`` multiplier for the step that follows ``step`` finished steps."""
        i = max(self.index, 0)
        phase, o = self.phases[i], self.optim
        ratio = (phase.lr or o.lr) / o.lr
        if phase.schedule == "continue":
            return self.budget.lr_factor(step) * ratio
        start, end = self.span(i)
        begun = self.starts[i]["step"] if self.starts else 0
        into = step - begun  # steps of this phase already taken
        p = min(1.0, self.budget.progress(step + 1, self.budget.tokens + self.budget.step_tokens))
        q = min(1.0, max(0.0, (p - start) / max(end - start, 1e-12)))
        if phase.schedule == "decay":
            d = math.sqrt(q) if o.decay_shape == "1-sqrt" else q
            return o.min_lr_ratio + (ratio - o.min_lr_ratio) * (1.0 - d)
        warmup = (
            phase.warmup_steps
            if phase.warmup_steps is not None
            else (o.warmup_steps if phase.schedule == "rewarm" else 0)
        )
        if warmup and into < warmup:
            return ratio * (into + 1) / warmup
        if phase.schedule == "constant":
            return ratio
        # rewarm: optim.schedule's decay over the phase, from the end of its warmup
        warm_end = 0.0
        if self.budget.max_steps and not (self.budget.max_tokens or self.budget.max_time):
            phase_steps = end * self.budget.max_steps - begun
            warm_end = min(1.0, warmup / max(phase_steps, 1.0))
        return ratio * schedule_multiplier(o, q, warm_end)

    def state_dict(self) -> dict[str, Any]:
        return {"starts": self.starts, "names": [p.name for p in self.phases]}


def begun_phases(
    cfg: Config, saved: dict[str, Any] | None, checkpoint: Path | None
) -> list[dict[str, Any]]:
    """Return the starts of the phases a resumed checkpoint had begun (``saved``: its loop state's
    ``phases``), checked against this run's list: those phases keep their names, order and
    settings (a checkpoint of a run without phases was in a first phase with the run's own
    settings). Empty for a new run."""
    starts = list((saved or {}).get("starts") or [])
    if not cfg.phases:
        if len(starts) > 1:
            raise ConfigError(
                f"train.resume: {checkpoint.name} was written in phase {starts[-1]['name']!r} of a "
                "phased run; resume with the run's phases list (phases=...)."
            )
        return []
    if checkpoint is None:
        return []
    if not starts:
        starts = [{"name": cfg.phases[0].name, "set": {}, "step": 0, "tokens": 0, "elapsed": 0.0}]
    if len(starts) > len(cfg.phases):
        raise ConfigError(
            f"train.resume: {checkpoint.name} is in phase {starts[-1]['name']!r}, the "
            f"{len(starts)}th, but phases lists {len(cfg.phases)}; keep the phases that ran "
            "and add new ones after them."
        )
    for i, (old, phase) in enumerate(zip(starts, cfg.phases)):
        if old["name"] != phase.name or _canonical(old["set"]) != _canonical(phase.set):
            raise ConfigError(
                f"train.resume: phase {i} of {checkpoint.name} was {old['name']!r} with "
                f"{json.dumps(old['set'])} and is now {phase.name!r} with {json.dumps(phase.set)}; "
                "a phase that has begun keeps its name and settings: change only later phases, or "
                "start a new run with model.init_from."
            )
    return starts


def _canonical(settings: dict[str, Any]) -> str:
    return json.dumps(settings, sort_keys=True, default=str)


def phase_changes(before: Config, after: Config, phase_set: dict[str, Any]) -> dict[str, Any]:
    """Return the settings that change at a boundary, for the log and the ``phase`` event."""
    out = {}
    for name in phase_set:
        section, _, key = name.partition(".")
        old, new = getattr(getattr(before, section), key), getattr(getattr(after, section), key)
        if old != new:
            out[name] = new
    return out


class BatchRamp:
    """The batch-size warmup (``train.batch_warmup_tokens``): the global batch grows linearly
    from ``train.batch_warmup_start`` to the run's over that many tokens, by accumulating
    more micro-batches per optimizer step; the learning rate follows the real batch (scaled
    by the batch's share of the target, Goyal et al. (2017)'s linear scaling)."""

    def __init__(
        self, tokens: int, start_batch: int | None, per_pass: int, target_accum: int
    ) -> None:
        self.tokens, self.per_pass, self.target = tokens, per_pass, target_accum
        start = start_batch if start_batch is not None else per_pass
        self.start = max(1, min(target_accum, math.ceil(start / per_pass)))

    def accum(self, tokens_seen: int) -> int:
        """Micro-batches of the next step, after ``tokens_seen`` tokens."""
        if not self.tokens or tokens_seen >= self.tokens:
            return self.target
        share = tokens_seen / self.tokens
        return max(
            self.start, min(self.target, self.start + int((self.target - self.start) * share))
        )

    def lr_ratio(self, tokens_seen: int) -> float:
        return self.accum(tokens_seen) / self.target

    def retarget(self, per_pass: int, target_accum: int) -> None:
        """Take a phase's batch as the target: the ramp goes on towards it."""
        start = self.start * self.per_pass
        self.per_pass, self.target = per_pass, target_accum
        self.start = max(1, min(target_accum, math.ceil(start / per_pass)))

    def scaled(self, factor, budget: Budget):
        """``factor`` (a schedule's multiplier) times the batch's share of its target for the
        step it sets the rate of (the batch after the budget's tokens so far)."""
        return lambda step: factor(step) * self.lr_ratio(budget.tokens)
