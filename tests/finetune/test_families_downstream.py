"""The toolkit after continued pretraining of another family: a RoBERTa and an XLM-RoBERTa
continued by ``mlmkit train model.init_from=...`` (tiny released models of ``families.py``, with
the real released tokenizers) are fine-tuned on a sentence-pair task and named entities and
served by ``mlmkit predict``, ``mlmkit fill-mask`` (their own ``<mask>``), transformers and
sentence-transformers. XLM-R's parts are RoBERTa's, and its tokenizer of 250,000 pieces takes
seconds each time a command loads it: the RoBERTa alone answers questions and runs through
``mlmkit glue`` and ``mlmkit embed``. DistilBERT, ALBERT, DeBERTa-v3 and ELECTRA are fine-tuned
from their released folders, and every family's head (the frozen encoder's cache, what trains
frozen, what a continued fine-tuning keeps) is checked without a run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from families import FAMILY_TOKENIZERS, SIZE, family_config, released_model
from runs import run_cli, run_train

from mlmkit.model.architectures import architecture

CONTINUED = ["roberta", "xlm-roberta"]
ROBERTA = pytest.mark.parametrize("continued", ["roberta"], indirect=True)  # the family's parts
OTHERS = ["distilbert", "albert", "deberta-v2", "electra"]
CORPUS = "\n\n".join(
    f"Report {i}: the harbour of the town saw {i % 7} ships arrive before the storm."
    for i in range(120)
)
NER_LABELS = ["O", "B-location", "B-person", "I-person"]
PAIR_LABELS = ["no", "yes"]
CONTEXT = (
    "The Normans were a people who in the 10th and 11th centuries gave their name to Normandy, "
    "a region in France."
)


def cli(*args) -> tuple[str, str]:
    """``mlmkit *args`` in this process; its stdout and stderr, or a failure with their tail."""
    proc = run_cli(*args)
    assert proc.returncode == 0, (
        f"mlmkit {args[0]} failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    )
    return proc.stdout, proc.stderr


def write_tasks(root: Path) -> Path:
    """A sentence-pair task (TSV), a CoNLL NER task and a SQuAD v2.0 task, a few examples each."""
    root.mkdir(parents=True, exist_ok=True)
    rows = ["premise\thypothesis\tlabel"]
    for i in range(16):
        name = ["Anna", "Ben", "Carl", "Dora"][i % 4]
        who, label = (name, "yes") if i % 2 == 0 else ("Nobody", "no")
        rows.append(f"{name} sailed to Lisbon.\t{who} went to sea.\t{label}")
    (root / "train.tsv").write_text("\n".join(rows) + "\n")
    (root / "dev.tsv").write_text("\n".join(rows[:9]) + "\n")
    sentences = [
        [("John", "B-person"), ("lives", "O"), ("in", "O"), ("Paris", "B-location")],
        [("Mary", "B-person"), ("Smith", "I-person"), ("visited", "O"), ("London", "B-location")],
    ] * 4
    conll = "\n\n".join("\n".join(f"{w}\t{t}" for w, t in s) for s in sentences) + "\n"
    (root / "ner").mkdir(exist_ok=True)
    (root / "ner" / "train.conll").write_text(conll)
    (root / "ner" / "dev.conll").write_text(conll)
    questions = [
        ("Where is Normandy?", "France"),
        ("Who gave their name to Normandy?", "The Normans"),
    ]
    articles = []
    for a in range(2):
        qas = [
            {
                "id": f"{a}-{i}",
                "question": q,
                "answers": [{"text": t, "answer_start": CONTEXT.index(t)}],
                "is_impossible": False,
            }
            for i, (q, t) in enumerate(questions)
        ]
        qas.append(
            {
                "id": f"{a}-x",
                "question": "What is Mars made of?",
                "answers": [],
                "is_impossible": True,
            }
        )
        articles.append({"title": f"A{a}", "paragraphs": [{"context": CONTEXT, "qas": qas}]})
    (root / "qa").mkdir(exist_ok=True)
    squad = json.dumps({"version": "v2.0", "data": articles})
    (root / "qa" / "train.json").write_text(squad)
    (root / "qa" / "dev.json").write_text(squad)
    return root


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    return write_tasks(tmp_path_factory.mktemp("tasks"))


@pytest.fixture(scope="module", params=CONTINUED)
def continued(request, tmp_path_factory) -> Path:
    """The final/ of a tiny released model of the family, continued by ``mlmkit train`` for 2
    steps."""
    root = tmp_path_factory.mktemp(request.param)
    source = released_model(root / "released", request.param)
    corpus = root / "corpus.txt"
    corpus.write_text(CORPUS)
    run_train(
        root / "run",
        root / "cache",
        f"model.init_from={source}",
        "data=files",
        f"data.train_files=[{corpus}]",
        "data.max_seq_length=32",
        "data.max_eval_samples=8",
        "train.max_steps=2",
        "train.eval_every=0",
        "train.save_every=0",
        "train.precision=no",
        "logger=none",
    )
    return root / "run" / "final"


def finetune(checkpoint: Path, out: Path, *args: str) -> tuple[dict, str]:
    """``mlmkit finetune`` for one epoch; its results.json and its log."""
    stdout, stderr = cli(
        "finetune", f"checkpoint={checkpoint}", f"hydra.run.dir={out}", "epochs=1", "batch_size=8",
        "precision=no", *args,
    )  # fmt: skip
    return json.loads((out / "results.json").read_text()), stdout + stderr


def pair_task(tasks: Path, *more: str) -> list[str]:
    return [
        "task=files", f"task.data_dir={tasks}", "task.train_file=train.tsv",
        "task.eval_file=dev.tsv", "task.text_columns=[premise,hypothesis]", *more,
    ]  # fmt: skip


def predict_json(model_dir: Path, *texts: str) -> list[dict]:
    stdout, _ = cli("predict", model_dir, *texts, "--json")
    return [json.loads(line) for line in stdout.splitlines()]


def model_type(folder: Path) -> str:
    return json.loads((folder / "config.json").read_text())["model_type"]


# ---- fine-tuning, prediction and transformers' loaders ----------------------------------------


@pytest.fixture(scope="module")
def pair_run(continued, tasks):
    out = continued.parent.parent / "pairs"
    return out, *finetune(continued, out, *pair_task(tasks))


@pytest.mark.slow
def test_a_pair_classifier_is_the_familys_own_and_pools_its_first_token(continued, pair_run):
    """pooling=mean (the default) is BERT's: the family's own head pools its first token, the log
    says so in one line, results.json records cls; the model dir loads in transformers without
    mlmkit as the family's class and predicts what mlmkit predict does, pairs two by two (no
    second token type reaches a model with one)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out, results, log = pair_run
    family = architecture(model_type(continued))
    assert results["pooling"] == "cls" and results["labels"] == PAIR_LABELS
    assert 0.0 <= results["eval_accuracy"] <= 1.0 and results["steps"] == 2
    said = [line for line in log.splitlines() if "pools its first token" in line]
    assert len(said) == 1 and family.sequence_classification in said[0]
    assert "(pretrained, cls pooling) on files" in log
    model = AutoModelForSequenceClassification.from_pretrained(out / "model")
    assert type(model).__name__ == family.sequence_classification
    assert model.config.type_vocab_size == 1 and model.config.id2label == dict(
        enumerate(PAIR_LABELS)
    )
    texts = ["Anna sailed to Lisbon.", "Anna went to sea."]
    predicted = predict_json(out / "model", *texts)
    assert len(predicted) == 1 and predicted[0]["label"] in PAIR_LABELS
    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    with torch.no_grad():
        probs = model(**tokenizer(*texts, return_tensors="pt")).logits.softmax(-1)[0]
    label = PAIR_LABELS.index(predicted[0]["label"])
    assert predicted[0]["probability"] == pytest.approx(float(probs[label]), abs=1e-5)


@pytest.mark.slow
@ROBERTA
def test_a_sequence_longer_than_the_familys_positions_is_refused(continued, tasks, tmp_path):
    """RoBERTa's positions start after padding_idx: 130 rows hold 128 tokens, and 129 is refused
    in one sentence, not an index error in the embeddings."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(continued)
    assert config.max_position_embeddings == 130
    proc = run_cli(
        "finetune", f"checkpoint={continued}", f"hydra.run.dir={tmp_path / 'long'}",
        "max_seq_length=129", *pair_task(tasks),
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "max_seq_length (129) is longer than the model's 128 positions" in proc.stderr


@pytest.fixture(scope="module")
def ner_run(continued, tasks):
    out = continued.parent.parent / "ner"
    return out, *finetune(continued, out, "task=ner", f"task.data_dir={tasks / 'ner'}")


@pytest.mark.slow
def test_a_tagger_loads_in_the_token_classification_pipeline_and_in_predict(continued, ner_run):
    """The family's token classifier, its words read as running text reads them (RoBERTa's
    byte-level BPE: the space before each word kept, saved so with the model); pipeline and
    mlmkit predict tag with the task's labels."""
    from transformers import pipeline

    out, results, _ = ner_run
    family = architecture(model_type(continued))
    assert results["labels"] == NER_LABELS and 0.0 <= results["eval_f1"] <= 1.0
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["architectures"] == [family.token_classification]
    tagger = pipeline("token-classification", model=str(out / "model"))
    tokenizer = tagger.tokenizer  # the saved one
    words = tokenizer(["John", "lives", "in", "Paris"], is_split_into_words=True).tokens()
    assert words == tokenizer("John lives in Paris").tokens()  # as running text
    assert len(words) == 6  # <s>, a token per word, </s>: no word split for want of its space
    found = tagger("Mary Smith visited London")
    assert all(e["entity"] in NER_LABELS[1:] for e in found)
    tagged = predict_json(out / "model", "Mary Smith visited London")[0]
    assert tagged["words"] == ["Mary", "Smith", "visited", "London"]
    assert set(tagged["tags"]) <= set(NER_LABELS)
    records = (out / "eval_predictions.jsonl").read_text().splitlines()
    assert len(records) == 8 and all(
        set(json.loads(r)["predicted"]) <= set(NER_LABELS) for r in records
    )


@pytest.mark.slow
@ROBERTA
def test_a_question_answerer_answers_with_a_span_of_its_context(continued, tasks):
    out = continued.parent.parent / "qa"
    results, _ = finetune(
        continued, out, "task=qa", f"task.data_dir={tasks / 'qa'}", "task.train_file=train.json",
        "task.eval_file=dev.json", "max_seq_length=64", "task.doc_stride=16",
        "task.max_question_length=16",
    )  # fmt: skip
    family = architecture(model_type(continued))
    assert 0.0 <= results["eval_f1"] <= 100.0 and results["eval_examples"] == 6
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["architectures"] == [family.question_answering]
    answer = predict_json(out / "model", "Where is Normandy?", CONTEXT)[0]
    assert answer["answer"] == "" or answer["answer"] == CONTEXT[answer["start"] : answer["end"]]


@pytest.mark.slow
@ROBERTA
def test_glue_fine_tunes_and_scores_the_continued_model(continued, tmp_path):
    from runs import write_probe_task

    write_probe_task(tmp_path / "glue" / "SST-2", n_train=16, n_dev=8)
    out = tmp_path / "run"
    cli(
        "glue", f"checkpoint={continued}", f"data_dir={tmp_path / 'glue'}", "tasks=[sst2]",
        "lrs=[1e-4]", "epochs=1", "batch_size=8", "max_seq_length=32", "precision=no",
        f"hydra.run.dir={out}",
    )  # fmt: skip
    results = json.loads((out / "results.json").read_text())
    sst2 = results["tasks"]["sst2"]
    assert results["average_tasks"] == ["sst2"] and 0.0 <= sst2["score"] <= 1.0
    assert sst2["runs"][0]["pooling"] == "cls"
    config = json.loads((Path(sst2["runs"][0]["model"]) / "config.json").read_text())
    assert config["architectures"] == [architecture(model_type(continued)).sequence_classification]


# ---- the export, the embedder and fill-mask ----------------------------------------------------


@pytest.mark.slow
def test_the_export_cuts_inputs_at_the_familys_positions(continued):
    """final/'s tokenizer cuts at the positions the model holds (RoBERTa: its rows less 2), so a
    long text through transformers or sentence-transformers never runs past them."""
    from sentence_transformers import SentenceTransformer

    embedder = SentenceTransformer(str(continued), device="cpu")
    encoder, tokenizer = embedder[0].auto_model, embedder.tokenizer
    family = architecture(encoder.config.model_type)
    assert type(encoder).__name__ == family.masked_lm.replace("ForMaskedLM", "Model")
    saved = json.loads((continued / "tokenizer_config.json").read_text())["model_max_length"]
    assert saved == 128 == family.positions(encoder.config)  # 130 rows
    long = tokenizer(CORPUS, truncation=True, max_length=saved, return_tensors="pt")
    assert long["input_ids"].shape[1] == 128
    with torch.no_grad():
        assert encoder(**long).last_hidden_state.shape[1] == 128
    vectors = embedder.encode(["A ship in the harbour.", CORPUS])
    assert vectors.shape == (2, SIZE["hidden_size"]) and embedder.max_seq_length <= 128


@pytest.mark.slow
@ROBERTA
def test_embed_trains_the_continued_encoder_with_its_dropout(continued, tmp_path):
    """mlmkit embed on the family's encoder: dropout set through the family's config keys (the
    continued model has none, as mlmkit's presets), final/ a SentenceTransformer of its class."""
    from sentence_transformers import SentenceTransformer

    pairs = tmp_path / "pairs.jsonl"
    colours = ["red", "blue", "green", "black", "white", "grey", "brown", "pink"]
    pairs.write_text(
        "".join(
            json.dumps(
                {"anchor": f"the {c} ship sails at dawn", "positive": f"a {c} boat leaves early"}
            )
            + "\n"
            for c in colours
        )
    )
    out = tmp_path / "embed"
    cli(
        "embed", f"checkpoint={continued}", f"pairs.files=[{pairs}]", "batch_size=4", "max_steps=2",
        "dropout=0.1", "logger=none", "precision=no", f"hydra.run.dir={out}",
    )  # fmt: skip
    config = json.loads((out / "final" / "config.json").read_text())
    assert config["model_type"] == model_type(continued)
    assert config["hidden_dropout_prob"] == 0.1 == config["attention_probs_dropout_prob"]
    embedder = SentenceTransformer(str(out / "final"), device="cpu")
    assert embedder.encode(["the red ship"]).shape == (1, SIZE["hidden_size"])


@pytest.mark.slow
def test_fill_mask_takes_the_familys_own_mask_token(continued):
    stdout, _ = cli("fill-mask", continued, "The ship left the <mask> at dawn.", "--top-k", "3")
    lines = stdout.splitlines()
    assert len(lines) == 3 and not any("<mask>" in line for line in lines)


@pytest.mark.slow
@ROBERTA
def test_fill_mask_names_the_familys_mask_token_where_the_text_has_another(continued):
    proc = run_cli("fill-mask", continued, "The ship left the [MASK] at dawn.")
    assert proc.returncode == 2
    assert "no <mask> token" in proc.stderr and "[MASK] is another model family's" in proc.stderr


# ---- the other families -------------------------------------------------------------------------


def small_classifier(model_type: str, seed: int = 0):
    """A tiny ``...ForSequenceClassification`` of ``model_type`` (2 labels), in eval mode."""
    from types import SimpleNamespace

    from mlmkit.model.architectures import transformers_class

    vocab = SimpleNamespace(
        get_vocab=lambda: {str(i): i for i in range(100)},
        pad_token_id=1,
        cls_token_id=0,
        sep_token_id=2,
    )
    config = family_config(model_type, vocab, num_labels=2)
    torch.manual_seed(seed)
    return transformers_class(architecture(model_type).sequence_classification)(config).eval()


@pytest.mark.parametrize("model_type", [*CONTINUED, *OTHERS])
def test_a_frozen_encoders_cache_gives_each_familys_head_what_its_encoder_gives(model_type):
    """Linear probing's cache of the encoder's states feeds the head as the encoder itself does:
    ALBERT's pooler (a linear layer and a separate tanh) and DeBERTa's, DistilBERT's and
    RoBERTa's heads of their own included."""
    from mlmkit.finetune.model import FrozenEncoderCache

    model = small_classifier(model_type)
    ids = torch.randint(5, 100, (3, 7))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask).logits
        cache = FrozenEncoderCache(model)
        try:
            cached = model(input_ids=ids, attention_mask=mask).logits
        finally:
            cache.close()
    assert cached.shape == plain.shape == (3, 2)
    torch.testing.assert_close(cached, plain, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("model_type", [*CONTINUED, *OTHERS])
def test_the_head_is_what_trains_frozen_and_what_a_continued_fine_tuning_keeps(
    model_type, tmp_path
):
    """Everything outside the encoder (DistilBERT's pre_classifier, DeBERTa's pooler, RoBERTa's
    dense + out_proj) and the encoder's own pooler (ALBERT's) trains with the encoder frozen, and
    is loaded back when a fine-tuned model is fine-tuned further."""
    from mlmkit.finetune.model import freeze_encoder, load_head

    trained = small_classifier(model_type, seed=0)
    freeze_encoder(trained)
    prefix = trained.base_model_prefix
    trainable = {n for n, p in trained.named_parameters() if p.requires_grad}
    assert trainable and all(not n.startswith(f"{prefix}.") or ".pooler" in n for n in trainable)
    outside = {n for n, _ in trained.named_parameters() if not n.startswith(f"{prefix}.")}
    assert outside <= trainable
    if model_type == "distilbert":
        assert any(n.startswith("pre_classifier.") for n in trainable)
    if model_type == "albert":
        assert "albert.pooler.weight" in trainable
    trained.save_pretrained(tmp_path)
    again = small_classifier(model_type, seed=1)
    load_head(again, tmp_path)
    for name, tensor in trained.state_dict().items():
        torch.testing.assert_close(again.state_dict()[name], tensor, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", OTHERS)
def test_other_families_fine_tune_frozen_and_predict(model_type, tasks, tmp_path):
    """A released DistilBERT, ALBERT, DeBERTa-v3 (eager attention: no SDPA in transformers) or
    ELECTRA is fine-tuned on the pair task with its encoder frozen, and its model dir predicts in
    mlmkit predict and loads in transformers as the family's class."""
    from transformers import AutoModelForSequenceClassification

    assert model_type in FAMILY_TOKENIZERS
    source = released_model(tmp_path / "released", model_type)
    family = architecture(model_type)
    results, log = finetune(source, tmp_path / "run", *pair_task(tasks), "freeze_encoder=true")
    assert results["pooling"] == "cls" and 0.0 <= results["eval_accuracy"] <= 1.0
    assert "freeze_encoder: the encoder is frozen" in log
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "run" / "model")
    assert type(model).__name__ == family.sequence_classification
    predicted = predict_json(
        tmp_path / "run" / "model", "Ben sailed to Lisbon.", "Ben went to sea."
    )
    assert predicted[0]["label"] in PAIR_LABELS
