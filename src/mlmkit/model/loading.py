"""Load a trained model from whatever a user points at: an exported dir, a run, a checkpoint.

A run dir holds ``model/`` (the Hugging Face config and the tokenizer, written when the run
starts), so each ``checkpoints/step_*`` folder, which holds only weights and training
state, can be turned back into a plain ``BertForMaskedLM`` (or ``ModernBertForMaskedLM``).
"""

from __future__ import annotations

from pathlib import Path

from mlmkit.data.tokenizer import load_tokenizer
from mlmkit.errors import CheckpointError, ConfigError
from mlmkit.model.architectures import architecture, fit_tokenizer, transformers_class
from mlmkit.model.bert import load_pretrained
from mlmkit.model.safety import refuse_custom_code
from mlmkit.training.checkpoint import is_checkpoint, list_checkpoints

RUN_MODEL_DIR = "model"  # <run dir>/model: config.json and the tokenizer


def save_run_model_spec(run_dir: Path, model, tokenizer) -> None:
    """Write the model's config and the tokenizer to ``<run dir>/model`` (main process)."""
    target = Path(run_dir) / RUN_MODEL_DIR
    target.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))


def resolve_model_path(path: str | Path, setting: str = "checkpoint") -> Path:
    """An exported model dir or a ``checkpoints/step_*`` folder for ``path``.

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


def load_model_and_tokenizer(path: str | Path, setting: str = "checkpoint",
                             attn_implementation: str = "sdpa"):
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
    refuse_custom_code(spec, setting)
    model = _from_checkpoint(resolved, spec, attn_implementation, setting)
    tokenizer = load_tokenizer(str(spec), setting)
    fit_tokenizer(tokenizer, model)
    return model, tokenizer, resolved


def _from_checkpoint(ckpt: Path, spec: Path, attn_implementation: str, setting: str = "checkpoint"):
    from safetensors.torch import load_file
    from transformers import AutoConfig

    weights = ckpt / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(
            f"The checkpoint {str(ckpt)!r} has no model.safetensors (a sharded FSDP/DeepSpeed "
            "checkpoint); evaluate the run's final/ dir instead."
        )
    try:
        config = AutoConfig.from_pretrained(str(spec), trust_remote_code=False)
        tensors = load_file(str(weights))
    except Exception as exc:  # a cut or garbled file fails in json or in the safetensors header
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0].rstrip(".")
        raise CheckpointError(
            f"{setting}: could not read the checkpoint {str(ckpt)!r} ({detail}); it is damaged, so "
            f"point {setting} at another checkpoint or at the run's final/ dir."
        ) from None
    arch = architecture(config.model_type)  # bert or modernbert, else one sentence
    config._attn_implementation = attn_implementation
    model = transformers_class(arch.masked_lm)(config)
    # the training objective wraps the model as .model; tied weights are stored once
    state = {k.removeprefix("model."): v for k, v in tensors.items()}
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # tensors of other shapes than the run's config says
        raise CheckpointError(
            f"The checkpoint {str(ckpt)!r} does not match the run's model config ("
            f"{(str(exc).strip().splitlines() or ['size mismatch'])[-1].strip()[:160]}); "
            f"point {setting} at the run's final/ dir."
        ) from None
    missing = [k for k in missing if k not in arch.tied_keys]  # = the embeddings (and bias)
    if missing or unexpected:
        raise CheckpointError(
            f"The checkpoint {str(ckpt)!r} does not match the run's model config "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})."
        )
    model.tie_weights()
    return model
