"""Extractive question answering (``mlmkit.finetune.spans``): windows with a stride, answers
placed by the offset mapping, n-best decoding, and ``mlmkit finetune task=qa`` end to end."""

from __future__ import annotations

import json
import random

import pytest
import torch
from helpers import task_config
from runs import TEST_ENV, python_run, run_cli, run_finetune

from mlmkit.errors import ConfigError
from mlmkit.finetune.spans import SpanTask, best_spans, choose, question_windows

from .test_squad import squad_json

FILLER = "The river runs past old mills and quiet farms while the hills rise behind them ."
COUNTRIES = [("France", "Paris"), ("Norway", "Oslo"), ("Peru", "Lima"), ("Japan", "Tokyo")]
COUNTRIES += [("Italy", "Rome"), ("Kenya", "Nairobi"), ("Chile", "Santiago"), ("Egypt", "Cairo")]


def capitals(n_articles: int, seed: int, filler: int = 1) -> dict:
    """A SQuAD v2.0 document: per article, paragraphs that name a country's capital, asked
    about it (answerable) and about another country's (unanswerable)."""
    rng = random.Random(seed)
    articles = []
    for _ in range(n_articles):
        paragraphs = []
        for country, city in rng.sample(COUNTRIES, 4):
            other = rng.choice([c for c, _ in COUNTRIES if c != country])
            context = f"{FILLER * filler} The capital of {country} is {city} . {FILLER}"
            qas = [(f"What is the capital of {country}?", city)]
            qas.append((f"What is the capital of {other}?", None))
            paragraphs.append((context, qas))
        articles.append(paragraphs)
    return squad_json(articles)


def _examples(doc: dict) -> list[dict]:
    out = []
    for p in (p for a in doc["data"] for p in a["paragraphs"]):
        for qa in p["qas"]:
            answers = [{"text": a["text"], "start": a["answer_start"]} for a in qa["answers"]]
            out.append(
                {
                    "id": qa["id"],
                    "question": qa["question"],
                    "context": p["context"],
                    "answers": answers,
                    "impossible": qa["is_impossible"],
                    "article": 0,
                }
            )
    return out


def _qa_task(**settings):
    return task_config("qa", train_file="a.json", eval_file="b.json", **settings)


def test_long_contexts_are_cut_into_overlapping_windows_that_place_the_answer(tokenizer):
    examples = _examples(capitals(1, 0, filler=4))[:2]  # an answerable question, then not
    cfg = _qa_task(doc_stride=8, max_question_length=12)
    features = question_windows(examples, tokenizer, 40, cfg, training=True)
    mine = [f for f in features if f["example"] == 0]
    assert len(mine) > 3 and all(len(f["input_ids"]) <= 40 for f in features)
    context, answer = examples[0]["context"], examples[0]["answers"][0]
    for a, b in zip(mine, mine[1:]):  # consecutive windows share doc_stride context tokens
        first = [o for o in a["offsets"] if o is not None]
        second = [o for o in b["offsets"] if o is not None]
        assert first[-8:] == second[:8]
    placed = [f for f in mine if f["start_positions"] != 0]
    assert placed, "a window holds the answer"
    for f in placed:
        s, e = f["start_positions"], f["end_positions"]
        assert context[f["offsets"][s][0] : f["offsets"][e][1]] == answer["text"]
    end = answer["start"] + len(answer["text"])
    for f in mine:  # a window without all of the answer: no answer, at [CLS]
        span = [o for o in f["offsets"] if o is not None]
        holds = span[0][0] <= answer["start"] and span[-1][1] >= end
        assert (f["start_positions"] != 0) == holds
        assert (f["end_positions"] != 0) == holds
    assert len(placed) < len(mine)
    assert all(f["start_positions"] == f["end_positions"] == 0 for f in features if f["example"])
    with pytest.raises(ConfigError, match=r"task.doc_stride=30 leaves no new context"):
        question_windows(examples, tokenizer, 40, _qa_task(doc_stride=30), training=True)


def _logits(feature, start: int, end: int, null: float = 0.0) -> torch.Tensor:
    logits = torch.zeros(len(feature["input_ids"]) + 5, 2)  # padded, as gathered
    logits[0] = null / 2
    logits[start, 0], logits[end, 1] = 5.0, 5.0
    return logits


def test_the_best_span_over_a_question_s_windows_is_its_answer(tokenizer):
    examples = _examples(capitals(1, 0, filler=4))[:1]
    cfg = _qa_task(doc_stride=8, max_question_length=12)
    features = question_windows(examples, tokenizer, 40, cfg, training=True)
    answer = examples[0]["answers"][0]
    outputs = []
    for f in features:  # each window points at its own labelled answer, or at its first word
        first = next(k for k, o in enumerate(f["offsets"]) if o is not None)
        s, e = (
            (f["start_positions"], f["end_positions"]) if f["start_positions"] else (first, first)
        )
        outputs.append(_logits(f, s, e) * (2.0 if f["start_positions"] else 1.0))
    (span,) = best_spans(outputs, features, examples, n_best=5, max_answer_length=10)
    assert span["span"] == answer["text"]
    assert (span["start"], span["end"]) == (answer["start"], answer["start"] + len(answer["text"]))
    # a null score above the span's: "no answer" in v2.0, the span in v1.1
    outputs = [o.clone() for o in outputs]
    for o in outputs:
        o[0] = 15.0
    (span,) = best_spans(outputs, features, examples, n_best=5, max_answer_length=10)
    assert span["margin"] == pytest.approx(30.0 - 20.0)
    assert choose(span, v2=True, threshold=0.0)["text"] == ""
    assert choose(span, v2=True, threshold=11.0)["text"] == answer["text"]
    assert choose(span, v2=False, threshold=0.0)["text"] == answer["text"]
    # a span longer than max_answer_length is never chosen
    f = features[0]
    ctx = [k for k, o in enumerate(f["offsets"]) if o is not None]
    logits = _logits(f, ctx[0], ctx[6])
    logits[ctx[1], 1] = 1.0
    (span,) = best_spans([logits], [f], examples, n_best=5, max_answer_length=3)
    context = examples[0]["context"]
    assert span["span"] == context[f["offsets"][ctx[0]][0] : f["offsets"][ctx[1]][1]]


def test_a_split_is_held_out_by_whole_articles(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(capitals(5, 0)))
    task = SpanTask(
        task_config(
            "qa", data_dir=str(tmp_path), train_file="a.json", eval_file=None, eval_share=0.4
        )
    )
    train, dev = task.load()
    assert task.v2 and len(dev) == 2 * 8 and len(train) == 3 * 8
    assert not {q["article"] for q in train} & {q["article"] for q in dev}


@pytest.fixture(scope="module")
def qa_run(trained_run, tmp_path_factory):
    """``mlmkit finetune task=qa`` on capitals, the threshold tuned: its run dir and output."""
    folder = tmp_path_factory.mktemp("qa")
    (folder / "train.json").write_text(json.dumps(capitals(6, 0)))
    (folder / "dev.json").write_text(json.dumps(capitals(2, 1)))
    out = folder / "run"
    proc = run_finetune(
        f"checkpoint={trained_run}",
        "task=qa",
        f"task.data_dir={folder}",
        "task.train_file=train.json",
        "task.eval_file=dev.json",
        "task.tune_null_threshold=true",
        "epochs=2",
        "lr=3e-3",
        "batch_size=8",
        "max_seq_length=48",
        "task.doc_stride=16",
        "precision=no",
        f"hydra.run.dir={out}",
    )
    return out, proc


def test_the_kept_epochs_threshold_is_the_one_saved(trained_run, tmp_path, monkeypatch):
    """``keep_best`` keeping the first of two epochs of a QA run (its F1 scripted higher, each
    epoch's tuned threshold set apart): the saved config's null threshold is the first epoch's,
    the one its predictions and figures were chosen with."""
    from mlmkit.finetune import loop

    real, scripted = loop.evaluate, iter([(90.0, 1.5), (10.0, 7.5)])

    def evaluate(run):
        figures, predictions = real(run)
        figures["f1"], run.task.threshold = next(scripted)
        figures["null_threshold"] = run.task.threshold
        return figures, predictions

    monkeypatch.setattr(loop, "evaluate", evaluate)
    folder = tmp_path / "qa"
    folder.mkdir()
    (folder / "train.json").write_text(json.dumps(capitals(6, 0)))
    (folder / "dev.json").write_text(json.dumps(capitals(2, 1)))
    run_finetune(
        f"checkpoint={trained_run}", "task=qa", f"task.data_dir={folder}",
        "task.train_file=train.json", "task.eval_file=dev.json", "task.tune_null_threshold=true",
        "epochs=2", "batch_size=8", "max_seq_length=48", "task.doc_stride=16", "precision=no",
        f"hydra.run.dir={tmp_path / 'run'}",
    )  # fmt: skip
    result = json.loads((tmp_path / "run" / "results.json").read_text())
    assert (result["epoch"], result["epochs"], result["eval_null_threshold"]) == (1, 2, 1.5)
    config = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert config["mlmkit_task"]["null_threshold"] == 1.5


def test_qa_fine_tunes_and_scores_as_the_squad_script(qa_run):
    out, proc = qa_run
    result = json.loads((out / "results.json").read_text())
    assert result["kind"] == "qa" and result["headline"] == "f1"
    assert result["eval_total"] == 16 and result["eval_HasAns_total"] == 8
    assert result["eval_NoAns_total"] == 8
    assert result["baseline"] == pytest.approx(
        {"baseline": '"no answer" to every question', "exact": 50.0, "f1": 50.0, "total": 16,
         "HasAns_exact": 0.0, "HasAns_f1": 0.0, "HasAns_total": 8,
         "NoAns_exact": 100.0, "NoAns_f1": 100.0, "NoAns_total": 8}
    )  # fmt: skip
    # the tuned threshold is said so, and the figures it gives are at least the baseline's
    assert result["eval_null_threshold_tuned_on_eval"] is True
    assert result["eval_f1"] == pytest.approx(result["eval_best_f1"])
    assert result["eval_null_threshold"] == result["eval_best_f1_thresh"]
    assert result["eval_best_f1"] >= 50.0
    assert f"qa dev f1: {result['eval_f1']:.4f}" in proc.stdout
    predictions = [json.loads(line) for line in (out / "eval_predictions.jsonl").open()]
    contexts = {q["id"]: q["context"] for q in _examples(capitals(2, 1))}
    assert len(predictions) == 16
    for p in predictions:
        if p["prediction"]:
            assert contexts[p["id"]][p["start"] : p["end"]] == p["prediction"]
    f1 = 100 * sum(p["f1"] for p in predictions) / 16
    assert f1 == pytest.approx(result["eval_f1"])
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["architectures"] == ["BertForQuestionAnswering"]
    assert config["mlmkit_task"]["null_threshold"] == result["eval_null_threshold"]


def test_the_qa_model_dir_answers_without_mlmkit_as_predict_does(qa_run):
    """transformers 5 has no question-answering pipeline; the model dir loads with its auto
    classes, and the plain start/end argmax of one window agrees with mlmkit predict."""
    out, _ = qa_run
    question, context = "What is the capital of Peru?", "The capital of Peru is Lima ."
    script = (
        "import json, sys, torch\n"
        "from transformers import AutoModelForQuestionAnswering, AutoTokenizer\n"
        f"path = {str(out / 'model')!r}\n"
        "model = AutoModelForQuestionAnswering.from_pretrained(path).eval()\n"
        "tok = AutoTokenizer.from_pretrained(path)\n"
        f"enc = tok({question!r}, {context!r}, return_tensors='pt', return_offsets_mapping=True)\n"
        "offsets = enc.pop('offset_mapping')[0]\n"
        "ctx = torch.tensor([s == 1 for s in enc.sequence_ids(0)])\n"
        "with torch.no_grad():\n"
        "    out = model(**enc)\n"
        "start = out.start_logits[0].masked_fill(~ctx, -1e9)\n"
        "end = out.end_logits[0].masked_fill(~ctx, -1e9)\n"
        "scores = start[:, None] + end[None, :]\n"
        "n = len(start)\n"
        "i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]\n"
        "scores = scores.masked_fill((j < i) | (j - i >= 30), -1e9)\n"
        "best = int(scores.argmax())\n"
        "a, b = offsets[best // n][0], offsets[best % n][1]\n"
        "assert not any(m.startswith('mlmkit') for m in sys.modules)\n"
        "print(json.dumps([int(a), int(b)]))\n"
    )
    proc = python_run("-c", script, env={**TEST_ENV, "PATH": "/usr/bin:/bin"}, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    plain = json.loads(proc.stdout.strip().splitlines()[-1])
    # mlmkit's decoding of the same model: its best span (a threshold no margin reaches)
    from mlmkit.evaluation.predict import answer, load_classifier

    model, tokenizer, meta = load_classifier(out)
    (best,) = answer(model, tokenizer, [[question, context]], {**meta, "null_threshold": 1e9})
    assert [best["start"], best["end"]] == plain and best["answer"] == context[plain[0] : plain[1]]
    served = run_cli("predict", out, question, context, "--json")
    assert served.returncode == 0, served.stderr[-2000:]
    (said,) = [json.loads(line) for line in served.stdout.splitlines()]
    assert said["null_margin"] == pytest.approx(best["null_margin"], abs=1e-4)
    assert said["answer"] in ("", best["answer"])
    assert (said["answer"] == "") == (said["null_margin"] > meta["null_threshold"])
