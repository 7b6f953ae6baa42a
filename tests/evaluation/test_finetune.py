"""python -m mlmkit finetune: GLUE-format data, the classifier, and the end-to-end command."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import shared_file
from runs import ROOT, run_cli, run_finetune

from mlmkit.config import TaskConfig
from mlmkit.errors import DataError
from mlmkit.evaluation.finetune import load_task, read_tsv


def _task(name: str, **settings) -> TaskConfig:
    """conf/task/<name>.yaml with ``settings``."""
    from omegaconf import OmegaConf

    return OmegaConf.to_object(
        OmegaConf.merge(
            OmegaConf.structured(TaskConfig),
            OmegaConf.load(ROOT / "conf" / "task" / f"{name}.yaml"),
            settings,
        )
    )


@pytest.mark.parametrize(
    "name,folder,n_text", [("sst2", "SST-2", 1), ("cola", "CoLA", 1), ("rte", "RTE", 2)]
)
def test_glue_tsv_files_are_read_as_the_task_says(name, folder, n_text):
    task = _task(name)
    task.data_dir = str(shared_file(f"glue/{folder}/dev.tsv").parent)
    train, dev = load_task(task)
    lines = sum(1 for _ in open(shared_file(f"glue/{folder}/dev.tsv"), encoding="utf-8"))
    assert len(dev) == lines - int(task.header)  # every line is an example
    assert len(train) > len(dev) / 10
    for ex in dev[:50]:
        assert len(ex["text"]) == n_text and all(isinstance(t, str) and t for t in ex["text"])
        assert ex["label"] in (0, 1)
    assert {ex["label"] for ex in dev} == {0, 1}


def test_rte_labels_map_to_class_ids(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_text(
        "index\tsentence1\tsentence2\tlabel\n0\tA cat.\tAn animal.\tentailment\n"
        "1\tA cat.\tA dog.\tnot_entailment\n2\tbroken line\n"
    )
    task = _task("rte")
    examples = read_tsv(path, task)
    assert [e["label"] for e in examples] == [0, 1]  # the broken line is skipped with a warning
    assert examples[0]["text"] == ["A cat.", "An animal."]


def test_bad_task_data_is_one_sentence(tmp_path):
    task = _task("sst2")
    task.data_dir = str(tmp_path)
    with pytest.raises(DataError, match="task.data_dir"):
        load_task(task)
    (tmp_path / "train.tsv").write_text("text\tlabel\nfine\t1\n")
    with pytest.raises(DataError, match=r"no column 'sentence'.*task.text_columns"):
        read_tsv(tmp_path / "train.tsv", task)
    task.data_dir = None  # the Hub, which tests never reach
    with pytest.raises(DataError, match=r"nyu-mll/glue \(sst2\).*task.data_dir"):
        load_task(task)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,folder,metric", [("cola", "CoLA", "matthews_correlation"), ("rte", "RTE", "accuracy")]
)
def test_finetune_command_reports_the_task_metric(trained_run, tmp_path, name, folder, metric):
    data_dir = shared_file(f"glue/{folder}/dev.tsv").parent
    out = tmp_path / name
    proc = run_finetune(
        f"checkpoint={trained_run}",
        f"task={name}",
        f"task.data_dir={data_dir}",
        "max_train_samples=64",
        "epochs=1",
        "max_seq_length=64",
        "batch_size=16",
        f"hydra.run.dir={out}",
        "save_model=true",
    )
    result = json.loads((out / "results.json").read_text())
    dev_lines = sum(1 for _ in open(data_dir / "dev.tsv", encoding="utf-8")) - int(name == "rte")
    assert result["task"] == name and result["eval_examples"] == dev_lines
    assert result["steps"] == 4 and result["train_examples"] == 64
    assert -1.0 <= result[f"eval_{metric}"] <= 1.0
    assert f"{name} dev {metric}: {result[f'eval_{metric}']:.4f}" in proc.stdout
    if name == "cola":
        assert "eval_accuracy" in result  # CoLA reports both
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(out / "model")
    assert model.config.num_labels == 2


def test_finetune_user_errors_are_one_sentence(tmp_path):
    proc = run_finetune(f"hydra.run.dir={tmp_path / 'a'}", check=False)
    assert proc.returncode == 2 and "checkpoint=" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_finetune(f"checkpoint={tmp_path}", f"hydra.run.dir={tmp_path / 'b'}", check=False)
    assert (
        proc.returncode == 2 and "not a model dir" in proc.stderr and "Traceback" not in proc.stderr
    )


def test_mean_pooling_reads_the_token_states_without_padding(tmp_path):
    import torch
    from transformers import BertConfig

    from mlmkit.model.classifier import MeanPoolBertForSequenceClassification, masked_mean

    config = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(0)
    model = MeanPoolBertForSequenceClassification(config).eval()
    ids = torch.tensor([[2, 7, 9, 3, 0, 0], [2, 5, 6, 8, 11, 3]])
    mask = (ids != 0).long()
    out = model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1]))
    hidden = model.bert(input_ids=ids, attention_mask=mask).last_hidden_state
    pooled = model.bert.pooler.activation(model.bert.pooler.dense(hidden[0, :4].mean(0)))
    torch.testing.assert_close(out.logits[0], model.classifier(pooled))  # padding left out
    assert out.loss is not None and out.loss.item() > 0
    # the padded row scores as it does alone, without padding
    alone = model(input_ids=ids[:1, :4]).logits
    torch.testing.assert_close(out.logits[:1], alone, rtol=1e-4, atol=1e-5)
    assert torch.equal(masked_mean(hidden, None), hidden.mean(1))
    model.save_pretrained(tmp_path)
    again = MeanPoolBertForSequenceClassification.from_pretrained(tmp_path).eval()
    assert again.config.classifier_pooling == "mean"
    torch.testing.assert_close(again(input_ids=ids, attention_mask=mask).logits, out.logits)


def test_finetune_pooling_setting_is_checked():
    from mlmkit.config import FinetuneConfig
    from mlmkit.errors import ConfigError

    with pytest.raises(ConfigError, match="pooling must be cls or mean"):
        FinetuneConfig(checkpoint="x", pooling="max")


# a BERT of a few thousand weights, for the classifiers' own tests
SMALL_BERT = dict(
    vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
)


def test_freeze_encoder_trains_only_the_pooler_and_classifier():
    from transformers import BertConfig

    from mlmkit.evaluation.finetune import freeze_encoder
    from mlmkit.model.classifier import MeanPoolBertForSequenceClassification

    model = MeanPoolBertForSequenceClassification(BertConfig(**SMALL_BERT))
    freeze_encoder(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {
        "bert.pooler.dense.weight",
        "bert.pooler.dense.bias",
        "classifier.weight",
        "classifier.bias",
    }
    before = model.bert.encoder.layer[0].output.dense.weight.clone()
    out = model(input_ids=torch.randint(5, 100, (4, 8)), labels=torch.tensor([0, 1, 0, 1]))
    out.loss.backward()
    assert model.bert.encoder.layer[0].output.dense.weight.grad is None
    assert torch.equal(model.bert.encoder.layer[0].output.dense.weight, before)


def _frozen_classifiers(kind: str):
    """Two identical classifiers (BERT mean or [CLS] pooling, ModernBERT) with frozen encoders
    (the encoder's dropout on, the classifier's off: the two draw from one generator)."""
    from mlmkit.evaluation.finetune import freeze_encoder

    if kind == "modernbert":
        from transformers import ModernBertConfig, ModernBertForSequenceClassification

        def make():
            return ModernBertForSequenceClassification(
                ModernBertConfig(
                    vocab_size=100,
                    hidden_size=16,
                    num_hidden_layers=2,
                    num_attention_heads=2,
                    intermediate_size=32,
                    pad_token_id=0,
                    classifier_pooling="mean",
                    local_attention=4,
                    attn_implementation="sdpa",
                )
            )
    else:
        from transformers import BertConfig, BertForSequenceClassification

        from mlmkit.model.classifier import MeanPoolBertForSequenceClassification

        cls = (
            MeanPoolBertForSequenceClassification
            if kind == "bert-mean"
            else BertForSequenceClassification
        )

        def make():
            return cls(BertConfig(**SMALL_BERT, hidden_dropout_prob=0.2, classifier_dropout=0.0))

    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(make())
        freeze_encoder(models[-1])
    return models


@pytest.mark.parametrize("kind", ["bert-mean", "bert-cls", "modernbert"])
def test_a_frozen_encoder_runs_once_per_row_and_trains_the_same_head(kind):
    """Linear probing caches the frozen encoder's states: the head trains as it does when the
    encoder runs every step (in eval mode: no dropout in a frozen encoder), and the encoder
    runs only for rows it has not seen, whatever the batch and its padding."""
    from mlmkit.evaluation.finetune import FrozenEncoderCache

    plain, cached = _frozen_classifiers(kind)
    plain.base_model.eval()  # what the cache computes: the frozen encoder without dropout
    cache = FrozenEncoderCache(cached)
    calls = []
    inner = cache.forward
    cache.forward = lambda **kw: calls.append(kw["input_ids"].shape[0]) or inner(**kw)
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(5, 100, (n,), generator=g) for n in (3, 7, 5, 8, 4, 6)]
    labels = torch.tensor([0, 1, 0, 1, 1, 0])
    opts = [
        torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.5)
        for m in (plain, cached)
    ]
    for _epoch in range(3):
        order = torch.randperm(6, generator=g).tolist()
        for batch in (order[:4], order[4:]):  # other batches, other padding, every epoch
            width = max(len(rows[i]) for i in batch)
            ids = torch.zeros(len(batch), width, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for j, i in enumerate(batch):
                ids[j, : len(rows[i])], mask[j, : len(rows[i])] = rows[i], 1
            for model, opt in zip((plain, cached), opts):
                loss = model(input_ids=ids, attention_mask=mask, labels=labels[batch]).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
    assert sum(calls) == 6  # each row encoded once
    for (name, a), b in zip(plain.named_parameters(), cached.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert any(
        not torch.equal(a, b)
        for a, b in zip(plain.parameters(), _frozen_classifiers(kind)[0].parameters())
    )
    cache.close()
    assert "forward" not in vars(cached.base_model) and not cache.states  # its own forward again


def test_a_regression_head_starts_at_the_mean_training_label():
    from transformers import BertConfig

    from mlmkit.evaluation.finetune import start_at_mean_label
    from mlmkit.model.classifier import MeanPoolBertForSequenceClassification

    model = MeanPoolBertForSequenceClassification(
        BertConfig(
            vocab_size=100,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            num_labels=1,
        )
    )
    start_at_mean_label(model, [{"label": 1.0}, {"label": 4.0}, {"label": 2.5}])
    assert model.classifier.bias.tolist() == [2.5]
    model.eval()
    out = model(input_ids=torch.randint(5, 100, (3, 6))).logits
    assert (out - 2.5).abs().max() < 1.0  # the weights start near zero: predictions near the mean


# ---- own labelled files (task=files) and mlmkit predict -------------------------------------

WORDS = ["cat", "dog", "bird", "fish", "horse", "mouse", "tree", "house", "river", "road"]


def _pairs(n: int, seed: int = 0) -> list[dict]:
    """``n`` premise/hypothesis pairs labelled same or other (the same animal or not), with a
    comma and a quote in some texts (CSV quoting)."""
    import random

    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.choice(WORDS), rng.choice(WORDS)
        rows.append(
            {
                "premise": f'The {a} sat, said "{WORDS[i % 10]}", by the {b}.'
                if i % 3 == 0
                else f"The {a} sat by the {b}.",
                "hypothesis": f"A {a if i % 2 else rng.choice(WORDS)} was there.",
                "gold": "same" if i % 2 else "other",
                "score": round(i % 5 + 0.5 * (i % 2), 1),
            }
        )
    return rows


def _write(path, rows: list[dict], columns=("premise", "hypothesis", "gold", "score")):
    """``rows`` as a CSV, JSONL or TSV file, by the suffix of ``path``."""
    import csv

    with open(path, "w", encoding="utf-8", newline="") as f:
        if path.suffix == ".jsonl":
            f.writelines(json.dumps({c: r[c] for c in columns}) + "\n" for r in rows)
        else:
            writer = csv.writer(
                f,
                delimiter="," if path.suffix == ".csv" else "\t",
                quoting=csv.QUOTE_MINIMAL if path.suffix == ".csv" else csv.QUOTE_NONE,
                escapechar=None if path.suffix == ".csv" else "\\",
            )
            writer.writerow(columns)
            writer.writerows([r[c] for c in columns] for r in rows)
    return path


def _files_task(tmp_path, train, dev, **settings) -> TaskConfig:
    return _task(
        "files",
        **{
            "data_dir": str(tmp_path),
            "train_file": str(train),
            "eval_file": str(dev),
            "text_columns": ["premise", "hypothesis"],
            "label_column": "gold",
            **settings,
        },
    )


def test_own_csv_jsonl_and_tsv_files_give_the_same_examples(tmp_path):
    rows = _pairs(12)
    rows[4]["premise"] = "A line\nbroken, in a quoted CSV field."
    examples = {}
    for suffix in (".csv", ".jsonl"):
        _write(tmp_path / f"train{suffix}", rows)
        _write(tmp_path / f"dev{suffix}", rows[:5])
        # relative to task.data_dir, and absolute
        task = _files_task(tmp_path, f"train{suffix}", tmp_path / f"dev{suffix}")
        train, dev = load_task(task)
        assert task.labels == ["other", "same"]  # taken from the training file, sorted
        examples[suffix] = (train, dev)
    assert examples[".csv"] == examples[".jsonl"]
    train, dev = examples[".csv"]
    assert len(train) == 12 and len(dev) == 5
    assert train[0] == {"text": [rows[0]["premise"], rows[0]["hypothesis"]], "label": 0}
    assert '"' in train[0]["text"][0] and "," in train[0]["text"][0] and "\n" in train[4]["text"][0]
    # a TSV (no quoting, as GLUE's) of the texts without tabs or newlines
    plain = [dict(r, premise=f"The {WORDS[i % 10]} sat.") for i, r in enumerate(rows)]
    _write(tmp_path / "train.tsv", plain)
    _write(tmp_path / "plain.jsonl", plain)
    tsv = load_task(_files_task(tmp_path, "train.tsv", "train.tsv"))
    assert tsv == load_task(_files_task(tmp_path, "plain.jsonl", "plain.jsonl"))
    # numbers as labels: sorted by value; a JSONL number reads as the same label
    for i, r in enumerate(plain):
        r["gold"] = [2, 10, 1][i % 3]
    _write(tmp_path / "numbers.jsonl", plain)
    task = _files_task(tmp_path, "numbers.jsonl", "numbers.jsonl")
    train, _ = load_task(task)
    assert task.labels == ["1", "2", "10"] and [e["label"] for e in train[:3]] == [1, 2, 0]
    # regression: the score column
    task = _files_task(tmp_path, "train.csv", "dev.csv", kind="regression", label_column="score")
    train, _ = load_task(task)
    assert task.metrics == ["spearman", "pearson"] and [e["label"] for e in train[:3]] == [
        0.0,
        1.5,
        2.0,
    ]


def test_jsonl_lines_that_do_not_parse_or_hold_no_text_are_skipped_with_a_count(tmp_path):
    """As pretraining reads JSONL: a line that is no JSON object, a row without a value and a
    row whose text column holds a number are skipped and counted by cause in one warning; a
    text column whose first value is a number is an error; a label that is a number reads as
    its text."""
    import logging

    rows = _pairs(8)
    lines = [json.dumps({c: r[c] for c in ("premise", "hypothesis", "gold")}) for r in rows]
    lines[2] = '{"premise": "cut short'  # not JSON
    lines[4] = json.dumps({"premise": 42, "hypothesis": "A number.", "gold": "same"})
    lines[6] = json.dumps({"premise": "No hypothesis.", "gold": "same"})
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("mlmkit").addHandler(handler)
    try:
        train, _ = load_task(_files_task(tmp_path, "train.jsonl", "train.jsonl"))
    finally:
        logging.getLogger("mlmkit").removeHandler(handler)
    assert [e["text"][0] for e in train] == [rows[i]["premise"] for i in (0, 1, 3, 5, 7)]
    (warning,) = {r.getMessage() for r in records if r.levelno == logging.WARNING}
    assert warning.endswith(
        "train.jsonl: skipped 1 line(s) that are not JSON objects, 1 row(s) with a value "
        "missing, 1 row(s) whose 'premise' or 'hypothesis' is not text"
    ), warning
    numbers = [
        json.dumps({"premise": i, "hypothesis": "h", "gold": "same" if i % 2 else "other"})
        for i in range(6)
    ]
    (tmp_path / "numbers.jsonl").write_text("\n".join(numbers) + "\n")
    with pytest.raises(
        DataError,
        match=r"numbers.jsonl': the column 'premise' holds numbers, not text; "
        r"set task.text_columns",
    ):
        load_task(_files_task(tmp_path, "numbers.jsonl", "numbers.jsonl"))


def test_a_label_outside_the_task_labels_is_an_error(tmp_path):
    rows = _pairs(6)
    rows[3]["gold"] = "maybe"
    _write(tmp_path / "train.csv", rows)
    task = _files_task(tmp_path, "train.csv", "train.csv", labels=["other", "same"])
    with pytest.raises(
        DataError,
        match=r"train.csv' line 5: the gold 'maybe' is not one of "
        r"task.labels \(other, same\)",
    ):
        load_task(task)  # line 5: the header is line 1
    # labels from the training file: the eval file's own label is an error, naming it
    rows[3]["gold"] = "same"
    _write(tmp_path / "train.jsonl", rows)
    _write(tmp_path / "dev.jsonl", [dict(rows[0], gold="maybe")])
    with pytest.raises(
        DataError, match=r"dev.jsonl' line 1: the gold 'maybe' is not one of task.labels"
    ):
        load_task(_files_task(tmp_path, "train.jsonl", "dev.jsonl", labels=[]))
    # the GLUE presets too: SST-2's labels are 0 and 1
    (tmp_path / "sst").mkdir()
    (tmp_path / "sst" / "train.tsv").write_text("sentence\tlabel\nfine\t1\nbad\tnegative\n")
    sst = _task("sst2")
    sst.data_dir = str(tmp_path / "sst")
    with pytest.raises(
        DataError, match=r"line 3: the label 'negative' is not one of task.labels \(0, 1\)"
    ):
        load_task(sst)


def test_own_files_errors_name_the_setting(tmp_path):
    from mlmkit.config import FinetuneConfig
    from mlmkit.errors import ConfigError

    _write(tmp_path / "train.csv", _pairs(4))
    with pytest.raises(
        DataError, match=r"task.eval_file: '.*dev.csv' does not exist; set task.eval_file"
    ):
        load_task(_files_task(tmp_path, "train.csv", "dev.csv"))
    with pytest.raises(
        DataError, match=r"no column 'gold2' \(columns: premise, hypothesis, gold, score\)"
    ):
        load_task(_files_task(tmp_path, "train.csv", "train.csv", label_column="gold2"))
    _write(tmp_path / "one.csv", [dict(r, gold="same") for r in _pairs(4)])
    with pytest.raises(DataError, match=r"every example has the gold 'same'.*task.kind=regression"):
        load_task(_files_task(tmp_path, "one.csv", "one.csv"))
    with pytest.raises(ConfigError, match=r"set task.train_file=<file> and task.eval_file=<file>"):
        TaskConfig(name="files", hub_path=None, train_file=None, eval_file=None, labels=[])
    with pytest.raises(ConfigError, match=r"task.metrics: accuracy scores classes"):
        TaskConfig(kind="regression", labels=[])
    assert (
        FinetuneConfig(checkpoint="x").pooling == "mean"
        and FinetuneConfig(checkpoint="x").save_model
    )


def _predict(*args) -> list[dict]:

    proc = run_cli("predict", *map(str, args), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]


def _finetune_files(trained_run, out, train, dev, *settings, label: str = "gold"):
    return run_finetune(
        f"checkpoint={trained_run}",
        "task=files",
        f"task.train_file={train}",
        f"task.eval_file={dev}",
        "task.text_columns=[premise,hypothesis]",
        f"task.label_column={label}",
        "epochs=1",
        "max_seq_length=64",
        "batch_size=8",
        "precision=no",
        f"hydra.run.dir={out}",
        *settings,
    )


def _eval_predictions(out) -> list[dict]:
    return [json.loads(line) for line in (out / "eval_predictions.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_own_csv_pairs_give_a_plain_model_dir_that_predict_and_pipeline_serve(
    trained_run, tmp_path
):
    from transformers import AutoModelForSequenceClassification, pipeline

    train, dev = (
        _write(tmp_path / "train.csv", _pairs(40)),
        _write(tmp_path / "dev.csv", _pairs(12, seed=1)),
    )
    out = tmp_path / "ft"
    proc = _finetune_files(trained_run, out, train, dev, "pooling=cls")
    result = json.loads((out / "results.json").read_text())
    assert result["labels"] == ["other", "same"] and result["pooling"] == "cls"
    assert result["model"] == str(out / "model") and f"the model: {out / 'model'}" in proc.stdout
    assert "task.labels from" in proc.stdout + proc.stderr
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["id2label"] == {"0": "other", "1": "same"} and config["label2id"] == {
        "other": 0,
        "same": 1,
    }
    assert config["mlmkit_task"]["text_columns"] == ["premise", "hypothesis"]
    assert (out / "model" / "model.safetensors").is_file() and (
        out / "model" / "tokenizer.json"
    ).is_file()
    evaluated = _eval_predictions(out)
    assert [e["label"] for e in evaluated] == [r["gold"] for r in _pairs(12, seed=1)]
    predicted = _predict(out / "model", "--file", dev)
    assert [p["label"] for p in predicted] == [e["prediction"] for e in evaluated]
    assert all(0.5 <= p["probability"] <= 1.0 for p in predicted)
    # a [CLS]-pooled model dir is a plain transformers classifier: the pipeline agrees
    model = AutoModelForSequenceClassification.from_pretrained(out / "model")
    assert type(model).__name__ == "BertForSequenceClassification"
    classify = pipeline("text-classification", model=str(out / "model"))
    served = classify(
        [{"text": r["premise"], "text_pair": r["hypothesis"]} for r in _pairs(12, seed=1)]
    )
    assert [s["label"] for s in served] == [p["label"] for p in predicted]
    assert [s["score"] for s in served] == pytest.approx(
        [p["probability"] for p in predicted], abs=1e-5
    )


@pytest.mark.slow
def test_predict_serves_a_mean_pooled_model_as_it_was_evaluated(trained_run, tmp_path):
    from transformers import AutoModelForSequenceClassification

    from mlmkit.evaluation.predict import load_classifier

    train, dev = (
        _write(tmp_path / "train.jsonl", _pairs(40)),
        _write(tmp_path / "dev.jsonl", _pairs(12, seed=1)),
    )
    out = tmp_path / "ft"
    _finetune_files(
        trained_run, out, train, dev, "task.labels=[same,other]"
    )  # pooling=mean: the default
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["classifier_pooling"] == "mean" and config["id2label"] == {
        "0": "same",
        "1": "other",
    }
    evaluated = _eval_predictions(out)
    texts = [t for r in _pairs(12, seed=1) for t in (r["premise"], r["hypothesis"])]
    predicted = _predict(out, *texts)  # the run dir stands for its model/; the texts two by two
    assert [p["label"] for p in predicted] == [e["prediction"] for e in evaluated]
    assert [p["text"] for p in predicted][0] == texts[:2]
    # what transformers' auto class would do instead: [CLS] pooling, other logits
    model, tokenizer, _ = load_classifier(out)
    enc = tokenizer(
        texts[0::2], texts[1::2], padding=True, truncation=True, max_length=64, return_tensors="pt"
    )
    with torch.no_grad():
        mean = model(**enc).logits
        cls = AutoModelForSequenceClassification.from_pretrained(out / "model").eval()(**enc).logits
    probs = mean.softmax(-1).max(-1).values
    assert probs.tolist() == pytest.approx([p["probability"] for p in predicted], abs=1e-5)
    assert not torch.allclose(mean, cls, atol=1e-3)


@pytest.mark.slow
def test_a_regression_file_predicts_the_scores_it_was_evaluated_with(trained_run, tmp_path):
    train, dev = (
        _write(tmp_path / "train.csv", _pairs(40)),
        _write(tmp_path / "dev.csv", _pairs(12, seed=1)),
    )
    out = tmp_path / "ft"
    proc = _finetune_files(trained_run, out, train, dev, "task.kind=regression", label="score")
    result = json.loads((out / "results.json").read_text())
    assert "eval_spearman" in result and "eval_pearson" in result and "labels" not in result
    assert "files dev spearman:" in proc.stdout
    evaluated = _eval_predictions(out)
    assert [e["label"] for e in evaluated] == [r["score"] for r in _pairs(12, seed=1)]
    predicted = _predict(out / "model", "--file", dev)
    assert [p["score"] for p in predicted] == pytest.approx(
        [e["prediction"] for e in evaluated], abs=1e-4
    )
