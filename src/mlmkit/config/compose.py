"""Hydra composition: conf/ (shipped as ``mlmkit.conf``) + the command line -> a validated
schema object (``to_config``); the ``launch_time`` resolver that gives all ranks one run dir."""

from __future__ import annotations

import os
import time
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from mlmkit.config.schema import (
    Config,
    EmbedConfig,
    EvalConfig,
    FinetuneConfig,
    GlueConfig,
    PairsEvalConfig,
    RetrievalEvalConfig,
    ScorecardConfig,
    StsEvalConfig,
)
from mlmkit.errors import ConfigError


def launch_time(fmt: str = "%Y-%m-%d/%H-%M-%S") -> str:
    """Return the start time of the run, the same on every rank of a node.

    Under ``accelerate launch``/torchrun each rank resolves the Hydra config on its own, at
    slightly different moments; they share the launcher process, so its start time names
    one run dir for all of them. Outside a launcher this is simply now.
    """
    started = time.time()
    if "LOCAL_RANK" in os.environ:
        try:
            with open(f"/proc/{os.getppid()}/stat") as f:
                ticks = int(f.read().rsplit(")", 1)[1].split()[19])
            with open("/proc/stat") as f:
                btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
            started = btime + ticks / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError, StopIteration):
            pass
    return time.strftime(fmt, time.localtime(started))


# The YAML config groups: conf/ in the checkout, shipped as the package mlmkit.conf.
CONFIG_MODULE = "mlmkit.conf"
CONFIG_PATH = f"pkg://{CONFIG_MODULE}"


SCHEMAS = {
    "mlmkit_schema": Config,
    "mlmkit_eval_schema": EvalConfig,
    "mlmkit_finetune_schema": FinetuneConfig,
    "mlmkit_eval_sts_schema": StsEvalConfig,
    "mlmkit_glue_schema": GlueConfig,
    "mlmkit_scorecard_schema": ScorecardConfig,
    "mlmkit_eval_retrieval_schema": RetrievalEvalConfig,
    "mlmkit_eval_pairs_schema": PairsEvalConfig,
    "mlmkit_embed_schema": EmbedConfig,
}


def register_configs() -> None:
    """Register the schema with Hydra's ConfigStore (conf/config.yaml extends it) and the
    ``launch_time`` resolver used by the default run dir. Each schema is stored once per
    process (storing turns the dataclasses into configs: a tenth of a second each time)."""
    cs = ConfigStore.instance()
    for name, schema in SCHEMAS.items():
        stored = cs.repo.get(f"{name}.yaml")
        if stored is None or OmegaConf.get_type(stored.node) is not schema:
            cs.store(name=name, node=schema)
    if not OmegaConf.has_resolver("launch_time"):
        OmegaConf.register_new_resolver("launch_time", launch_time, use_cache=True)


def objective_shorthand(overrides: list[str] | tuple[str, ...]) -> list[str]:
    """Return a pretraining run's ``overrides`` with ``objective=<name>`` read as
    ``objective.name=<name>`` (``-m objective=mlm,rtd`` sweeps both). The objective is a node of
    settings (``ObjectiveConfig``), not a config group: a group named objective would claim the
    word for every command, and ``mlmkit embed objective=simcse`` sets a setting of its own."""
    return [
        "objective.name=" + o.split("=", 1)[1] if o.split("=", 1)[0] == "objective" else o
        for o in overrides
    ]


def compose_command(config_name: str, overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Compose conf/<config_name>.yaml with ``overrides`` as that command's Hydra does, outside a
    run (no run dir; Hydra's global state is left clear)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    if config_name == "config":  # pretraining's
        overrides = objective_shorthand(overrides)
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            return hydra_compose(config_name=config_name, overrides=list(overrides))
    finally:
        GlobalHydra.instance().clear()


def compose(overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Compose the ``Config`` that ``mlmkit train <overrides>`` runs with: conf/config.yaml,
    the presets it names, the overrides and the recipes (``compose(["model=bert-mini"])``)."""
    overrides = list(overrides)
    return finish(compose_command("config", overrides), overrides)[0]


def finish(cfg: DictConfig, overrides: list[str]) -> tuple[Config, list[str]]:
    """Apply the recipes to a composed run config for what ``overrides`` leaves unset, then
    check it: the ``Config`` and the lines the run's log opens with (the recipe taken)."""
    from mlmkit.config.recipes import (
        apply_continued_pretraining,
        apply_rtd_masking,
        apply_rtd_rate,
        recipe_note,
    )

    note = recipe_note(apply_continued_pretraining(cfg, overrides), cfg.model.get("init_from"))
    rtd = (apply_rtd_rate(cfg, overrides), apply_rtd_masking(cfg, overrides))
    notes = [line for line in (note, *rtd) if line]
    return to_config(cfg), notes


def to_config(cfg: Any, schema_class: type = Config) -> Any:
    """Turn a composed DictConfig (or a plain dict) into a checked ``Config`` (or
    ``schema_class``)."""
    if isinstance(cfg, schema_class):
        return cfg
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg)
    try:
        if OmegaConf.get_type(cfg) is not schema_class:  # Hydra's composition is typed already
            cfg = OmegaConf.merge(OmegaConf.structured(schema_class), cfg)
        return OmegaConf.to_object(cfg)
    except ConfigError:
        raise
    except Exception as exc:  # omegaconf validation errors name the key
        raise ConfigError(_omegaconf_message(exc)) from None


def _omegaconf_message(exc: Exception) -> str:
    key = getattr(exc, "full_key", None)
    msg = str(exc).splitlines()[0]
    if key:
        return f"config key '{key}': {msg}"
    return msg
