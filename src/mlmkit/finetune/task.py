"""What the one fine-tuning loop (``mlmkit.finetune.loop``) asks of a task.

A task is three small parts, as transformers' run_glue, run_ner and run_qa have them:

- a **reader** (``load``): its files -> examples, the training and the evaluation set;
- a **head** (``head``, ``configure``, ``features``, ``collate``): transformers'
  ``AutoModelFor...`` class of the checkpoint's architecture (``model.architectures``), and how
  labels meet subwords or windows: the examples become features, the model's inputs;
- a **decoder/scorer** (``outputs``, ``decode``, ``score``, ``records``): the model's outputs over
  the evaluation features back to one prediction per example, scored with the field's own metric.

``mlmkit.finetune.sequence`` (classification and regression of sentences and pairs),
``mlmkit.finetune.tokens`` (a tag per word: NER, POS) and ``mlmkit.finetune.spans`` (extractive
question answering) are the three kinds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from mlmkit.config import FinetuneConfig, TaskConfig


class Task:
    """The parts of one kind of fine-tuning task; each kind overrides what it needs."""

    # the batch keys the loss reads (left out of the evaluation's forward passes)
    targets: tuple[str, ...] = ("labels",)
    # batches of features of like length (windows), so that little of a batch is padding
    group_by_length: bool = False

    def __init__(self, cfg: TaskConfig) -> None:
        self.cfg = cfg
        self.train: list[Any] = []  # the examples ``load`` read (the loop keeps them here)
        self.eval: list[Any] = []

    @property
    def headline(self) -> str:
        """The figure the command prints (``eval_<headline>`` in results.json)."""
        return self.cfg.metrics[0]

    # ---- reader
    def load(self) -> tuple[list[Any], list[Any]]:
        """``(training examples, evaluation examples)``; may fill ``cfg.labels``."""
        raise NotImplementedError

    # ---- head
    def configure(self, config, cfg: FinetuneConfig) -> None:
        """Name the labels in the model's ``config`` and record the task (``mlmkit_task``)."""
        raise NotImplementedError

    def head(self, arch, config, cfg: FinetuneConfig):
        """Return the untrained model with the task's head (``arch``: the architecture's
        parts, ``mlmkit.model.architectures``)."""
        raise NotImplementedError

    def tokenizer_for(self, tokenizer):
        """Return the tokenizer the task's features are made with and its model is saved with
        (the checkpoint's own, by default)."""
        return tokenizer

    def start(self, model, train: list[Any]) -> None:
        """Set the head's start from the training examples (nothing by default)."""

    def features(
        self, examples: list[Any], tokenizer, max_seq_length: int, training: bool
    ) -> list[dict[str, Any]]:
        """Return the model's inputs of ``examples`` (one or more per example), each with its
        ``index`` in the returned list."""
        raise NotImplementedError

    def collate(self, tokenizer, max_seq_length: int) -> Callable[[list], dict]:
        """Return the function that turns features into a padded batch of tensors."""
        raise NotImplementedError

    # ---- decoder / scorer
    def outputs(self, out) -> torch.Tensor:
        """Return what the evaluation keeps of a forward pass (one row per feature)."""
        return out.logits.float()

    def decode(self, outputs: list[torch.Tensor], features: list, examples: list) -> list[Any]:
        """One prediction per example from the outputs of its features (in features' order)."""
        raise NotImplementedError

    def score(self, predictions: list[Any], examples: list[Any]) -> dict[str, Any]:
        """Return the task's figures (results.json's ``eval_*``) of ``predictions``."""
        raise NotImplementedError

    def records(self, examples: list[Any], predictions: list[Any]) -> Iterable[dict[str, Any]]:
        """One JSON object per example for ``eval_predictions.jsonl``."""
        raise NotImplementedError

    def baseline(self) -> dict[str, Any]:
        """Return the figures of the field's baseline on the evaluation set (``{"baseline": what it
        is, figure: value, ...}``), the figures to beat; empty where there is none."""
        return {}

    def summary(self) -> dict[str, Any]:
        """Fields of results.json beyond the loop's (the label set)."""
        return {}

    def keep(self, figures: dict[str, Any]) -> None:
        """Go back to what the evaluation settled at the epoch kept (``keep_best``), given its
        figures (nothing by default)."""

    def finish(self, model) -> None:
        """Record in the model's config what the evaluation settled (nothing by default)."""


def length_order(lengths: list[int]) -> list[int]:
    """Feature indices, longest first (the evaluation's batches by length)."""
    return sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))


class LengthBatches(torch.utils.data.Sampler):
    """Batches of feature indices of like length: for training, each epoch shuffles the
    features (seeded), sorts each run of 50 batches by length and shuffles the batches' order
    (transformers' ``group_by_length``); for evaluation, longest first, in one fixed order."""

    def __init__(
        self, lengths: list[int], batch_size: int, seed: int | None = None, window: int = 50
    ) -> None:
        self.lengths, self.batch_size, self.seed, self.window = lengths, batch_size, seed, window
        self.epoch = 0

    def __len__(self) -> int:
        return -(-len(self.lengths) // self.batch_size)

    def __iter__(self):
        if self.seed is None:
            order = length_order(self.lengths)
            yield from (
                order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)
            )
            return
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        self.epoch += 1
        order = torch.randperm(len(self.lengths), generator=g).tolist()
        span = self.batch_size * self.window
        batches = []
        for start in range(0, len(order), span):
            chunk = sorted(order[start : start + span], key=lambda i: -self.lengths[i])
            batches += [
                chunk[i : i + self.batch_size] for i in range(0, len(chunk), self.batch_size)
            ]
        yield from (batches[i] for i in torch.randperm(len(batches), generator=g).tolist())


def pad_batch(rows: list[dict[str, Any]], keys: Iterable[str], pad: dict[str, int]):
    """Tensors of ``rows``' values under ``keys``: lists padded on the right to the longest row
    (a multiple of 8) with ``pad[key]`` (0 where not named), numbers as they are."""
    width = -(-max(len(r["input_ids"]) for r in rows) // 8) * 8
    return {
        k: torch.tensor(
            [
                r[k] + [pad.get(k, 0)] * (width - len(r[k])) if isinstance(r[k], list) else r[k]
                for r in rows
            ]
        )
        for k in keys
    }
