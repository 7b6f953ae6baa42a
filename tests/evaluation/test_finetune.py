"""python -m mlmkit finetune: GLUE-format data, the classifier, and the end-to-end command."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import shared_file
from runs import ROOT, run_finetune

from mlmkit.config import TaskConfig
from mlmkit.errors import DataError
from mlmkit.evaluation.finetune import load_task, read_tsv


def _task(name: str) -> TaskConfig:
    from omegaconf import OmegaConf

    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TaskConfig),
                                               OmegaConf.load(ROOT / "conf" / "task" / f"{name}.yaml")))


@pytest.mark.parametrize("name,folder,n_text", [("sst2", "SST-2", 1), ("cola", "CoLA", 1), ("rte", "RTE", 2)])
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
    path.write_text("index\tsentence1\tsentence2\tlabel\n0\tA cat.\tAn animal.\tentailment\n"
                    "1\tA cat.\tA dog.\tnot_entailment\n2\tbroken line\n")
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
@pytest.mark.parametrize("name,folder,metric", [("cola", "CoLA", "matthews_correlation"),
                                                ("rte", "RTE", "accuracy")])
def test_finetune_command_reports_the_task_metric(trained_run, tmp_path, name, folder, metric):
    data_dir = shared_file(f"glue/{folder}/dev.tsv").parent
    out = tmp_path / name
    proc = run_finetune(f"checkpoint={trained_run}", f"task={name}", f"task.data_dir={data_dir}",
                        "max_train_samples=64", "epochs=1", "max_seq_length=64", "batch_size=16",
                        f"hydra.run.dir={out}", "save_model=true")
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
    assert proc.returncode == 2 and "not a model dir" in proc.stderr and "Traceback" not in proc.stderr



def test_mean_pooling_reads_the_token_states_without_padding(tmp_path):
    import torch
    from transformers import BertConfig

    from mlmkit.model.classifier import MeanPoolBertForSequenceClassification, masked_mean

    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, num_labels=2, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
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


def test_freeze_encoder_trains_only_the_pooler_and_classifier():
    from transformers import BertConfig

    from mlmkit.evaluation.finetune import freeze_encoder
    from mlmkit.model.classifier import MeanPoolBertForSequenceClassification

    model = MeanPoolBertForSequenceClassification(BertConfig(
        vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32))
    freeze_encoder(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"bert.pooler.dense.weight", "bert.pooler.dense.bias", "classifier.weight",
                         "classifier.bias"}
    before = model.bert.encoder.layer[0].output.dense.weight.clone()
    out = model(input_ids=torch.randint(5, 100, (4, 8)), labels=torch.tensor([0, 1, 0, 1]))
    out.loss.backward()
    assert model.bert.encoder.layer[0].output.dense.weight.grad is None
    assert torch.equal(model.bert.encoder.layer[0].output.dense.weight, before)


def test_a_regression_head_starts_at_the_mean_training_label():
    from transformers import BertConfig

    from mlmkit.evaluation.finetune import start_at_mean_label
    from mlmkit.model.classifier import MeanPoolBertForSequenceClassification

    model = MeanPoolBertForSequenceClassification(BertConfig(
        vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        num_labels=1))
    start_at_mean_label(model, [{"label": 1.0}, {"label": 4.0}, {"label": 2.5}])
    assert model.classifier.bias.tolist() == [2.5]
    model.eval()
    out = model(input_ids=torch.randint(5, 100, (3, 6))).logits
    assert (out - 2.5).abs().max() < 1.0  # the weights start near zero: predictions near the mean
