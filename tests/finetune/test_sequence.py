"""Sentence(-pair) tasks (``mlmkit.finetune.sequence``) through ``mlmkit finetune``: GLUE's
metrics, the classifier, own files, and the model dir that ``mlmkit predict`` and the
pipeline serve."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import shared_file
from helpers import pair_rows, write_rows
from runs import run_cli, run_finetune


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


def test_a_regression_head_starts_at_the_mean_training_label():
    from transformers import BertConfig

    from mlmkit.finetune.sequence import start_at_mean_label
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
        write_rows(tmp_path / "train.csv", pair_rows(40)),
        write_rows(tmp_path / "dev.csv", pair_rows(12, seed=1)),
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
    assert [e["label"] for e in evaluated] == [r["gold"] for r in pair_rows(12, seed=1)]
    predicted = _predict(out / "model", "--file", dev)
    assert [p["label"] for p in predicted] == [e["prediction"] for e in evaluated]
    assert all(0.5 <= p["probability"] <= 1.0 for p in predicted)
    # a [CLS]-pooled model dir is a plain transformers classifier: the pipeline agrees
    model = AutoModelForSequenceClassification.from_pretrained(out / "model")
    assert type(model).__name__ == "BertForSequenceClassification"
    classify = pipeline("text-classification", model=str(out / "model"))
    served = classify(
        [{"text": r["premise"], "text_pair": r["hypothesis"]} for r in pair_rows(12, seed=1)]
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
        write_rows(tmp_path / "train.jsonl", pair_rows(40)),
        write_rows(tmp_path / "dev.jsonl", pair_rows(12, seed=1)),
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
    texts = [t for r in pair_rows(12, seed=1) for t in (r["premise"], r["hypothesis"])]
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
        write_rows(tmp_path / "train.csv", pair_rows(40)),
        write_rows(tmp_path / "dev.csv", pair_rows(12, seed=1)),
    )
    out = tmp_path / "ft"
    proc = _finetune_files(trained_run, out, train, dev, "task.kind=regression", label="score")
    result = json.loads((out / "results.json").read_text())
    assert "eval_spearman" in result and "eval_pearson" in result and "labels" not in result
    assert "files dev spearman:" in proc.stdout
    evaluated = _eval_predictions(out)
    assert [e["label"] for e in evaluated] == [r["score"] for r in pair_rows(12, seed=1)]
    predicted = _predict(out / "model", "--file", dev)
    assert [p["score"] for p in predicted] == pytest.approx(
        [e["prediction"] for e in evaluated], abs=1e-4
    )
