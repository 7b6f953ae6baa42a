"""Linear probes: what a frozen encoder's sentence vectors are worth on a labelled task.

Each sentence (or pair, joined as the tokenizer joins pairs) is embedded once by the frozen
encoder (the mean of the last layer's token states, padding excluded: the pooling of a run's
``final/`` as a sentence embedder); a multinomial logistic regression is then fitted on the
training vectors, standardised, and scored on the dev vectors. Its L2 weight is chosen from
``L2_GRID`` on a held-out fifth of the training vectors, then refitted on all of them, as
SentEval does for its probes (Conneau & Kiela, 2018). The regression is convex and fitted to
convergence with L-BFGS, so a probe's score depends on the encoder and the data alone: no
learning rate, epochs or seed to tune, and it costs one forward pass over the sentences.

    probe = LinearProbe.from_task(task_config, max_train_samples=10000)
    figures = probe.score(encoder, tokenizer)      # {"probe_accuracy": ..., ...}

Pretraining runs a probe every ``probe.every`` steps (``probe_for_run``: ``mlmkit train
probe.every=500 probe.task.data_dir=../shared/data/glue/SST-2``). On a random encoder such a
regression already does well (its mean-pooled states are a random projection of the words), so
a briefly pretrained model need not beat its step-0 probe: docs/benchmarks.md has figures.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from mlmkit.config import ProbeConfig, TaskConfig
from mlmkit.errors import ConfigError, MLMKitError

L2_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)  # the regression's L2 weights tried (per example)


def encode_with(encoder) -> tuple[Callable[[dict], torch.Tensor], torch.device]:
    """``(encode, device)`` for an encoder module (``BertModel``, ...): ``encode(batch)`` is its
    last layer's states for a tokenized batch."""
    return (lambda batch: encoder(**batch).last_hidden_state), next(encoder.parameters()).device


def token_ids(tokenizer, texts: list[list[str]], max_seq_length: int = 64):
    """Return the tokenizer's unpadded ids of ``texts`` (sentences or pairs), cut at
    ``max_seq_length``."""
    return tokenizer(*zip(*texts), truncation=True, max_length=max_seq_length)


@torch.no_grad()
def sentence_vectors(
    encode: Callable[[dict], torch.Tensor],
    tokenizer,
    texts: list[list[str]],
    max_seq_length: int = 64,
    batch_size: int = 64,
    device="cpu",
    ids=None,
) -> torch.Tensor:
    """``(len(texts), hidden)`` float32 mean-pooled last-layer states; each item of ``texts`` is
    one sentence or a pair ``[a, b]``; ``encode`` maps a tokenized batch (on ``device``) to the
    encoder's last states (``encode_with``; a training run passes its objective's); ``ids``:
    ``token_ids`` of the texts, where the caller keeps them."""
    from mlmkit.model.classifier import masked_mean

    if not texts:
        return torch.empty(0)
    ids = ids if ids is not None else token_ids(tokenizer, texts, max_seq_length)
    # batches of similar lengths (the longest first): little padding to compute
    order = sorted(range(len(texts)), key=lambda i: -len(ids["input_ids"][i]))
    keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in ids]
    out = None
    for i in range(0, len(order), batch_size):
        rows = order[i : i + batch_size]
        enc = tokenizer.pad({k: [ids[k][r] for r in rows] for k in keys}, return_tensors="pt")
        enc = {k: v.to(device) for k, v in enc.items()}
        pooled = masked_mean(encode(enc).float(), enc["attention_mask"]).cpu()
        if out is None:
            out = torch.empty(len(texts), pooled.shape[-1])
        out[rows] = pooled
    return out


def fit_logistic(
    x: torch.Tensor, y: torch.Tensor, n_classes: int, l2: float, max_iter: int = 200
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights and bias of a multinomial logistic regression on ``x`` (standardised) with
    an L2 penalty of ``l2`` times the squared weights, fitted by L-BFGS."""
    w = torch.zeros(x.shape[1], n_classes, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(n_classes, dtype=torch.float64, requires_grad=True)
    x64, y = x.double(), y.long()
    opt = torch.optim.LBFGS(
        [w, b], lr=1.0, max_iter=max_iter, tolerance_grad=1e-6, line_search_fn="strong_wolfe"
    )

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x64 @ w + b, y) + l2 * (w * w).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return w.detach(), b.detach()


def accuracy(w: torch.Tensor, b: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
    return float(((x.double() @ w + b).argmax(-1) == y).double().mean()) if len(y) else float("nan")


def fit_and_score(
    train_x: torch.Tensor,
    train_y: torch.Tensor,
    eval_x: torch.Tensor,
    eval_y: torch.Tensor,
    n_classes: int,
) -> dict[str, float]:
    """Standardise by the training vectors, choose the L2 weight on a held-out fifth of them
    (a fixed draw), refit on all, score the dev vectors."""
    mean, std = train_x.mean(0), train_x.std(0).clamp(min=1e-6)
    train_x, eval_x = (train_x - mean) / std, (eval_x - mean) / std
    order = torch.randperm(len(train_y), generator=torch.Generator().manual_seed(0))
    fit, held_out = order[max(len(order) // 5, 1) :], order[: max(len(order) // 5, 1)]
    held = {
        l2: accuracy(
            *fit_logistic(train_x[fit], train_y[fit], n_classes, l2),
            train_x[held_out],
            train_y[held_out],
        )
        for l2 in L2_GRID
    }
    best = max(L2_GRID, key=lambda l2: (held[l2], l2))  # ties: the stronger penalty
    w, b = fit_logistic(train_x, train_y, n_classes, best)
    return {
        "probe_accuracy": accuracy(w, b, eval_x, eval_y),
        "probe_train_accuracy": accuracy(w, b, train_x, train_y),
        "probe_l2": best,
    }


@dataclass
class LinearProbe:
    """A labelled task's texts and classes, read once, scored for any encoder."""

    name: str
    train_texts: list[list[str]]
    train_labels: torch.Tensor
    eval_texts: list[list[str]]
    eval_labels: torch.Tensor
    n_classes: int
    max_seq_length: int = 64
    _ids: tuple | None = field(
        default=None, repr=False
    )  # (tokenizer, its token_ids): one tokenizing a run

    @classmethod
    def from_task(
        cls,
        task: TaskConfig,
        max_train_samples: int | None = 10000,
        max_eval_samples: int | None = None,
        max_seq_length: int = 64,
    ) -> LinearProbe:
        """Make a probe of the task's train and dev examples (its files or the Hub, as
        ``mlmkit finetune`` reads them); a regression task is refused."""
        from mlmkit.finetune.reader import load_task

        if task.kind != "classification":
            raise ConfigError(
                f"A linear probe classifies sentences, and task={task.name} is a {task.kind} task; "
                "choose a classification task for the probe."
            )
        train, dev = load_task(task)
        train, dev = train[:max_train_samples], dev[:max_eval_samples]
        if len({e["label"] for e in train}) < 2:
            raise ConfigError(
                f"The probe's training examples of task={task.name} hold one class; "
                "raise the probe's max_train_samples or use another task."
            )
        return cls(
            task.name,
            [e["text"] for e in train],
            torch.tensor([e["label"] for e in train]),
            [e["text"] for e in dev],
            torch.tensor([e["label"] for e in dev]),
            len(task.labels),
            max_seq_length,
        )

    def describe(self, every: int) -> str:
        """Return the run log's line for this probe."""
        return (
            f"Probe: {self.name}, {len(self.train_texts)} training and {len(self.eval_texts)} dev "
            f"examples, every {every} steps"
        )

    def score(self, encoder, tokenizer) -> dict[str, Any]:
        """``probe_accuracy`` on the dev examples (with the training accuracy, the L2 weight
        chosen and the seconds taken) for the frozen ``encoder`` module, in eval mode."""
        was_training = encoder.training
        encoder.eval()
        try:
            return self.score_encoded(*encode_with(encoder), tokenizer)
        finally:
            encoder.train(was_training)

    def score_encoded(
        self, encode: Callable[[dict], torch.Tensor], device, tokenizer
    ) -> dict[str, Any]:
        """``score`` for an ``encode`` function (``sentence_vectors``) on ``device``."""
        t0 = time.perf_counter()
        texts = self.train_texts + self.eval_texts
        if self._ids is None or self._ids[0] is not tokenizer:
            self._ids = (tokenizer, token_ids(tokenizer, texts, self.max_seq_length))
        vectors = sentence_vectors(
            encode, tokenizer, texts, self.max_seq_length, device=device, ids=self._ids[1]
        )
        n = len(self.train_texts)
        figures = fit_and_score(
            vectors[:n], self.train_labels, vectors[n:], self.eval_labels, self.n_classes
        )
        return {
            **figures,
            "probe_task": self.name,
            "probe_train_examples": n,
            "probe_eval_examples": len(self.eval_texts),
            "probe_seconds": time.perf_counter() - t0,
        }


def probe_for_run(cfg: ProbeConfig) -> LinearProbe | None:
    """Make the probe a pretraining run's ``probe`` settings ask for (None with ``probe.every=0``),
    its data read before the run starts; an error names the ``probe.task`` setting to change."""
    if not cfg.every:
        return None
    try:
        probe = LinearProbe.from_task(
            cfg.task, cfg.max_train_samples, cfg.max_eval_samples, cfg.max_seq_length
        )
    except MLMKitError as exc:  # the task's messages name task.*: here they are probe.task.*
        raise type(exc)(re.sub(r"(?<![\w.])task([.=])", r"probe.task\1", str(exc))) from None
    return probe
