"""The training loop.

``Trainer(cfg, run_dir)`` sets up (``setup``: run dir and accelerator, tokenizer and data,
model, optimizer and budget), ``resume`` restores a checkpoint if asked (``TrainState``),
then ``fit`` runs optimizer steps (``step``) until the first budget is spent, and once in a
while logs, evaluates (``validation``) and saves a checkpoint; ``final_state`` gathers the
weights for the export of ``final/`` (``export.run.train`` runs all of it).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from mlmkit.config import Config
from mlmkit.data.loader import training_stream
from mlmkit.data.packing import token_counts, unk_tokens
from mlmkit.data.tokenizer import unk_report
from mlmkit.errors import Preempted
from mlmkit.training import resume, setup
from mlmkit.training.checkpoint import load_checkpoint, load_latest, save_checkpoint
from mlmkit.training.loading import RUN_MODEL_DIR
from mlmkit.training.metrics_log import MetricsLog
from mlmkit.training.perf import peak_memory_gb
from mlmkit.training.signals import StopSignals
from mlmkit.training.state import TrainState
from mlmkit.training.step import StepResult, count_bad_step, next_micro_batches, optimizer_step
from mlmkit.training.tracking import finish_trackers_on_error, log_event, start_trackers
from mlmkit.training.validation import evaluate, fixed_eval_batches, majority_baseline

log = logging.getLogger("mlmkit")


class LogWindow:
    """The figures of the steps since the last log event (device tensors until then)."""

    def __init__(self, device: torch.device) -> None:
        self.loss = torch.zeros((), device=device)  # summed token loss, this rank
        self.masked = torch.zeros((), device=device)  # chosen tokens, all ranks
        self.tokens = 0
        self.reset()

    def reset(self) -> None:
        self.loss.zero_()
        self.masked.zero_()
        self.tokens = 0
        self.started, self.paused = time.perf_counter(), 0.0  # paused: eval and checkpoints

    def add(self, result: StepResult) -> None:
        self.loss += result.loss_sum
        self.masked += result.n_masked
        self.tokens += result.tokens


class Trainer:
    """A run: its parts (built by ``setup``), its state, and the loop over them."""

    def __init__(self, cfg: Config, run_dir: Path, notes: Sequence[str] = (), probe=None) -> None:
        """``notes``: lines for the log from before it opened (what composition chose);
        ``probe``: scores the frozen encoder every ``probe.every`` steps (any object with
        ``score(encoder, tokenizer) -> dict``, e.g. ``evaluation.probe.LinearProbe``)."""
        self.cfg, tc, self.probe = cfg, cfg.train, probe
        self.accelerator, self.run_dir, precision, self.resume_from = setup.start(cfg, run_dir)
        for note in notes:
            log.info(note)
        acc = self.accelerator
        self.ckpt_dir = self.run_dir / "checkpoints"
        # a resume is checked against the checkpoint before anything in the run dir is written
        saved = resume.saved_loop_state(self.resume_from) if self.resume_from else {}
        self.changed = resume.check_settings(cfg, saved.get("settings"), self.resume_from) if saved else []
        self.accum = setup.check_engine(acc, cfg)  # before the data: an engine's refusal costs no tokenizing
        # the tokenizer of the checkpoint's own run (another run dir's, with an explicit path)
        run_tokenizer = self.resume_from.parent.parent / RUN_MODEL_DIR if self.resume_from else None
        data = setup.prepare_data(cfg, acc, run_tokenizer if run_tokenizer and run_tokenizer.is_dir() else None)
        if saved:
            resume.check_data(saved, data.corpus, data.train_blocks, self.resume_from)
        self.data_identity = {"corpus": data.corpus, "train_blocks": data.train_blocks}
        self.tokenizer = data.tokenizer
        counts = token_counts(data.baseline_set, data.tokenizer)
        unk, tokens = unk_tokens(data.val_set, data.tokenizer)
        trained_here = not (cfg.tokenizer.name_or_path or cfg.model.init_from)
        line, warn = unk_report(data.tokenizer, unk, tokens, trained_here=trained_here)
        (log.warning if warn else log.info)("Tokenizer: %s", line.replace("held-out", "validation"))
        self.tokenizer_fit = {"validation_unk_share": unk / max(tokens, 1)}
        parts = setup.build_model_parts(cfg, acc, precision, data.tokenizer, self.run_dir, self.resume_from,
                                        counts)
        self.model, self.meter = parts.model, parts.meter
        self.collator = setup.build_collator(cfg, data.tokenizer, acc.process_index)
        stream = training_stream(cfg, self.collator, data.train_set, acc)
        self.eval_batches = fixed_eval_batches(data.val_set, data.tokenizer, cfg.masking, tc.batch_size)
        self.baseline = majority_baseline(counts, self.eval_batches, data.tokenizer)
        self.objective, self.optimizer, self.scheduler = acc.prepare(parts.objective, parts.optimizer,
                                                                     parts.scheduler)
        self.state = TrainState(parts.budget, stream, self.collator, acc.process_index,
                                acc.num_processes, cfg.data.streaming)
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl", enabled=acc.is_main_process)

    def record(self, event: dict[str, Any]) -> None:
        """One event to metrics.jsonl and the trackers."""
        self.metrics.write(event)
        log_event(self.accelerator, event)

    def resume(self) -> None:
        """Restore the checkpoint chosen at setup (none: a new run, whose baseline is logged)."""
        tc = self.cfg.train
        if self.resume_from is None:
            self.metrics.truncate_after(-1)  # resume=auto without a checkpoint: the run starts over
        else:
            if tc.resume == "auto":  # a damaged latest checkpoint falls back to the one before
                self.resume_from, restored = load_latest(self.accelerator, self.ckpt_dir, self.resume_from)
            else:
                restored = load_checkpoint(self.accelerator, self.resume_from)
            self.state.load_state_dict(restored)
            if tc.resume != "auto" and self.accelerator.is_main_process:
                # an older checkpoint than the latest: the later continuation is abandoned
                resume.retire_later(self.run_dir, self.resume_from, self.metrics.events_after(self.state.step))
            self.metrics.truncate_after(self.state.step)
            log.info("Resumed from %s at step %d", self.resume_from, self.state.step)
            if self.changed:
                log.info("Settings changed since the checkpoint, applied: %s", "; ".join(self.changed))
            if any(change.startswith("optim.") for change in self.changed):
                inner = getattr(self.scheduler, "scheduler", self.scheduler)
                resume.apply_optim_settings(self.optimizer, self.scheduler, self.cfg.optim,
                                            inner.lr_lambdas[0](inner.last_epoch))
        start_trackers(self.accelerator, self.cfg.logger, self.run_dir, asdict(self.cfg))
        if self.resume_from is None:
            self.record({"event": "baseline", "step": 0, **self.baseline})
            log.info("Baseline: always predicting %r scores eval accuracy %.4f",
                     self.baseline["baseline_token"], self.baseline["baseline_accuracy"])
            if self.probe is not None:  # the random init, for the curve to start from
                self.run_probe()

    def fit(self) -> dict[str, Any]:
        """Optimizer steps until the first budget is spent; log, evaluate and checkpoint on
        their intervals and at the end. Returns the last evaluation."""
        tc, state, acc = self.cfg.train, self.state, self.accelerator
        self.progress = self._progress_bar()
        self.time_base = state.budget.elapsed(state.step)  # training time before this process (resume)
        self.t_start = time.perf_counter()
        window, last_eval = LogWindow(acc.device), {}
        self.objective.train()
        with StopSignals() as signals, finish_trackers_on_error(acc):
            while not state.budget.done(state.step):
                result = self.train_step()
                window.add(result)
                last = state.budget.done(state.step)
                # log: the step's figures are fetched from the device only here
                if state.step % tc.log_every == 0 or last:
                    self.log(window, result)
                # evaluate on the fixed validation batches
                if (tc.eval_every and state.step % tc.eval_every == 0) or last:
                    last_eval = self._paused(window, self.evaluate)
                # probe the frozen encoder on a labelled task (probe.every)
                if self.probe is not None and (state.step % self.cfg.probe.every == 0 or last):
                    self._paused(window, self.run_probe)
                # checkpoint; a stop signal saves one and ends the run
                stop = signals.requested(acc)
                if tc.save_every and state.step % tc.save_every == 0 and state.bad_steps and not (last or stop):
                    log.warning("Step %d: no checkpoint while steps are skipped as non-finite; the "
                                "next one is saved after a good step.", state.step)
                elif (tc.save_every and state.step % tc.save_every == 0) or last or stop:
                    self._paused(window, self.save)
                if stop:
                    self._close_progress()
                    raise Preempted(f"Stopped by {signals.name} at step {state.step} after saving a "
                                    "checkpoint; continue with train.resume=auto in the same "
                                    "hydra.run.dir.", signum=signals.received)
        self._close_progress()
        return last_eval

    def train_step(self) -> StepResult:
        """One optimizer step, counted in the state; the schedule then moves on."""
        cfg, state = self.cfg, self.state
        m = cfg.masking
        mlm_probability = (m.probability_at(state.step, cfg.train.max_steps) if state.budget.step_only
                           else m.rate_at(state.budget.progress(state.step)))
        self.collator.set_mlm_probability(mlm_probability)  # before the step's batches are collated
        micro = next_micro_batches(state.stream, self.collator, self.accum, m.on_device)
        result = optimizer_step(self.accelerator, self.objective, self.optimizer,
                                self.scheduler.get_last_lr()[0], micro, cfg.optim.max_grad_norm)
        result.mlm_probability = mlm_probability
        count_bad_step(state, result, cfg.train.max_bad_steps)
        state.finish_step(result.tokens)
        self.scheduler.step()  # the rate of the next step, from the budget used so far
        self.optimizer.zero_grad(set_to_none=True)
        if state.budget.max_time and state.step % cfg.train.log_every == 0:
            state.budget.sync(state.step, self._shared_clock())  # the main process's clock
        if self.progress is not None:
            self.progress.update(1)
        return result

    def log(self, window: LogWindow, result: StepResult) -> None:
        """A ``train`` event of the steps since the last one."""
        acc, state = self.accelerator, self.state
        elapsed = max(time.perf_counter() - window.started - window.paused, 1e-9)
        masked = float(window.masked)
        event = {
            "event": "train",
            "step": state.step,
            "loss": float(acc.reduce(window.loss, reduction="sum")) / max(masked, 1.0),
            "lr": result.lr,
            "mlm_probability": result.mlm_probability,
            "grad_norm": float(result.grad_norm),
            "skipped_steps": state.skipped_steps,
            **self.meter.figures(window.tokens, masked, elapsed),  # tokens/s, masked tokens/s, MFU
            "peak_memory_gb": peak_memory_gb(acc.device),
            "tokens_seen": state.tokens_seen,
            "epoch": state.stream.epoch,
            "elapsed_s": self.time_base + time.perf_counter() - self.t_start,
            "global_batch_size": self.cfg.train.batch_size * acc.num_processes * self.accum,
        }
        self.record(event)
        if self.progress is not None:  # tqdm shows the time left itself
            self.progress.set_postfix(loss=f"{event['loss']:.3f}", lr=f"{event['lr']:.2e}",
                                      tok_s=f"{event['tokens_per_s']:.0f}", mfu=f"{event['mfu']:.0%}")
        if not math.isfinite(event["loss"]):
            log.warning("Step %d: loss is %s", state.step, event["loss"])
        window.reset()

    def evaluate(self) -> dict[str, Any]:
        figures = evaluate(self.accelerator, self.objective, self.eval_batches)
        self.record({"event": "eval", "step": self.state.step, **figures})
        log.info("step %d | eval loss %.4f | perplexity %.2f | accuracy %.4f ± %.4f (%d masked tokens)",
                 self.state.step, figures["eval_loss"], figures["eval_perplexity"], figures["eval_accuracy"],
                 figures["eval_accuracy_stderr"], figures["eval_tokens"])
        return figures

    def run_probe(self) -> None:
        """A ``probe`` event: the probe's figures for the encoder as it is now (every rank
        takes part, as sharded weights need; the run's autocast and engine, as its evaluation)."""
        objective, was_training = self.objective, self.objective.training
        objective.eval()
        try:  # through the prepared objective's forward (labels=None: the encoder's states alone)
            with self.accelerator.autocast():
                figures = self.probe.score_encoded(
                    lambda batch: objective(**batch)["last_hidden_state"], self.accelerator.device, self.tokenizer)
        finally:
            objective.train(was_training)
        self.record({"event": "probe", "step": self.state.step, **figures})
        log.info("step %d | probe %s accuracy %.4f (%d training, %d dev examples, %.1f s)", self.state.step,
                 figures.get("probe_task"), figures["probe_accuracy"], figures.get("probe_train_examples", 0),
                 figures.get("probe_eval_examples", 0), figures.get("probe_seconds", 0.0))

    def save(self) -> None:
        loop_state = {**self.state.state_dict(), "settings": asdict(self.cfg), **self.data_identity}
        path = save_checkpoint(self.accelerator, self.ckpt_dir, self.state.step, loop_state,
                               self.cfg.train.keep_last)
        log.info("Saved checkpoint %s", path)

    def final_state(self, last_eval: dict[str, Any]) -> tuple[Any, dict[str, Any], dict[str, Any]] | None:
        """``(plain model, its full weights, summary)`` for ``final/`` on the main process
        (every rank takes part: FSDP and ZeRO-3 gather the weights), None on the others and
        with ``train.export=false``. An empty ``last_eval`` (resumed at the end of the
        budget) is filled with an evaluation of the restored weights."""
        acc, state = self.accelerator, self.state
        acc.wait_for_everyone()
        if not last_eval:
            last_eval.update(evaluate(acc, self.objective, self.eval_batches))
        if not self.cfg.train.export:
            return None
        weights = acc.get_state_dict(self.objective)
        if not acc.is_main_process:
            return None
        summary = {"step": state.step, "tokens_seen": state.tokens_seen, **last_eval, **self.baseline,
                   **self.tokenizer_fit}
        # the training objective wraps the model as .model
        return (acc.unwrap_model(self.objective).model,
                {k.removeprefix("model."): v for k, v in weights.items()}, summary)

    def end(self) -> None:
        """Wait for every rank (the main one writes ``final/`` first), then end the trackers."""
        self.accelerator.wait_for_everyone()
        self.accelerator.end_training()

    def _paused(self, window: LogWindow, job):
        """Run ``job`` (evaluation, a checkpoint) with its time kept out of tokens/s."""
        t0 = time.perf_counter()
        out = job()
        window.paused += time.perf_counter() - t0
        return out

    def _shared_clock(self) -> float:
        """The main process's training seconds, on every rank."""
        seconds = self.time_base + time.perf_counter() - self.t_start
        acc = self.accelerator
        if acc.num_processes == 1:
            return seconds
        t = torch.tensor([seconds if acc.is_main_process else 0.0], dtype=torch.float64, device=acc.device)
        return float(acc.reduce(t, reduction="sum"))

    def _progress_bar(self):
        if not (self.accelerator.is_main_process and self.cfg.train.progress):
            return None
        from tqdm.auto import tqdm

        return tqdm(total=self.cfg.train.max_steps, initial=self.state.step, desc="train", dynamic_ncols=True)

    def _close_progress(self) -> None:
        if self.progress is not None:
            self.progress.close()
            self.progress = None
