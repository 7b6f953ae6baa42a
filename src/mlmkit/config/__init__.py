"""Configuration: the typed schema of conf/ (``schema``: every setting, its meaning, unit
and checks, in one place) and Hydra composition (``compose``: conf/ + the command line ->
a checked ``Config``). Library code takes these objects, never a DictConfig."""

from mlmkit.config.compose import (
    CONFIG_MODULE,
    CONFIG_PATH,
    launch_time,
    register_configs,
    to_config,
)
from mlmkit.config.schema import (
    PRECISIONS,
    STRATEGIES,
    TRACKERS,
    Config,
    DataConfig,
    EvalConfig,
    FinetuneConfig,
    LoggerConfig,
    MaskingConfig,
    ModelConfig,
    OptimConfig,
    PathsConfig,
    SourceConfig,
    TaskConfig,
    TokenizerConfig,
    TrainConfig,
    check_masking,
    check_precision,
    parse_duration,
)

__all__ = [
    "CONFIG_MODULE",
    "CONFIG_PATH",
    "Config",
    "DataConfig",
    "EvalConfig",
    "FinetuneConfig",
    "LoggerConfig",
    "MaskingConfig",
    "ModelConfig",
    "OptimConfig",
    "PRECISIONS",
    "PathsConfig",
    "STRATEGIES",
    "SourceConfig",
    "TRACKERS",
    "TaskConfig",
    "TokenizerConfig",
    "TrainConfig",
    "check_masking",
    "check_precision",
    "launch_time",
    "parse_duration",
    "register_configs",
    "to_config",
]
