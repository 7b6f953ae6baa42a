"""Entity-level scores of tag sequences, as conlleval (CoNLL-2000's script) and seqeval's default
mode score them: an entity counts as found only when its type and both its ends are right.

Tags are ``O``, or a prefix and a type: ``B-PER``, ``I-PER`` (BIO, also called IOB2), ``E-``
and ``S-`` (BIOES), or IOB1's ``I-`` that begins an entity after ``O``. A sequence that is not
valid BIO (an ``I-`` after ``O`` or after another type) is read as conlleval reads it: the
``I-`` tag begins a new entity. ``ill_formed`` counts such tags.

    chunks(["B-PER", "I-PER", "O", "I-LOC"])  ->  [("PER", 0, 2), ("LOC", 3, 4)]
    entity_scores(gold, predicted)  ->  {"precision", "recall", "f1", "accuracy", "per_type"}
"""

from __future__ import annotations

from collections import Counter

PREFIXES = ("B", "I", "E", "S")


def split_tag(tag: str) -> tuple[str, str]:
    """``(prefix, type)`` of a tag: ``("O", "")`` for O, ``("B", "PER")`` for B-PER; a tag
    without a prefix is an inside tag of its own type."""
    if tag == "O":
        return "O", ""
    prefix, sep, kind = tag.partition("-")
    if sep and prefix in PREFIXES:
        return prefix, kind
    return "I", tag


def ends_chunk(prev: tuple[str, str], cur: tuple[str, str]) -> bool:
    """Whether the entity open at the previous tag ends before the current one (conlleval)."""
    (p, pt), (c, ct) = prev, cur
    if p in ("E", "S"):
        return True
    if p == "B" and c in ("B", "S", "O"):
        return True
    if p == "I" and c in ("B", "S", "O"):
        return True
    return p != "O" and pt != ct


def starts_chunk(prev: tuple[str, str], cur: tuple[str, str]) -> bool:
    """Whether an entity begins at the current tag (conlleval)."""
    (p, pt), (c, ct) = prev, cur
    if c in ("B", "S"):
        return True
    if p in ("E", "S", "O") and c in ("E", "I"):
        return True
    return c != "O" and pt != ct


def chunks(tags: list[str]) -> list[tuple[str, int, int]]:
    """Return the entities of one sentence's tags: ``(type, first word, one past the last)``."""
    found, start, prev = [], None, ("O", "")
    for i, tag in enumerate([*tags, "O"]):
        cur = split_tag(tag)
        if start is not None and ends_chunk(prev, cur):
            found.append((prev[1], start, i))
            start = None
        if starts_chunk(prev, cur) and i < len(tags):
            start = i
        prev = cur
    return found


def ill_formed(tags: list[str]) -> int:
    """Return the ``I-`` and ``E-`` tags that begin an entity (after ``O`` or another type)."""
    count, prev = 0, ("O", "")
    for tag in tags:
        cur = split_tag(tag)
        count += cur[0] in ("I", "E") and starts_chunk(prev, cur)
        prev = cur
    return count


def is_bio(labels: list[str]) -> bool:
    """Whether a tag set marks entities (``O`` and prefixed tags, one prefix at least)."""
    prefixed = [t for t in labels if t != "O"]
    return bool(prefixed) and all(t.partition("-")[0] in PREFIXES and "-" in t for t in prefixed)


def _prf(found: int, predicted: int, gold: int) -> dict[str, float]:
    precision = found / predicted if predicted else 0.0
    recall = found / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def entity_scores(gold: list[list[str]], predicted: list[list[str]]) -> dict:
    """Precision, recall and F1 of the entities (micro-averaged over all of them, as conlleval's
    overall line), the word accuracy, and per type precision, recall, F1 and the number of gold
    entities; sentences are scored apart (an entity never spans two)."""
    found, n_pred, n_gold = Counter(), Counter(), Counter()
    right = words = 0
    for g, p in zip(gold, predicted, strict=True):
        gold_chunks, pred_chunks = set(chunks(g)), set(chunks(p))
        n_gold.update(t for t, _, _ in gold_chunks)
        n_pred.update(t for t, _, _ in pred_chunks)
        found.update(t for t, _, _ in gold_chunks & pred_chunks)
        right += sum(a == b for a, b in zip(g, p, strict=True))
        words += len(g)
    per_type = {
        t: {**_prf(found[t], n_pred[t], n_gold[t]), "number": n_gold[t]}
        for t in sorted(set(n_gold) | set(n_pred))
    }
    return {
        **_prf(sum(found.values()), sum(n_pred.values()), sum(n_gold.values())),
        "accuracy": right / words if words else 0.0,
        "per_type": per_type,
    }
