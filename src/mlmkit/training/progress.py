"""Show how far a run is: a progress bar on a terminal, and elsewhere (a log file, a SLURM job's
output) one plain line every ``LINE_EVERY`` seconds, never a line of carriage returns."""

from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger("mlmkit")

LINE_EVERY = 15.0  # seconds between two progress lines where stderr is not a terminal


def on_terminal() -> bool:
    """Whether stderr is a terminal a bar can redraw in place."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def duration(seconds: float) -> str:
    """``seconds`` as people read a time: 45s, 12m05s, 3h20m."""
    seconds = max(int(seconds), 0)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """The progress of a run against its budget (steps, tokens or time: whichever it has, as a
    share, so that a time-budgeted streaming run shows a total and the time left too)."""

    def __init__(
        self, budget, start_step: int, enabled: bool, terminal: bool | None = None
    ) -> None:
        self.budget, self.enabled = budget, enabled
        self.terminal = on_terminal() if terminal is None else terminal
        self.started, self.last_line = time.monotonic(), time.monotonic()
        self.start_share = budget.progress(start_step)
        self.figures: dict[str, str] = {}
        self.bar = None
        if enabled and self.terminal:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=1000,
                initial=round(1000 * self.start_share),
                desc="train",
                dynamic_ncols=True,
                bar_format="{desc} {percentage:3.0f}%|{bar}| {postfix} [{elapsed}<{remaining}]",
            )

    def update(self, step: int) -> None:
        """Move to ``step`` (after each optimizer step)."""
        if not self.enabled:
            return
        share = min(self.budget.progress(step), 1.0)
        if self.bar is not None:
            self.bar.n = round(1000 * share)
            self.bar.set_postfix_str(self._postfix(step), refresh=False)
            self.bar.refresh()
        elif time.monotonic() - self.last_line >= LINE_EVERY:
            self.last_line = time.monotonic()
            log.info("progress: %s", self._line(step, share))

    def show(self, **figures: str) -> None:
        """Keep the latest figures (loss, tokens/s) for the bar or the next line."""
        self.figures.update(figures)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _postfix(self, step: int) -> str:
        return ", ".join([f"step {step}", *(f"{k} {v}" for k, v in self.figures.items())])

    def _line(self, step: int, share: float) -> str:
        elapsed = time.monotonic() - self.started
        done = share - self.start_share
        left = f", about {duration(elapsed * (1 - share) / done)} left" if done > 0 else ""
        return f"{share:.0%} of the budget, {self._postfix(step)}; {duration(elapsed)} so far{left}"
