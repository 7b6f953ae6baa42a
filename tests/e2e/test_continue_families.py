"""Continued pretraining of every encoder family from a released-model folder (tests/families.py):
a run that trains, resumes exactly and exports the family's own class, which transformers'
fill-mask pipeline loads without mlmkit; two processes and FSDP as one; and each refusal in one
sentence, exit 2, nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import SHARED_DATA
from families import FAMILY_TOKENIZERS, released_model
from runs import TEST_ENV, events, launch_engine, python_run, run_cli

TEXT = SHARED_DATA / "corpora" / "tinyshakespeare" / "input.txt"
RUN = [
    "data=files",
    "data.max_seq_length=32",
    "data.max_eval_samples=16",
    "train.batch_size=4",
    "train.max_steps=4",
    "train.save_every=2",
    "train.eval_every=4",
    "train.log_every=1",
    "train.progress=false",
    "train.precision=no",
    "logger=none",
]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    """The first 40,000 characters of Tiny Shakespeare (tokenizing the whole with XLM-R's
    250,000-piece tokenizer would take most of the tests' time)."""
    if not TEXT.is_file():
        pytest.skip(f"reference data {TEXT} is absent (../shared/data is laid beside the project)")
    part = tmp_path_factory.mktemp("text") / "shakespeare.txt"
    part.write_text(TEXT.read_text()[:40_000])
    return part


@pytest.fixture(scope="module")
def continued(tmp_path_factory, text):
    """``model_type -> (released folder, run dir)``: each family continued for 4 steps."""
    root = tmp_path_factory.mktemp("continued")
    runs = {}
    for model_type in FAMILY_TOKENIZERS:
        folder = released_model(root / "released" / model_type, model_type)
        run = root / "runs" / model_type
        proc = run_cli(
            "train", f"model.init_from={folder}", *RUN, f"data.train_files=[{text}]",
            f"hydra.run.dir={run}", f"paths.cache_dir={root / 'cache'}",
        )  # fmt: skip
        assert proc.returncode == 0, (model_type, proc.stderr[-3000:])
        runs[model_type] = (folder, run)
    return runs


@pytest.mark.slow
def test_every_family_continues_and_exports_its_own_class(continued):
    for model_type, (folder, run) in continued.items():
        config = json.loads((run / "final" / "config.json").read_text())
        released = json.loads((folder / "config.json").read_text())
        assert config["model_type"] == model_type
        assert config["architectures"] == released["architectures"]
        train = events(run, "train")
        assert [e["step"] for e in train] == [1, 2, 3, 4]
        assert all(e["loss"] > 0 for e in train)
        assert "Continued pretraining from" in (run / "train.log").read_text()


@pytest.mark.slow
def test_the_exports_fill_masks_with_their_own_mask_token_without_mlmkit(continued, tmp_path):
    """One process that never imports mlmkit loads every family's final/ in a fill-mask
    pipeline with the tokenizer's own mask token (<mask> for RoBERTa, [MASK] for BERT)."""
    script = tmp_path / "fill.py"
    dirs = {t: str(run / "final") for t, (_, run) in continued.items()}
    script.write_text(
        "import json, sys\n"
        "from transformers import AutoModelForMaskedLM, pipeline\n"
        f"dirs = {dirs!r}\n"
        "out = {}\n"
        "for t, d in dirs.items():\n"
        "    fill = pipeline('fill-mask', model=d)\n"
        "    mask = fill.tokenizer.mask_token\n"
        "    top = fill(f'the king {mask} the crown')\n"
        "    out[t] = [mask, type(fill.model).__name__, len(top)]\n"
        "assert not any(m.startswith('mlmkit') for m in sys.modules)\n"
        "print(json.dumps(out))\n"
    )
    proc = python_run(str(script), env={**TEST_ENV, "PATH": "/usr/bin:/bin"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["roberta"][0] == out["xlm-roberta"][0] == "<mask>"
    assert out["bert"][0] == "[MASK]"
    for model_type, (_, cls, n) in out.items():
        assert cls.endswith("ForMaskedLM") and n == 5, (model_type, cls, n)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["roberta", "deberta-v2", "distilbert", "albert", "electra"])
def test_a_continued_run_resumes_exactly(continued, text, tmp_path, model_type):
    folder, run = continued[model_type]
    resumed = tmp_path / "resumed"
    shutil.copytree(run, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_0000004")
    shutil.rmtree(resumed / "final")
    proc = run_cli(
        "train", f"model.init_from={folder}", *RUN, f"data.train_files=[{text}]",
        f"hydra.run.dir={resumed}", "train.resume=auto", f"paths.cache_dir={tmp_path / 'cache'}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = events(run, "train"), events(resumed, "train")
    assert [e["step"] for e in b] == [1, 2, 3, 4]
    for x, y in zip(a[2:], b[2:]):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-6), (x["step"], x["loss"], y["loss"])
    assert events(run, "eval")[-1]["eval_loss"] == pytest.approx(
        events(resumed, "eval")[-1]["eval_loss"], rel=1e-6
    )


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["roberta", "deberta-v2"])
def test_fsdp_on_two_processes_follows_one_process(
    continued, text, tmp_path, model_type, zygote_python
):
    """The continued run again under FSDP2 on two processes of half the batch (one unit per the
    family's encoder layer: RobertaLayer, DebertaV2Layer): the same losses as one process, and
    final/ is the whole model of the family's class. Two processes of DDP are FSDP's
    arithmetic without the sharding, shown for BERT in tests/e2e/test_distributed.py."""
    folder, one = continued[model_type]
    fsdp = tmp_path / "fsdp"
    settings = (f"model.init_from={folder}", *RUN, f"data.train_files=[{text}]")
    launch_engine(
        "fsdp", fsdp, tmp_path / "cache", "train.batch_size=2", model=settings,
        python=zygote_python,
    )  # fmt: skip
    assert "2 process(es)" in (fsdp / "train.log").read_text()
    a, b = events(one, "train"), events(fsdp, "train")
    assert [e["step"] for e in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        assert x["global_batch_size"] == y["global_batch_size"] == 4
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-4), (x["step"], x["loss"], y["loss"])
    assert events(one, "eval")[-1]["eval_loss"] == pytest.approx(
        events(fsdp, "eval")[-1]["eval_loss"], rel=1e-4
    )
    from safetensors.torch import load_file

    whole, sharded = (load_file(r / "final" / "model.safetensors") for r in (one, fsdp))
    assert whole.keys() == sharded.keys()
    assert all(sharded[k].shape == v.shape for k, v in whole.items())
    config = json.loads((fsdp / "final" / "config.json").read_text())
    assert config["model_type"] == model_type


def refused(tmp_path, text, *args) -> str:
    """Run ``mlmkit train *args``: it must exit 2 with one sentence and write no run dir."""
    run = tmp_path / "run"
    proc = run_cli(
        "train", *RUN, *args, f"data.train_files=[{text}]", f"hydra.run.dir={run}",
        f"paths.cache_dir={tmp_path}/c",
    )  # fmt: skip
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert not run.exists() or not any(run.iterdir()), list(run.iterdir())
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return errors[0]


def saved_config(folder: Path, **config) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_decoder_is_refused_as_a_decoder(tmp_path, text):
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=100)).save_pretrained(
        folder
    )
    line = refused(tmp_path, text, f"model.init_from={folder}")
    assert "mlmkit trains encoders" in line and "'gpt2'" in line and "decoder" in line


def test_a_model_shipped_as_code_is_refused_before_its_tokenizer(tmp_path, text):
    folder = saved_config(
        tmp_path / "neobert",
        model_type="neobert",
        hidden_size=32,
        auto_map={"AutoModelForMaskedLM": "model.NeoBERTLMHead"},
    )
    line = refused(tmp_path, text, f"model.init_from={folder}")
    assert "auto_map" in line and "never runs" in line and "tokenizer" not in line


def test_an_unknown_encoder_family_is_refused(tmp_path, text):
    folder = saved_config(tmp_path / "mpnet", model_type="mpnet", hidden_size=32)
    line = refused(tmp_path, text, f"model.init_from={folder}")
    assert "'mpnet'" in line and "does not continue" in line and "roberta" in line


def test_a_hub_name_that_cannot_be_fetched_is_one_sentence(tmp_path, text, monkeypatch):
    """A Hub name stays real code (transformers' AutoConfig): offline, or with the Hub out of
    reach, it is one sentence that says the Hub could not provide it and what to point at."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = refused(tmp_path, text, "model.init_from=FacebookAI/roberta-base")
    assert "'FacebookAI/roberta-base'" in line and "Hugging Face Hub could not provide" in line
    assert "point model.init_from at a local dir" in line


def test_a_tokenizer_without_a_mask_token_is_refused(tmp_path, text):
    from transformers import AutoTokenizer

    folder = released_model(tmp_path / "roberta", "distilbert")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.mask_token = None
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("mask_token", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] != "[MASK]"]
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    line = refused(tmp_path, text, f"model.init_from={folder}")
    assert "MASK" in line and "tokenizer" in line


def test_a_sequence_longer_than_robertas_positions_is_refused(tmp_path, text):
    folder = released_model(tmp_path / "roberta", "roberta")  # 130 rows: 128 tokens
    line = refused(tmp_path, text, f"model.init_from={folder}", "data.max_seq_length=129")
    assert "data.max_seq_length (129" in line and "128 positions" in line


def test_deberta_refuses_document_isolation_in_one_sentence(tmp_path, text):
    folder = released_model(tmp_path / "deberta", "deberta-v2")
    line = refused(tmp_path, text, f"model.init_from={folder}", "data.packing=documents")
    assert "data.packing=documents" in line and "deberta-v2" in line


def test_objective_rtd_refuses_a_family_whose_embeddings_it_cannot_share(tmp_path, text):
    folder = released_model(tmp_path / "roberta", "roberta")
    line = refused(tmp_path, text, f"model.init_from={folder}", "objective=rtd")
    assert "objective=rtd" in line and "roberta" in line and "objective=mlm" in line


@pytest.mark.slow
def test_an_electra_discriminator_continues_with_rtd_and_keeps_its_head(tmp_path, text):
    import torch
    from families import family_config, family_tokenizer
    from transformers import ElectraForPreTraining

    tokenizer = family_tokenizer("electra")
    torch.manual_seed(0)
    model = ElectraForPreTraining(family_config("electra", tokenizer))
    folder = tmp_path / "discriminator"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    run = tmp_path / "run"
    proc = run_cli(
        "train", f"model.init_from={folder}", "objective=rtd", "objective.generator_size=0.5",
        *RUN, f"data.train_files=[{text}]", "train.max_steps=2", f"hydra.run.dir={run}",
        f"paths.cache_dir={tmp_path}/c",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    from safetensors.torch import load_file

    assert "the discriminator head is its own" in (run / "train.log").read_text()
    trained = load_file(run / "checkpoints" / "step_0000002" / "model.safetensors")
    released = model.discriminator_predictions.dense.weight
    # two steps at the continued rate move each weight by well under 0.01; a new head's init
    # (std 0.02) would differ from the released one everywhere by about that much
    moved = (trained["discriminator_head.dense.weight"] - released).abs().max()
    assert float(moved.detach()) < 0.005, float(moved.detach())
    assert (run / "final" / "generator" / "config.json").is_file()


def test_vocabulary_extension_of_a_byte_level_bpe_is_refused(tmp_path, text):
    folder = released_model(tmp_path / "roberta", "roberta")
    line = refused(tmp_path, text, f"model.init_from={folder}", "tokenizer.extend_vocab=50")
    assert "tokenizer.extend_vocab" in line and "WordPiece" in line and "BPE" in line
