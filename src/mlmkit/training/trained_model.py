"""Load a trained model from whatever a user points at: an exported dir, a run, a checkpoint.

A run dir holds ``model/`` (the Hugging Face config and the tokenizer, written when the run
starts), so each ``checkpoints/step_*`` folder, which holds only weights and training
state, can be turned back into a plain ``BertForMaskedLM`` (or ``ModernBertForMaskedLM``,
``model.bert.model_from_checkpoint``) with the run's tokenizer.
"""

from __future__ import annotations

from pathlib import Path

from mlmkit.data.tokenizer import load_tokenizer
from mlmkit.errors import CheckpointError, ConfigError
from mlmkit.model.architectures import fit_tokenizer
from mlmkit.model.bert import load_pretrained, model_from_checkpoint
from mlmkit.training.checkpoint_files import is_checkpoint, list_checkpoints
from mlmkit.training.resume_checks import saved_loop_state

RUN_MODEL_DIR = "model"  # <run dir>/model: config.json and the tokenizer


def save_run_model_spec(run_dir: Path, model, tokenizer) -> None:
    """Write the model's config and the tokenizer to ``<run dir>/model`` (main process)."""
    target = Path(run_dir) / RUN_MODEL_DIR
    target.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))


def resolve_model_path(path: str | Path, setting: str = "checkpoint") -> Path:
    """Resolve ``path`` to an exported model dir or a ``checkpoints/step_*`` folder.

    A run dir stands for its ``final/`` export, or for its latest checkpoint when the run
    has not finished.
    """
    p = Path(path).expanduser()
    if (p / "config.json").is_file() or is_checkpoint(p):
        return p
    if (p / "final" / "config.json").is_file():
        return p / "final"
    found = list_checkpoints(p / "checkpoints")
    if found:
        return found[-1]
    raise ConfigError(
        f"{setting}={str(path)!r} is not a model dir (config.json), a run dir (final/ or "
        "checkpoints/) or a checkpoints/step_* folder; point it at one of those."
    )


def load_model_and_tokenizer(
    path: str | Path, setting: str = "checkpoint", attn_implementation: str = "sdpa"
):
    """``(masked-LM model, tokenizer, resolved path)`` for a model dir, run dir or checkpoint;
    the tokenizer gives only the inputs the model takes (``fit_tokenizer``)."""
    resolved = resolve_model_path(path, setting)
    if not is_checkpoint(resolved):
        model = load_pretrained(str(resolved), attn_implementation, setting)
        tokenizer = load_tokenizer(str(resolved), setting)
        fit_tokenizer(tokenizer, model)
        return model, tokenizer, resolved
    spec = resolved.parent.parent / RUN_MODEL_DIR
    if not (spec / "config.json").is_file():
        raise CheckpointError(
            f"{setting}={str(path)!r} is a checkpoint, but its run dir has no {RUN_MODEL_DIR}/ "
            "(config and tokenizer); evaluate the run's final/ dir instead."
        )
    model = model_from_checkpoint(resolved, spec, attn_implementation, setting)
    tokenizer = load_tokenizer(str(spec), setting)
    fit_tokenizer(tokenizer, model)
    return model, tokenizer, resolved


def run_settings(resolved: Path) -> tuple[Path, dict] | None:
    """``(run dir, its settings)`` of the run a resolved model path (``resolve_model_path``)
    came from: a run's ``final/`` or a checkpoint of it. The settings are the run's
    ``.hydra/config.yaml`` (the command line's run, recipes applied), else those its newest
    readable checkpoint saved (a Python API run); None for a model dir of no run."""
    import yaml

    run = resolved.parent.parent if is_checkpoint(resolved) else resolved.parent
    if (
        not (resolved.name == "final" or is_checkpoint(resolved))
        or not (run / RUN_MODEL_DIR).is_dir()
    ):
        return None
    saved = run / ".hydra" / "config.yaml"
    if saved.is_file():
        try:
            settings = yaml.safe_load(saved.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(
                f"The run's settings {str(saved)!r} cannot be read ({exc}); set data= "
                "(or files=) to say what to evaluate."
            ) from None
        if isinstance(settings, dict):
            return run, settings
    found = list_checkpoints(run / "checkpoints")
    settings = saved_loop_state(found[-1]).get("settings") if found else None
    return (run, settings) if isinstance(settings, dict) else None
