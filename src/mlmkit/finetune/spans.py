"""Extractive question answering: the answer to a question is a span of its context, or (SQuAD
v2.0) none.

    mlmkit finetune checkpoint=outputs/<run> task=qa task.data_dir=<SQuAD folder>
    mlmkit finetune checkpoint=outputs/<run> task=qa task.data_dir=../shared/data/qa \\
        task.train_file=squad2-dev-subset.json task.eval_file=null task.eval_share=0.2

Reader: ``mlmkit.finetune.squad`` (SQuAD v1.1 and v2.0 JSON). Without an evaluation file,
``task.eval_share`` of the articles are held out (whole articles, so that no paragraph is in
both sets).

Head: ``BertForQuestionAnswering`` (or ``ModernBertForQuestionAnswering``): a start and an end
logit per token. As in transformers' run_qa, a question and a context longer than the window
are cut into windows that overlap by ``task.doc_stride`` tokens (the question, cut to
``task.max_question_length`` tokens, in each); the offset mapping places the answer, and a
window that does not hold all of it is labelled "no answer" (start and end at [CLS]).

Decoder/scorer: in each window the ``task.n_best`` largest start and end logits of the context
give the candidate spans (end not before start, at most ``task.max_answer_length`` tokens); the
best span over all of a question's windows is its answer. In v2.0 a question is answered "no
answer" when the null score ([CLS]'s start and end, the least over its windows) beats the best
span's by more than ``task.null_threshold`` (``task.tune_null_threshold``: the threshold that
scores best on the evaluation set, said so in the results). Scored as the SQuAD v2.0 script
scores (``mlmkit.finetune.squad``); the baseline answers "no answer" to every question.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from mlmkit.config import FinetuneConfig, TaskConfig
from mlmkit.errors import ConfigError
from mlmkit.finetune.reader import hold_out, task_file
from mlmkit.finetune.squad import best_threshold, question_scores, read_squad, squad_scores
from mlmkit.finetune.task import Task, pad_batch

log = logging.getLogger("mlmkit")


class SpanTask(Task):
    """Extractive question answering on SQuAD files, a span-extraction head."""

    targets = ("start_positions", "end_positions")
    group_by_length = True

    def __init__(self, cfg: TaskConfig) -> None:
        super().__init__(cfg)
        self.v2 = False  # v2.0: questions may have no answer
        self.threshold = cfg.null_threshold

    def load(self):
        cfg = self.cfg
        path = task_file(cfg, "train")
        train, self.v2 = read_squad(path, "task.train_file")
        if cfg.eval_file:
            dev, v2 = read_squad(task_file(cfg, "eval"), "task.eval_file")
            self.v2 = self.v2 or v2
        else:
            articles: dict[int, list] = {}
            for q in train:
                articles.setdefault(q["article"], []).append(q)
            kept, held = hold_out(list(articles.values()), cfg, path, "articles")
            train, dev = [q for a in kept for q in a], [q for a in held for q in a]
        log.info(
            "SQuAD %s: %d training and %d evaluation questions (%d of them unanswerable)",
            "v2.0" if self.v2 else "v1.1",
            len(train),
            len(dev),
            sum(q["impossible"] for q in dev),
        )
        return train, dev

    def configure(self, config, cfg: FinetuneConfig) -> None:
        config.mlmkit_task = {
            "name": self.cfg.name,
            "kind": "qa",
            "max_seq_length": cfg.max_seq_length,
            "doc_stride": self.cfg.doc_stride,
            "max_question_length": self.cfg.max_question_length,
            "max_answer_length": self.cfg.max_answer_length,
            "n_best": self.cfg.n_best,
            "v2": self.v2,
            "null_threshold": self.cfg.null_threshold,
        }

    def head(self, arch, config, cfg: FinetuneConfig):
        return arch.question_answerer(config)

    def features(self, examples, tokenizer, max_seq_length, training):
        return question_windows(examples, tokenizer, max_seq_length, self.cfg, training)

    def collate(self, tokenizer, max_seq_length: int):
        names = [*tokenizer.model_input_names, *self.targets, "index"]
        pad = {"input_ids": tokenizer.pad_token_id}
        return lambda rows: pad_batch(rows, [k for k in names if k in rows[0]], pad)

    def outputs(self, out) -> torch.Tensor:
        """Return the start and end logits of each token: ``(tokens, 2)`` per window."""
        return torch.stack([out.start_logits.float(), out.end_logits.float()], dim=-1)

    def decode(self, outputs, features, examples) -> list[dict[str, Any]]:
        """Each question's answer: its best span, or "" where "no answer" wins (v2.0)."""
        spans = best_spans(outputs, features, examples, self.cfg.n_best, self.cfg.max_answer_length)
        if self.v2 and self.cfg.tune_null_threshold:
            texts, margins = [s["span"] for s in spans], [s["margin"] for s in spans]
            self.threshold = best_threshold(examples, texts, margins, metric=1)[1]
        return [choose(s, self.v2, self.threshold) for s in spans]

    def score(self, predictions, examples) -> dict[str, Any]:
        figures: dict[str, Any] = squad_scores(examples, [p["text"] for p in predictions])
        if self.v2 and self.cfg.tune_null_threshold:
            texts, margins = [p["span"] for p in predictions], [p["margin"] for p in predictions]
            for i, name in enumerate(("exact", "f1")):
                best, threshold = best_threshold(examples, texts, margins, metric=i)
                figures[f"best_{name}"], figures[f"best_{name}_thresh"] = best, threshold
            figures["null_threshold_tuned_on_eval"] = True
        if self.v2:
            figures["null_threshold"] = self.threshold
        return figures

    def records(self, examples, predictions):
        for q, p in zip(examples, predictions, strict=True):
            exact, f1 = question_scores(q, p["text"])
            yield {
                "id": q["id"],
                "question": q["question"],
                "prediction": p["text"],
                "start": p["start"] if p["text"] else None,
                "end": p["end"] if p["text"] else None,
                "null_margin": p["margin"],
                "answers": [a["text"] for a in q["answers"]],
                "impossible": q["impossible"],
                "exact": exact,
                "f1": f1,
            }

    def baseline(self) -> dict[str, Any]:
        figures = squad_scores(self.eval, [""] * len(self.eval))
        return {"baseline": '"no answer" to every question', **figures}

    def keep(self, figures: dict[str, Any]) -> None:
        """Take back the kept epoch's threshold: its predictions were chosen with it."""
        if "null_threshold" in figures:
            self.threshold = figures["null_threshold"]

    def finish(self, model) -> None:
        """Record the threshold the predictions used in the saved config (``mlmkit predict``)."""
        model.config.mlmkit_task = {**model.config.mlmkit_task, "null_threshold": self.threshold}


def cut_question(tokenizer, question: str, max_tokens: int) -> str:
    """Return the question, cut after its first ``max_tokens`` tokens."""
    enc = tokenizer(question, add_special_tokens=False, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]
    return question if len(offsets) <= max_tokens else question[: offsets[max_tokens - 1][1]]


def question_windows(
    examples: list[dict], tokenizer, max_seq_length: int, cfg: TaskConfig, training: bool
) -> list[dict[str, Any]]:
    """Return the model's inputs of questions on contexts: windows of the question and a stretch of
    the context (overlapping by ``cfg.doc_stride`` tokens), each with its question's index
    (``example``), each token's character offsets in the context (None outside it) and, for
    training, the answer's start and end tokens ([CLS]: no answer in this window)."""
    questions = [cut_question(tokenizer, e["question"], cfg.max_question_length) for e in examples]
    check_stride(tokenizer, questions, max_seq_length, cfg)
    enc = tokenizer(
        questions,
        [e["context"] for e in examples],
        truncation="only_second",
        max_length=max_seq_length,
        stride=cfg.doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
    )
    names = [k for k in tokenizer.model_input_names if k in enc]
    features = []
    for i, example in enumerate(enc["overflow_to_sample_mapping"]):
        offsets = [
            tuple(o) if s == 1 else None
            for o, s in zip(enc["offset_mapping"][i], enc.sequence_ids(i))
        ]
        feature = {k: enc[k][i] for k in names}
        feature.update(example=example, offsets=offsets, index=len(features))
        if training:
            start, end = answer_tokens(examples[example], offsets)
            feature.update(start_positions=start, end_positions=end)
        features.append(feature)
    return features


def check_stride(tokenizer, questions: list[str], max_seq_length: int, cfg: TaskConfig) -> None:
    """Refuse a stride that leaves a window no new context after its longest question."""
    longest = max(
        (len(tokenizer(q, add_special_tokens=False)["input_ids"]) for q in questions), default=0
    )
    room = max_seq_length - longest - tokenizer.num_special_tokens_to_add(pair=True)
    if cfg.doc_stride >= room:
        raise ConfigError(
            f"task.doc_stride={cfg.doc_stride} leaves no new context in a window: "
            f"max_seq_length={max_seq_length} holds {room} context tokens after a question of "
            f"{longest} tokens; lower task.doc_stride or task.max_question_length, or raise "
            "max_seq_length."
        )


def answer_tokens(example: dict, offsets: list) -> tuple[int, int]:
    """Return the first and last token of the example's (first) answer in a window, or ``(0, 0)``
    ([CLS]) where the window does not hold all of it or the question has none."""
    if example["impossible"]:
        return 0, 0
    answer = example["answers"][0]
    first, last = answer["start"], answer["start"] + len(answer["text"])
    context = [k for k, o in enumerate(offsets) if o is not None]
    if not context or offsets[context[0]][0] > first or offsets[context[-1]][1] < last:
        return 0, 0
    start = max(k for k in context if offsets[k][0] <= first)
    end = min(k for k in context if offsets[k][1] >= last)
    return start, end


def best_spans(
    outputs, features, examples, n_best: int, max_answer_length: int
) -> list[dict[str, Any]]:
    """Each question's best span over its windows (``{"span", "start", "end", "margin"}``:
    its text, character offsets, and the null score less the span's score)."""
    best: list[tuple[float, int, int] | None] = [None] * len(examples)
    null = [math.inf] * len(examples)
    for feature, out in zip(features, outputs, strict=True):
        offsets, ex = feature["offsets"], feature["example"]
        logits = out[: len(offsets)]
        null[ex] = min(null[ex], float(logits[0, 0] + logits[0, 1]))
        found = window_span(logits, offsets, n_best, max_answer_length)
        if found is not None and (best[ex] is None or found[0] > best[ex][0]):
            best[ex] = found
    spans = []
    for ex, (example, found) in enumerate(zip(examples, best)):
        if found is None:
            spans.append({"span": "", "start": None, "end": None, "margin": math.inf})
            continue
        score, a, b = found
        margin = null[ex] - score
        spans.append({"span": example["context"][a:b], "start": a, "end": b, "margin": margin})
    return spans


def window_span(logits, offsets: list, n_best: int, max_answer_length: int):
    """``(score, first character, one past the last)`` of a window's best valid span, or None."""
    in_context = torch.tensor([o is not None for o in offsets])
    if not bool(in_context.any()):
        return None
    start = logits[:, 0].masked_fill(~in_context, -math.inf)
    end = logits[:, 1].masked_fill(~in_context, -math.inf)
    k = min(n_best, int(in_context.sum()))
    starts, ends = start.topk(k).indices, end.topk(k).indices
    length = ends[None, :] - starts[:, None]
    scores = (start[starts][:, None] + end[ends][None, :]).masked_fill(
        (length < 0) | (length >= max_answer_length), -math.inf
    )
    flat = int(scores.argmax())
    score = float(scores.flatten()[flat])
    if score == -math.inf:
        return None
    a, b = int(starts[flat // k]), int(ends[flat % k])
    return score, offsets[a][0], offsets[b][1]


def choose(span: dict[str, Any], v2: bool, threshold: float) -> dict[str, Any]:
    """Return the answer of a question: its span, or "" where "no answer" wins by more than the
    threshold (v2.0 only)."""
    no_answer = v2 and span["margin"] > threshold
    return {**span, "text": "" if no_answer else span["span"]}
