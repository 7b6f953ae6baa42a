"""A run's parts and the jobs the loop does between its optimizer steps.

``Trainer(cfg, run_dir)`` sets the run up in named steps (``setup``: run dir and accelerator,
tokenizer and data, model, optimizer and budget); ``resume`` restores a checkpoint if asked
(``TrainState``). The loop itself is ``mlmkit.pretrain.fit``: one optimizer step at a time
(``step.train_step``), and between steps the jobs this class does when they are due: ``log``,
``evaluate`` (``validation``), ``begin_phase`` (a phased run switches its data, masking and
batch), ``run_probe`` and ``checkpoint``. ``final_state`` gathers the weights for the export of
``final/``.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
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
from mlmkit.model.architectures import set_rope_theta
from mlmkit.model.documents import isolation_sep_id
from mlmkit.model.rtd import generator_weights
from mlmkit.training import setup
from mlmkit.training.metrics_log import MetricsLog
from mlmkit.training.perf import peak_memory_gb
from mlmkit.training.phases import begun_phases, phase_changes
from mlmkit.training.progress import Progress
from mlmkit.training.runtime import full_state_dict, unwrap
from mlmkit.training.signals import StopSignals
from mlmkit.training.state import TrainState
from mlmkit.training.step import SkipCount, StepResult
from mlmkit.training.tracking import log_event, start_trackers
from mlmkit.training.validation import evaluate, fixed_eval_batches, majority_baseline

log = logging.getLogger("mlmkit")


class LogWindow:
    """The figures of the steps since the last log event (device tensors until then)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.sums: torch.Tensor | None = None  # this rank's sums (the objective's ``stats``)
        self.counts: torch.Tensor | None = None  # tokens of each loss term, all ranks
        self.blocks: Counter = Counter()  # this rank's attended blocks by length (the meter's)
        self.data_wait = 0.0  # seconds the host waited for batches
        self.started, self.paused = time.perf_counter(), 0.0  # paused: eval and checkpoints

    def add(self, result: StepResult) -> None:
        self.sums = result.sums if self.sums is None else self.sums + result.sums
        self.counts = result.counts if self.counts is None else self.counts + result.counts
        self.blocks.update(result.blocks)
        self.data_wait += result.data_wait


class Trainer:
    """A run: its parts (built by ``setup``), its state, and the loop over them."""

    def __init__(
        self,
        cfg: Config,
        run_dir: Path,
        notes: Sequence[str] = (),
        probe=None,
        on_phase_end=None,
        on_open=None,
    ) -> None:
        """Set up the trainer. ``notes``: lines for the log from before it opened (what composition
        chose); ``probe``: scores the frozen encoder every ``probe.every`` steps (any object with
        ``score(encoder, tokenizer) -> dict``, e.g. ``evaluation.probe.LinearProbe``);
        ``on_phase_end(trainer, name, last_eval)``: called on every rank when a phase ends
        (``mlmkit.pretrain`` writes ``phases/<name>/``); ``on_open(run_dir)``: called on the
        main process once every check has passed, before the run writes into its run dir (the
        command line's record of its settings). ``self.cfg`` holds the current phase's
        settings, ``self.run_cfg`` the run's. Nothing is written into the run dir before
        ``resume`` (or ``start_fit``) has checked the checkpoint it continues."""
        self.run_cfg, self.probe, self.on_phase_end, self.on_open = (
            cfg,
            probe,
            on_phase_end,
            on_open,
        )
        self.opened = False
        self.skips = SkipCount()  # steps skipped as non-finite, counted on the device
        self.accelerator, self.run_dir, precision, self.checkpoints = setup.start(cfg, run_dir)
        for note in notes:
            log.info(note)
        saved = self._check_resume()
        data = self._prepare_data(saved)
        counts = self._report_tokenizer(data)
        self._build_parts(
            precision, counts, begun=begun_phases(cfg, saved.get("phases"), self.resume_from)
        )
        self.use_data(data)
        self.baseline = majority_baseline(counts, self.eval_batches, data.tokenizer)
        self.metrics = MetricsLog(
            self.run_dir / "metrics.jsonl", enabled=self.accelerator.is_main_process
        )
        self.last_eval, self.last_eval_step = {}, -1
        self.window, self.progress = LogWindow(self.accelerator.device), None

    def _check_resume(self) -> dict[str, Any]:
        """Return the checkpoint's loop state ({} for a new run), its settings checked against this
        run's before anything in the run dir is written; the phase the run continues in."""
        cfg = self.run_cfg
        saved = self.checkpoints.saved
        self.checkpoints.check_settings(cfg)
        starts = begun_phases(cfg, saved.get("phases") if saved else None, self.resume_from)
        self.cfg = cfg.phase_configs()[max(len(starts), 1) - 1] if cfg.phases else cfg
        # before the data: an engine's refusal costs no tokenizing
        self.accum = self.step_accum = setup.check_engine(self.accelerator, self.cfg, cfg.phases)
        return saved

    def _prepare_data(self, saved: dict[str, Any]):
        """Prepare the tokenizer and data of the current phase; a resume's data must be the
        checkpoint's."""
        # the tokenizer of the checkpoint's own run (another run dir's, with an explicit path)
        data = setup.prepare_data(self.cfg, self.accelerator, self.checkpoints.run_tokenizer())
        self.checkpoints.check_data(data.corpus, data.train_blocks)
        self.tokenizer = data.tokenizer
        return data

    def _report_tokenizer(self, data):
        """Log the share of [UNK] in the validation text; the training blocks' token counts."""
        unk, tokens = unk_tokens(data.val_set, data.tokenizer)
        cfg = self.run_cfg
        trained_here = not (cfg.tokenizer.name_or_path or cfg.model.init_from)
        extended = cfg.tokenizer.extend_vocab if not trained_here else 0
        line, warn = unk_report(
            data.tokenizer, unk, tokens, trained_here=trained_here, extended=extended
        )
        (log.warning if warn else log.info)("Tokenizer: %s", line.replace("held-out", "validation"))
        self.tokenizer_fit = {"validation_unk_share": unk / max(tokens, 1)}
        return token_counts(data.baseline_set, data.tokenizer)

    def _build_parts(self, precision: str, counts, begun: list) -> None:
        """Build the model and objective, the optimizer and its schedule, the budget, the collator
        and the loop's state, prepared by the accelerator."""
        acc = self.accelerator
        model = setup.build_run_model(
            self.cfg, acc, precision, self.tokenizer, self.checkpoints, counts, run_cfg=self.run_cfg
        )
        self.model, self.meter = (
            model.model,
            setup.build_meter(self.cfg, acc, precision, model.model, model.objective),
        )
        schedule = setup.build_schedule(
            self.cfg, acc, model.objective, run_cfg=self.run_cfg, accum=self.accum
        )
        self.plan, self.ramp = schedule.plan, schedule.ramp
        if self.plan is not None:
            self.plan.starts = begun
        self.collator = setup.build_collator(self.cfg, self.tokenizer, acc.process_index)
        self.objective, self.optimizer, self.scheduler = acc.prepare(
            model.objective, schedule.optimizer, schedule.scheduler
        )
        self.state = TrainState(
            schedule.budget,
            None,
            self.collator,
            acc.process_index,
            acc.num_processes,
            self.run_cfg.data.streaming,
        )

    def use_data(self, data, collator=None) -> None:
        """Train and evaluate on ``data`` under the current phase's settings (``self.cfg``):
        its stream and eval batches; the model takes the phase's RoPE bases and document
        isolation; ``collator``: a new phase's."""
        cfg, acc = self.cfg, self.accelerator
        self.data_identity = {"corpus": data.corpus, "train_blocks": data.train_blocks}
        if collator is not None:
            self.collator = self.state.collator = collator
        objective = unwrap(acc, self.objective)
        objective.document_sep_id = isolation_sep_id(cfg.data.packing, data.tokenizer)
        # flash-attn's variable-length kernel takes batches the loader flattened (model.documents)
        varlen = objective.model.config._attn_implementation == "flash_attention_2"
        self.state.stream = training_stream(
            cfg, self.collator, data.train_set, acc, objective.document_sep_id, varlen
        )
        self.eval_batches = fixed_eval_batches(
            data.val_set, data.tokenizer, cfg.masking, cfg.train.batch_size, self.collator.draws
        )
        set_rope_theta(objective.model, cfg.model.global_rope_theta, cfg.model.local_rope_theta)

    def begin_phase(self) -> None:
        """End the current phase (evaluated, ``on_phase_end``) and switch to the next one: its
        data, masking, batch and learning rate, logged as a ``phase`` event."""
        state, old = self.state, self.cfg
        if self.plan.index >= 0:
            log.info(
                "Phase %s ends at step %d (%s tokens)",
                self.plan.name,
                state.step,
                f"{state.tokens_seen:,}",
            )
            if self.last_eval_step != state.step:
                self.evaluate()
            if self.on_phase_end is not None:
                self.on_phase_end(self, self.plan.name, dict(self.last_eval))
        index = self.plan.begin(state.step, state.tokens_seen, state.budget.elapsed(state.step))
        self.cfg = self.plan.config(index)
        if index > 0:  # the first phase's data is the run's own, prepared at setup
            self.accum = setup.check_engine(self.accelerator, self.cfg)
            if self.ramp is not None:
                self.ramp.retarget(
                    self.cfg.train.batch_size * self.accelerator.num_processes, self.accum
                )
            data = setup.prepare_data(self.cfg, self.accelerator, tokenizer=self.tokenizer)
            # the phase's masking; the mask generator carries on
            self.use_data(
                data,
                setup.build_collator(
                    self.cfg,
                    self.tokenizer,
                    self.accelerator.process_index,
                    generator=self.collator.generator,
                ),
            )
        refresh_lr(self.scheduler)
        phase = self.plan.phases[index]
        changes = phase_changes(old, self.cfg, phase.set)
        start, end = self.plan.span(index)
        self.record(
            {
                "event": "phase",
                "step": state.step,
                "phase": phase.name,
                "index": index,
                "share": round(end - start, 6),
                "schedule": phase.schedule,
                "lr": self.scheduler.get_last_lr()[0],
                "changes": changes,
                "max_seq_length": self.cfg.data.max_seq_length,
                "global_batch_size": self.global_batch(),
            }
        )
        log.info(
            "Phase %d/%d %s from step %d (%.0f%% of the budget; learning rate %s from %s; %s)%s",
            index + 1,
            len(self.plan.phases),
            phase.name,
            state.step,
            100 * (end - start),
            phase.schedule,
            f"{self.scheduler.get_last_lr()[0]:.3g}",
            f"{self.cfg.data.max_seq_length} tokens x {self.global_batch()} sequences",
            "; " + ", ".join(f"{k}={v}" for k, v in changes.items()) if changes else "",
        )

    def global_batch(self, accum: int | None = None) -> int:
        """Sequences per optimizer step (``accum``: micro-batches; the phase's by default)."""
        return self.cfg.train.batch_size * self.accelerator.num_processes * (accum or self.accum)

    def record(self, event: dict[str, Any]) -> None:
        """One event to metrics.jsonl and the trackers (a phased run's name its phase)."""
        if self.plan is not None and self.plan.index >= 0:
            event.setdefault("phase", self.plan.name)
        self.metrics.write(event)
        log_event(self.accelerator, event)

    def resume(self) -> None:
        """Restore the checkpoint chosen at setup (none: a new run, whose baseline is logged)."""
        if self.resume_from is None:
            self.open_run_dir()
            self.metrics.truncate_after(-1)  # resume=auto without a checkpoint: the run starts over
        else:
            restored = self.checkpoints.load(self.accelerator, self.state)
            self.open_run_dir()  # the checkpoint restored: every check has passed
            later = self.metrics.events_after(self.state.step)
            self.checkpoints.settle(
                self.accelerator, self.state.step, later, self.optimizer, self.scheduler,
                self.cfg.optim,
            )  # fmt: skip
            self.metrics.truncate_after(self.state.step)
            self.log_batch_change(restored)
        start_trackers(self.accelerator, self.cfg.logger, self.run_dir, asdict(self.run_cfg))
        if self.resume_from is None:
            if self.plan is not None:
                self.begin_phase()
            self.record({"event": "baseline", "step": 0, **self.baseline})
            log.info(
                "Baseline: always predicting %r scores eval accuracy %.4f",
                self.baseline["baseline_token"],
                self.baseline["baseline_accuracy"],
            )
            if self.probe is not None:  # the random init, for the curve to start from
                self.run_probe()

    @property
    def resume_from(self) -> Path | None:
        """The checkpoint the run continues from (None: a new run)."""
        return self.checkpoints.resume_from

    def log_batch_change(self, restored: dict[str, Any]) -> None:
        """One line where the checkpoint's run took another global batch than this one takes
        (another number of processes with train.grad_accum_steps fixed)."""
        saved, now = restored.get("global_batch_size"), self.global_batch()
        if restored.get("world_size") == self.accelerator.num_processes or saved in (None, now):
            return
        log.warning(
            "The global batch is now %d sequences (%d process(es) x %d x %d accumulation "
            "step(s)), where the checkpoint's run took %d; set train.global_batch_size=%d to "
            "keep it.",
            now,
            self.accelerator.num_processes,
            self.cfg.train.batch_size,
            self.accum,
            saved,
            saved,
        )

    def open_run_dir(self) -> None:
        """From here on the run writes into its run dir (``setup.open_run_dir``; once)."""
        if self.opened:
            return
        self.opened = True
        if self.accelerator.is_main_process:
            setup.open_run_dir(self.run_dir, self.model, self.tokenizer)
            if self.on_open is not None:
                self.on_open(self.run_dir)
        self.accelerator.wait_for_everyone()

    # ---- the loop's jobs (mlmkit.pretrain.fit calls them in order) ----------------------------

    def start_fit(self) -> None:
        """Start the clock, the log window and the progress display of this process's steps."""
        self.open_run_dir()
        state = self.state
        self.progress = Progress(
            state.budget,
            state.step,
            enabled=self.accelerator.is_main_process and self.cfg.train.progress,
        )
        self.time_base = state.budget.elapsed(
            state.step
        )  # training time before this process (resume)
        self.t_start = time.perf_counter()
        self.window.reset()
        self.objective.train()

    def end_fit(self) -> None:
        self.progress.close()

    def done(self) -> bool:
        """Whether the first budget is spent."""
        return self.state.budget.done(self.state.step)

    def log_due(self, last: bool) -> bool:
        return self.state.step % self.cfg.train.log_every == 0 or last

    def eval_due(self, last: bool) -> bool:
        every = self.cfg.train.eval_every
        return bool(every and self.state.step % every == 0) or last

    def phase_due(self) -> bool:
        return self.plan is not None and self.plan.due(self.state.step)

    def probe_due(self, last: bool) -> bool:
        return self.probe is not None and (self.state.step % self.cfg.probe.every == 0 or last)

    def stop_requested(self, signals: StopSignals, last: bool) -> bool:
        """Whether a stop signal came (several processes agree at log and checkpoint steps,
        where the host waits anyway)."""
        tc, step = self.cfg.train, self.state.step
        return signals.requested(
            self.accelerator,
            everywhere=bool(tc.save_every and step % tc.save_every == 0)
            or last
            or step % tc.log_every == 0,
        )

    def checkpoint(self, last: bool, stop: bool) -> None:
        """Save a checkpoint at its interval, at the end, and on a stop request; while steps are
        skipped as non-finite only at the end or a stop (the count is read from the device here)."""
        tc, state = self.cfg.train, self.state
        due = bool(tc.save_every) and state.step % tc.save_every == 0
        if not (due or last or stop):
            return
        self.skips.settle(state, tc.max_bad_steps, self.last_grad_norm)
        if due and state.bad_steps and not (last or stop):
            log.warning(
                "Step %d: no checkpoint while steps are skipped as non-finite; the next one is "
                "saved after a good step.",
                state.step,
            )
            return
        self.paused(self.save)

    def stopped(self, signals: StopSignals) -> Preempted:
        """Return the error that ends a run stopped by a signal, after its checkpoint."""
        self.end_fit()
        return Preempted(
            f"Stopped by {signals.name} at step {self.state.step} after saving a checkpoint; "
            "continue with train.resume=auto in the same hydra.run.dir.",
            signum=signals.received,
        )

    def paused(self, job):
        """Run ``job`` (evaluation, a checkpoint, a phase's switch) with its time kept out of
        tokens/s."""
        t0 = time.perf_counter()
        out = job()
        self.window.paused += time.perf_counter() - t0
        return out

    def log(self, result: StepResult) -> None:
        """Log a ``train`` event of the steps since the last one (their skipped steps read from the
        device first)."""
        acc, state, window = self.accelerator, self.state, self.window
        objective = unwrap(acc, self.objective)
        self.skips.settle(state, self.cfg.train.max_bad_steps, result.grad_norm)
        elapsed = max(time.perf_counter() - window.started - window.paused, 1e-9)
        sums = acc.reduce(window.sums, reduction="sum").tolist()
        counts = window.counts.tolist()
        masked = counts[0]
        event = {
            "event": "train",
            "step": state.step,
            # the objective's figures: its loss (MLM's over the chosen tokens), its parts
            **objective.figures(sums, counts),
            "lr": result.lr,
            "mlm_probability": result.mlm_probability,
            "grad_norm": float(result.grad_norm),
            "skipped_steps": state.skipped_steps,
            # real tokens/s (no padding), masked tokens/s, model TFLOP/s and MFU
            **self.meter.figures(window.blocks, masked, elapsed, acc.num_processes),
            "data_wait_share": min(
                window.data_wait / elapsed, 1.0
            ),  # of the steps' time: the loader's
            "peak_memory_gb": peak_memory_gb(acc.device),
            "tokens_seen": state.tokens_seen,
            "epoch": state.stream.epoch,
            "elapsed_s": self.time_base + time.perf_counter() - self.t_start,
            "global_batch_size": self.global_batch(self.step_accum),  # the last step's
        }
        self.record(event)
        warning = objective.warning(event)
        if warning:
            log.warning(warning)
        self.progress.show(
            loss=f"{event['loss']:.3f}",
            lr=f"{event['lr']:.2e}",
            tok_s=f"{event['tokens_per_s']:.0f}",
            mfu=f"{event['mfu']:.0%}",
        )
        if not math.isfinite(event["loss"]):
            log.warning("Step %d: loss is %s", state.step, event["loss"])
        window.reset()

    def evaluate(self) -> dict[str, Any]:
        figures = evaluate(self.accelerator, self.objective, self.eval_batches)
        self.record({"event": "eval", "step": self.state.step, **figures})
        self.last_eval, self.last_eval_step = figures, self.state.step
        log.info(
            "step %d | eval loss %.4f | perplexity %.2f | accuracy %.4f ± %.4f (%d masked tokens)",
            self.state.step,
            figures["eval_loss"],
            figures["eval_perplexity"],
            figures["eval_accuracy"],
            figures["eval_accuracy_stderr"],
            figures["eval_tokens"],
        )
        return figures

    def run_probe(self) -> None:
        """Log a ``probe`` event: the probe's figures for the encoder as it is now (every rank
        takes part, as sharded weights need; the run's autocast and engine, as its evaluation)."""
        objective, was_training = self.objective, self.objective.training
        objective.eval()
        try:  # through the prepared objective's forward (labels=None: the encoder's states alone)
            with self.accelerator.autocast():
                figures = self.probe.score_encoded(
                    lambda batch: objective(**batch)["last_hidden_state"],
                    self.accelerator.device,
                    self.tokenizer,
                )
        finally:
            objective.train(was_training)
        self.record({"event": "probe", "step": self.state.step, **figures})
        log.info(
            "step %d | probe %s accuracy %.4f (%d training, %d dev examples, %.1f s)",
            self.state.step,
            figures.get("probe_task"),
            figures["probe_accuracy"],
            figures.get("probe_train_examples", 0),
            figures.get("probe_eval_examples", 0),
            figures.get("probe_seconds", 0.0),
        )

    def save(self) -> None:
        loop_state = {
            **self.state.state_dict(),
            "global_batch_size": self.global_batch(),
            "settings": asdict(self.run_cfg),
            **self.data_identity,
            **({"phases": self.plan.state_dict()} if self.plan is not None else {}),
        }
        self.checkpoints.save(
            self.accelerator, self.state.step, loop_state, self.cfg.train.keep_last
        )

    def final_state(self, last_eval: dict[str, Any]) -> tuple | None:
        """``(plain model, its full weights, summary, generator)`` for ``final/`` on the main
        process (every rank takes part: FSDP and ZeRO-3 gather the weights), None on the others
        and with ``train.export=false``; ``generator``: replaced-token detection's generator and
        its full weights (None for a masked-LM run). An empty ``last_eval`` (resumed at the end
        of the budget) is filled with an evaluation of the restored weights."""
        acc, state = self.accelerator, self.state
        acc.wait_for_everyone()
        if not last_eval:
            last_eval.update(evaluate(acc, self.objective, self.eval_batches))
        if not self.cfg.train.export:
            return None
        weights = full_state_dict(acc, self.objective)
        if not acc.is_main_process:
            return None
        summary = {
            "step": state.step,
            "tokens_seen": state.tokens_seen,
            **last_eval,
            **self.baseline,
            **self.tokenizer_fit,
        }
        if self.plan is not None:
            begun = self.plan.starts[self.plan.index]
            summary.update(
                {
                    "phase": self.plan.name,
                    "phase_steps": state.step - begun["step"],
                    "phase_tokens": state.tokens_seen - begun["tokens"],
                }
            )
        # the training objective wraps the model as .model (replaced-token detection also holds
        # a generator, exported beside it, and a discriminator head, kept in checkpoints only)
        objective = unwrap(acc, self.objective)
        generator = getattr(objective, "generator", None)
        return (
            objective.model,
            {k.removeprefix("model."): v for k, v in weights.items() if k.startswith("model.")},
            summary,
            (generator, generator_weights(weights)) if generator is not None else None,
        )

    def end(self) -> None:
        """Wait for every rank (the main one writes ``final/`` first), then end the trackers."""
        self.accelerator.wait_for_everyone()
        self.accelerator.end_training()

    def shared_clock(self) -> float:
        """Return the main process's training seconds, on every rank."""
        seconds = self.time_base + time.perf_counter() - self.t_start
        acc = self.accelerator
        if acc.num_processes == 1:
            return seconds
        t = torch.tensor(
            [seconds if acc.is_main_process else 0.0], dtype=torch.float64, device=acc.device
        )
        return float(acc.reduce(t, reduction="sum"))


def refresh_lr(scheduler) -> None:
    """Set the learning rate of the next step from the schedule as it now stands (a new phase)."""
    inner = getattr(scheduler, "scheduler", scheduler)  # accelerate wraps the scheduler
    factors = [fn(inner.last_epoch) for fn in inner.lr_lambdas]
    for group, base, factor in zip(inner.optimizer.param_groups, inner.base_lrs, factors):
        group["lr"] = base * factor
    inner._last_lr = [g["lr"] for g in inner.optimizer.param_groups]
