"""Entity-level scores (``mlmkit.finetune.entities``) as conlleval reads and scores tags."""

from __future__ import annotations

import pytest

from mlmkit.finetune.entities import chunks, entity_scores, ill_formed, is_bio


@pytest.mark.parametrize(
    "tags,expected",
    [
        (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 2), ("LOC", 3, 4)]),
        (["B-PER", "B-PER"], [("PER", 0, 1), ("PER", 1, 2)]),  # B after B: two entities
        (["O", "B-X", "I-X"], [("X", 1, 3)]),  # open at the sentence's end
        (["O", "I-LOC", "I-LOC"], [("LOC", 1, 3)]),  # I- after O begins one (conlleval)
        (["B-PER", "I-LOC", "I-LOC"], [("PER", 0, 1), ("LOC", 1, 3)]),  # another type
        (["S-PER", "B-LOC", "E-LOC", "B-LOC"], [("PER", 0, 1), ("LOC", 1, 3), ("LOC", 3, 4)]),
        (["O", "O"], []),
    ],
)
def test_chunks_are_read_as_conlleval_reads_them(tags, expected):
    assert chunks(tags) == expected


def test_ill_formed_counts_the_inside_tags_that_begin_an_entity():
    assert ill_formed(["B-PER", "I-PER", "O", "B-LOC"]) == 0
    assert ill_formed(["O", "I-LOC", "I-LOC", "O", "I-PER", "B-PER", "I-LOC"]) == 3
    assert ill_formed(["O", "E-LOC"]) == 1  # BIOES: an end without its beginning


def test_bio_tag_sets_are_told_from_other_tags():
    assert is_bio(["O", "B-person", "I-person", "B-creative-work"])
    assert is_bio(["O", "S-x", "E-x", "B-x", "I-x"])
    assert not is_bio(["NOUN", "VERB", "PUNCT"])
    assert not is_bio(["O"])
    assert not is_bio(["O", "B-x", "NOUN"])


def test_entity_scores_count_an_entity_found_only_with_its_type_and_both_ends():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["O", "B-LOC", "I-LOC"], ["B-PER", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["O", "I-LOC", "I-LOC"], ["B-PER", "I-LOC"]]
    # gold: PER x2, LOC x2; predicted: PER x2, ORG, LOC x2 (the I-LOC of sentence 2 begins one
    # that matches the gold's ends); found: PER x2 and LOC x1
    got = entity_scores(gold, pred)
    assert got["precision"] == pytest.approx(3 / 5)
    assert got["recall"] == pytest.approx(3 / 4)
    assert got["f1"] == pytest.approx(2 * 0.6 * 0.75 / 1.35)
    assert got["accuracy"] == pytest.approx(6 / 9)
    assert got["per_type"]["PER"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "number": 2}
    assert got["per_type"]["LOC"] == pytest.approx(
        {"precision": 0.5, "recall": 0.5, "f1": 0.5, "number": 2}
    )
    assert got["per_type"]["ORG"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "number": 0}
    # every word O: nothing predicted, F1 0; the gold itself: 1
    assert entity_scores(gold, [["O"] * len(g) for g in gold])["f1"] == 0.0
    assert entity_scores(gold, gold)["f1"] == 1.0
