"""Fine-tune a pretrained encoder for sentence(-pair) classification and report dev metrics.

    mlmkit finetune checkpoint=outputs/<run> task=sst2 task.data_dir=../shared/data/glue/SST-2
    mlmkit finetune checkpoint=outputs/<run> task=cola task.data_dir=../shared/data/glue/CoLA
    mlmkit finetune checkpoint=outputs/<run> task=rte task.data_dir=../shared/data/glue/RTE
    mlmkit finetune checkpoint=outputs/<run> task=stsb task.data_dir=../shared/data/glue/STS-B
    mlmkit finetune ... init=random          # same architecture from scratch
    mlmkit finetune ... pooling=mean         # classify from the mean token state

``BertForSequenceClassification`` (or ``ModernBertForSequenceClassification``) takes the
checkpoint's encoder (and ModernBERT's MLM head, its pooler); the pooler and the
classifier start from a seeded random init, the same one for ``init=random``, so the two
differ only by pretraining. Data: GLUE-format TSV files (``task.data_dir``), or the Hub's
``glue`` dataset when ``task.data_dir`` is null and the Hub can be reached. The dev-set
figures (accuracy; Matthews correlation for CoLA; Spearman and Pearson correlation for the
regression task STS-B, one output trained with MSE) come from the ``evaluate`` metric modules
shipped in mlmkit and are written to ``<run dir>/results.json`` and metrics.jsonl.
Settings: conf/finetune.yaml and conf/task/.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from mlmkit.config import FinetuneConfig, OptimConfig, TaskConfig
from mlmkit.data.sources import check_not_binary
from mlmkit.errors import ConfigError, DataError
from mlmkit.evaluation.metric_modules import load_metric
from mlmkit.model.architectures import parts_of
from mlmkit.training.loading import load_model_and_tokenizer
from mlmkit.training.metrics_log import MetricsLog
from mlmkit.training.optim import build_optimizer, build_scheduler
from mlmkit.training.runtime import resolve_precision, runs_on_cpu

log = logging.getLogger("mlmkit")


# ---- data -----------------------------------------------------------------------------------

def read_tsv(path: Path, task: TaskConfig) -> list[dict[str, Any]]:
    """Examples ``{"text": [...], "label": class id | score}`` of one GLUE-format TSV file."""
    if not path.is_file():
        raise DataError(f"{str(path)!r} does not exist; set task.data_dir to the folder holding "
                        f"{task.train_file} and {task.eval_file}.")
    check_not_binary(str(path), "task.data_dir")  # UTF-16 (named) or binary: one sentence
    csv.field_size_limit(1 << 24)
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    if not rows:
        raise DataError(f"task.data_dir: {str(path)!r} is empty; fill it with examples in GLUE's TSV "
                        "format or point task.data_dir at another folder.")
    names, rows, first_line = _columns(path, task, rows)
    wanted = [*task.text_columns, task.label_column]
    missing = [c for c in wanted if c not in names]
    if missing:
        raise DataError(f"{str(path)!r} has no column {missing[0]!r} (columns: {', '.join(names)}); "
                        "set task.text_columns / task.label_column, or task.column_names for "
                        "files without a header.")
    index = {c: names.index(c) for c in wanted}
    label_of = _label_reader(path, task)
    examples, bad = [], 0
    for line, row in enumerate(rows, first_line):
        label = label_of(row[index[task.label_column]], line) if len(row) >= len(names) else None
        if label is None:
            bad += 1
            continue
        examples.append({"text": [row[index[c]].strip() for c in task.text_columns], "label": label})
    if bad:
        log.warning("%s: skipped %d line(s) with missing columns%s", path, bad,
                    f" or a label outside task.labels ({', '.join(task.labels)})"
                    if task.kind == "classification" else "")
    if not examples:
        raise DataError(f"{str(path)!r} holds no usable example; check task.labels and the columns.")
    return examples


def _columns(path: Path, task: TaskConfig, rows: list[list[str]]) -> tuple[list[str], list[list[str]], int]:
    """``(column names, data rows, line number of the first data row)``."""
    if task.header:
        return [c.strip() for c in rows[0]], rows[1:], 2
    names = list(task.column_names)
    if [c.strip().lower() for c in rows[0]] == [c.lower() for c in names]:
        return names, rows[1:], 2  # a header line that repeats task.column_names (GLUE's STS-B)
    if len(rows[0]) != len(names):
        raise DataError(f"{str(path)!r} has {len(rows[0])} tab-separated columns in its first line, "
                        f"but {task.name} files have {len(names)} ({', '.join(names)}); point "
                        "task.data_dir at files in that format, or set task.column_names.")
    return names, rows, 1


def _label_reader(path: Path, task: TaskConfig):
    """``(value, line) -> label``: the class id (None for a value outside task.labels), or for
    a regression task the score, where a value that is no number or lies outside
    task.label_range is an error naming the line."""
    if task.kind == "classification":
        label_ids = {v: i for i, v in enumerate(task.labels)}
        return lambda value, line: label_ids.get(value.strip())
    low, high = task.label_range or (-math.inf, math.inf)

    def score(value: str, line: int) -> float:
        try:
            x = float(value)
        except ValueError:
            x = math.nan
        if not low <= x <= high:  # NaN fails too
            what = "is not a number" if math.isnan(x) else f"is outside task.label_range [{low}, {high}]"
            raise DataError(f"{str(path)!r} line {line}: the {task.label_column} {value.strip()!r} "
                            f"{what}; correct the line or point task.data_dir at other files.")
        return x

    return score


def _hub_label(task: TaskConfig, value) -> float | int | None:
    """The label of a Hub row (None for an unlabelled one, -1 in GLUE's test splits)."""
    if task.kind == "regression":
        return float(value)
    return int(value) if int(value) >= 0 else None


def load_split(task: TaskConfig, split: str) -> list[dict[str, Any]]:
    """The examples of ``split`` (train | eval) from ``task.data_dir`` or the Hub."""
    if task.data_dir:
        name = task.train_file if split == "train" else task.eval_file
        return read_tsv(Path(task.data_dir).expanduser() / name, task)
    return _from_hub(task, ["train" if split == "train" else task.hub_eval_split])[0]


def load_task(task: TaskConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, eval) examples from ``task.data_dir`` or the Hub."""
    if task.data_dir:
        return load_split(task, "train"), load_split(task, "eval")
    train, dev = _from_hub(task, ["train", task.hub_eval_split])
    return train, dev


def _from_hub(task: TaskConfig, splits: list[str]) -> list[list[dict[str, Any]]]:
    import datasets

    try:
        ds = datasets.load_dataset(task.hub_path, task.hub_name)
    except Exception as exc:
        raise DataError(
            f"Could not load {task.hub_path} ({task.hub_name}) from the Hugging Face Hub "
            f"({str(exc).splitlines()[0][:120]}); set task.data_dir to a folder of GLUE TSV files."
        ) from None

    def rows(split):
        labelled = ((r, _hub_label(task, r[task.label_column])) for r in ds[split])
        return [{"text": [r[c] for c in task.text_columns], "label": label}
                for r, label in labelled if label is not None]

    return [rows(split) for split in splits]


class Collate:
    """Tokenize a batch of examples, padded to its longest (a multiple of 8)."""

    def __init__(self, tokenizer, max_seq_length: int) -> None:
        self.tokenizer, self.max_seq_length = tokenizer, max_seq_length

    def __call__(self, examples):
        columns = list(zip(*(e["text"] for e in examples)))
        enc = self.tokenizer(*columns, truncation=True, max_length=self.max_seq_length,
                             padding=True, pad_to_multiple_of=8, return_tensors="pt")
        enc["labels"] = torch.tensor([e["label"] for e in examples])
        return dict(enc)


# ---- model ----------------------------------------------------------------------------------

def build_classifier(cfg: FinetuneConfig):
    """``(Bert- or ModernBertForSequenceClassification, tokenizer, source path)`` for ``cfg``."""
    mlm, tokenizer, resolved = load_model_and_tokenizer(cfg.checkpoint)
    config = mlm.config.__class__.from_dict(mlm.config.to_dict())
    if cfg.task.kind == "regression":  # one output, MSE loss
        config.num_labels, config.problem_type = 1, "regression"
    else:
        config.num_labels = len(cfg.task.labels)
    config.classifier_dropout = cfg.classifier_dropout
    config._attn_implementation = "sdpa"
    arch = parts_of(mlm)  # BERT or ModernBERT: the classifier of the same architecture
    torch.manual_seed(cfg.seed)  # pooler and classifier init: the same for both inits
    model = arch.sequence_classifier(config, cfg.pooling)
    if cfg.init == "pretrained":
        for name in arch.shared_with_classifier:
            missing, unexpected = getattr(model, name).load_state_dict(getattr(mlm, name).state_dict(),
                                                                      strict=False)
            assert not unexpected and all(k.startswith("pooler.") for k in missing), (missing, unexpected)
    if cfg.max_seq_length > config.max_position_embeddings:
        raise ConfigError(f"max_seq_length ({cfg.max_seq_length}) is longer than the model's "
                          f"{config.max_position_embeddings} positions; lower max_seq_length.")
    return model, tokenizer, resolved


def start_at_mean_label(model, train_set: list[dict[str, Any]]) -> None:
    """A regression head starts at the mean training label (its bias), so that training
    learns how scores differ, not first their level (0-5 for STS-B): a small encoder's
    output layer would otherwise spend most of a short fine-tuning reaching it, predicting
    nearly one value for every pair."""
    labels = [float(e["label"]) for e in train_set]
    with torch.no_grad():
        model.classifier.bias.fill_(sum(labels) / max(len(labels), 1))


def freeze_encoder(model) -> None:
    """Linear probing: only the pooler (dense + tanh, or ModernBERT's head) and the
    classification layer keep training."""
    trainable = 0
    for name, p in model.named_parameters():
        keep = name.startswith(("classifier.", "head.")) or ".pooler." in f".{name}"
        p.requires_grad_(keep)
        trainable += p.numel() if keep else 0
    log.info("freeze_encoder: the encoder is frozen; %d parameters train (pooler and classifier)", trainable)


# ---- loop -----------------------------------------------------------------------------------

@torch.no_grad()
def predict(accelerator, model, loader) -> tuple[list[float], list[float]]:
    """Predictions and references of the dev set: class ids, or scores for one output."""
    model.eval()
    preds, refs = [], []
    for batch in loader:
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        pred = logits.float().squeeze(-1) if logits.shape[-1] == 1 else logits.argmax(-1)
        p, r = accelerator.gather_for_metrics((pred, batch["labels"]))
        preds += p.tolist()
        refs += r.tolist()
    model.train()
    return preds, refs


def score(task: TaskConfig, preds: list[int], refs: list[int]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name in task.metrics:
        out.update(load_metric(name).compute(predictions=preds, references=refs))
    return out


def fit_classifier(accelerator, model, optimizer, scheduler, train_loader, eval_loader, total: int,
                   task: TaskConfig, metrics) -> tuple[int, dict[str, Any]]:
    """``total`` optimizer steps, the dev set scored after every epoch (and the last step);
    returns the steps taken and the last ``eval`` event."""
    step, epoch = 0, 0
    results: dict[str, Any] = {}
    model.train()
    while step < total:
        loss_sum, n = 0.0, 0
        for batch in train_loader:
            loss = model(**batch).loss
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            loss_sum, n = loss_sum + float(loss), n + 1
            if step >= total:
                break
        epoch += 1
        figures = score(task, *predict(accelerator, model, eval_loader))
        results = {"event": "eval", "step": step, "epoch": epoch, "train_loss": loss_sum / max(n, 1),
                   **{f"eval_{k}": v for k, v in figures.items()}}
        metrics.write(results)
        log.info("epoch %d | step %d | train loss %.4f | %s", epoch, step, results["train_loss"],
                 " | ".join(f"{k} {v:.4f}" for k, v in figures.items()))
    return step, results


def finetune(cfg: FinetuneConfig, run_dir: str | os.PathLike) -> dict[str, Any]:
    """Fine-tune and evaluate after every epoch; returns the final dev figures."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader

    run_dir = Path(run_dir)
    use_cpu = runs_on_cpu()
    accelerator = Accelerator(cpu=use_cpu, mixed_precision=resolve_precision(cfg.precision, use_cpu=use_cpu,
                                                                              setting="precision"))
    set_seed(cfg.seed)
    model, tokenizer, source = build_classifier(cfg)
    if cfg.freeze_encoder:
        freeze_encoder(model)
    train_set, eval_set = load_task(cfg.task)
    if cfg.max_train_samples:
        train_set = train_set[:cfg.max_train_samples]
    if cfg.task.kind == "regression":
        start_at_mean_label(model, train_set)
    collate = Collate(tokenizer, cfg.max_seq_length)
    train_loader = DataLoader(train_set, batch_size=cfg.batch_size, shuffle=True, collate_fn=collate,
                              generator=torch.Generator().manual_seed(cfg.seed), drop_last=False)
    eval_loader = DataLoader(eval_set, batch_size=cfg.batch_size * 2, collate_fn=collate)
    steps_per_epoch = math.ceil(len(train_set) / (cfg.batch_size * accelerator.num_processes))
    total = max(1, round(cfg.epochs * steps_per_epoch))
    optim = OptimConfig(lr=cfg.lr, weight_decay=cfg.weight_decay, beta2=0.999, eps=1e-8,
                        warmup_steps=int(cfg.warmup_ratio * total), schedule="linear")
    optimizer = build_optimizer(model, optim, accelerator.device.type)
    scheduler = build_scheduler(optimizer, optim, total)
    model, optimizer, train_loader, eval_loader = accelerator.prepare(model, optimizer, train_loader, eval_loader)
    metrics = MetricsLog(run_dir / "metrics.jsonl", enabled=accelerator.is_main_process)
    metrics.truncate_after(-1)
    log.info("Fine-tuning %s (%s) on %s: %d train / %d dev examples, %d steps", source, cfg.init,
             cfg.task.name, len(train_set), len(eval_set), total)

    t0 = time.perf_counter()
    step, results = fit_classifier(accelerator, model, optimizer, scheduler, train_loader, eval_loader,
                                   total, cfg.task, metrics)
    summary = {"task": cfg.task.name, "checkpoint": str(source), "init": cfg.init, "steps": step,
               "train_examples": len(train_set), "eval_examples": len(eval_set),
               "seconds": round(time.perf_counter() - t0, 1),
               **{k: v for k, v in results.items() if k.startswith("eval_")}}
    if accelerator.is_main_process:
        (run_dir / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
        if cfg.save_model:
            accelerator.unwrap_model(model).save_pretrained(str(run_dir / "model"))
            tokenizer.save_pretrained(str(run_dir / "model"))
    accelerator.end_training()
    return summary
