"""``mlmkit train [settings]`` (and ``python train.py`` in a checkout): Hydra composes
conf/config.yaml with the command line's overrides, then ``mlmkit.export.run.train``
runs in Hydra's run dir, on every process under ``accelerate launch``."""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig

from mlmkit.cli.errors import exit_on_error, run_hydra_main
from mlmkit.config import CONFIG_PATH, register_configs, to_config
from mlmkit.errors import ConfigError


def check_run_dir_override(argv: list[str]) -> None:
    """Fail with one sentence, before Hydra does with a traceback, on an unusable run dir."""
    for arg in argv:
        if arg.startswith("hydra.run.dir=") and "${" not in arg:
            path = arg.split("=", 1)[1]
            try:
                os.makedirs(path, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"Cannot create the run dir {path!r} ({exc.strerror}); set "
                                  "hydra.run.dir to a writable folder.") from None


def main() -> None:
    exit_on_error(lambda: check_run_dir_override(sys.argv[1:]))
    register_configs()

    @hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="config")
    def run(cfg: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig

        from mlmkit.export.run import train

        exit_on_error(lambda: train(to_config(cfg), HydraConfig.get().runtime.output_dir) and None)

    run_hydra_main(run)
