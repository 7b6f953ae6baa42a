"""SQuAD files and scores (``task.kind=qa``): questions on paragraphs, answered by a span of the
paragraph or, in v2.0, by "no answer".

Reader: SQuAD v1.1 or v2.0 JSON (``{"version", "data": [{"title", "paragraphs": [{"context",
"qas": [{"id", "question", "answers": [{"text", "answer_start"}], "is_impossible"}]}]}]}``);
each question becomes ``{"id", "question", "context", "answers": [{"text", "start"}],
"impossible", "article"}``. An answer whose text is not the context's at its offset, a file that
is not SQuAD, a file without a question are errors naming the file (and question id).

Scores, as the official SQuAD v2.0 evaluation script computes them: both texts normalised
(lower case, punctuation and the articles a, an, the removed, spaces collapsed); exact match and
token F1 against the best of a question's gold answers ("" for an unanswerable one, which only
"no answer" matches); percentages over all questions and apart for answerable (``HasAns_*``) and
unanswerable (``NoAns_*``) ones. ``best_threshold`` finds the "no answer" threshold that scores
best on a set (reported only when asked: it is tuned on what it scores).
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from pathlib import Path
from typing import Any

from mlmkit.data.sources import check_not_binary
from mlmkit.errors import DataError

PUNCTUATION = set(string.punctuation)
ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def read_squad(path: Path, setting: str) -> tuple[list[dict[str, Any]], bool]:
    """``(questions, v2)`` of a SQuAD JSON file: v2 when its version says so or a question is
    unanswerable."""
    if not path.is_file():
        raise DataError(
            f"{setting}: {str(path)!r} does not exist; set {setting} to a SQuAD .json file "
            "(absolute, or relative to task.data_dir)."
        )
    check_not_binary(str(path), setting)
    not_squad = (
        f'{setting}: {str(path)!r} is not SQuAD JSON (an object whose "data" lists articles '
        f'with "paragraphs" of "context" and "qas"); point {setting} at a SQuAD v1.1 or '
        "v2.0 file"
    )
    try:
        doc = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except ValueError as exc:
        raise DataError(f"{not_squad} ({exc}).") from None
    articles = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(articles, list) or not all(
        isinstance(a, dict) and isinstance(a.get("paragraphs"), list) for a in articles
    ):
        raise DataError(f"{not_squad}.")
    questions = [
        q for i, article in enumerate(articles) for q in _questions(article, i, path, not_squad)
    ]
    if not questions:
        raise DataError(
            f"{setting}: {str(path)!r} holds no question; point {setting} at a SQuAD file "
            "with questions."
        )
    v2 = str(doc.get("version", "")).startswith("v2") or any(q["impossible"] for q in questions)
    return questions, v2


def _questions(article: dict, index: int, path: Path, not_squad: str) -> list[dict[str, Any]]:
    """Return the questions of one article, each answer checked against its context."""
    found = []
    for paragraph in article["paragraphs"]:
        context = paragraph.get("context") if isinstance(paragraph, dict) else None
        if not isinstance(context, str) or not isinstance(paragraph.get("qas"), list):
            raise DataError(f"{not_squad}.")
        for qa in paragraph["qas"]:
            if not isinstance(qa, dict) or not isinstance(qa.get("question"), str):
                raise DataError(f"{not_squad}.")
            qid = str(qa.get("id", len(found)))
            answers = [_answer(a, context, qid, path) for a in qa.get("answers") or []]
            impossible = bool(qa.get("is_impossible", False)) or not answers
            found.append(
                {
                    "id": qid,
                    "question": qa["question"].strip(),
                    "context": context,
                    "answers": [] if impossible else answers,
                    "impossible": impossible,
                    "article": index,
                }
            )
    return found


def _answer(answer: dict, context: str, qid: str, path: Path) -> dict[str, Any]:
    """``{"text", "start"}`` of a gold answer whose text is the context's at its offset."""
    text, start = answer.get("text"), answer.get("answer_start")
    if not isinstance(text, str) or not isinstance(start, int):
        raise DataError(
            f'{str(path)!r}, question {qid!r}: an answer without its "text" and '
            '"answer_start" (a character offset); correct the answer, or use another file.'
        )
    found = context[start : start + len(text)]
    if found != text:
        raise DataError(
            f"{str(path)!r}, question {qid!r}: the answer {text!r} is not the context's text at "
            f"character {start} ({found!r}); correct its answer_start, or use another file."
        )
    return {"text": text, "start": start}


# ---- scores ---------------------------------------------------------------------------------


def normalize_answer(text: str) -> str:
    """Return ``text`` lower-cased, without punctuation and articles, its spaces collapsed."""
    text = "".join(ch for ch in text.lower() if ch not in PUNCTUATION)
    return " ".join(ARTICLES.sub(" ", text).split())


def exact_match(gold: str, predicted: str) -> float:
    """Return 1.0 when the two normalised texts are equal, else 0.0."""
    return float(normalize_answer(gold) == normalize_answer(predicted))


def token_f1(gold: str, predicted: str) -> float:
    """Return the F1 of the normalised texts' words (1.0 when both are empty, 0.0 when one is)."""
    g, p = normalize_answer(gold).split(), normalize_answer(predicted).split()
    if not g or not p:
        return float(g == p)
    same = sum((Counter(g) & Counter(p)).values())
    if not same:
        return 0.0
    precision, recall = same / len(p), same / len(g)
    return 2 * precision * recall / (precision + recall)


def gold_texts(question: dict[str, Any]) -> list[str]:
    """Return the gold answers a prediction is scored against ("" for an unanswerable one)."""
    texts = [a["text"] for a in question["answers"] if normalize_answer(a["text"])]
    return texts or [""]


def question_scores(question: dict[str, Any], predicted: str) -> tuple[float, float]:
    """Return ``(exact, f1)`` of a prediction: the best over the question's gold answers."""
    golds = gold_texts(question)
    return max(exact_match(g, predicted) for g in golds), max(token_f1(g, predicted) for g in golds)


def squad_scores(questions: list[dict[str, Any]], predictions: list[str]) -> dict[str, float]:
    """Return exact and f1 (percentages) over all questions and apart for answerable
    (``HasAns_*``) and unanswerable (``NoAns_*``) ones, with their counts (``*_total``)."""
    scored = [(q["impossible"], *question_scores(q, p)) for q, p in zip(questions, predictions)]
    out: dict[str, float] = {}
    for name, keep in (("", None), ("HasAns_", False), ("NoAns_", True)):
        part = [(e, f) for impossible, e, f in scored if keep is None or impossible == keep]
        if keep is not None and not part:
            continue
        n = max(len(part), 1)
        out[f"{name}exact"] = 100.0 * sum(e for e, _ in part) / n
        out[f"{name}f1"] = 100.0 * sum(f for _, f in part) / n
        out[f"{name}total"] = len(part)
    return out


def best_threshold(
    questions: list[dict[str, Any]], spans: list[str], null_margins: list[float], metric: int
) -> tuple[float, float]:
    """Return ``(score, threshold)``: the "no answer" threshold that scores best (``metric`` 0:
    exact, 1: f1) when a question is answered "no answer" where its null margin (the null score
    less the best span's) is above the threshold, else with its best span; and that score, a
    percentage. The threshold tried first is below every margin (every question "no answer")."""
    answered = [question_scores(q, s)[metric] for q, s in zip(questions, spans)]
    unanswered = [float(q["impossible"]) for q in questions]
    score = best = sum(unanswered)
    threshold = min(null_margins, default=0.0) - 1.0
    order = sorted(range(len(questions)), key=lambda i: null_margins[i])
    for k, i in enumerate(order):
        score += answered[i] - unanswered[i]  # answered from this threshold up
        tied = k + 1 < len(order) and null_margins[order[k + 1]] == null_margins[i]
        if not tied and score > best:
            best, threshold = score, null_margins[i]
    return 100.0 * best / max(len(questions), 1), threshold
