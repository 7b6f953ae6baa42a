"""SQuAD files and the SQuAD v2.0 script's scores (``mlmkit.finetune.squad``)."""

from __future__ import annotations

import json

import pytest
from conftest import shared_file

from mlmkit.errors import DataError
from mlmkit.finetune.squad import (
    best_threshold,
    exact_match,
    normalize_answer,
    read_squad,
    squad_scores,
    token_f1,
)


def squad_json(articles: list[list[tuple[str, list[tuple[str, str | None]]]]], version="v2.0"):
    """A SQuAD document: articles of paragraphs ``(context, [(question, answer or None)])``,
    each answer placed at its first occurrence in the context."""
    data = []
    for a, paragraphs in enumerate(articles):
        paras = []
        for p, (context, qas) in enumerate(paragraphs):
            items = []
            for q, (question, answer) in enumerate(qas):
                item = {"id": f"{a}-{p}-{q}", "question": question, "answers": []}
                if answer is not None:
                    item["answers"] = [{"text": answer, "answer_start": context.index(answer)}]
                if version.startswith("v2"):
                    item["is_impossible"] = answer is None
                items.append(item)
            paras.append({"context": context, "qas": items})
        data.append({"title": f"article {a}", "paragraphs": paras})
    return {"version": version, "data": data}


def test_answers_are_normalised_as_the_official_script_does():
    assert normalize_answer("The  Eiffel-Tower, in PARIS!") == "eiffeltower in paris"
    assert normalize_answer("an apple and a pear") == "apple and pear"
    assert exact_match("the Norman dynasty", "Norman Dynasty.") == 1.0
    assert exact_match("Normans", "the Normans of France") == 0.0
    # F1 of word bags: 2 words shared, 3 predicted, 2 gold
    assert token_f1("Norman conquest", "the Norman conquest of England") == pytest.approx(
        2 * (2 / 4) * 1.0 / (2 / 4 + 1.0)
    )
    assert token_f1("", "") == 1.0 and token_f1("", "France") == 0.0 and token_f1("a", "") == 1.0


def test_squad_scores_split_answerable_and_unanswerable_questions():
    questions = [
        {"answers": [{"text": "France"}, {"text": "in France"}], "impossible": False},
        {"answers": [{"text": "10th century"}], "impossible": False},
        {"answers": [], "impossible": True},
        {"answers": [], "impossible": True},
    ]
    got = squad_scores(questions, ["France", "the 10th and 11th centuries", "", "Rollo"])
    f1_second = 2 * (1 / 4) * (1 / 2) / (1 / 4 + 1 / 2)  # "10th" shared; 4 predicted, 2 gold
    assert got == pytest.approx(
        {
            "exact": 100 * 2 / 4,
            "f1": 100 * (1 + f1_second + 1 + 0) / 4,
            "total": 4,
            "HasAns_exact": 50.0,
            "HasAns_f1": 100 * (1 + f1_second) / 2,
            "HasAns_total": 2,
            "NoAns_exact": 50.0,
            "NoAns_f1": 50.0,
            "NoAns_total": 2,
        }
    )
    assert "NoAns_exact" not in squad_scores(questions[:2], ["France", ""])  # v1.1: none


def test_the_best_null_threshold_is_the_one_that_scores_best():
    questions = [
        {"answers": [{"text": "A"}], "impossible": False},
        {"answers": [{"text": "B"}], "impossible": False},
        {"answers": [], "impossible": True},
    ]
    spans, margins = ["A", "C", "D"], [-2.0, 0.5, 1.0]
    # every question "no answer" below -2: 1 of 3; answer the first: 2; the second too: 2
    # (wrong); all three: 1. Best: answer where the margin is at most -2
    assert best_threshold(questions, spans, margins, metric=0) == (pytest.approx(200 / 3), -2.0)
    assert best_threshold(questions[2:], ["D"], [1.0], metric=1) == (100.0, 0.0)  # never answer


def test_squad_files_read_v1_and_v2_and_bad_ones_name_the_file_and_question(tmp_path):
    context = "Rollo led the Normans to Normandy in the 10th century."
    doc = squad_json([[(context, [("Who led?", "Rollo"), ("Who ate?", None)])]])
    path = tmp_path / "a.json"
    path.write_text(json.dumps(doc))
    questions, v2 = read_squad(path, "task.train_file")
    assert v2 and [q["impossible"] for q in questions] == [False, True]
    assert questions[0]["answers"] == [{"text": "Rollo", "start": 0}]
    assert questions[0]["context"] == context and questions[0]["article"] == 0
    v1 = squad_json([[(context, [("Who led?", "Rollo")])]], version="1.1")
    path.write_text(json.dumps(v1))
    assert read_squad(path, "task.train_file")[1] is False
    doc["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["answer_start"] = 3
    path.write_text(json.dumps(doc))
    with pytest.raises(
        DataError,
        match=r"a.json', question '0-0-0': the answer 'Rollo' is not the context's text at "
        r"character 3 \('lo le'\); correct its answer_start",
    ):
        read_squad(path, "task.train_file")
    for text in ('[{"context": "x"}]', '{"data": [{"title": "x"}]}', "{not json"):
        path.write_text(text)
        with pytest.raises(DataError, match=r"task.eval_file: .*a.json' is not SQuAD JSON"):
            read_squad(path, "task.eval_file")
    path.write_text(json.dumps({"version": "v2.0", "data": []}))
    with pytest.raises(DataError, match=r"a.json' holds no question"):
        read_squad(path, "task.train_file")
    with pytest.raises(DataError, match=r"b.json' does not exist; set task.train_file"):
        read_squad(tmp_path / "b.json", "task.train_file")


def test_the_shared_squad_subset_reads_as_its_readme_counts_it():
    questions, v2 = read_squad(shared_file("qa/squad2-dev-subset.json"), "task.train_file")
    assert v2 and len(questions) == 1407 and sum(q["impossible"] for q in questions) == 702
    assert len({q["article"] for q in questions}) == 5
