"""Fine-tune a pretrained encoder for sentence(-pair) classification and report dev metrics.

    mlmkit finetune checkpoint=outputs/<run> task=sst2 task.data_dir=../shared/data/glue/SST-2
    mlmkit finetune checkpoint=outputs/<run> task=cola task.data_dir=../shared/data/glue/CoLA
    mlmkit finetune checkpoint=outputs/<run> task=rte task.data_dir=../shared/data/glue/RTE
    mlmkit finetune checkpoint=outputs/<run> task=stsb task.data_dir=../shared/data/glue/STS-B
    mlmkit finetune checkpoint=outputs/<run> task=files task.train_file=train.csv \
        task.eval_file=dev.jsonl 'task.text_columns=[premise,hypothesis]' task.label_column=label
    mlmkit finetune ... init=random          # same architecture from scratch
    mlmkit finetune ... pooling=cls          # classify from the [CLS] state (default: the mean)

``BertForSequenceClassification`` (or ``ModernBertForSequenceClassification``) takes the
checkpoint's encoder (and ModernBERT's MLM head, its pooler); the pooler and the
classifier start from a seeded random init, the same one for ``init=random``, so the two
differ only by pretraining. Data: GLUE-format TSV files (``task.data_dir``), the Hub's
``glue`` dataset when ``task.data_dir`` is null and the Hub can be reached, or your own TSV,
CSV or JSONL files (``task=files``, conf/task/files.yaml), whose classes are task.labels or
the training file's label values, sorted; a label outside them is an error naming the file
and line. The dev-set figures (accuracy; Matthews correlation for CoLA; Spearman and Pearson
correlation for a regression task such as STS-B, one output trained with MSE) come from the
``evaluate`` metric modules shipped in mlmkit and are written to ``<run dir>/results.json``
and metrics.jsonl, the last epoch's dev predictions to ``eval_predictions.jsonl``, and the
model (a plain model dir, its classes in ``id2label``) to ``<run dir>/model``, which
``mlmkit predict`` serves. Settings: conf/finetune.yaml and conf/task/.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mlmkit.config import FinetuneConfig, OptimConfig, TaskConfig
from mlmkit.data.sources import check_not_binary
from mlmkit.errors import ConfigError, DataError
from mlmkit.evaluation.metric_modules import load_metric
from mlmkit.model.architectures import parts_of
from mlmkit.training.metrics_log import MetricsLog
from mlmkit.training.optim import build_optimizer, build_scheduler
from mlmkit.training.runtime import resolve_precision, runs_on_cpu
from mlmkit.training.trained_model import load_model_and_tokenizer

log = logging.getLogger("mlmkit")


# ---- data -----------------------------------------------------------------------------------
# A task's files: TSV (GLUE's layout: no quoting), CSV (quoted fields allowed) or JSONL (one
# object per line, its keys the columns). Each is read into rows ``(line number, {column:
# value})``, then into examples ``{"text": [...], "label": class id | score}``.

CSV_DIALECTS = {"tsv": {"delimiter": "\t", "quoting": csv.QUOTE_NONE}, "csv": {"delimiter": ","}}


def file_format(path: Path) -> str:
    """csv, jsonl or tsv, by the file's suffix (any other suffix: TSV, as GLUE's files)."""
    suffix = path.suffix.lower()
    return "csv" if suffix == ".csv" else "jsonl" if suffix in (".jsonl", ".json") else "tsv"


def reads_files(task: TaskConfig) -> bool:
    """Whether the task's examples come from files (else from the Hub)."""
    return bool(task.data_dir) or not task.hub_path


def task_file(task: TaskConfig, split: str) -> Path:
    """Return the file of ``split`` (train | eval): absolute, or relative to task.data_dir."""
    path = Path(task.train_file if split == "train" else task.eval_file).expanduser()
    return path if path.is_absolute() else Path(task.data_dir or ".").expanduser() / path


def file_setting(task: TaskConfig, split: str) -> str:
    """Return the setting that points at the file of ``split``, for messages: task.data_dir for the
    GLUE presets (a folder of their files), else task.train_file or task.eval_file."""
    return "task.data_dir" if task.hub_path else f"task.{split}_file"


def read_rows(
    path: Path, task: TaskConfig, setting: str = "task.data_dir", columns: list[str] | None = None
) -> list[tuple[int, dict[str, str]]]:
    """``(line, {column: value})`` of each row of a TSV, CSV or JSONL file that holds all of
    ``columns`` (texts; default: the task's text and label columns); a file without one of the
    columns is an error, and so is a JSONL text column that holds no text (numbers, objects), as
    in pretraining. Other rows are skipped with a warning that counts them by cause: a line that
    is no JSON object (or has too few fields), a value missing, a JSONL value that is not text
    in a text column. A JSONL label that is a number reads as that number's text."""
    if not path.is_file():
        if setting == "task.data_dir":
            raise DataError(
                f"{str(path)!r} does not exist; set task.data_dir to the folder holding "
                f"{task.train_file} and {task.eval_file}."
            )
        raise DataError(
            f"{setting}: {str(path)!r} does not exist; set {setting} to a .tsv, .csv or "
            ".jsonl file (absolute, or relative to task.data_dir)."
        )
    check_not_binary(str(path), setting)  # UTF-16 (named) or binary: one sentence
    fmt = file_format(path)
    names, rows = _json_rows(path) if fmt == "jsonl" else _delimited_rows(path, task, fmt, setting)
    if names is None:
        raise DataError(
            f"{setting}: {str(path)!r} is empty; fill it with examples, or point {setting} "
            "at other files."
        )
    if not names:  # JSON lines, none of them an object
        raise DataError(
            f"{setting}: {str(path)!r} holds no JSON object; write one object per line, "
            "its keys the columns."
        )
    wanted = list(columns or [*task.text_columns, task.label_column])
    missing = [c for c in wanted if c not in names]
    if missing:
        fix = (
            "set task.text_columns / task.label_column, or task.column_names for files without "
            "a header"
            if setting.startswith("task.")
            else f"give {setting} a file with the columns {', '.join(wanted)}"
        )
        raise DataError(
            f"{str(path)!r} has no column {missing[0]!r} (columns: {', '.join(names)}); {fix}."
        )
    texts = list(columns or task.text_columns)
    if fmt == "jsonl":
        check_json_texts(path, rows, texts)
    kept, skipped = [], {"bad": 0, "missing": 0, "not_text": 0}
    for line, row in rows:
        if row is None:
            skipped["bad"] += 1
        elif any(row.get(c) is None for c in wanted):
            skipped["missing"] += 1
        elif any(not isinstance(row[c], str) for c in texts):
            skipped["not_text"] += 1
        else:
            kept.append(
                (line, {c: v if isinstance(v, str) else json.dumps(v) for c, v in row.items()})
            )
    if len(kept) < len(rows):
        warn_skipped(path, fmt, skipped, texts)
    return kept


def check_json_texts(path: Path, rows: list[tuple[int, dict | None]], texts: list[str]) -> None:
    """Refuse a JSONL text column that holds no text, by its first row with a value there (as
    pretraining's ``data.sources.check_text_column``): numbers or objects would become text such
    as "3" or "{...}" for the model to read."""
    for column in texts:
        first = next(
            (row[column] for _, row in rows if row is not None and row.get(column) is not None), ""
        )
        if not isinstance(first, str):
            what = (
                "numbers"
                if isinstance(first, (int, float)) and not isinstance(first, bool)
                else f"{type(first).__name__} values"
            )
            raise DataError(
                f"{str(path)!r}: the column {column!r} holds {what}, not text; set "
                "task.text_columns to the columns of text."
            )


def warn_skipped(path: Path, fmt: str, skipped: dict[str, int], texts: list[str]) -> None:
    """One warning counting the rows ``read_rows`` skipped, by cause."""
    bad = "that are not JSON objects" if fmt == "jsonl" else "with too few fields"
    causes = [
        (skipped["bad"], f"line(s) {bad}"),
        (skipped["missing"], "row(s) with a value missing"),
        (skipped["not_text"], f"row(s) whose {' or '.join(map(repr, texts))} is not text"),
    ]
    log.warning("%s: skipped %s", path, ", ".join(f"{n} {what}" for n, what in causes if n))


def _delimited_rows(path: Path, task: TaskConfig, fmt: str, setting: str):
    """``(column names, rows)`` of a TSV or CSV file; a row with too few fields is None, blank
    lines are left out; names are None for a file without a line. A UTF-8 byte-order mark
    before the first line is dropped (GLUE's MRPC files start with one: its download script
    copies the header line of Microsoft's msr_paraphrase_train.txt, mark and all)."""
    csv.field_size_limit(1 << 24)
    with open(path, encoding="utf-8-sig", errors="replace", newline="") as f:
        reader, lines, end = csv.reader(f, **CSV_DIALECTS[fmt]), [], 0
        for fields in reader:
            if fields:  # a blank line is no row
                lines.append((end + 1, fields))
            end = reader.line_num
    if not lines:
        return None, []
    names, lines = _columns(path, task, lines, fmt, setting)
    return names, [
        (line, dict(zip(names, fields)) if len(fields) >= len(names) else None)
        for line, fields in lines
    ]


def _columns(path: Path, task: TaskConfig, lines: list, fmt: str, setting: str):
    """``(column names, data lines)``: the header's names, or task.column_names."""
    first = lines[0][1]
    if task.header:
        return [c.strip() for c in first], lines[1:]
    names = list(task.column_names)
    if [c.strip().lower() for c in first] == [c.lower() for c in names]:
        return names, lines[1:]  # a header line that repeats task.column_names (GLUE's STS-B)
    if len(first) != len(names):
        sep = "tab" if fmt == "tsv" else "comma"
        raise DataError(
            f"{str(path)!r} has {len(first)} {sep}-separated columns in its first line, "
            f"but {task.name} files have {len(names)} ({', '.join(names)}); point "
            f"{setting} at files in that format, or set task.column_names."
        )
    return names, lines


def _json_rows(path: Path):
    """``(column names, rows)`` of a JSONL file: the keys of its first object, and each line's
    values as JSON gives them (null as missing); a line that is no JSON object is None; names
    are None for a file without a line."""
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except ValueError:
                obj = None
            rows.append((line, obj if isinstance(obj, dict) else None))
    if not rows:
        return None, []
    return next((list(row) for _, row in rows if row is not None), []), rows


def examples_of(
    rows: list[tuple[int, dict[str, str]]], path: Path, task: TaskConfig
) -> list[dict[str, Any]]:
    """Examples ``{"text": [...], "label": class id | score}`` of rows of ``path``."""
    label_of = _label_reader(path, task)
    examples = [
        {
            "text": [row[c].strip() for c in task.text_columns],
            "label": label_of(row[task.label_column], line),
        }
        for line, row in rows
    ]
    if not examples:
        raise DataError(
            f"{str(path)!r} holds no usable example; check the columns and that it has "
            "lines below its header."
        )
    return examples


def read_examples(
    path: Path, task: TaskConfig, setting: str = "task.data_dir"
) -> list[dict[str, Any]]:
    """Examples ``{"text": [...], "label": class id | score}`` of a TSV, CSV or JSONL file."""
    return examples_of(read_rows(path, task, setting), path, task)


read_tsv = read_examples  # the name of the GLUE-format reader


def discover_labels(
    rows: list[tuple[int, dict[str, str]]], path: Path, task: TaskConfig
) -> list[str]:
    """Return the label values of the training rows, sorted (numbers by value), for a task that
    lists none."""
    values = {row[task.label_column].strip() for _, row in rows}

    def number(value: str) -> float | None:
        try:
            return float(value)
        except ValueError:
            return None

    numbers = {v: number(v) for v in values}
    labels = sorted(
        values, key=lambda v: (0, numbers[v], v) if numbers[v] is not None else (1, 0.0, v)
    )
    if len(labels) < 2:
        raise DataError(
            f"{str(path)!r}: every example has the {task.label_column} "
            f"{(labels or [''])[0]!r}; a classifier needs two labels or more (for scores "
            "set task.kind=regression)."
        )
    log.info(
        "task.labels from %s: %s (class ids in this order; set task.labels=[...] to fix them)",
        path,
        ", ".join(labels),
    )
    if len(labels) > 20 and all(numbers[v] is not None for v in labels):
        log.warning(
            "%s: the %s takes %d different numbers; if they are scores, set task.kind=regression",
            path,
            task.label_column,
            len(labels),
        )
    return labels


def _label_reader(path: Path, task: TaskConfig):
    """``(value, line) -> label``: the class id, or for a regression task the score; a value
    outside task.labels, one that is no number, or one outside task.label_range is an error
    naming the line."""
    if task.kind == "classification":
        if not task.labels:
            raise ConfigError("task.labels is empty; list the label values (task.labels=[...]).")
        label_ids = {v: i for i, v in enumerate(task.labels)}

        def class_id(value: str, line: int) -> int:
            if value.strip() not in label_ids:
                raise DataError(
                    f"{str(path)!r} line {line}: the {task.label_column} {value.strip()!r} "
                    f"is not one of task.labels ({', '.join(task.labels)}); correct the "
                    "line, or list every label value in task.labels."
                )
            return label_ids[value.strip()]

        return class_id
    low, high = task.label_range or (-math.inf, math.inf)

    def score(value: str, line: int) -> float:
        try:
            x = float(value)
        except ValueError:
            x = math.nan
        if not low <= x <= high:  # NaN fails too
            what = (
                "is not a number"
                if math.isnan(x)
                else f"is outside task.label_range [{low}, {high}]"
            )
            raise DataError(
                f"{str(path)!r} line {line}: the {task.label_column} {value.strip()!r} "
                f"{what}; correct the line, or use other files."
            )
        return x

    return score


def _hub_label(task: TaskConfig, value) -> float | int | None:
    """Return the label of a Hub row (None for an unlabelled one, -1 in GLUE's test splits)."""
    if task.kind == "regression":
        return float(value)
    return int(value) if int(value) >= 0 else None


def load_split(task: TaskConfig, split: str) -> list[dict[str, Any]]:
    """Load the examples of ``split`` (train | eval) from the task's files or the Hub."""
    if reads_files(task):
        return read_examples(task_file(task, split), task, file_setting(task, split))
    return _from_hub(task, ["train" if split == "train" else task.hub_eval_split])[0]


def load_task(task: TaskConfig) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, eval) examples from the task's files or the Hub; a classification task that
    lists no labels takes the training file's (``task.labels`` is set)."""
    if not reads_files(task):
        if task.kind == "classification" and not task.labels:
            raise ConfigError("task.labels is empty; list the label values (task.labels=[...]).")
        train, dev = _from_hub(task, ["train", task.hub_eval_split])
        return train, dev
    path = task_file(task, "train")
    rows = read_rows(path, task, file_setting(task, "train"))
    if task.kind == "classification" and not task.labels:
        task.labels = discover_labels(rows, path, task)
    return examples_of(rows, path, task), load_split(task, "eval")


def _hub_columns(task: TaskConfig, features) -> tuple[list[str], str]:
    """Return the Hub dataset's text and label columns for the task's: the same names where the
    dataset has them, else its ``label`` and its text (string) columns in order. The Hub's ``glue``
    renames GLUE's file columns: MRPC's ``#1 String`` / ``#2 String`` are ``sentence1`` /
    ``sentence2``, MNLI's ``sentence1`` / ``sentence2`` ``premise`` / ``hypothesis``, and every
    task's label (``Quality``, ``is_duplicate``, ``gold_label``, ``score``) is ``label``."""
    label = task.label_column if task.label_column in features else "label"
    texts = list(task.text_columns)
    if any(c not in features for c in texts):
        strings = [name for name, f in features.items() if getattr(f, "dtype", None) == "string"]
        texts = strings if len(strings) == len(texts) else texts
    missing = [c for c in (*texts, label) if c not in features]
    if missing:
        raise DataError(
            f"{task.hub_path} ({task.hub_name}) has no column {missing[0]!r} (columns: "
            f"{', '.join(features)}); set task.text_columns and task.label_column to its "
            "columns, or task.data_dir to a folder of the task's files."
        )
    return texts, label


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
        texts, label_column = _hub_columns(task, ds[split].features)
        labelled = ((r, _hub_label(task, r[label_column])) for r in ds[split])
        return [
            {"text": [r[c] for c in texts], "label": label}
            for r, label in labelled
            if label is not None
        ]

    return [rows(split) for split in splits]


class Collate:
    """Tokenize a batch of examples, padded to its longest (a multiple of 8)."""

    def __init__(self, tokenizer, max_seq_length: int) -> None:
        self.tokenizer, self.max_seq_length = tokenizer, max_seq_length

    def __call__(self, examples):
        columns = list(zip(*(e["text"] for e in examples)))
        enc = self.tokenizer(
            *columns,
            truncation=True,
            max_length=self.max_seq_length,
            padding=True,
            pad_to_multiple_of=8,
            return_tensors="pt",
        )
        enc["labels"] = torch.tensor([e["label"] for e in examples])
        return dict(enc)


# ---- model ----------------------------------------------------------------------------------


def build_classifier(cfg: FinetuneConfig, mlm):
    """``Bert-`` (or ``ModernBertForSequenceClassification``) for ``cfg`` on the encoder of the
    masked-LM model ``mlm``; its config names the classes (id2label) and records the task
    (``mlmkit_task``: its text columns and kind, which ``mlmkit predict`` reads)."""
    config = mlm.config.__class__.from_dict(mlm.config.to_dict())
    task = cfg.task
    if task.kind == "regression":  # one output, MSE loss
        config.problem_type = "regression"
        config.id2label, config.label2id = {0: task.label_column}, {task.label_column: 0}
    else:
        config.id2label = dict(enumerate(task.labels))
        config.label2id = {label: i for i, label in enumerate(task.labels)}
    config.mlmkit_task = {
        "name": task.name,
        "kind": task.kind,
        "text_columns": list(task.text_columns),
        "label_column": task.label_column,
        "max_seq_length": cfg.max_seq_length,
    }
    config.classifier_dropout = cfg.classifier_dropout
    config._attn_implementation = "sdpa"
    arch = parts_of(mlm)  # BERT or ModernBERT: the classifier of the same architecture
    torch.manual_seed(cfg.seed)  # pooler and classifier init: the same for both inits
    model = arch.sequence_classifier(config, cfg.pooling)
    if cfg.init == "pretrained":
        for name in arch.shared_with_classifier:
            missing, unexpected = getattr(model, name).load_state_dict(
                getattr(mlm, name).state_dict(), strict=False
            )
            assert not unexpected and all(k.startswith("pooler.") for k in missing), (
                missing,
                unexpected,
            )
    if cfg.max_seq_length > config.max_position_embeddings:
        raise ConfigError(
            f"max_seq_length ({cfg.max_seq_length}) is longer than the model's "
            f"{config.max_position_embeddings} positions; lower max_seq_length."
        )
    return model


def start_at_mean_label(model, train_set: list[dict[str, Any]]) -> None:
    """Start a regression head at the mean training label (its bias), so that training
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
    log.info(
        "freeze_encoder: the encoder is frozen; %d parameters train (pooler and classifier)",
        trainable,
    )


class FrozenEncoderCache:
    """With the encoder frozen (linear probing) its states are the same every epoch: the
    classifier's encoder (``model.base_model``) runs once per distinct input row, without
    dropout, and later batches read its token states back. The trainable parts still run on
    every step: BERT's pooler (which sits in the encoder module) and every layer after it.
    Memory: the token states of every distinct row (rows x tokens x hidden)."""

    def __init__(self, model) -> None:
        self.encoder = model.base_model
        self.forward = self.encoder.forward  # the module's own forward, restored by close()
        self.states: dict[bytes, torch.Tensor] = {}
        self.encoder.forward = self  # nn.Module.__call__ looks forward up on the instance first

    def __call__(self, input_ids=None, attention_mask=None, **kwargs):
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        keep = attention_mask.bool()
        keys = [ids[row].cpu().numpy().tobytes() for ids, row in zip(input_ids, keep)]
        new = sorted({i for i, key in enumerate(keys) if key not in self.states})
        if new:
            self._encode(
                input_ids[new],
                attention_mask[new],
                keep[new],
                [keys[i] for i in new],
                {
                    k: v[new] if torch.is_tensor(v) and v.shape[:1] == input_ids.shape[:1] else v
                    for k, v in kwargs.items()
                },
            )
        hidden = self.states[keys[0]]
        out = hidden.new_zeros(*input_ids.shape, hidden.shape[-1])
        for i, key in enumerate(keys):
            out[i, keep[i]] = self.states[key]
        pooler = getattr(self.encoder, "pooler", None)
        return BaseModelOutputWithPooling(
            last_hidden_state=out, pooler_output=pooler(out) if pooler is not None else None
        )

    @torch.no_grad()
    def _encode(self, input_ids, attention_mask, keep, keys, kwargs) -> None:
        was_training = self.encoder.training
        self.encoder.eval()
        try:
            hidden = self.forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)[0]
        finally:
            self.encoder.train(was_training)
        for key, row, mask in zip(keys, hidden, keep):
            self.states[key] = row[mask].clone()

    def close(self) -> None:
        """Restore the encoder's own forward (before the model is saved or used elsewhere)."""
        del self.encoder.forward
        self.states.clear()


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


def fit_classifier(
    accelerator,
    model,
    optimizer,
    scheduler,
    train_loader,
    eval_loader,
    total: int,
    task: TaskConfig,
    metrics,
) -> tuple[int, dict[str, Any], list[float]]:
    """``total`` optimizer steps, the dev set scored after every epoch (and the last step);
    returns the steps taken, the last ``eval`` event and the dev predictions it scored."""
    step, epoch = 0, 0
    results: dict[str, Any] = {}
    preds: list[float] = []
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
            loss_sum, n = loss_sum + float(loss.detach()), n + 1
            if step >= total:
                break
        epoch += 1
        preds, refs = predict(accelerator, model, eval_loader)
        figures = score(task, preds, refs)
        results = {
            "event": "eval",
            "step": step,
            "epoch": epoch,
            "train_loss": loss_sum / max(n, 1),
            **{f"eval_{k}": v for k, v in figures.items()},
        }
        metrics.write(results)
        log.info(
            "epoch %d | step %d | train loss %.4f | %s",
            epoch,
            step,
            results["train_loss"],
            " | ".join(f"{k} {v:.4f}" for k, v in figures.items()),
        )
    return step, results, preds


def write_predictions(
    path: Path, task: TaskConfig, eval_set: list[dict[str, Any]], preds: list[float]
) -> None:
    """``<run dir>/eval_predictions.jsonl``: each dev example's texts, label and prediction
    (label names, or scores for regression), in the order of the eval file."""

    def name(value):
        return task.labels[int(value)] if task.kind == "classification" else value

    with open(path, "w", encoding="utf-8") as f:
        for example, pred in zip(eval_set, preds, strict=True):
            f.write(
                json.dumps(
                    {
                        "text": example["text"],
                        "label": name(example["label"]),
                        "prediction": name(pred),
                    },
                    ensure_ascii=False,
                )
                + "\n"
            )


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


def data_loaders(cfg: FinetuneConfig, tokenizer, train_set, eval_set) -> tuple[Any, Any]:
    """Return the training loader (shuffled by ``cfg.seed``) and the dev set's loader."""
    from torch.utils.data import DataLoader

    collate = Collate(tokenizer, cfg.max_seq_length)
    train_loader = DataLoader(
        train_set,
        batch_size=cfg.batch_size,
        shuffle=True,
        collate_fn=collate,
        generator=torch.Generator().manual_seed(cfg.seed),
        drop_last=False,
    )
    eval_loader = DataLoader(eval_set, batch_size=cfg.batch_size * 2, collate_fn=collate)
    return train_loader, eval_loader


def optimizer_and_schedule(
    cfg: FinetuneConfig, model, accelerator, train_examples: int
) -> tuple[Any, Any, int]:
    """Return the optimizer, its linear schedule with warmup, and the number of steps."""
    steps_per_epoch = math.ceil(train_examples / (cfg.batch_size * accelerator.num_processes))
    total = max(1, round(cfg.epochs * steps_per_epoch))
    optim = OptimConfig(
        lr=cfg.lr,
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
    source,
    steps: int,
    train_examples: int,
    eval_examples: int,
    started: float,
    results: dict[str, Any],
    run_dir: Path,
) -> dict[str, Any]:
    """Return what results.json holds: the run's settings, sizes and time, the dev figures."""
    return {
        "task": cfg.task.name,
        "checkpoint": str(source),
        "init": cfg.init,
        "pooling": cfg.pooling,
        "steps": steps,
        "train_examples": train_examples,
        "eval_examples": eval_examples,
        "seconds": round(time.perf_counter() - started, 1),
        **({"labels": list(cfg.task.labels)} if cfg.task.kind == "classification" else {}),
        "model": str(run_dir / "model") if cfg.save_model else None,
        **{k: v for k, v in results.items() if k.startswith("eval_")},
    }


def finetune(
    cfg: FinetuneConfig, run_dir: str | os.PathLike, on_open: Callable[[Path], None] | None = None
) -> dict[str, Any]:
    """Fine-tune and evaluate after every epoch into ``run_dir`` (a new or empty folder); returns
    the final dev figures (and where the model was saved, ``model``). ``on_open(run_dir)`` is
    called on the main process once every check has passed, before anything is written there."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    run_dir = Path(run_dir)
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
    train_set, eval_set = load_task(
        cfg.task
    )  # before the classifier: its labels may come from the data
    model = build_classifier(cfg, mlm)
    del mlm
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        if on_open is not None:
            on_open(run_dir)
    if cfg.freeze_encoder:
        freeze_encoder(model)
    if cfg.max_train_samples:
        train_set = train_set[: cfg.max_train_samples]
    if cfg.task.kind == "regression":
        start_at_mean_label(model, train_set)
    train_loader, eval_loader = data_loaders(cfg, tokenizer, train_set, eval_set)
    optimizer, scheduler, total = optimizer_and_schedule(cfg, model, accelerator, len(train_set))
    model, optimizer, train_loader, eval_loader = accelerator.prepare(
        model, optimizer, train_loader, eval_loader
    )
    metrics = MetricsLog(run_dir / "metrics.jsonl", enabled=accelerator.is_main_process)
    metrics.truncate_after(-1)
    log.info(
        "Fine-tuning %s (%s, %s pooling) on %s: %d train / %d dev examples, %d steps",
        source,
        cfg.init,
        cfg.pooling,
        cfg.task.name,
        len(train_set),
        len(eval_set),
        total,
    )

    t0 = time.perf_counter()
    cache = FrozenEncoderCache(accelerator.unwrap_model(model)) if cfg.freeze_encoder else None
    try:
        step, results, preds = fit_classifier(
            accelerator,
            model,
            optimizer,
            scheduler,
            train_loader,
            eval_loader,
            total,
            cfg.task,
            metrics,
        )
    finally:
        if cache is not None:
            cache.close()
    summary = summarize(cfg, source, step, len(train_set), len(eval_set), t0, results, run_dir)
    if accelerator.is_main_process:
        save_results(
            run_dir, cfg.task, summary, eval_set, preds, accelerator.unwrap_model(model), tokenizer
        )
    accelerator.end_training()
    return summary


def save_results(
    run_dir: Path,
    task: TaskConfig,
    summary: dict[str, Any],
    eval_set: list[dict[str, Any]],
    preds: list[float],
    model,
    tokenizer,
) -> None:
    """results.json, eval_predictions.jsonl and, where ``summary`` names it, the model dir."""
    (run_dir / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_predictions(run_dir / "eval_predictions.jsonl", task, eval_set, preds)
    if summary["model"]:
        model.save_pretrained(summary["model"])
        tokenizer.save_pretrained(summary["model"])
        log.info(
            'Saved the fine-tuned model to %s (mlmkit predict %s "some text")',
            summary["model"],
            summary["model"],
        )
