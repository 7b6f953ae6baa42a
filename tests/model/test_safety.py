"""Loading models and tokenizers: no custom code, weights from safetensors only, and a
pickle that would run code is refused without torch's advice to load it unsafely."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from mlmkit.errors import CheckpointError, ConfigError, MLMKitError, TokenizerError

TINY = dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer) -> Path:
    """A plain exported BertForMaskedLM dir (config.json, model.safetensors, tokenizer)."""
    from transformers import BertConfig, BertForMaskedLM

    path = tmp_path_factory.mktemp("model") / "final"
    config = BertConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **TINY)
    BertForMaskedLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _with_auto_map(folder: Path, file: str, marker: Path) -> None:
    """Name custom code in ``file`` (as a Hub repo with its own classes does); the code
    would create ``marker`` if it ever ran."""
    data = json.loads((folder / file).read_text())
    data["auto_map"] = {
        "AutoConfig": "custom.Config",
        "AutoModelForMaskedLM": "custom.Model",
        "AutoTokenizer": ["custom.Tokenizer", None],
    }
    (folder / file).write_text(json.dumps(data))
    (folder / "custom.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")


def _one_sentence(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text and text.endswith("."), text
    return text


def test_every_loader_passes_trust_remote_code_false(model_dir, monkeypatch):
    import transformers
    from transformers import AutoConfig, AutoTokenizer, BertForMaskedLM

    from mlmkit.cli.fill_mask import fill_mask
    from mlmkit.training.trained_model import load_model_and_tokenizer

    calls: list[tuple[str, dict]] = []

    def spy(name, real):
        def wrapper(*args, **kwargs):
            calls.append((name, kwargs))
            return real(*args, **kwargs)

        return wrapper

    for owner, name in (
        (AutoConfig, "from_pretrained"),
        (AutoTokenizer, "from_pretrained"),
        (BertForMaskedLM, "from_pretrained"),
        (transformers, "pipeline"),
    ):
        monkeypatch.setattr(
            owner, name, spy(f"{getattr(owner, '__name__', owner)}.{name}", getattr(owner, name))
        )
    out = fill_mask(str(model_dir), "the [MASK] is here.", top_k=3)
    assert len(out) == 3
    load_model_and_tokenizer(model_dir)
    names = {name for name, _ in calls}
    assert {
        "AutoConfig.from_pretrained",
        "AutoTokenizer.from_pretrained",
        "BertForMaskedLM.from_pretrained",
        "transformers.pipeline",
    } <= names, names
    assert all(kwargs.get("trust_remote_code") is False for _, kwargs in calls), calls


@pytest.mark.parametrize("file", ["config.json", "tokenizer_config.json"])
def test_a_dir_naming_custom_code_is_refused_before_transformers_reads_it(
    model_dir, tmp_path, file
):
    from mlmkit.cli.fill_mask import fill_mask
    from mlmkit.data.tokenizer import load_tokenizer
    from mlmkit.model.bert import load_pretrained
    from mlmkit.training.trained_model import load_model_and_tokenizer

    folder = _copy(model_dir, tmp_path / "custom")
    marker = tmp_path / "code-ran"
    _with_auto_map(folder, file, marker)
    attempts = [
        (lambda: load_tokenizer(str(folder)), TokenizerError, "tokenizer.name_or_path"),
        (lambda: fill_mask(str(folder), "a [MASK] b"), MLMKitError, "model_dir"),
        (lambda: load_model_and_tokenizer(folder), MLMKitError, "checkpoint"),
    ]
    if file == "config.json":
        attempts.append((lambda: load_pretrained(str(folder)), ConfigError, "model.init_from"))
    for attempt, error, setting in attempts:
        with pytest.raises(error) as info:
            attempt()
        message = _one_sentence(info.value)
        assert "auto_map" in message and file in message and setting in message, message
    assert not marker.exists()


def test_pickled_weights_are_never_loaded(model_dir, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from mlmkit.cli.fill_mask import fill_mask
    from mlmkit.model.bert import load_pretrained
    from mlmkit.training.trained_model import load_model_and_tokenizer

    folder = _copy(model_dir, tmp_path / "pickled")
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()

    def no_unpickling(*args, **kwargs):
        raise AssertionError("torch.load was called on a pickle")

    monkeypatch.setattr(torch, "load", no_unpickling)
    for attempt, setting in (
        (lambda: load_pretrained(str(folder)), "model.init_from"),
        (lambda: load_model_and_tokenizer(folder), "checkpoint"),
        (lambda: fill_mask(str(folder), "a [MASK] b"), "model_dir"),
    ):
        with pytest.raises(ConfigError) as info:
            attempt()
        message = _one_sentence(info.value)
        assert setting in message and "pytorch_model.bin" in message, message
        assert "convert it to model.safetensors" in message


def test_a_refused_pickle_is_not_met_with_advice_to_load_it_unsafely(tmp_path):
    from accelerate import Accelerator

    from mlmkit.training.checkpoint_files import load_checkpoint

    marker = tmp_path / "code-ran"

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    ckpt = tmp_path / "step_0000002"
    ckpt.mkdir()
    (ckpt / "loop_state.json").write_text(json.dumps({"step": 2, "tokens_seen": 8, "stream": {}}))
    (ckpt / "random_states_0.pkl").write_bytes(pickle.dumps(Exploit()))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(Accelerator(cpu=True), ckpt)
    message = _one_sentence(info.value)
    assert "could run code" in message and "refused" in message
    assert "weights_only" not in message and "False" not in message
    assert not marker.exists()


def test_damaged_config_and_an_offline_hub_id_are_one_sentence(model_dir, tmp_path):
    from mlmkit.model.bert import load_pretrained

    folder = _copy(model_dir, tmp_path / "garbled")
    (folder / "config.json").write_text("{not json")
    with pytest.raises(ConfigError) as info:
        load_pretrained(str(folder), setting="checkpoint")
    assert "config.json" in _one_sentence(info.value) and "checkpoint" in str(info.value)
    # HF_HUB_OFFLINE=1 in the tests: a Hub id that is not cached cannot be fetched
    with pytest.raises(ConfigError) as info:
        load_pretrained("some-org/some-bert-that-is-not-cached")
    message = _one_sentence(info.value)
    assert "Hugging Face Hub" in message and "model.init_from" in message
