"""Trackers: TensorBoard, W&B (offline) and MLflow receive the run's events and config."""

from __future__ import annotations

import re

import pytest
from runs import events, run_train

from mlmkit.config import LoggerConfig
from mlmkit.errors import ConfigError
from mlmkit.training.tracking import flat_hparams, log_with


def test_flat_hparams():
    flat = flat_hparams(
        {
            "model": {"hidden_size": 32, "init_from": None},
            "data": {"train_files": ["a.txt"]},
            "seed": 0,
        }
    )
    assert flat == {
        "model.hidden_size": 32,
        "model.init_from": "None",
        "data.train_files": "['a.txt']",
        "seed": 0,
    }


def test_missing_tracker_package_is_one_sentence(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(ConfigError, match=r"logger=wandb needs the wandb package.*logger=none"):
        log_with(LoggerConfig(name="wandb"))
    with pytest.raises(ConfigError, match="not a tracker"):
        LoggerConfig(name="neptune")


def _tensorboard(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    losses = {e.step: e.value for e in acc.Scalars("train/loss")}
    hparams = list((run / "tensorboard").glob("*/hparams.yml"))
    assert hparams, "the config was not logged as hyperparameters"
    return losses, "model.hidden_size: 32" in hparams[0].read_text()


def _wandb(run):
    # an offline run is one protobuf record log; values are stored as JSON text
    (log,) = run.glob("wandb/offline-run-*/run-*.wandb")
    data = log.read_bytes()
    # the value's field: its tag, then its length in one byte (any byte: DOTALL), then the JSON
    losses = [
        float(data[m.end() : m.end() + m.group(1)[0]])
        for m in re.finditer(rb"train/loss\x82\x01(.)", data, re.DOTALL)
    ]
    steps = [e["step"] for e in events(run, "train")]
    # each history row appears twice (history and summary records)
    return dict(zip(steps, losses[::2])), b"model.hidden_size\x82\x01\x0232" in data


def _mlflow(run):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(run / "mlruns").resolve().as_uri())
    (exp,) = [e for e in client.search_experiments() if e.name == "mlmkit"]
    (found,) = client.search_runs([exp.experiment_id])
    losses = {m.step: m.value for m in client.get_metric_history(found.info.run_id, "train/loss")}
    return losses, found.data.params.get("model.hidden_size") == "32"


@pytest.mark.slow
@pytest.mark.parametrize("tracker", ["tensorboard", "wandb", "mlflow"])
def test_tracker_receives_events_and_config(tracker, tmp_path, cache_dir, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the run's own file store
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    run_train(
        run,
        cache_dir,
        "train.max_steps=10",
        "train.eval_every=5",
        "train.save_every=10",
        f"logger={tracker}",
        "logger.offline=true",
    )
    losses, has_config = {"tensorboard": _tensorboard, "wandb": _wandb, "mlflow": _mlflow}[tracker](
        run
    )
    expected = {e["step"]: e["loss"] for e in events(run, "train")}
    assert sorted(losses) == sorted(expected) == [5, 10]
    for step, loss in expected.items():
        assert losses[step] == pytest.approx(loss, rel=1e-5)
    assert has_config, "the full config was not logged"
