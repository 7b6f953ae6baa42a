"""Pretraining in phases (``phases``): a run whose second phase trains on longer blocks,
killed and resumed inside that phase, a finished run continued with a new phase, a plain
model at every phase's end, and the changes a resume refuses."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from runs import events, python_run, run_train

# bert-tiny's TINY settings at 32 tokens, then 64 tokens with half the batch and a new warmup
TWO_PHASES = (
    "phases=[{name:short,share:0.5},{name:long,share:0.5,schedule:rewarm,warmup_steps:2,"
    "set:{data:{max_seq_length:64},train:{batch_size:4}}}]"
)
ARGS = [
    "data.max_seq_length=32",
    "train.max_steps=20",
    "train.save_every=5",
    "train.keep_last=4",
    "train.eval_every=0",
    "train.log_every=1",
    "train.precision=no",
    TWO_PHASES,
]


def _weights(folder):
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


@pytest.mark.slow
def test_a_two_phase_run_resumed_inside_its_second_phase_ends_as_the_uninterrupted_one(
    tmp_path, cache_dir
):
    import torch

    run = tmp_path / "run"
    run_train(run, cache_dir, *ARGS)
    phases = events(run, "phase")
    assert [
        (e["step"], e["phase"], e["max_seq_length"], e["global_batch_size"]) for e in phases
    ] == [(0, "short", 32, 8), (10, "long", 64, 4)]
    assert phases[1]["changes"] == {"data.max_seq_length": 64, "train.batch_size": 4}
    train = events(run, "train")
    assert all(e["phase"] == ("short" if e["step"] <= 10 else "long") for e in train)
    # 8 x 32 tokens a step, then 4 x 64
    assert [e["tokens_seen"] for e in train if e["step"] in (10, 11, 20)] == [2560, 2816, 5120]
    # the new warmup: the rate climbs again over the long phase's first two steps
    lr = {e["step"]: e["lr"] for e in train}
    assert lr[11] < lr[12] and lr[11] == pytest.approx(lr[12] / 2)
    assert len(events(run, "eval")) >= 2  # each phase ends evaluated
    full_losses = [(e["step"], e["loss"]) for e in train]
    full = _weights(run / "final")
    assert set(os.listdir(run / "phases")) == {"short", "long"}
    assert all(torch.equal(full[k], v) for k, v in _weights(run / "phases" / "long").items())
    short = _weights(run / "phases" / "short")
    assert not all(torch.equal(full[k], v) for k, v in short.items())
    card = (run / "phases" / "short" / "README.md").read_text()
    assert "Phase: short" in card and "10 steps" in card

    # killed after the step-15 checkpoint: roll back to it and resume
    shutil.rmtree(run / "checkpoints" / "step_0000020")
    shutil.rmtree(run / "final")
    shutil.rmtree(run / "phases" / "long")
    proc = run_train(run, cache_dir, *ARGS, "train.resume=auto")
    assert "Resumed from" in proc.stderr and "step 15" in proc.stderr
    resumed = events(run, "train")
    assert [(e["step"], e["loss"]) for e in resumed] == full_losses  # fp32, one process: bitwise
    assert [e["step"] for e in events(run, "phase")] == [0, 10]
    again = _weights(run / "final")
    assert all(torch.equal(full[k], again[k]) for k in full)

    # from the boundary's own checkpoint: the second phase had begun when it was written
    proc = run_train(run, cache_dir, *ARGS, f"train.resume={run / 'checkpoints' / 'step_0000010'}")
    assert "step 10" in proc.stderr
    assert [(e["step"], e["loss"]) for e in events(run, "train")] == full_losses
    assert [e["step"] for e in events(run, "phase")] == [0, 10]  # logged once
    evals = [e["step"] for e in events(run, "eval")]
    assert len(evals) == len(set(evals))
    assert all(torch.equal(full[k], v) for k, v in _weights(run / "final").items())


@pytest.mark.slow
def test_each_phase_export_loads_with_nothing_from_mlmkit(tmp_path, cache_dir):
    run = tmp_path / "run"
    run_train(
        run,
        cache_dir,
        "data.max_seq_length=32",
        "train.max_steps=6",
        "train.save_every=0",
        "train.eval_every=0",
        TWO_PHASES,
    )
    code = (
        "import json, sys\n"
        "from transformers import AutoModelForMaskedLM, pipeline\n"
        "from sentence_transformers import SentenceTransformer\n"
        "out = {}\n"
        "for path in sys.argv[1:]:\n"
        "    model = AutoModelForMaskedLM.from_pretrained(path)\n"
        "    fill = pipeline('fill-mask', model=path)\n"
        "    vectors = SentenceTransformer(path, device='cpu')"
        ".encode(['a short line', 'another one'])\n"
        "    out[path] = [type(model).__name__, len(fill('The [MASK] is here.')), "
        "list(vectors.shape)]\n"
        "assert 'mlmkit' not in sys.modules\n"
        "print(json.dumps(out))\n"
    )
    paths = [str(run / "phases" / name) for name in ("short", "long")]
    proc = python_run("-c", code, *paths, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [out[p] for p in paths] == [["BertForMaskedLM", 5, [2, 32]]] * 2
    # the sentence embedder of each phase cuts at that phase's blocks
    lengths = [
        json.loads((run / "phases" / n / "sentence_bert_config.json").read_text())["max_seq_length"]
        for n in ("short", "long")
    ]
    assert lengths == [32, 64]


@pytest.mark.slow
def test_a_finished_run_continues_with_a_new_phase_and_a_begun_phase_cannot_change(
    tmp_path, cache_dir
):
    run = tmp_path / "run"
    base = [
        "data.max_seq_length=32",
        "train.save_every=0",
        "train.eval_every=0",
        "train.log_every=1",
    ]
    run_train(run, cache_dir, *base, "train.max_steps=8")
    ckpt = run / "checkpoints" / "step_0000008"
    before = (run / "metrics.jsonl").read_text()

    # a context extension of the finished run: its 8 steps are the first phase, 4 more at 64 tokens
    extend = (
        "phases=[{name:main,share:0.6},{name:long,share:0.4,schedule:rewarm,warmup_steps:1,"
        "set:{data.max_seq_length:64}}]"
    )
    bad = (
        "phases=[{name:main,share:0.6,set:{masking.mlm_probability:0.3}},{name:long,share:0.4,"
        "set:{data.max_seq_length:64}}]"
    )
    proc = run_train(
        run, cache_dir, *base, "train.max_steps=12", f"train.resume={ckpt}", bad, check=False
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("Error")]
    assert (
        len(lines) == 1 and "phase 0" in lines[0] and "keeps its name and settings" in lines[0]
    ), proc.stderr[-2000:]
    assert (run / "metrics.jsonl").read_text() == before and not (run / "phases").exists()

    run_train(run, cache_dir, *base, "train.max_steps=12", f"train.resume={ckpt}", extend)
    phases = events(run, "phase")
    assert [(e["step"], e["phase"], e["max_seq_length"]) for e in phases] == [(8, "long", 64)]
    steps = [(e["step"], e.get("phase")) for e in events(run, "train")]
    assert steps[-5:] == [(8, None), (9, "long"), (10, "long"), (11, "long"), (12, "long")]
    assert (run / "phases" / "main" / "model.safetensors").is_file()
    assert (
        json.loads((run / "final" / "sentence_bert_config.json").read_text())["max_seq_length"]
        == 64
    )


@pytest.mark.slow
def test_a_modernbert_context_extension_raises_the_rope_theta_in_its_export(tmp_path, cache_dir):
    run = tmp_path / "run"
    run_train(
        run,
        cache_dir,
        "model=modernbert-tiny",
        "model.num_hidden_layers=3",
        "model.local_attention=16",
        "model.intermediate_size=48",
        "model.global_rope_theta=10000",
        "data.max_seq_length=32",
        "train.max_steps=4",
        "train.save_every=0",
        "train.log_every=1",
        "train.eval_every=0",
        "phases=[{name:short,share:0.5},{name:extend,share:0.5,schedule:constant,"
        "lr:1e-4,set:{data.max_seq_length:64,model.global_rope_theta:160000}}]",
    )
    theta = {
        name: json.loads((run / "phases" / name / "config.json").read_text())["rope_parameters"][
            "full_attention"
        ]["rope_theta"]
        for name in ("short", "extend")
    }
    assert theta == {"short": 10000.0, "extend": 160000.0}
    assert (
        json.loads((run / "final" / "config.json").read_text())["rope_parameters"][
            "full_attention"
        ]["rope_theta"]
        == 160000.0
    )
    assert [e["lr"] for e in events(run, "train") if e["step"] > 2] == [pytest.approx(1e-4)] * 2


@pytest.mark.slow
def test_the_batch_warmup_resumes_exactly_inside_its_ramp(tmp_path, cache_dir):
    run = tmp_path / "run"
    args = [
        "data.max_seq_length=32",
        "train.batch_size=4",
        "train.global_batch_size=16",
        "train.batch_warmup_tokens=1024",
        "train.max_steps=10",
        "train.save_every=4",
        "train.keep_last=3",
        "train.eval_every=0",
        "train.log_every=1",
        "train.precision=no",
        "optim.warmup_steps=0",
        "optim.schedule=constant",
    ]
    run_train(run, cache_dir, *args)
    train = events(run, "train")
    assert [e["global_batch_size"] for e in train] == [4, 4, 4, 8, 8, 12, 16, 16, 16, 16]
    # the rate follows the batch: a quarter of the run's at a quarter of its batch
    assert [e["lr"] / train[-1]["lr"] for e in train[:7]] == pytest.approx(
        [0.25] * 3 + [0.5] * 2 + [0.75, 1.0]
    )
    full = [(e["step"], e["loss"]) for e in train]
    shutil.rmtree(run / "checkpoints" / "step_0000010")
    shutil.rmtree(run / "checkpoints" / "step_0000008")
    shutil.rmtree(run / "final")
    proc = run_train(run, cache_dir, *args, "train.resume=auto")
    assert "step 4" in proc.stderr
    assert [(e["step"], e["loss"]) for e in events(run, "train")] == full
