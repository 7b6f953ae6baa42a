"""End to end through train.py: training, export, fill-mask, resume, and user errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import yaml
from conftest import SHARED_DATA, shared_file
from runs import (
    ROOT,
    SMALLEST,
    TEST_ENV,
    TINY,
    assert_same_losses,
    assert_same_weights,
    events,
    python_run,
    run_cli,
    run_finetune,
    run_train,
)


@pytest.mark.slow
def test_train_export_and_fill_mask(trained_run, tmp_path):
    run = trained_run
    train_events, eval_events = events(run, "train"), events(run, "eval")
    assert [e["step"] for e in train_events] == [5, 10, 15, 20, 25, 30]
    assert [e["step"] for e in eval_events] == [15, 30]
    for e in train_events:
        assert e["loss"] > 0 and e["tokens_per_s"] > 0 and e["lr"] > 0
        assert e["masked_tokens_per_s"] > 0 and 0 < e["mfu"] <= 1 and e["peak_memory_gb"] > 0
        assert (
            0 <= e["data_wait_share"] < 1
        )  # the host's wait for batches, a share of the steps' time
        share = e["masked_tokens_per_s"] / e["tokens_per_s"]
        assert (
            0.30 < share < 0.50
        )  # 40% of the real tokens are chosen (masking=mask40, the default)
    assert train_events[-1]["loss"] < train_events[0]["loss"]  # it learns
    for key in ("eval_loss", "eval_accuracy", "eval_perplexity"):
        assert key in eval_events[-1]
    assert (run / ".hydra" / "config.yaml").is_file()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "step_0000015",
        "step_0000030",
    ]
    final = run / "final"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "README.md"):
        assert (final / name).is_file(), name
    card = (final / "README.md").read_text()
    last_train, last_eval = train_events[-1], eval_events[-1]
    for fact in (
        "layers 1, hidden 32, heads 2, FFN 64, vocabulary 1000",  # architecture
        "M parameters",
        "Data: builtin",
        "blocks of 64 tokens",  # size, data
        f"{last_train['step']} optimizer steps, {last_train['tokens_seen']} tokens seen",
        f"| eval_accuracy | {last_eval['eval_accuracy']:.4f} |",  # final eval metrics
        '"hidden_size": 32',
        '"max_steps": 30',  # the full config
        'pipeline("fill-mask"',
        "mlmkit fill-mask",  # usage
        "[UNK] is 0.00% of the validation text's tokens",
    ):  # the tokenizer's fit
        assert fact in card, fact
    assert (
        "Tokenizer: [UNK] is 0.00% of the tokens of the validation text"
        in (run / "train.log").read_text()
    )

    # The export is a plain Hugging Face dir: fill-mask with nothing from mlmkit imported.
    code = (
        "import sys, json\n"
        "from transformers import AutoModelForMaskedLM, pipeline\n"
        f"path = {str(final)!r}\n"
        "model = AutoModelForMaskedLM.from_pretrained(path)\n"
        "fill = pipeline('fill-mask', model=path)\n"
        "out = fill('The [MASK] is returned by the function.')\n"
        "assert 'mlmkit' not in sys.modules\n"
        "print(json.dumps({'n': len(out), 'cls': type(model).__name__, 'token': "
        "out[0]['token_str']}))\n"
    )
    proc = python_run("-c", code, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["n"] == 5 and result["cls"] == "BertForMaskedLM" and result["token"]


@pytest.mark.slow
@pytest.mark.parametrize("precision,workers", [("no", 0), ("no", 2), ("bf16", 0)])
def test_resume_reproduces_the_uninterrupted_run(tmp_path, cache_dir, precision, workers):
    """Stop after the step-10 checkpoint, resume with train.resume=auto: same losses, same
    weights."""
    from safetensors.torch import load_file

    run = tmp_path / "run"
    args = [
        "train.max_steps=20",
        "train.save_every=10",
        "train.eval_every=10",
        f"train.precision={precision}",
        f"train.num_workers={workers}",
        "train.log_every=2",
    ]
    run_train(run, cache_dir, *args)
    full_losses = [(e["step"], e["loss"]) for e in events(run, "train")]
    full_weights = load_file(run / "final" / "model.safetensors")

    # Roll the run back to its step-10 checkpoint, as if it had been killed there.
    import shutil

    shutil.rmtree(run / "checkpoints" / "step_0000020")
    shutil.rmtree(run / "final")
    proc = run_train(run, cache_dir, *args, "train.resume=auto")
    assert "Resumed from" in proc.stderr
    resumed_losses = [(e["step"], e["loss"]) for e in events(run, "train")]
    assert_same_losses(resumed_losses, full_losses)
    assert len(events(run, "baseline")) == 1
    assert_same_weights(load_file(run / "final" / "model.safetensors"), full_weights)


@pytest.mark.slow
def test_used_run_dir_is_not_overwritten(tmp_path, cache_dir):
    run = tmp_path / "run"
    run_train(run, cache_dir, "train.max_steps=5", "train.eval_every=0", "train.save_every=0")
    before = (run / "metrics.jsonl").read_text()
    proc = run_train(run, cache_dir, "train.max_steps=5", check=False)
    assert proc.returncode == 2 and "train.resume=auto" in proc.stderr
    assert (run / "metrics.jsonl").read_text() == before


@pytest.mark.slow
def test_continued_pretraining_from_an_exported_model(trained_run, tmp_path, cache_dir):
    """model.init_from loads the weights and keeps that model's tokenizer."""
    from safetensors.torch import load_file

    source = trained_run / "final"
    corpus = tmp_path / "domain.txt"
    corpus.write_text(
        "\n\n".join(f"Domain text {i} about ships, whales and the open sea." for i in range(400))
    )
    run = tmp_path / "continued"
    run_train(
        run,
        cache_dir,
        f"model.init_from={source}",
        "data=files",
        f"data.train_files=[{corpus}]",
        "tokenizer.vocab_size=500",
        "train.max_steps=3",
        "optim.lr=1e-12",
        "optim.warmup_steps=0",
    )
    before, after = (
        load_file(source / "model.safetensors"),
        load_file(run / "final" / "model.safetensors"),
    )
    assert before.keys() == after.keys()
    for name in before:  # lr ~ 0: the weights are the loaded ones
        assert before[name].shape == after[name].shape
        assert (before[name].float() - after[name].float()).abs().max() < 1e-6, name
    # the tokenizer is the source model's, not one trained on the new corpus
    assert (source / "tokenizer.json").read_text() == (run / "final" / "tokenizer.json").read_text()
    # the continued-pretraining recipe took what the command line left unset, said so and saved it
    log = (run / "train.log").read_text()
    recipe = next(line for line in log.splitlines() if "Continued pretraining from" in line)
    assert "masking.mlm_probability=0.15" in recipe
    assert "optim.lr" not in recipe and "optim.warmup" not in recipe  # given on the command line
    assert f"Model {trained_run.name}/final (continued):" in log  # named by what it loaded
    saved = yaml.safe_load((run / ".hydra" / "config.yaml").read_text())
    assert saved["masking"]["mlm_probability"] == 0.15 and saved["optim"]["lr"] == 1e-12
    card = (run / "final" / "README.md").read_text()
    assert f"Continued pretraining of: {source}." in card
    assert f"# {trained_run.name}/final (continued) (masked language model)" in card.splitlines()


@pytest.mark.slow
def test_vocabulary_extension_trains_resumes_evaluates_and_fine_tunes(
    trained_run, tmp_path, cache_dir
):
    """tokenizer.extend_vocab: the base model's vocabulary grows by the domain's words, the
    run resumes exactly, and its final/ is a plain model that mlmkit eval and finetune take."""
    from safetensors.torch import load_file
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    shared_file("corpora/gutenberg/melville-moby_dick.txt")
    source = trained_run / "final"
    book = SHARED_DATA / "corpora" / "gutenberg" / "melville-moby_dick.txt"
    args = [
        f"model.init_from={source}",
        "data=files",
        f"data.train_files=[{book}]",
        "tokenizer.extend_vocab=100",
        "train.max_steps=6",
        "train.save_every=3",
        "train.eval_every=6",
        "train.precision=no",
    ]
    run = tmp_path / "extended"
    run_train(run, cache_dir, *args)
    base, tok = AutoTokenizer.from_pretrained(source), AutoTokenizer.from_pretrained(run / "final")
    added = len(tok) - len(base)
    assert 50 <= added <= 100
    assert "Vocabulary extension: " in (run / "train.log").read_text()
    model = AutoModelForMaskedLM.from_pretrained(run / "final")  # plain transformers
    assert model.get_input_embeddings().num_embeddings >= len(tok)
    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed, ignore=shutil.ignore_patterns(".lock"))
    shutil.rmtree(resumed / "final")
    shutil.rmtree(resumed / "checkpoints" / "step_0000006")
    run_train(resumed, cache_dir, *args, "train.resume=auto")
    first, again = (
        load_file(run / "final" / "model.safetensors"),
        load_file(resumed / "final" / "model.safetensors"),
    )
    for name, tensor in first.items():
        assert torch.allclose(tensor, again[name], rtol=1e-5, atol=1e-6), name
    out = tmp_path / "eval.json"
    proc = run_cli("eval", f"checkpoint={run}", f"output={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["tokens"] > 0
    sst = shared_file("glue/SST-2/train.tsv")
    run_finetune(
        f"checkpoint={run}/final",
        "task=sst2",
        f"task.data_dir={sst.parent}",
        "max_train_samples=32",
        "epochs=1",
        "max_seq_length=32",
        "save_model=false",
        f"hydra.run.dir={tmp_path / 'ft'}",
    )
    assert (tmp_path / "ft" / "results.json").is_file()


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        ["masking=schedule", "masking.on_device=true"],
        ["masking=span"],
        ["masking=whole_word", "masking.on_device=true", "train.num_workers=1"],
    ],
)
def test_masking_strategies_train(tmp_path, cache_dir, overrides):
    run = tmp_path / "run"
    run_train(
        run,
        cache_dir,
        "train.max_steps=10",
        "train.log_every=1",
        "train.eval_every=0",
        "train.save_every=0",
        *overrides,
    )
    train_events = events(run, "train")
    assert len(train_events) == 10 and all(e["loss"] > 0 for e in train_events)
    rates = [e["mlm_probability"] for e in train_events]
    if "masking=schedule" in overrides:
        assert rates[0] == pytest.approx(0.30) and rates[-1] == pytest.approx(0.15)
        assert rates == sorted(rates, reverse=True)
    else:
        assert set(rates) == {0.15}


@pytest.mark.slow
def test_gradient_checkpointing_trains_end_to_end(tmp_path, cache_dir):
    """train.gradient_checkpointing=true: the smallest run (4 steps) trains with its encoder
    layers recomputed in the backward, evaluates, checkpoints and exports, with no warning from
    transformers."""
    run = tmp_path / "run"
    proc = run_cli(
        "train",
        *SMALLEST,
        f"paths.cache_dir={cache_dir}",
        f"hydra.run.dir={run}",
        "train.gradient_checkpointing=true",
        "train.eval_every=4",
        check=True,
    )
    assert "Gradient checkpointing: the encoder layers' activations" in proc.stderr
    assert "use_cache" not in proc.stderr
    losses = [e["loss"] for e in events(run, "train")]
    assert len(losses) == 2 and all(loss > 0 for loss in losses)
    assert events(run, "eval") and (run / "checkpoints" / "step_0000004").is_dir()
    assert (run / "final" / "model.safetensors").is_file()


@pytest.mark.slow
def test_tokenizer_larger_than_init_from_embeddings_is_refused(
    trained_run, tmp_path, cache_dir, tokenizer
):
    """A 2,000-token tokenizer cannot drive a model with 1,000 embeddings."""
    tokenizer.save_pretrained(tmp_path / "big-tokenizer")
    proc = run_train(
        tmp_path / "run",
        cache_dir,
        f"model.init_from={trained_run / 'final'}",
        f"tokenizer.name_or_path={tmp_path / 'big-tokenizer'}",
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "embeddings" in proc.stderr and "tokenizer.name_or_path" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_fill_mask_command_answers_bad_input_in_one_sentence(trained_run, capsys):
    from mlmkit.cli import main

    final = str(trained_run / "final")
    assert main(["fill-mask", final, "The [MASK] is returned."]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 5
    for args, expected in (
        (["--top-k", "100000"], "--top-k must be between 1 and the vocabulary size"),
        (["--top-k", "0"], "--top-k must be between 1"),
        ([], "has no [MASK] token"),
    ):
        text = "No mask here." if not args else "The [MASK] is returned."
        assert main(["fill-mask", final, text, *args]) == 2
        err = capsys.readouterr().err
        assert expected in err and "Traceback" not in err


@pytest.mark.slow
def test_export_turns_a_checkpoint_into_a_model_dir(trained_run, tmp_path):
    """``mlmkit export`` of the step-15 checkpoint: its weights, loadable by transformers and
    sentence-transformers with nothing from mlmkit, with the run's settings in the card."""
    from safetensors.torch import load_file

    ckpt = trained_run / "checkpoints" / "step_0000015"
    out = tmp_path / "step15"
    proc = run_cli("export", ckpt, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = load_file(ckpt / "model.safetensors")
    exported = load_file(out / "model.safetensors")
    for name, tensor in exported.items():
        assert torch.equal(tensor, saved[f"model.{name}"]), name
    assert "15 optimizer steps" in (out / "README.md").read_text()
    code = (
        "import sys; from transformers import AutoModelForMaskedLM; "
        "from sentence_transformers import SentenceTransformer; "
        f"AutoModelForMaskedLM.from_pretrained({str(out)!r}); "
        f"v = SentenceTransformer({str(out)!r}, device='cpu').encode(['a b c']); "
        "assert v.shape[0] == 1 and not any(m.startswith('mlmkit') for m in sys.modules)"
    )
    check = python_run("-c", code, timeout=300)  # a process that never imported mlmkit
    assert check.returncode == 0, check.stderr[-3000:]
    again = run_cli("export", ckpt, out)
    assert again.returncode == 2 and "already exists" in again.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "preset,lr,warmup",
    [
        ("bert-tiny", 3e-3, 20),
        ("bert-mini", 2e-3, 20),
        ("bert-small", 1e-3, 20),
        ("modernbert-tiny", 3e-3, 100),
    ],
)
def test_small_presets_train_with_their_defaults(tmp_path, cache_dir, preset, lr, warmup):
    """The preset alone on the command line: its size, its peak lr and warmup, 40% masking,
    the sinusoidal position start and the unigram output bias (docs/recipes.md); a few steps
    of 8 sequences (the batch is no setting of a preset) train and evaluate."""
    from omegaconf import OmegaConf
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from mlmkit.model.architectures import parts_of

    run = tmp_path / "run"
    proc = run_cli(
        "train",
        f"model={preset}",
        "train.max_steps=4",
        "train.batch_size=8",
        "train.log_every=1",
        "train.eval_every=4",
        "train.save_every=0",
        "data.max_eval_samples=8",
        "train.progress=false",
        "masking.eval_min_masked_tokens=0",
        "logger=none",
        f"paths.cache_dir={cache_dir}",
        f"hydra.run.dir={run}",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    cfg = OmegaConf.load(run / ".hydra" / "config.yaml")
    assert cfg.model.name == preset and cfg.optim.lr == lr and cfg.optim.warmup_steps == warmup
    assert cfg.masking.mlm_probability == 0.4 and cfg.model.position_init == "sinusoidal"
    assert cfg.model.output_bias_init == "unigram" and cfg.model.attention_init == "local"
    train_events = events(run, "train")
    assert [e["step"] for e in train_events] == [1, 2, 3, 4]
    assert all(e["mlm_probability"] == 0.4 and e["loss"] > 0 for e in train_events)
    assert train_events[0]["lr"] == pytest.approx(lr / min(warmup, 4))  # warmup fits in the 4 steps
    # the output bias started at the corpus's frequencies: its top token is the majority baseline's
    model = AutoModelForMaskedLM.from_pretrained(run / "final")
    top = int(parts_of(model).output_bias(model).argmax())
    baseline = events(run, "baseline")[0]["baseline_token"]
    assert AutoTokenizer.from_pretrained(run / "final").convert_ids_to_tokens(top) == baseline
    final = events(run, "eval")[-1]
    assert final["step"] == 4 and 0 < final["eval_loss"] < 20


@pytest.mark.slow
def test_a_run_logged_to_a_file_reads_line_by_line_and_ends_with_its_summary(tmp_path, cache_dir):
    """Where stderr is a file (a log, a SLURM job's output), no progress bar writes carriage
    returns, no line runs past 1,000 characters, and the run ends with its summary."""
    run = tmp_path / "run"
    with open(tmp_path / "log", "w") as log:
        proc = subprocess.run(
            [
                sys.executable,
                str(ROOT / "train.py"),
                *TINY,
                "train.max_steps=6",
                "train.progress=true",
                f"paths.cache_dir={cache_dir}",
                f"hydra.run.dir={run}",
                "logger=none",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **TEST_ENV},
            timeout=300,
        )
    text = (tmp_path / "log").read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "\r" not in text and max(map(len, text.splitlines())) <= 1000
    assert "Setting accelerator to CPU" not in text  # DeepSpeed's note, silenced
    last = text.strip().splitlines()[-2:]
    assert last[0].split("] ", 1)[1].startswith("Done: 6 steps in this run, 6 in all")
    assert f"The model: {run / 'final'}" in last[1]
