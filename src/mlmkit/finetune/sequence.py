"""Sentence and sentence-pair tasks: a class (or, for regression, a score) per input.

    mlmkit finetune checkpoint=outputs/<run> task=sst2 task.data_dir=../shared/data/glue/SST-2
    mlmkit finetune checkpoint=outputs/<run> task=stsb task.data_dir=../shared/data/glue/STS-B
    mlmkit finetune checkpoint=outputs/<run> task=files task.train_file=train.csv \\
        task.eval_file=dev.jsonl 'task.text_columns=[premise,hypothesis]' task.label_column=label

Reader: ``mlmkit.finetune.reader`` (GLUE's TSVs, the Hub's ``glue``, your TSV, CSV or JSONL).
Head: ``BertForSequenceClassification`` (pooling the mean token state by default,
``mlmkit.model.classifier``, or [CLS] with ``pooling=cls``) or
``ModernBertForSequenceClassification``; the other families' own ``...ForSequenceClassification``
(RoBERTa's, XLM-R's, DeBERTa's, ...) pools its first token's state, whatever ``pooling`` says
(the log says so, results.json records ``pooling: cls``); a regression task has one output
trained with MSE.
Scorer: the ``evaluate`` metric modules shipped in mlmkit (``mlmkit.finetune.metric_modules``):
accuracy; Matthews correlation for CoLA; Spearman and Pearson correlation for STS-B.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import torch

from mlmkit.config import FinetuneConfig, TaskConfig
from mlmkit.finetune.metric_modules import load_metric
from mlmkit.finetune.reader import load_task
from mlmkit.finetune.task import Task
from mlmkit.model.architectures import TITLES

log = logging.getLogger("mlmkit")


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
        if all("index" in e for e in examples):
            enc["index"] = torch.tensor([e["index"] for e in examples])
        return dict(enc)


def start_at_mean_label(model, train_set: list[dict[str, Any]]) -> None:
    """Start a regression head at the mean training label (its bias), so that training
    learns how scores differ, not first their level (0-5 for STS-B): a small encoder's
    output layer would otherwise spend most of a short fine-tuning reaching it, predicting
    nearly one value for every pair."""
    labels = [float(e["label"]) for e in train_set]
    with torch.no_grad():
        model.classifier.bias.fill_(sum(labels) / max(len(labels), 1))


def family_pooling(arch, pooling: str) -> str:
    """Return the pooling the family's classifier runs for the setting ``pooling``: mean pooling is
    BERT's and ModernBERT's (``Family.mean_pooling``); another family's own head pools its first
    token's state, which the log says in one line."""
    if pooling == "cls" or arch.mean_pooling:
        return pooling
    log.info(
        "pooling=mean is BERT's and ModernBERT's: a %s's own head (%s) pools its first "
        "token's state, so this run pools cls",
        TITLES.get(arch.model_type, arch.model_type),
        arch.sequence_classification,
    )
    return "cls"


def score(task: TaskConfig, preds: list[int], refs: list[int]) -> dict[str, float]:
    """Return the task's metrics (``task.metrics``) of predictions against references."""
    out: dict[str, float] = {}
    for name in task.metrics:
        out.update(load_metric(name).compute(predictions=preds, references=refs))
    return out


class SequenceTask(Task):
    """A class or a score per sentence (pair): GLUE's tasks and ``task=files``."""

    pooling = "mean"  # what the head pools (``family_pooling``), set by ``head``

    def load(self):
        return load_task(self.cfg)  # before the head: its labels may come from the data

    def configure(self, config, cfg: FinetuneConfig) -> None:
        task = self.cfg
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

    def head(self, arch, config, cfg: FinetuneConfig):
        self.pooling = family_pooling(arch, cfg.pooling)
        return arch.sequence_classifier(config, self.pooling)

    def start(self, model, train) -> None:
        if self.cfg.kind == "regression":
            start_at_mean_label(model, train)

    def features(self, examples, tokenizer, max_seq_length, training):
        return [dict(e, index=i) for i, e in enumerate(examples)]

    def collate(self, tokenizer, max_seq_length: int):
        return Collate(tokenizer, max_seq_length)

    def decode(self, outputs, features, examples) -> list[float]:
        """Class ids, or scores for one output."""
        return [float(o[0]) if o.shape[-1] == 1 else int(o.argmax(-1)) for o in outputs]

    def score(self, predictions, examples) -> dict[str, float]:
        return score(self.cfg, predictions, [e["label"] for e in examples])

    def records(self, examples, predictions):
        """Each dev example's texts, label and prediction (label names, or scores for
        regression), in the order of the eval file."""

        def name(value):
            return self.cfg.labels[int(value)] if self.cfg.kind == "classification" else value

        for example, pred in zip(examples, predictions, strict=True):
            yield {
                "text": example["text"],
                "label": name(example["label"]),
                "prediction": name(pred),
            }

    def baseline(self) -> dict[str, Any]:
        """Return a classifier's baseline: the most frequent class of the training set, always."""
        if self.cfg.kind != "classification" or not self.train or not self.eval:
            return {}
        majority = Counter(e["label"] for e in self.train).most_common(1)[0][0]
        guess = [majority] * len(self.eval)
        return {
            "baseline": f"always {self.cfg.labels[majority]!r}, the most frequent training label",
            **self.score(guess, self.eval),
        }

    def summary(self) -> dict[str, Any]:
        return {"labels": list(self.cfg.labels)} if self.cfg.kind == "classification" else {}
