"""Fine-tuning's defaults: epochs from the data's size and a learning rate from the encoder's
width where they are null, the best epoch kept, and patience ending a training that stopped
improving (``mlmkit.finetune.loop``)."""

from __future__ import annotations

import json

import pytest
import torch
from runs import run_finetune, write_probe_task

from mlmkit.config import FinetuneConfig
from mlmkit.errors import ConfigError
from mlmkit.finetune import loop


@pytest.mark.parametrize(
    "steps_per_epoch,epochs", [(50, 20.0), (10, 20.0), (200, 5.0), (334, 3.0), (2105, 3.0)]
)
def test_null_epochs_give_at_least_the_auto_steps_within_the_epoch_bounds(steps_per_epoch, epochs):
    chosen, _, said = loop.resolve_schedule(FinetuneConfig(checkpoint="x"), 128, steps_per_epoch)
    assert chosen == epochs and "epochs=N" in said[0]
    low, high = loop.AUTO_EPOCHS
    assert low <= chosen <= high
    assert chosen * steps_per_epoch >= loop.AUTO_STEPS or chosen == high


@pytest.mark.parametrize(
    "width,lr", [(128, 1e-3), (256, 3e-4), (384, 1e-4), (512, 1e-4), (768, 3e-5), (1024, 3e-5)]
)
def test_null_lr_follows_the_encoders_width(width, lr):
    _, chosen, said = loop.resolve_schedule(FinetuneConfig(checkpoint="x"), width, 100)
    assert chosen == lr and f"{width} wide" in said[1]
    frozen = FinetuneConfig(checkpoint="x", freeze_encoder=True)
    assert loop.resolve_schedule(frozen, width, 100)[1] == loop.PROBE_LR


def test_set_epochs_and_lr_are_kept_and_bad_ones_refused():
    cfg = FinetuneConfig(checkpoint="x", epochs=2.5, lr=2e-5)
    assert loop.resolve_schedule(cfg, 128, 7) == (2.5, 2e-5, [])
    for bad in ({"epochs": 0}, {"lr": -1.0}, {"patience": 0}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            FinetuneConfig(checkpoint="x", **bad)


def script_the_accuracy(monkeypatch, figures: list[float]) -> list[tuple[dict, list]]:
    """The loop's evaluations run as they do, their accuracy replaced by ``figures`` in turn;
    returns the list that each evaluation's weights and predictions are added to."""
    scripted, seen, real = iter(figures), [], loop.evaluate

    def evaluate(run):
        figures, predictions = real(run)
        figures["accuracy"] = next(scripted)
        model = loop.unwrap(run.accelerator, run.model)
        seen.append(({k: v.clone() for k, v in model.state_dict().items()}, predictions))
        return figures, predictions

    monkeypatch.setattr(loop, "evaluate", evaluate)
    return seen


def finetune_probe(trained_run, tmp_path, n_train: int, n_dev: int, *settings: str):
    """``mlmkit finetune`` of the fixture run on a small probe task, into ``tmp_path / "ft"``."""
    return run_finetune(
        f"checkpoint={trained_run}",
        f"task.data_dir={write_probe_task(tmp_path / 'task', n_train=n_train, n_dev=n_dev)}",
        "batch_size=8",
        "max_seq_length=32",
        "precision=no",
        f"hydra.run.dir={tmp_path / 'ft'}",
        *settings,
    )


@pytest.mark.slow
def test_the_best_epoch_is_kept_and_patience_ends_the_training(trained_run, tmp_path, monkeypatch):
    """The dev figures are scripted (the real evaluation runs, its accuracy replaced): the second
    epoch is the best, two epochs without a better one end a training planned for ten, and the
    saved model, results.json and eval_predictions.jsonl are the second epoch's."""
    seen = script_the_accuracy(monkeypatch, [0.5, 0.9, 0.6, 0.9, 0.95])  # equal is no better
    out = tmp_path / "ft"
    proc = finetune_probe(trained_run, tmp_path, 32, 16, "epochs=10", "patience=2")
    result = json.loads((out / "results.json").read_text())
    assert (result["epoch"], result["epochs"], result["eval_accuracy"]) == (2, 4, 0.9)
    assert result["steps"] == 16 and len(seen) == 4
    assert "Stopping after epoch 4" in proc.stdout and "Kept epoch 2 of 4" in proc.stdout
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e["eval_accuracy"] for e in events if e.get("event") == "eval"] == [0.5, 0.9, 0.6, 0.9]
    from safetensors.torch import load_file

    saved = load_file(out / "model" / "model.safetensors")
    best, last = seen[1][0], seen[3][0]
    shared = [k for k in saved if k in best]
    assert shared and all(torch.equal(saved[k], best[k]) for k in shared)
    assert any(not torch.equal(saved[k], last[k]) for k in shared)
    written = [
        json.loads(line) for line in (out / "eval_predictions.jsonl").read_text().splitlines()
    ]
    assert len(written) == len(seen[1][1]) == 16


@pytest.mark.slow
def test_keep_best_false_keeps_the_last_epoch(trained_run, tmp_path, monkeypatch):
    script_the_accuracy(monkeypatch, [0.8, 0.4, 0.3])
    out = tmp_path / "ft"
    finetune_probe(
        trained_run, tmp_path, 16, 8, "epochs=3", "keep_best=false", "patience=null",
        "save_model=false",
    )  # fmt: skip
    result = json.loads((out / "results.json").read_text())
    assert (result["epoch"], result["epochs"], result["eval_accuracy"]) == (3, 3, 0.3)
