"""Experiment trackers (TensorBoard, Weights & Biases, MLflow) through accelerate's.

``metrics.jsonl`` is always written; a tracker receives the same train and eval events
(as ``train/loss``, ``eval/eval_accuracy``, ...) and the full config as hyperparameters.
Everything works without a network: TensorBoard and MLflow write files in the run dir,
and W&B does too with ``logger.offline=true``.
"""

from __future__ import annotations

import importlib.util
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mlmkit.config import LoggerConfig
from mlmkit.errors import ConfigError

# tracker -> (module that must be importable, what to install)
_REQUIRES = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow-skinny"),
}


def log_with(cfg: LoggerConfig) -> str | None:
    """Return the accelerate tracker name for ``cfg`` (None for ``logger=none``), checked to be
    installed."""
    if cfg.name == "none":
        return None
    module, package = _REQUIRES[cfg.name]
    if importlib.util.find_spec(module) is None:
        raise ConfigError(
            f"logger={cfg.name} needs the {package} package (pip install {package}); "
            "install it or set logger=none."
        )
    return cfg.name


def flat_hparams(config: dict[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """``{"model": {"hidden_size": 128}}`` -> ``{"model.hidden_size": 128}``.

    Values a tracker cannot store as a hyperparameter (None, lists) become strings.
    """
    flat: dict[str, bool | int | float | str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flat_hparams(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = str(value)
    return flat


def tracker_setup(cfg: LoggerConfig, run_dir: Path) -> tuple[str | None, dict[str, Any]]:
    """``(log_with, project_config kwargs)`` for the Accelerator of a run in ``run_dir``."""
    return log_with(cfg), {"project_dir": str(run_dir), "logging_dir": str(run_dir / "tensorboard")}


def start_trackers(accelerator, cfg: LoggerConfig, run_dir: Path, config: dict[str, Any]) -> None:
    """Start the tracker of ``cfg`` (main process only) and log the full config."""
    if cfg.name == "none":
        return
    run_name = cfg.run_name or _default_run_name(run_dir)
    init_kwargs: dict[str, Any] = {}
    if cfg.name == "wandb":
        init_kwargs["wandb"] = {
            "name": run_name,
            "dir": str(run_dir),
            "mode": "offline" if cfg.offline else "online",
        }
    elif cfg.name == "mlflow":
        if accelerator.is_main_process and "MLFLOW_TRACKING_URI" not in os.environ:
            import mlflow

            # a local file store needs no server or database; MLflow 3 asks for an opt-in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            mlflow.set_tracking_uri((run_dir / "mlruns").resolve().as_uri())
        init_kwargs["mlflow"] = {"run_name": run_name}
    elif cfg.name == "tensorboard":
        init_kwargs["tensorboard"] = {"flush_secs": 30}
    project = cfg.project if cfg.name != "tensorboard" else "."
    accelerator.init_trackers(project, config=flat_hparams(config), init_kwargs=init_kwargs)


def log_event(accelerator, event: dict[str, Any]) -> None:
    """Send a metrics.jsonl event's numbers to the trackers, e.g. ``train/loss``."""
    if not accelerator.trackers:
        return
    kind = event["event"]
    values = {
        f"{kind}/{k}": v
        for k, v in event.items()
        if k not in ("event", "step") and isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    if values:
        accelerator.log(values, step=int(event.get("step", 0)))


@contextmanager
def finish_trackers_on_error(accelerator):
    """Flush and close the trackers when the run stops early (signal, divergence, error)."""
    try:
        yield
    except BaseException:
        for tracker in accelerator.trackers:
            try:
                tracker.finish()
            except Exception:  # the original error matters more
                pass
        raise


def _default_run_name(run_dir: Path) -> str:
    parts = run_dir.resolve().parts
    return "/".join(parts[-2:]) if len(parts) >= 2 else str(run_dir)
