"""A pretraining run, start to ``final/``: the loop (``training.trainer.Trainer``: setup,
resume, fit), then the export of its weights (``export.final``).

The run sits here, above the loop, because its last act is an export: the loop itself
imports nothing from ``export``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mlmkit.config import Config
from mlmkit.evaluation.probe import probe_for_run
from mlmkit.export.final import export_final, without_tied_copies
from mlmkit.training import lock as run_lock
from mlmkit.training.trainer import Trainer

log = logging.getLogger("mlmkit")


def train(cfg: Config, run_dir: str | os.PathLike, notes: Sequence[str] = (),
          on_open: Callable[[Path], None] | None = None) -> dict[str, Any]:
    """Pretrain a masked language model as ``cfg`` says, writing everything to ``run_dir``
    (``notes``: lines for the run's log, such as the recipe composition took; ``on_open``:
    called with the run dir once every check has passed, before the run writes there).

    Returns the final evaluation metrics (``eval_loss``, ``eval_accuracy``, ...).
    """
    probe = probe_for_run(cfg.probe)  # its data read, or refused, before the run dir is touched
    if probe is not None:
        notes = (*notes, probe.describe(cfg.probe.every))
    try:
        trainer = Trainer(cfg, Path(run_dir), notes, probe, on_phase_end=export_phase, on_open=on_open)
        trainer.resume()
        last_eval = trainer.fit()
        export_run(trainer, last_eval)
    finally:
        run_lock.release()  # the run dir's lock, taken at setup
    return last_eval


def export_run(trainer: Trainer, last_eval: dict[str, Any]) -> None:
    """``final/``: the full weights (every rank takes part: FSDP and ZeRO-3 gather them),
    written by the main process, and for a phased run its last phase's ``phases/<name>/``;
    then every rank ends the run."""
    final_state = trainer.final_state(last_eval)
    if final_state is not None:
        plain, weights, summary = final_state
        weights = without_tied_copies(plain, weights)
        final = export_final(plain, trainer.tokenizer, trainer.run_dir / "final", config=asdict(trainer.run_cfg),
                             summary=summary, state_dict=weights)
        log.info("Exported %s", final)
        if trainer.plan is not None:
            _write_phase(trainer, trainer.plan.name, plain, weights, summary)
    trainer.end()


def export_phase(trainer: Trainer, name: str, last_eval: dict[str, Any]) -> None:
    """``phases/<name>/`` at a phase's end: a plain model dir as ``final/`` is, whose model
    card names the phase and whose config holds the phase's settings (every rank takes part)."""
    final_state = trainer.final_state(last_eval)
    if final_state is not None:
        plain, weights, summary = final_state
        _write_phase(trainer, name, plain, without_tied_copies(plain, weights), summary)


def _write_phase(trainer: Trainer, name: str, plain, weights: dict[str, Any], summary: dict[str, Any]) -> None:
    phase = next(p for p in trainer.plan.phases if p.name == name)
    config = {**asdict(trainer.cfg), "phase": asdict(phase)}
    path = export_final(plain, trainer.tokenizer, trainer.run_dir / "phases" / name, config=config,
                        summary=summary, state_dict=weights)
    log.info("Exported phase %s to %s", name, path)
