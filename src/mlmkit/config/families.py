"""Which released models mlmkit continues, read from a model dir's config.json before anything is
loaded: the model types of the encoder families (``mlmkit.model.architectures`` holds their
parts), and one sentence for each model it refuses (a decoder, a model shipped as code, a family
it does not know)."""

from __future__ import annotations

import json
from pathlib import Path

from mlmkit.errors import ConfigError

# every model_type mlmkit continues (mlmkit.model.architectures.MODEL_TYPES: the same keys)
CONTINUED_MODEL_TYPES = (
    "bert",
    "modernbert",
    "roberta",
    "xlm-roberta",
    "camembert",
    "deberta-v2",
    "distilbert",
    "albert",
    "electra",
)
# a config's width, under the names its families use for it
WIDTH_KEYS = ("hidden_size", "dim", "n_embd", "d_model")


def read_model_config(name_or_path: str, setting: str = "model.init_from") -> dict:
    """Return the config of the model at ``name_or_path`` as a dict: a local dir's config.json
    read as JSON (nothing of the dir is imported), or the Hub's through ``AutoConfig``; one
    sentence where neither can be read."""
    local = Path(name_or_path).expanduser()
    try:
        if local.exists():
            data = json.loads((local / "config.json").read_text(encoding="utf-8"))
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            return data
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(name_or_path, trust_remote_code=False).to_dict()
    except Exception as exc:
        where = (
            "a local dir without a readable config.json"
            if local.exists()
            else "not a local model dir, and the Hugging Face Hub could not provide its config"
        )
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        raise ConfigError(
            f"Could not read {setting}={name_or_path!r} ({where}: {detail}); point {setting} at "
            "a local dir with config.json and model.safetensors."
        ) from None


def refusal(config: dict, name_or_path: str, setting: str = "model.init_from") -> str | None:
    """Return the sentence that refuses the model of ``config`` (read by ``read_model_config``),
    or None for a model mlmkit continues."""
    model_type = config.get("model_type")
    families = ", ".join(CONTINUED_MODEL_TYPES)
    if config.get("auto_map"):
        return (
            f"{setting}={name_or_path!r} is a {model_type!r} model whose config.json names code "
            "to run from its folder or the Hub (auto_map, trust_remote_code), which mlmkit never "
            "runs; "
            f"continue a model of a family transformers ships ({families}), or convert this one "
            "to such a family's classes first."
        )
    if model_type in CONTINUED_MODEL_TYPES:
        return None
    from transformers.models.auto import modeling_auto as auto

    if model_type in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and (
        model_type not in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES or config.get("is_decoder")
    ):
        return (
            f"mlmkit trains encoders with a masked-LM objective and {setting}={name_or_path!r} is "
            f"a {model_type!r} model, a decoder (causal LM); point {setting} at an encoder "
            f"({families})."
        )
    return (
        f"{setting}={name_or_path!r} is a {model_type!r} model, a family mlmkit does not "
        f"continue; point {setting} at a model of one of {families}."
    )


def check_continued(name_or_path: str, setting: str = "model.init_from") -> dict:
    """Return the config of the model at ``name_or_path``, or one sentence why mlmkit does not
    continue it."""
    config = read_model_config(name_or_path, setting)
    sentence = refusal(config, name_or_path, setting)
    if sentence:
        raise ConfigError(sentence)
    return config


def model_width(config: dict) -> int:
    """Return the width of a model from its config dict (its families' names for it)."""
    return int(next(config[key] for key in WIDTH_KEYS if key in config))
