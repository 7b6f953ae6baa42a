"""``mlmkit train``: pretrain a masked language model, from the command line to ``final/``.

    main()   the command (``mlmkit train``, ``python train.py``): Hydra composes
             conf/config.yaml with the command line, on every process under accelerate launch
    train()  the run: setup -> resume -> fit -> export
    fit()    the loop: optimizer steps until the first budget is spent, the jobs between them

The ``Trainer`` (``training.trainer``) holds the run's parts and does each job; this module
says in which order. ``mlmkit.train(cfg, run_dir)`` is ``train`` for a ``Config`` made in Python
(``mlmkit.compose([...])``).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from mlmkit.cli.errors import exit_on_error, run_hydra_main
from mlmkit.cli.record import write_record
from mlmkit.config import CONFIG_PATH, Config, register_configs
from mlmkit.config.compose import finish, objective_shorthand
from mlmkit.errors import ConfigError
from mlmkit.evaluation.probe import probe_for_run
from mlmkit.export.final import GENERATOR_DIR, export_final, without_tied_copies
from mlmkit.training import lock as run_lock
from mlmkit.training import setup
from mlmkit.training.progress import duration
from mlmkit.training.signals import StopSignals
from mlmkit.training.step import train_step
from mlmkit.training.tracking import finish_trackers_on_error
from mlmkit.training.trainer import Trainer

log = logging.getLogger("mlmkit")


# ---- the command ---------------------------------------------------------------------------------


def main() -> None:
    """Run ``mlmkit train`` with the overrides of ``sys.argv``."""
    exit_on_error(partial(check_run_dir_override, sys.argv[1:]))
    sys.argv[1:] = objective_shorthand(sys.argv[1:])  # objective=rtd: objective.name=rtd
    register_configs()
    run_hydra_main(command)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="config")
def command(cfg: DictConfig) -> None:
    """Hydra's job: finish the composed ``cfg`` (its recipes) and train it in Hydra's run dir."""
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.get()
    exit_on_error(
        partial(train_composed, cfg, list(hydra_cfg.overrides.task), hydra_cfg.runtime.output_dir)
    )


def train_composed(cfg: DictConfig, overrides: list[str], run_dir: str) -> None:
    """Apply the recipes to the composed ``cfg`` and train it; the run's ``.hydra/`` record (the
    settings as run, recipes applied) is written once the run's checks have passed."""
    config, notes = finish(cfg, overrides)
    train(config, run_dir, notes, on_open=lambda opened: write_record(opened, cfg))


def check_run_dir_override(argv: list[str]) -> None:
    """Fail with one sentence, before Hydra does with a traceback, on an unusable run dir."""
    for arg in argv:
        if arg.startswith("hydra.run.dir=") and "${" not in arg:
            path = arg.split("=", 1)[1]
            try:
                os.makedirs(path, exist_ok=True)
            except OSError as exc:
                raise ConfigError(
                    f"Cannot create the run dir {path!r} ({exc.strerror}); set "
                    "hydra.run.dir to a writable folder."
                ) from None


# ---- the run -------------------------------------------------------------------------------------


def train(
    cfg: Config,
    run_dir: str | os.PathLike,
    notes: Sequence[str] = (),
    on_open: Callable[[Path], None] | None = None,
) -> dict[str, Any]:
    """Pretrain a masked language model as ``cfg`` says, writing everything to ``run_dir``
    (``notes``: lines for the run's log, such as the recipe composition took; ``on_open``:
    called with the run dir once every check has passed, before the run writes there).

    Returns the final evaluation metrics (``eval_loss``, ``eval_accuracy``, ...).
    """
    probe = probe_for_run(cfg.probe)  # its data read, or refused, before the run dir is touched
    if probe is not None:
        notes = (*notes, probe.describe(cfg.probe.every))
    started = time.monotonic()
    try:
        trainer = Trainer(
            cfg, Path(run_dir), notes, probe, on_phase_end=export_phase, on_open=on_open
        )
        trainer.resume()
        first_step = trainer.state.step
        last_eval = fit(trainer)
        export_run(trainer, last_eval)
        summarize(trainer, last_eval, trainer.state.step - first_step, time.monotonic() - started)
    finally:
        run_lock.release()  # the run dir's lock, taken at setup
        setup.stop_logging()
    return last_eval


def fit(trainer: Trainer) -> dict[str, Any]:
    """Train until the first budget is spent; return the last evaluation."""
    trainer.start_fit()
    with StopSignals() as signals, finish_trackers_on_error(trainer.accelerator):
        while not trainer.done():
            if trainer.phase_due():  # a finished run given a new phase
                trainer.paused(trainer.begin_phase)
            result = train_step(trainer)
            last = trainer.done()
            # log: the step's figures leave the device only here
            if trainer.log_due(last):
                trainer.log(result)
            # evaluate on the fixed validation batches
            if trainer.eval_due(last):
                trainer.paused(trainer.evaluate)
            # a phase's end: its export, then the next phase's data (before the step's checkpoint)
            if trainer.phase_due():
                trainer.paused(trainer.begin_phase)
            # probe the frozen encoder on a labelled task
            if trainer.probe_due(last):
                trainer.paused(trainer.run_probe)
            # checkpoint at its interval and the end; a stop signal saves one and ends the run
            stop = trainer.stop_requested(signals, last)
            trainer.checkpoint(last, stop)
            if stop:
                raise trainer.stopped(signals)
    trainer.end_fit()
    return trainer.last_eval


# ---- the export ----------------------------------------------------------------------------------


def export_run(trainer: Trainer, last_eval: dict[str, Any]) -> None:
    """Write ``final/`` (the full weights: every rank takes part, as FSDP and ZeRO-3 gather
    them; the main process writes) and, for a phased run, its last phase's ``phases/<name>/``;
    then end the run on every rank."""
    final_state = trainer.final_state(last_eval)
    if final_state is not None:
        plain, weights, summary, generator = final_state
        weights = without_tied_copies(plain, weights)
        final = export_final(
            plain,
            trainer.tokenizer,
            trainer.run_dir / "final",
            config=asdict(trainer.run_cfg),
            summary=summary,
            state_dict=weights,
            generator=generator,
        )
        log.info("Exported %s", final)
        if trainer.plan is not None:
            write_phase(trainer, trainer.plan.name, plain, weights, summary)
    trainer.end()


def export_phase(trainer: Trainer, name: str, last_eval: dict[str, Any]) -> None:
    """Write ``phases/<name>/`` at a phase's end: a plain model dir as ``final/`` is, whose model
    card names the phase and whose config holds the phase's settings (every rank takes part)."""
    final_state = trainer.final_state(last_eval)
    if final_state is not None:
        plain, weights, summary, _ = final_state
        write_phase(trainer, name, plain, without_tied_copies(plain, weights), summary)


def write_phase(
    trainer: Trainer, name: str, plain, weights: dict[str, Any], summary: dict[str, Any]
) -> None:
    phase = next(p for p in trainer.plan.phases if p.name == name)
    config = {**asdict(trainer.cfg), "phase": asdict(phase)}
    path = export_final(
        plain,
        trainer.tokenizer,
        trainer.run_dir / "phases" / name,
        config=config,
        summary=summary,
        state_dict=weights,
    )
    log.info("Exported phase %s to %s", name, path)


def summarize(trainer: Trainer, last_eval: dict[str, Any], steps: int, seconds: float) -> None:
    """Log the run's closing lines: what was trained, its last figures, where its outputs are."""
    state, run = trainer.state, trainer.run_dir
    figures = ""
    if "eval_loss" in last_eval:
        figures = (
            f": eval loss {last_eval['eval_loss']:.4f}, accuracy {last_eval['eval_accuracy']:.4f} "
            f"(the baseline {trainer.baseline['baseline_accuracy']:.4f})"
        )
    log.info(
        "Done: %d steps in this run, %d in all (%s tokens) in %s%s.",
        steps,
        state.step,
        f"{state.tokens_seen:,}",
        duration(seconds),
        figures,
    )
    final = run / "final"
    if (final / GENERATOR_DIR / "config.json").is_file():  # objective=rtd
        log.info(
            "The discriminator: %s (transformers' AutoModel, SentenceTransformer, mlmkit "
            "finetune or glue); the generator, a fill-mask model: %s; the evaluations' "
            "masked-token figures are the generator's; the log: %s; the curves: mlmkit plot %s",
            final,
            final / GENERATOR_DIR,
            run / "train.log",
            run,
        )
    elif (final / "config.json").is_file():
        log.info(
            "The model: %s (transformers' AutoModelForMaskedLM or pipeline('fill-mask'), or "
            "SentenceTransformer); the log: %s; the curves: mlmkit plot %s",
            final,
            run / "train.log",
            run,
        )
