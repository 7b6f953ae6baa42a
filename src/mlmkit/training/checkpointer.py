"""A run's checkpoints in one place: ``Checkpointer`` finds the checkpoint a run continues from,
checks that the resume would not mix runs, loads it, and saves the run's checkpoints.

The run makes one as it starts (``setup.start``, before any expensive work) and the trainer
calls it at each stage of a resume and at its checkpoint steps:

- ``Checkpointer(run_dir, train.resume)`` finds the checkpoint (``train.resume=auto``: the
  latest; a path: that one) and refuses a run dir that already holds a run it is not asked to
  continue;
- ``check_settings``, ``check_data`` and ``check_model``, as each part is built, refuse a resume
  that would change what the weights or the data position mean (``resume_checks``), before
  anything in the run dir is written;
- ``load`` restores the accelerator's state (any number of processes: ``checkpoint_files``) and
  the loop's (``TrainState``: step, budget, data position, masks), falling back to the checkpoint
  before a damaged latest one; ``settle`` then retires a later continuation abandoned by an
  explicit older checkpoint and applies the settings a resume may change;
- ``save`` writes a checkpoint whole, keeping the last ``train.keep_last``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from mlmkit.errors import ConfigError
from mlmkit.training import resume_checks
from mlmkit.training.checkpoint_files import (
    load_checkpoint,
    load_latest,
    resolve_resume,
    save_checkpoint,
)
from mlmkit.training.trained_model import RUN_MODEL_DIR

log = logging.getLogger("mlmkit")


class Checkpointer:
    """The checkpoints of the run in ``run_dir``: the one it resumes from (``resume_from``, None
    for a new run), that checkpoint's loop state (``saved``) and the settings changed since it
    (``changed``)."""

    def __init__(self, run_dir: Path, resume: str | None) -> None:
        self.run_dir, self.resume = run_dir, resume
        self.dir = run_dir / "checkpoints"
        self.resume_from = resolve_resume(resume, self.dir)
        previous = [
            p for p in (run_dir / "metrics.jsonl", self.dir, run_dir / "final") if p.exists()
        ]
        if self.resume_from is None and previous and resume != "auto":
            raise ConfigError(
                f"The run dir {str(run_dir)!r} already holds a run ({previous[0].name}); set "
                "train.resume=auto to continue it, or choose a new hydra.run.dir."
            )
        self.saved: dict[str, Any] = (
            resume_checks.saved_loop_state(self.resume_from) if self.resume_from else {}
        )
        self.changed: list[str] = []

    def check_settings(self, cfg) -> None:
        """Refuse settings that would change what the checkpoint means; note those changed."""
        if self.saved:
            self.changed = resume_checks.check_settings(
                cfg, self.saved.get("settings"), self.resume_from
            )

    def run_tokenizer(self) -> Path | None:
        """Return the tokenizer dir of the checkpoint's own run (None: a new run)."""
        if self.resume_from is None:
            return None
        path = self.resume_from.parent.parent / RUN_MODEL_DIR
        return path if path.is_dir() else None

    def check_data(self, corpus: str, train_blocks: int | None) -> None:
        """Refuse data whose position the checkpoint's cannot carry over to."""
        if self.saved:
            resume_checks.check_data(self.saved, corpus, train_blocks, self.resume_from)

    def check_model(self, config) -> None:
        """Refuse a model of another shape than the checkpoint's run's."""
        if self.resume_from is None:
            return
        source = self.resume_from.parent.parent / RUN_MODEL_DIR
        if (source / "config.json").is_file():
            resume_checks.check_model_shape(source, config, self.resume_from)

    def load(self, accelerator, state) -> dict[str, Any]:
        """Restore the checkpoint into the accelerator's objects and ``state`` (a
        ``TrainState``); return its loop state. Under ``train.resume=auto`` a damaged latest
        checkpoint falls back to the one before (``resume_from`` then names the one loaded)."""
        if self.resume == "auto":
            self.resume_from, restored = load_latest(accelerator, self.dir, self.resume_from)
        else:
            restored = load_checkpoint(accelerator, self.resume_from)
        state.load_state_dict(restored)
        return restored

    def settle(self, accelerator, step: int, later_events: list[str], optimizer, scheduler, optim):
        """After ``load``: retire the continuation after an explicit older checkpoint (its
        checkpoints, ``final/`` and ``later_events``), and apply the settings changed since the
        checkpoint (the optimizer's over the restored optimizer and schedule)."""
        if self.resume != "auto" and accelerator.is_main_process:
            resume_checks.retire_later(self.run_dir, self.resume_from, later_events)
        log.info("Resumed from %s at step %d", self.resume_from, step)
        if self.changed:
            log.info("Settings changed since the checkpoint, applied: %s", "; ".join(self.changed))
        if any(change.startswith("optim.") for change in self.changed):
            inner = getattr(scheduler, "scheduler", scheduler)
            resume_checks.apply_optim_settings(
                optimizer, scheduler, optim, inner.lr_lambdas[0](inner.last_epoch)
            )

    def save(self, accelerator, step: int, loop_state: dict[str, Any], keep_last: int) -> Path:
        """Write the step's checkpoint whole (on every rank), keeping the last ``keep_last``."""
        path = save_checkpoint(accelerator, self.dir, step, loop_state, keep_last)
        log.info("Saved checkpoint %s", path)
        return path
