"""The one fine-tuning loop and its run: ``mlmkit finetune`` for every kind of task.

    mlmkit finetune checkpoint=outputs/<run> task=sst2 task.data_dir=../shared/data/glue/SST-2
    mlmkit finetune checkpoint=outputs/<run> task=files task.train_file=a.csv task.eval_file=b.csv
    mlmkit finetune ... init=random          # same architecture from scratch
    mlmkit finetune ... pooling=cls          # classify from the [CLS] state (default: the mean)

The task (``mlmkit.finetune.task.Task``: a reader, a head, a decoder/scorer) reads its
examples, names its labels in the model's config and turns examples into features; the loop
trains the model (``mlmkit.finetune.model.build_model``: the task's head on the checkpoint's
encoder) for ``epochs`` (null: from the data's size) with AdamW at ``lr`` (null: by the
encoder's width) and a linear schedule, and after every epoch runs the evaluation features through
it, has the task decode and score them and logs the figures (``metrics.jsonl``'s ``eval`` events,
with the training's tokens/s). The epoch with the best headline figure is kept (``keep_best``),
and ``patience`` epochs without a better one end the training. At the end it writes
``<run dir>/results.json``, the kept epoch's predictions (``eval_predictions.jsonl``) and
model (a plain model dir, its labels in ``id2label``) to ``<run dir>/model``, which
``mlmkit predict`` and transformers' pipelines serve. Settings: conf/finetune.yaml and
conf/task/.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mlmkit.config import FinetuneConfig, OptimConfig, TaskConfig
from mlmkit.errors import ConfigError
from mlmkit.finetune.model import (
    FrozenEncoderCache,
    build_model,
    continues,
    freeze_encoder,
    load_head,
)
from mlmkit.finetune.sequence import SequenceTask
from mlmkit.finetune.spans import SpanTask
from mlmkit.finetune.task import LengthBatches, Task
from mlmkit.finetune.tokens import TokenTask
from mlmkit.training.metrics_log import MetricsLog
from mlmkit.training.optim import build_optimizer, build_scheduler
from mlmkit.training.runtime import resolve_precision, runs_on_cpu, save_model, unwrap
from mlmkit.training.trained_model import load_model_and_tokenizer

log = logging.getLogger("mlmkit")


def task_of(cfg: TaskConfig) -> Task:
    """Return the task object of ``cfg``, by its kind."""
    if cfg.kind == "tokens":
        return TokenTask(cfg)
    if cfg.kind == "qa":
        return SpanTask(cfg)
    return SequenceTask(cfg)


@dataclass
class Run:
    """What the loop works with: the prepared model, optimizer, schedule and loaders, the task
    and its evaluation features."""

    accelerator: Any
    model: Any
    optimizer: Any
    scheduler: Any
    train_loader: Any
    eval_loader: Any
    task: Task
    eval_features: list
    eval_examples: list
    metrics: MetricsLog


# ---- loop -----------------------------------------------------------------------------------


@torch.no_grad()
def evaluation_outputs(run: Run) -> list[torch.Tensor]:
    """Return the task's outputs (``Task.outputs``) of every evaluation feature, in the
    features' order, gathered from every process; a row padded past its feature is cut at
    decoding."""
    accelerator, model = run.accelerator, run.model
    model.eval()
    found: dict[int, torch.Tensor] = {}
    for batch in run.eval_loader:
        index = batch.pop("index")
        inputs = {k: v for k, v in batch.items() if k not in run.task.targets}
        out = run.task.outputs(model(**inputs))
        if out.dim() > 2 and accelerator.num_processes > 1:
            out = accelerator.pad_across_processes(out, dim=1)
        index, out = accelerator.gather_for_metrics((index, out))
        found.update(zip(index.tolist(), out.cpu()))
    model.train()
    return [found[i] for i in range(len(run.eval_features))]


def evaluate(run: Run) -> tuple[dict[str, Any], list[Any]]:
    """Return the task's figures on the evaluation set and its predictions (one per example)."""
    outputs = evaluation_outputs(run)
    predictions = run.task.decode(outputs, run.eval_features, run.eval_examples)
    return run.task.score(predictions, run.eval_examples), predictions


def train_epoch(run: Run, step: int, total: int) -> tuple[int, float, int]:
    """Step over the training loader until it ends or ``total`` steps are taken; returns the
    step reached, the mean training loss and the tokens (padding excluded) of all processes."""
    accelerator, model, optimizer = run.accelerator, run.model, run.optimizer
    loss_sum, n = 0.0, 0
    tokens = torch.zeros((), dtype=torch.long, device=accelerator.device)
    for batch in run.train_loader:
        batch.pop("index", None)
        tokens += batch["attention_mask"].sum()  # on the device: no wait for it here
        loss = model(**batch).loss
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        run.scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        loss_sum, n = loss_sum + float(loss.detach()), n + 1
        if step >= total:
            break
    return step, loss_sum / max(n, 1), int(accelerator.reduce(tokens, "sum"))


def figures_line(figures: dict[str, Any]) -> str:
    """``name value | ...`` of the figures that are numbers (per-type tables left out)."""
    return " | ".join(f"{k} {v:.4f}" for k, v in figures.items() if isinstance(v, float))


def fit(
    run: Run, total: int, keep_best: bool = True, patience: int | None = None
) -> tuple[int, dict[str, Any], list[Any]]:
    """``total`` optimizer steps, the evaluation set scored after every epoch (and the last
    step); returns the steps taken, the kept ``eval`` event and the predictions it scored.
    ``keep_best``: the epoch with the best headline figure is kept (its weights put back at the
    end), else the last; ``patience``: the training stops after that many epochs without a
    better headline figure."""
    step, epoch = 0, 0
    last: dict[str, Any] = {}
    predictions: list[Any] = []
    best: tuple[float, dict[str, Any], list[Any], dict[str, torch.Tensor]] | None = None
    since_best = 0
    headline = f"eval_{run.task.headline}"
    run.model.train()
    while step < total:
        started = time.perf_counter()
        step, train_loss, tokens = train_epoch(run, step, total)
        seconds = time.perf_counter() - started
        epoch += 1
        figures, predictions = evaluate(run)
        last = {
            "event": "eval",
            "step": step,
            "epoch": epoch,
            "train_loss": train_loss,
            "tokens_per_s": tokens / max(seconds, 1e-9),
            **{f"eval_{k}": v for k, v in figures.items()},
        }
        run.metrics.write(last)
        log.info(
            "epoch %d | step %d | train loss %.4f | %.0f tokens/s | %s",
            epoch,
            step,
            train_loss,
            last["tokens_per_s"],
            figures_line(figures),
        )
        score = float(last.get(headline, float("nan")))
        if best is None or score > best[0]:  # a NaN figure is never better
            weights = {}
            if keep_best and step < total:  # the last epoch's weights are in the model already
                model = unwrap(run.accelerator, run.model)
                weights = {
                    k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()
                }
            best, since_best = (score, last, predictions, weights), 0
        else:
            since_best += 1
            if patience is not None and since_best >= patience and step < total:
                log.info(
                    "Stopping after epoch %d: %s has not improved on epoch %d's %.4f for %d "
                    "epoch(s) (patience=%d)",
                    epoch, headline, best[1]["epoch"], best[0], since_best, patience,
                )  # fmt: skip
                break
    if not keep_best or best is None or best[1] is last:
        return step, {**last, "epochs": epoch}, predictions
    score, kept, predictions, weights = best
    unwrap(run.accelerator, run.model).load_state_dict(weights)
    run.task.keep({k.removeprefix("eval_"): v for k, v in kept.items() if k.startswith("eval_")})
    log.info(
        "Kept epoch %d of %d, the best %s (%.4f; the last epoch's: %.4f); keep_best=false keeps "
        "the last",
        kept["epoch"], epoch, headline, score, float(last.get(headline, float("nan"))),
    )  # fmt: skip
    return step, {**kept, "epochs": epoch}, predictions


# ---- the run --------------------------------------------------------------------------------


def check_new_run_dir(run_dir: Path, what: str) -> None:
    """Refuse a run dir that holds anything already (an earlier fine-tuning's results and model,
    a pretraining run): a second command there would overwrite it. ``what``: the command's
    kind of run, for the message."""
    try:
        held = sorted(p.name for p in run_dir.iterdir())
    except FileNotFoundError:
        return
    except NotADirectoryError:
        held = [run_dir.name]
    if held:
        shown = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
        raise ConfigError(
            f"The run dir {str(run_dir)!r} is not empty ({shown}); a {what} writes "
            "only into a new or empty folder, so that nothing there is overwritten: "
            "choose a new hydra.run.dir."
        )


def data_loaders(
    cfg: FinetuneConfig, task: Task, tokenizer, train_features, eval_features
) -> tuple[Any, Any]:
    """Return the training loader (shuffled by ``cfg.seed``; a task of windows batches them by
    length) and the evaluation set's loader."""
    from torch.utils.data import DataLoader

    collate = task.collate(tokenizer, cfg.max_seq_length)
    if task.group_by_length:
        lengths = [len(f["input_ids"]) for f in train_features]
        train_loader = DataLoader(
            train_features,
            batch_sampler=LengthBatches(lengths, cfg.batch_size, seed=cfg.seed),
            collate_fn=collate,
        )
        lengths = [len(f["input_ids"]) for f in eval_features]
        eval_loader = DataLoader(
            eval_features,
            batch_sampler=LengthBatches(lengths, cfg.batch_size * 2),
            collate_fn=collate,
        )
        return train_loader, eval_loader
    train_loader = DataLoader(
        train_features,
        batch_size=cfg.batch_size,
        shuffle=True,
        collate_fn=collate,
        generator=torch.Generator().manual_seed(cfg.seed),
        drop_last=False,
    )
    eval_loader = DataLoader(eval_features, batch_size=cfg.batch_size * 2, collate_fn=collate)
    return train_loader, eval_loader


# Defaults where ``epochs`` or ``lr`` is null (docs/benchmarks.md, "Fine-tuning defaults", has the
# measurements): enough passes for AUTO_STEPS optimizer steps, within AUTO_EPOCHS; a learning rate
# by the encoder's width, the first of AUTO_LRS whose width is at least the model's.
AUTO_STEPS = 1000
AUTO_EPOCHS = (3, 20)
AUTO_LRS = ((128, 1e-3), (256, 3e-4), (512, 1e-4), (None, 3e-5))
PROBE_LR = 1e-3  # freeze_encoder=true: the pooler and classifier alone


def auto_lr(width: int, frozen: bool = False) -> float:
    """Return the learning rate of ``lr: null`` for an encoder ``width`` wide."""
    if frozen:
        return PROBE_LR
    return next(lr for w, lr in AUTO_LRS if w is None or width <= w)


def resolve_schedule(
    cfg: FinetuneConfig, width: int, steps_per_epoch: int
) -> tuple[float, float, list[str]]:
    """``(epochs, lr)`` of ``cfg`` where set, else chosen from the data and the model; with a
    phrase for each chosen one, for the log."""
    chosen = []
    epochs = cfg.epochs
    if epochs is None:
        low, high = AUTO_EPOCHS
        epochs = float(min(high, max(low, math.ceil(AUTO_STEPS / steps_per_epoch))))
        chosen.append(
            f"epochs {epochs:g} (passes for {AUTO_STEPS:,} optimizer steps, within {low} to "
            f"{high} epochs; epochs=N sets them)"
        )
    lr = cfg.lr
    if lr is None:
        lr = auto_lr(width, cfg.freeze_encoder)
        why = "a frozen encoder" if cfg.freeze_encoder else f"an encoder {width} wide"
        chosen.append(f"lr {lr:g} (for {why}; lr=X sets it)")
    return epochs, lr, chosen


def optimizer_and_schedule(
    cfg: FinetuneConfig, model, accelerator, train_examples: int
) -> tuple[Any, Any, int]:
    """Return the optimizer, its linear schedule with warmup, and the number of steps."""
    steps_per_epoch = math.ceil(train_examples / (cfg.batch_size * accelerator.num_processes))
    epochs, lr, chosen = resolve_schedule(
        cfg, int(getattr(model.config, "hidden_size", 768)), steps_per_epoch
    )
    if chosen:
        log.info("Chose %s", "; ".join(chosen))
    total = max(1, round(epochs * steps_per_epoch))
    optim = OptimConfig(
        lr=lr,
        weight_decay=cfg.weight_decay,
        beta2=0.999,
        eps=1e-8,
        warmup_steps=int(cfg.warmup_ratio * total),
        schedule="linear",
    )
    optimizer = build_optimizer(model, optim, accelerator.device.type)
    return optimizer, build_scheduler(optimizer, optim, total), total


def summarize(
    cfg: FinetuneConfig,
    task: Task,
    source,
    steps: int,
    sizes: tuple[int, int],
    started: float,
    results: dict[str, Any],
    run_dir: Path,
    baseline: dict[str, Any],
) -> dict[str, Any]:
    """Return what results.json holds: the run's settings, sizes and time, the figures."""
    return {
        "task": cfg.task.name,
        "kind": cfg.task.kind,
        "headline": task.headline,
        "checkpoint": str(source),
        "init": cfg.init,
        **({"pooling": task.pooling} if isinstance(task, SequenceTask) else {}),
        "steps": steps,
        "epoch": results.get("epoch"),  # the kept one (keep_best: the best on the dev set)
        "epochs": results.get("epochs"),  # those trained (patience: fewer than planned)
        "train_examples": sizes[0],
        "eval_examples": sizes[1],
        "seconds": round(time.perf_counter() - started, 1),
        "tokens_per_s": round(results.get("tokens_per_s", 0.0), 1),
        **task.summary(),
        "model": str(run_dir / "model") if cfg.save_model else None,
        **{k: v for k, v in results.items() if k.startswith("eval_")},
        **({"baseline": baseline} if baseline else {}),
    }


def open_run(cfg: FinetuneConfig, run_dir: Path, on_open) -> tuple[Any, Task, Any, Any, Any]:
    """Check the run dir, start the accelerator, load the checkpoint and the task's examples,
    build the model; returns ``(accelerator, task, model, tokenizer, checkpoint)`` and the
    examples in ``task.train``/``task.eval``."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    check_new_run_dir(run_dir, "fine-tuning")
    use_cpu = runs_on_cpu()
    accelerator = Accelerator(
        cpu=use_cpu,
        mixed_precision=resolve_precision(cfg.precision, use_cpu=use_cpu, setting="precision"),
    )
    # every rank has found the run dir empty before one writes there
    accelerator.wait_for_everyone()
    set_seed(cfg.seed)
    mlm, tokenizer, source = load_model_and_tokenizer(cfg.checkpoint)
    task = task_of(cfg.task)
    tokenizer = task.tokenizer_for(tokenizer)
    continued = cfg.init == "pretrained" and continues(cfg.task, mlm, source)
    task.train, task.eval = task.load()  # before the head: its labels may come from the data
    model = build_model(cfg, task, mlm)
    del mlm
    if continued:
        load_head(model, source)
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        if on_open is not None:
            on_open(run_dir)
    return accelerator, task, model, tokenizer, source


def finetune(
    cfg: FinetuneConfig, run_dir: str | os.PathLike, on_open: Callable[[Path], None] | None = None
) -> dict[str, Any]:
    """Fine-tune and evaluate after every epoch into ``run_dir`` (a new or empty folder); returns
    the final figures (and where the model was saved, ``model``). ``on_open(run_dir)`` is called
    on the main process once every check has passed, before anything is written there."""
    return finetune_scored(cfg, run_dir, on_open)[0]


def finetune_scored(
    cfg: FinetuneConfig, run_dir: str | os.PathLike, on_open: Callable[[Path], None] | None = None
) -> tuple[dict[str, Any], Task, list[Any]]:
    """``finetune``, returning as well the task (its evaluation examples in ``task.eval``, its
    ``score``) and the last evaluation's predictions, one per example (``mlmkit scorecard``
    scores them again on draws of the examples)."""
    run_dir = Path(run_dir)
    accelerator, task, model, tokenizer, source = open_run(cfg, run_dir, on_open)
    if cfg.freeze_encoder:
        freeze_encoder(model)
    train_set = task.train[: cfg.max_train_samples] if cfg.max_train_samples else task.train
    task.train = train_set  # what the model trains on, and the baseline learns from
    task.start(model, train_set)
    train_features = task.features(train_set, tokenizer, cfg.max_seq_length, training=True)
    eval_features = task.features(task.eval, tokenizer, cfg.max_seq_length, training=False)
    train_loader, eval_loader = data_loaders(cfg, task, tokenizer, train_features, eval_features)
    optimizer, scheduler, total = optimizer_and_schedule(
        cfg, model, accelerator, len(train_features)
    )
    model, optimizer, train_loader, eval_loader = accelerator.prepare(
        model, optimizer, train_loader, eval_loader
    )
    metrics = MetricsLog(run_dir / "metrics.jsonl", enabled=accelerator.is_main_process)
    metrics.truncate_after(-1)
    log_start(cfg, task, source, (len(train_set), len(task.eval)), train_features, total)
    baseline = task.baseline()
    if baseline:
        log.info("Baseline (%s): %s", baseline["baseline"], figures_line(baseline))
    run = Run(
        accelerator, model, optimizer, scheduler, train_loader, eval_loader, task,
        eval_features, task.eval, metrics,
    )  # fmt: skip
    t0 = time.perf_counter()
    cache = FrozenEncoderCache(unwrap(accelerator, model)) if cfg.freeze_encoder else None
    try:
        step, results, predictions = fit(run, total, cfg.keep_best, cfg.patience)
    finally:
        if cache is not None:
            cache.close()
    sizes = (len(train_set), len(task.eval))
    summary = summarize(cfg, task, source, step, sizes, t0, results, run_dir, baseline)
    task.finish(unwrap(accelerator, model))
    if accelerator.is_main_process:
        save_results(run_dir, task, summary, predictions, unwrap(accelerator, model), tokenizer)
    accelerator.end_training()
    return summary, task, predictions


def log_start(cfg, task: Task, source, sizes: tuple[int, int], train_features, total) -> None:
    """One line: what is fine-tuned on what, the sizes and the steps."""
    windows = (
        f" ({len(train_features)} training windows)" if len(train_features) != sizes[0] else ""
    )
    how = cfg.init + (f", {task.pooling} pooling" if isinstance(task, SequenceTask) else "")
    log.info(
        "Fine-tuning %s (%s) on %s: %d train / %d dev examples%s, %d steps",
        source,
        how,
        cfg.task.name,
        sizes[0],
        sizes[1],
        windows,
        total,
    )


def save_results(
    run_dir: Path, task: Task, summary: dict[str, Any], predictions: list[Any], model, tokenizer
) -> None:
    """results.json, eval_predictions.jsonl and, where ``summary`` names it, the model dir."""
    (run_dir / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    with open(run_dir / "eval_predictions.jsonl", "w", encoding="utf-8") as f:
        for record in task.records(task.eval, predictions):
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    if summary["model"]:
        save_model(model, summary["model"])
        tokenizer.save_pretrained(summary["model"])
        log.info(
            'Saved the fine-tuned model to %s (mlmkit predict %s "some text")',
            summary["model"],
            summary["model"],
        )
