"""model=modernbert-tiny end to end: train, resume, export, fill-mask, eval and finetune."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import shared_file
from runs import (
    assert_same_losses,
    assert_same_weights,
    events,
    python_run,
    run_cli,
    run_finetune,
    run_train,
)

# three layers (global, local, local) with a window of 16 tokens, so blocks of 64 use it
MODERNBERT = [
    "model=modernbert-tiny",
    "model.num_hidden_layers=3",
    "model.local_attention=16",
    "model.intermediate_size=48",
]
ARGS = [
    "train.max_steps=20",
    "train.save_every=10",
    "train.eval_every=10",
    "train.log_every=2",
    "train.precision=no",
    "model.output_bias_init=zero",
]  # zero: the loss must fall in 20 steps


@pytest.fixture(scope="module")
def modernbert_run(tmp_path_factory, cache_dir):
    """A 20-step run, then the same run rolled back to its step-10 checkpoint and resumed:
    (run dir, losses and final weights of the uninterrupted run)."""
    from safetensors.torch import load_file

    run = tmp_path_factory.mktemp("modernbert") / "run"
    run_train(run, cache_dir, *MODERNBERT, *ARGS)
    full_losses = [(e["step"], e["loss"]) for e in events(run, "train")]
    full_weights = load_file(run / "final" / "model.safetensors")
    shutil.rmtree(run / "checkpoints" / "step_0000020")
    shutil.rmtree(run / "final")
    proc = run_train(run, cache_dir, *MODERNBERT, *ARGS, "train.resume=auto")
    assert "Resumed from" in proc.stderr
    return run, full_losses, full_weights


@pytest.mark.slow
def test_modernbert_trains_and_resumes_to_the_same_losses(modernbert_run):
    from safetensors.torch import load_file

    run, full_losses, full_weights = modernbert_run
    config = json.loads((run / "final" / "config.json").read_text())
    assert config["model_type"] == "modernbert" and config["architectures"] == [
        "ModernBertForMaskedLM"
    ]
    assert json.loads((run / "model" / "config.json").read_text())["model_type"] == "modernbert"
    assert config["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention"]
    train_events = events(run, "train")
    assert_same_losses([(e["step"], e["loss"]) for e in train_events], full_losses)
    assert_same_weights(load_file(run / "final" / "model.safetensors"), full_weights)
    assert train_events[-1]["loss"] < train_events[0]["loss"]  # it learns
    assert all(0 < e["mfu"] < 1 for e in train_events)
    card = (run / "final" / "README.md").read_text()
    assert "A ModernBERT encoder" in card and "ModernBertForMaskedLM (layers 3" in card
    tokenizer_config = json.loads((run / "final" / "tokenizer_config.json").read_text())
    assert "token_type_ids" not in tokenizer_config["model_input_names"]


@pytest.mark.slow
def test_modernbert_export_fills_masks_without_mlmkit(modernbert_run, tmp_path):
    run = modernbert_run[0]
    final = run / "final"
    code = (
        "import sys, json\n"
        "import torch\n"
        "from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline\n"
        f"path = {str(final)!r}\n"
        "model = AutoModelForMaskedLM.from_pretrained(path, trust_remote_code=False)\n"
        "tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)\n"
        "fill = pipeline('fill-mask', model=path, trust_remote_code=False)\n"
        "out = fill('The [MASK] is returned by the function.')\n"
        "ids = tokenizer(['a b c ' * 30, 'short one'], padding=True, return_tensors='pt')\n"
        "with torch.no_grad():\n"
        "    logits = model(**ids).logits\n"
        "assert 'mlmkit' not in sys.modules\n"
        "print(json.dumps({'n': len(out), 'cls': type(model).__name__, 'token': "
        "out[0]['token_str'],\n"
        "                  'inputs': sorted(ids), 'finite': bool(torch.isfinite(logits).all()),\n"
        "                  'tied': model.decoder.weight is "
        "model.model.embeddings.tok_embeddings.weight}))\n"
    )
    proc = python_run("-c", code, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["n"] == 5 and result["cls"] == "ModernBertForMaskedLM" and result["token"]
    assert (
        result["inputs"] == ["attention_mask", "input_ids"] and result["finite"] and result["tied"]
    )
    # and mlmkit's own command
    from mlmkit.cli import main

    assert main(["fill-mask", str(final), "The [MASK] is returned."]) == 0


@pytest.mark.slow
def test_modernbert_eval_reproduces_the_runs_eval_events(modernbert_run, cache_dir, tmp_path):
    """mlmkit eval of the export and of a mid-run checkpoint gives what the run logged."""
    run = modernbert_run[0]
    by_step = {e["step"]: e for e in events(run, "eval")}
    for target, step in [(run, 20), (run / "checkpoints" / "step_0000010", 10)]:
        out = tmp_path / f"eval-{step}.json"
        proc = run_cli(
            "eval",
            f"checkpoint={target}",
            f"paths.cache_dir={cache_dir}",
            "data.max_seq_length=64",
            "data.max_eval_samples=64",
            "batch_size=8",
            f"output={out}",
            "precision=no",
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        result, logged = json.loads(out.read_text()), by_step[step]
        assert result["tokens"] == logged["eval_tokens"]
        assert result["loss"] == pytest.approx(logged["eval_loss"], rel=1e-4)
        assert result["accuracy"] == pytest.approx(
            logged["eval_accuracy"], abs=2 / result["tokens"]
        )


@pytest.mark.slow
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_modernbert_finetunes_on_sst2(modernbert_run, tmp_path, pooling):
    data_dir = shared_file("glue/SST-2/dev.tsv").parent
    out = tmp_path / "sst2"
    run_finetune(
        f"checkpoint={modernbert_run[0]}",
        "task=sst2",
        f"task.data_dir={data_dir}",
        "max_train_samples=64",
        "epochs=1",
        "max_seq_length=64",
        "batch_size=16",
        f"pooling={pooling}",
        f"hydra.run.dir={out}",
        "save_model=true",
    )
    result = json.loads((out / "results.json").read_text())
    assert result["steps"] == 4 and result["train_examples"] == 64
    assert 0.0 <= result["eval_accuracy"] <= 1.0
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(out / "model")
    assert type(model).__name__ == "ModernBertForSequenceClassification"
    assert model.config.classifier_pooling == pooling and model.config.num_labels == 2


@pytest.mark.gpu
def test_modernbert_tiny_preset_trains_on_a_gpu_in_bf16(tmp_path, cache_dir):
    """The modernbert-tiny preset (sizes unchanged) on CUDA in bf16 with attention auto:
    flash-attn's unpadded kernel where installed, on padded batches (line_by_line)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from mlmkit.model.bert import flash_attn_available

    run = tmp_path / "run"
    proc = run_train(
        run,
        cache_dir,
        "model=modernbert-tiny",
        "model.num_hidden_layers=3",
        "model.hidden_size=128",
        "model.num_attention_heads=2",
        "model.intermediate_size=192",
        "data.packing=line_by_line",
        "data.max_seq_length=256",
        "train.batch_size=16",
        "train.precision=bf16",
        "train.max_steps=60",
        "train.save_every=0",
        "train.eval_every=0",
    )
    expected = "flash_attention_2" if flash_attn_available() else "sdpa"
    assert f"attention {expected}" in proc.stderr
    losses = [e["loss"] for e in events(run, "train")]
    assert all(x == x and x < 20 for x in losses) and losses[-1] < losses[0]
    config = json.loads((run / "final" / "config.json").read_text())
    assert config["model_type"] == "modernbert" and config["hidden_size"] == 128
