"""The encoder as a sentence embedder: the sentence-transformers files of final/, mlmkit
eval-sts (zero-shot STS-B), finetune task=stsb (regression) and the correlation metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import shared_file
from runs import python_run, run_cli, run_finetune, run_train

from mlmkit.errors import DataError
from mlmkit.finetune.correlation import pearson, ranks, spearman

SENTENCES = [
    "A man is playing a guitar.",
    "Someone plays the guitar.",
    "The function returns the value of its argument.",
    "A cat sits on the mat.",
]


def run_eval_sts(*overrides: str, check: bool = True):
    proc = run_cli("eval-sts", *overrides)
    if check and proc.returncode != 0:
        raise AssertionError(f"eval-sts failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture(scope="module")
def sts_run(tmp_path_factory, cache_dir) -> Path:
    """A tiny run with a final/ export and a checkpoint at step 10."""
    run = tmp_path_factory.mktemp("sts") / "run"
    run_train(
        run,
        cache_dir,
        "train.max_steps=20",
        "train.eval_every=10",
        "train.save_every=10",
        "train.keep_last=2",
    )
    return run


def sts_files(folder: Path, lines: list[str], name: str = "dev.tsv") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(f"{line}\n" for line in lines))
    return folder


def sts_line(i: int, a: str, b: str, score: str) -> str:
    return f"{i}\tmain-captions\tMSRvid\t2012test\t{i:04d}\tnone\tnone\t{a}\t{b}\t{score}"


# ---- metrics ---------------------------------------------------------------------------------


def test_correlations_match_their_definitions():
    assert ranks([3, 1, 3, 2]).tolist() == [3.5, 1.0, 3.5, 2.0]  # ties share their mean rank
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert pearson([1, 1, 1], [1, 2, 3]) == 0.0 and spearman([5], [1]) == 0.0
    # monotone but not linear: Spearman 1, Pearson below
    assert spearman([1, 2, 3, 4], [1, 4, 9, 100]) == pytest.approx(1.0)
    assert pearson([1, 2, 3, 4], [1, 4, 9, 100]) < 0.9
    # with ties: Pearson of the ranks [1.5, 1.5, 3, 4] and [1, 2, 3, 4]
    x, y = [1.5, 1.5, 3, 4], [1, 2, 3, 4]
    mx, my = sum(x) / 4, sum(y) / 4
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y))
    var = (sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y)) ** 0.5
    assert spearman([0.2, 0.2, 0.5, 0.9], [0, 1, 2, 3]) == pytest.approx(cov / var)


def test_pearson_and_spearman_metric_modules_load_offline():
    from mlmkit.finetune.metric_modules import load_metric

    got = load_metric("spearman").compute(predictions=[0.1, 0.5, 0.2], references=[1.0, 3.0, 2.0])
    assert got == {"spearman": pytest.approx(1.0)}
    got = load_metric("pearson").compute(predictions=[1.0, 2.0, 3.0], references=[2.0, 4.0, 6.5])
    assert got["pearson"] == pytest.approx(pearson([1, 2, 3], [2, 4, 6.5]))


# ---- data ------------------------------------------------------------------------------------


def _stsb_task(data_dir: Path | None = None):
    from helpers import task_config as _task

    task = _task("stsb")
    task.data_dir = None if data_dir is None else str(data_dir)
    return task


def test_stsb_tsv_files_are_read_as_pairs_with_scores():
    from mlmkit.finetune.reader import load_task

    dev_file = shared_file("glue/STS-B/dev.tsv")
    train, dev = load_task(_stsb_task(dev_file.parent))
    assert len(dev) == 1500 and len(train) == 4249
    assert dev[0] == {
        "text": ["A man is playing the cello.", "A man seated is playing the cello."],
        "label": 4.25,
    }
    assert all(0.0 <= e["label"] <= 5.0 and len(e["text"]) == 2 for e in train + dev)


def test_a_header_line_of_the_column_names_is_skipped(tmp_path):
    from mlmkit.finetune.reader import read_tsv

    header = (
        "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    )
    folder = sts_files(tmp_path, [header, sts_line(0, "A b.", "C d.", "1.5")])
    assert read_tsv(folder / "dev.tsv", _stsb_task()) == [{"text": ["A b.", "C d."], "label": 1.5}]


@pytest.mark.parametrize(
    "case,lines,message",
    [
        ("missing", None, r"dev.tsv' does not exist; set task.data_dir"),
        ("empty", [], r"dev.tsv' is empty"),
        (
            "columns",
            ["A man sings.\tA man is singing.\t4.0"],
            r"has 3 tab-separated columns in its first line, but stsb files have 10",
        ),
        (
            "range",
            [sts_line(0, "A b.", "C d.", "2.0"), sts_line(1, "A b.", "C d.", "5.4")],
            r"dev.tsv' line 2: the score '5.4' is outside task.label_range \[0.0, 5.0\]",
        ),
        (
            "number",
            [sts_line(0, "A b.", "C d.", "high")],
            r"line 1: the score 'high' is not a number",
        ),
    ],
)
def test_bad_sts_files_are_one_sentence(tmp_path, case, lines, message):
    from mlmkit.finetune.reader import load_split

    folder = tmp_path / "STS-B"
    folder.mkdir()
    if lines is not None:
        (folder / "dev.tsv").write_text("".join(f"{line}\n" for line in lines))
    with pytest.raises(DataError, match=message):
        load_split(_stsb_task(folder), "eval")
    # the command: exit status 2 and the sentence, no traceback (the data is read first)
    proc = run_eval_sts(f"checkpoint={tmp_path}", f"data_dir={folder}", check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("Error: ") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_eval_sts_settings_are_checked():
    from mlmkit.config import StsEvalConfig
    from mlmkit.errors import ConfigError

    with pytest.raises(ConfigError, match="checkpoint="):
        StsEvalConfig()
    with pytest.raises(ConfigError, match="pooling must be cls or mean"):
        StsEvalConfig(checkpoint="x", task=_stsb_task(), pooling="max")
    with pytest.raises(ConfigError, match="task.kind=regression"):
        StsEvalConfig(checkpoint="x")  # the default task is sst2 (classification)


def test_regression_loss_of_the_mean_pooling_model():
    import torch
    from transformers import BertConfig

    from mlmkit.model.classifier import MeanPoolBertForSequenceClassification

    config = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=1,
    )
    torch.manual_seed(0)
    model = MeanPoolBertForSequenceClassification(config).eval()
    ids = torch.tensor([[2, 7, 9, 3], [2, 5, 6, 3]])
    scores = torch.tensor([4.5, 0.5])
    out = model(input_ids=ids, labels=scores)
    assert out.logits.shape == (2, 1)
    torch.testing.assert_close(out.loss, ((out.logits.squeeze(-1) - scores) ** 2).mean())


# ---- the exported embedder -------------------------------------------------------------------

# sentence-transformers alone, in a fresh interpreter that never imports mlmkit
ST_SCRIPT = """
import json, sys
from sentence_transformers import SentenceTransformer
model = SentenceTransformer(sys.argv[1], device="cpu")
vectors = model.encode(json.loads(sys.argv[2]), convert_to_numpy=True)
assert not [m for m in sys.modules if m.split(".")[0] == "mlmkit"]
print(json.dumps({"vectors": vectors.tolist(), "max_seq_length": model.max_seq_length,
                  "dimension": model.get_sentence_embedding_dimension()}))
"""


def test_sentence_transformers_loads_final_as_a_mean_pooling_embedder(sts_run):
    pytest.importorskip("sentence_transformers")
    import torch
    from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer, pipeline

    final = sts_run / "final"
    modules = json.loads((final / "modules.json").read_text())
    assert [(m["path"], m["type"].rsplit(".", 1)[-1]) for m in modules] == [
        ("", "Transformer"),
        ("1_Pooling", "Pooling"),
    ]
    pooling = json.loads((final / "1_Pooling" / "config.json").read_text())
    assert pooling["word_embedding_dimension"] == 32 and pooling["pooling_mode_mean_tokens"]
    assert not pooling["pooling_mode_cls_token"]
    assert json.loads((final / "sentence_bert_config.json").read_text())["max_seq_length"] == 64
    assert 'SentenceTransformer("path/to/this/dir")' in (final / "README.md").read_text()

    proc = python_run(
        "-c", ST_SCRIPT, final, json.dumps(SENTENCES), cwd=final, timeout=300
    )  # a process that never imported mlmkit
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["max_seq_length"] == 64 and got["dimension"] == 32

    # the same vectors from plain transformers: the mean of the last layer's token states
    tokenizer = AutoTokenizer.from_pretrained(final)
    encoder = AutoModel.from_pretrained(final).eval()
    enc = tokenizer(SENTENCES, padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.no_grad():
        hidden = encoder(**enc).last_hidden_state
    keep = enc["attention_mask"].unsqueeze(-1).float()
    expected = (hidden * keep).sum(1) / keep.sum(1)
    torch.testing.assert_close(torch.tensor(got["vectors"]), expected, rtol=1e-4, atol=1e-5)

    # the plain transformers readers of final/ are unchanged
    assert AutoModelForMaskedLM.from_pretrained(final).__class__.__name__ == "BertForMaskedLM"
    fill = pipeline("fill-mask", model=str(final), device="cpu")
    assert len(fill(f"The {tokenizer.mask_token} is here.", top_k=3)) == 3


# ---- zero-shot and fine-tuned STS-B ------------------------------------------------------------


def test_eval_sts_on_a_run_dir_and_a_checkpoint(sts_run, tmp_path):
    data_dir = shared_file("glue/STS-B/dev.tsv").parent
    figures = {}
    for name, target in [("run", sts_run), ("ckpt", sts_run / "checkpoints" / "step_0000010")]:
        out = tmp_path / f"{name}.json"
        proc = run_eval_sts(f"checkpoint={target}", f"data_dir={data_dir}", f"output={out}")
        figures[name] = result = json.loads(out.read_text())
        assert result["pairs"] == 1500 and result["split"] == "dev" and result["pooling"] == "mean"
        assert -1.0 <= result["spearman"] <= 1.0 and -1.0 <= result["pearson"] <= 1.0
        assert f"spearman  {result['spearman']:.4f}" in proc.stdout
    assert figures["run"]["checkpoint"] == str(sts_run / "final")
    assert figures["ckpt"]["checkpoint"].endswith("step_0000010")
    assert figures["run"]["spearman"] != figures["ckpt"]["spearman"]  # different weights


def test_eval_sts_python_api_matches_sentence_transformers_pooling(sts_run):
    """evaluate_sts scores the vectors the exported embedder gives (mean pooling)."""
    import torch

    from mlmkit.config import StsEvalConfig
    from mlmkit.evaluation.sts import embed, load_encoder
    from mlmkit.training.trained_model import load_model_and_tokenizer

    cfg = StsEvalConfig(checkpoint=str(sts_run), task=_stsb_task())
    encoder, tokenizer, _ = load_encoder(cfg)
    vectors = embed(encoder, tokenizer, SENTENCES, pooling="mean", batch_size=3)
    mlm, tok, _ = load_model_and_tokenizer(sts_run)
    enc = tok(SENTENCES[:1], return_tensors="pt")
    with torch.no_grad():
        hidden = mlm.bert(**enc).last_hidden_state
    torch.testing.assert_close(vectors[0], hidden[0].mean(0), rtol=1e-4, atol=1e-5)
    cls = embed(encoder, tokenizer, SENTENCES[:1], pooling="cls")
    torch.testing.assert_close(cls[0], hidden[0, 0], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_finetune_stsb_reports_pearson_and_spearman(sts_run, tmp_path):
    data_dir = shared_file("glue/STS-B/dev.tsv").parent
    out = tmp_path / "stsb"
    proc = run_finetune(
        f"checkpoint={sts_run}",
        "task=stsb",
        f"task.data_dir={data_dir}",
        "max_train_samples=64",
        "epochs=1",
        "max_seq_length=64",
        "batch_size=16",
        f"hydra.run.dir={out}",
        "save_model=true",
    )
    result = json.loads((out / "results.json").read_text())
    assert result["task"] == "stsb" and result["eval_examples"] == 1500
    assert result["steps"] == 4 and result["train_examples"] == 64
    for metric in ("eval_spearman", "eval_pearson"):
        assert -1.0 <= result[metric] <= 1.0
    assert f"stsb dev spearman: {result['eval_spearman']:.4f}" in proc.stdout
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in evals if e["event"] == "eval"] == [1]
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(out / "model")
    assert model.config.num_labels == 1 and model.config.problem_type == "regression"
