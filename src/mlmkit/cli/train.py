"""``mlmkit train [settings]`` (and ``python train.py`` in a checkout): Hydra composes
conf/config.yaml with the command line's overrides, composition's recipes apply
(``training.recipes``: continued pretraining with ``model.init_from``), then
``mlmkit.export.run.train`` runs in Hydra's run dir, on every process under ``accelerate
launch``. ``compose`` gives the Python API the same config as the command line."""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig

from mlmkit.cli.errors import exit_on_error, run_hydra_main
from mlmkit.cli.record import write_record
from mlmkit.config import CONFIG_MODULE, CONFIG_PATH, Config, register_configs, to_config
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


def apply_recipes(cfg: DictConfig, overrides: list[str]) -> list[str]:
    """Composition's recipes on ``cfg`` for what ``overrides`` leaves unset; the log's lines."""
    from mlmkit.training.recipes import apply_continued_pretraining, recipe_note

    note = recipe_note(apply_continued_pretraining(cfg, overrides), cfg.model.get("init_from"))
    return [note] if note else []


def compose(overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """The ``Config`` that ``mlmkit train <overrides>`` runs with: conf/config.yaml, the
    presets it names, the overrides and the recipes (``compose(["model=bert-mini"])``)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    overrides = list(overrides)
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=overrides)
    apply_recipes(cfg, overrides)
    return to_config(cfg)


def main() -> None:
    exit_on_error(lambda: check_run_dir_override(sys.argv[1:]))
    register_configs()

    @hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="config")
    def run(cfg: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig

        from mlmkit.export.run import train

        hydra_cfg = HydraConfig.get()
        output_dir = hydra_cfg.runtime.output_dir

        def start() -> None:
            notes = apply_recipes(cfg, list(hydra_cfg.overrides.task))
            # .hydra/ once the run's checks have passed (the settings as run, recipes applied)
            train(to_config(cfg), output_dir, notes, on_open=lambda run_dir: write_record(run_dir, cfg))

        exit_on_error(start)

    run_hydra_main(run)
