"""What mlmkit reads from a model or tokenizer dir: JSON and safetensors, never code.

transformers imports Python files shipped in a model dir when its config.json or
tokenizer_config.json names classes in ``auto_map`` (and, with ``trust_remote_code`` unset,
asks on a terminal whether to run them); a ``pytorch_model.bin`` is a pickle, which can run
code while it is read. mlmkit passes ``trust_remote_code=False`` to every transformers
loader, refuses a local dir that names custom code before transformers opens it, and reads
weights from safetensors only.
"""

from __future__ import annotations

import json
from pathlib import Path

from mlmkit.errors import ConfigError, MLMKitError

CODE_NAMING_FILES = ("config.json", "tokenizer_config.json")  # where auto_map can point at code
SAFE_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")


def read_json_object(path: Path, setting: str, error: type[MLMKitError] = ConfigError) -> dict:
    """Read the JSON object in ``path``; one sentence naming the file when it is not one."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        detail = (str(exc).splitlines() or [type(exc).__name__])[0][:120]
        raise error(
            f"{setting}: {str(path)!r} is not a valid JSON file ({detail}); restore it, "
            f"or point {setting} at another dir."
        ) from None
    if not isinstance(data, dict):
        raise error(
            f"{setting}: {str(path)!r} holds a JSON {type(data).__name__}, not an object; "
            f"restore it, or point {setting} at another dir."
        )
    return data


def refuse_custom_code(folder: Path, setting: str, error: type[MLMKitError] = ConfigError) -> None:
    """Refuse a local dir whose config.json or tokenizer_config.json has ``auto_map``."""
    for name in CODE_NAMING_FILES:
        path = Path(folder) / name
        if path.is_file() and "auto_map" in read_json_object(path, setting, error):
            raise error(
                f"{setting}: {str(path)!r} names custom code to run (auto_map), which mlmkit never "
                f"runs; remove the auto_map entry from {name}, or use a plain BERT model dir."
            )


def require_safetensors(folder: Path, setting: str) -> None:
    """Refuse a local model dir without safetensors weights (a pickle is never read)."""
    folder = Path(folder)
    if any((folder / name).is_file() for name in SAFE_WEIGHTS):
        return
    pickled = next((name for name in PICKLED_WEIGHTS if (folder / name).is_file()), None)
    if pickled:
        raise ConfigError(
            f"{setting}: {str(folder)!r} holds its weights only as {pickled}, a pickle, which "
            "mlmkit never loads; convert it to model.safetensors (save_pretrained with "
            "safe_serialization=True, where you trust the file)."
        )
    raise ConfigError(
        f"{setting}: {str(folder)!r} has no model.safetensors; point {setting} at "
        "a model dir with config.json and model.safetensors."
    )
