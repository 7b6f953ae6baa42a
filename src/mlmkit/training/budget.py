"""Training budgets: optimizer steps, tokens and wall-clock time, and the schedule against them.

A run stops at the first budget it reaches (``train.max_steps``, ``train.max_tokens``,
``train.max_time``), with a final checkpoint and export. The learning-rate schedule is a
function of *progress*, the largest used share of any budget, so a run limited by time
(cramming's setting: "what can one GPU learn in a day") still warms up and decays to its
end. With only a step budget the schedule is the plain step schedule.

Wall-clock progress must be the same on every rank (ranks that disagree about the learning
rate would drift apart), so the main process's clock is shared at log steps, the loop's
only synchronisation points, and extrapolated between them at the measured time per step.
"""

from __future__ import annotations

import logging

from mlmkit.config import OptimConfig, parse_duration  # noqa: F401 (parse_duration re-exported)
from mlmkit.training.optim import lr_lambda, schedule_multiplier

log = logging.getLogger(__name__)


def warn_long_warmup(optim: OptimConfig, max_steps: int | None) -> bool:
    """Warn when the warmup is not shorter than the step budget (the learning rate would
    never reach optim.lr nor decay)."""
    if (
        optim.warmup_fraction is None
        and max_steps is not None
        and optim.warmup_steps >= max_steps > 0
    ):
        log.warning(
            "optim.warmup_steps (%d) is not shorter than train.max_steps (%d), so the learning "
            "rate rises for the whole run and never decays; lower optim.warmup_steps or raise "
            "train.max_steps.",
            optim.warmup_steps,
            max_steps,
        )
        return True
    return False


class Budget:
    """Where a run stands against its budgets, and the learning-rate multiplier there."""

    def __init__(
        self,
        optim: OptimConfig,
        max_steps: int | None,
        max_tokens: int | None = None,
        max_time: float | None = None,
    ) -> None:
        self.optim = optim
        self.max_steps, self.max_tokens, self.max_time = max_steps, max_tokens, max_time
        self.step_only = max_tokens is None and max_time is None and optim.warmup_fraction is None
        # the state the schedule reads (the same on every rank)
        self.tokens = 0  # tokens seen after the last finished step
        self.step_tokens = 0  # tokens of the last step (to look one step ahead)
        self.synced_time = 0.0  # training seconds at the last sync
        self.synced_step = 0
        self.seconds_per_step = 0.0
        warn_long_warmup(optim, max_steps)

    # ---- progress -------------------------------------------------------------------------

    def elapsed(self, step: int) -> float:
        """Training seconds at ``step``, from the last shared clock reading."""
        return self.synced_time + max(0, step - self.synced_step) * self.seconds_per_step

    def progress(self, step: int, tokens: int | None = None) -> float:
        """Return the largest used share of any budget after ``step`` steps (and ``tokens``)."""
        return self.progress_at(step, self.tokens if tokens is None else tokens, self.elapsed(step))

    def progress_at(self, step: int, tokens: int, elapsed: float) -> float:
        """Return the largest used share of any budget at ``step`` steps, ``tokens`` and ``elapsed``
        seconds."""
        shares = []
        if self.max_steps:
            shares.append(step / self.max_steps)
        if self.max_tokens:
            shares.append(tokens / self.max_tokens)
        if self.max_time:
            shares.append(elapsed / self.max_time)
        return max(shares) if shares else 0.0

    def done(self, step: int) -> bool:
        return self.progress(step) >= 1.0

    def sync(self, step: int, elapsed: float) -> None:
        """Share the main process's training time at ``step`` (call on every rank)."""
        if step > self.synced_step:
            self.seconds_per_step = (elapsed - self.synced_time) / (step - self.synced_step)
        self.synced_time, self.synced_step = elapsed, step

    def finish_step(self, step_tokens: int) -> None:
        self.step_tokens = step_tokens
        self.tokens += step_tokens

    # ---- schedule -------------------------------------------------------------------------

    def lr_factor(self, step: int) -> float:
        """Multiplier of ``optim.lr`` for the step that follows ``step`` finished steps."""
        o = self.optim
        if self.step_only:
            return lr_lambda(step, o, self.max_steps)
        # the budget share this step will have used when it ends
        p = min(1.0, self.progress(step + 1, self.tokens + self.step_tokens))
        if o.warmup_fraction is not None:
            warm_end = o.warmup_fraction
            if warm_end and p < warm_end:
                return max(p / warm_end, 1e-3)
        else:
            if o.warmup_steps and step < o.warmup_steps:
                return (step + 1) / o.warmup_steps
            warm_end = 0.0
        return schedule_multiplier(o, p, warm_end)

    def state_dict(self) -> dict[str, float]:
        return {
            "tokens": self.tokens,
            "step_tokens": self.step_tokens,
            "synced_time": self.synced_time,
            "synced_step": self.synced_step,
            "seconds_per_step": self.seconds_per_step,
        }

    def load_state_dict(self, state: dict[str, float]) -> None:
        for key, value in state.items():
            setattr(self, key, type(getattr(self, key))(value))
