"""Saving a model (each run's export, a fine-tuned model, the embedder stage's base) without
importing DeepSpeed where the run has none: accelerate's unwrapping would import it (1.4 s of
every such command's time, most of it MLflow) only to ask whether the model is DeepSpeed's."""

from __future__ import annotations

import sys
import types

import torch
from accelerate.utils import other
from transformers import BertConfig, BertForMaskedLM

from mlmkit.training.runtime import save_model


def _tiny():
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=16,
    )  # fmt: skip
    return BertForMaskedLM(config)


def test_a_model_is_saved_without_asking_for_deepspeed_where_none_is_loaded(tmp_path, monkeypatch):
    asked = []

    def available():
        asked.append(True)
        return True

    monkeypatch.setattr(other, "is_deepspeed_available", available)
    monkeypatch.delitem(sys.modules, "deepspeed", raising=False)
    model = _tiny()
    save_model(model, tmp_path / "model", safe_serialization=True)
    assert asked == [] and "deepspeed" not in sys.modules
    assert other.is_deepspeed_available is available  # put back
    loaded = BertForMaskedLM.from_pretrained(tmp_path / "model")
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_run_with_deepspeed_loaded_is_unwrapped_as_accelerate_does(tmp_path, monkeypatch):
    """Where DeepSpeed is imported (a DeepSpeed run), accelerate asks for it as always: the
    model may be a ``DeepSpeedEngine``."""
    asked = []

    def available():
        asked.append(True)
        return True

    engine = type("DeepSpeedEngine", (torch.nn.Module,), {})
    monkeypatch.setitem(sys.modules, "deepspeed", types.SimpleNamespace(DeepSpeedEngine=engine))
    monkeypatch.setattr(other, "is_deepspeed_available", available)
    save_model(_tiny(), tmp_path / "model")
    assert asked and (tmp_path / "model" / "config.json").is_file()
