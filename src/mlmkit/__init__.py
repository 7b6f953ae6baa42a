"""mlmkit: pretrain BERT-style masked language models."""

from mlmkit.config import Config
from mlmkit.errors import MLMKitError

__version__ = "0.1.0"


def __getattr__(name):
    # The collator imports torch: ``import mlmkit.config`` and the commands that need no model
    # (``mlmkit --help``, ``mlmkit launch``'s own process, accelerate-config) start without it.
    if name == "MLMCollator":
        from mlmkit.masking.collator import MLMCollator

        return MLMCollator
    raise AttributeError(f"module 'mlmkit' has no attribute {name!r}")


def compose(overrides=()):
    """Compose the ``Config`` that ``mlmkit train <overrides>`` runs with (its presets and
    recipes); see ``mlmkit.config.compose``."""
    from mlmkit.config import compose as _compose

    return _compose(overrides)


def train(cfg, run_dir):
    """Pretrain as ``cfg`` (a ``Config``, DictConfig or dict) says; see
    ``mlmkit.pretrain.train``."""
    from mlmkit.config import to_config
    from mlmkit.pretrain import train as _train

    return _train(to_config(cfg), run_dir)


__all__ = ["Config", "MLMCollator", "MLMKitError", "compose", "train", "__version__"]
