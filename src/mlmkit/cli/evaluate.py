"""``mlmkit eval checkpoint=<run dir | final/ | checkpoints/step_*> [settings]``: the MLM
figures of a model (``mlmkit.evaluation.mlm.run_evaluation``: the training loop's own
evaluation; settings: conf/evaluate.yaml).

A model of a run is scored on the run's own validation data, by its saved data settings
and evaluation masks (``data.*`` and ``masking.*`` on the command line change them;
``data=<preset>`` or ``files=[...]`` score other text), so the figures equal the run's
``eval`` events. The first line printed says which data was scored."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from mlmkit.cli.errors import exit_on_error, run_hydra_main
from mlmkit.config import CONFIG_PATH, DataConfig, EvalConfig, register_configs, to_config

EVAL_MASKING = ("eval_mlm_probability", "eval_seed", "eval_min_masked_tokens")


def use_run_data(cfg: DictConfig, overrides: list[str]) -> str:
    """Put the data settings of the run ``cfg.checkpoint`` belongs to into ``cfg`` (the
    command line's ``data.*`` and ``masking.*`` on top); returns which data is scored."""
    from mlmkit.config.recipes import given_keys
    from mlmkit.training.trained_model import resolve_model_path, run_settings

    keys = given_keys(overrides)
    if cfg.files:
        return f"files {', '.join(map(str, cfg.files))} (whole)"
    found = None if "data" in keys else run_settings(resolve_model_path(cfg.checkpoint))
    if found is None or not isinstance(found[1].get("data"), dict):
        return f"the validation split of data={cfg.data.source} ({describe_data(cfg.data)})"
    run, settings = found
    data = OmegaConf.merge(OmegaConf.structured(DataConfig), settings["data"])
    for key in sorted(k for k in keys if k.startswith("data.")):
        OmegaConf.update(
            data, key.removeprefix("data."), OmegaConf.select(cfg, key), force_add=True
        )
    masking = settings.get("masking") or {}
    with open_dict(cfg):
        cfg.data = data
        for key in EVAL_MASKING:
            if key in masking and not any(k in (f"masking.{key}", "masking") for k in keys):
                cfg.masking[key] = masking[key]
    return f"the run's validation split ({describe_data(cfg.data)}; settings of {run})"


def describe_data(data) -> str:
    """Describe a data config briefly: its source and, for files or the Hub, what it reads."""
    if data.source == "files":
        what = f"data.train_files={list(data.train_files)}"
        if data.validation_files:
            what += f", data.validation_files={list(data.validation_files)}"
    elif data.source == "hub":
        what = f"data.hub_name={data.hub_name}" + (
            f", data.hub_config={data.hub_config}" if data.hub_config else ""
        )
    else:
        what = f"data.source={data.source}"
    return f"{what}, data.max_seq_length={data.max_seq_length}, data.packing={data.packing}"


def main() -> None:
    register_configs()

    @hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="evaluate")
    def run(cfg: DictConfig) -> None:
        from accelerate import PartialState
        from hydra.core.hydra_config import HydraConfig

        from mlmkit.evaluation.mlm import run_evaluation

        results, scored = [], []

        def evaluate() -> None:
            if cfg.checkpoint:
                scored.append(use_run_data(cfg, list(HydraConfig.get().overrides.task)))
            results.append(
                run_evaluation(to_config(cfg, EvalConfig), data=scored[0] if scored else None)
            )

        exit_on_error(evaluate)
        result = results[0]
        if PartialState().is_main_process:
            print(f"Scored {result['data']}")
            print(
                f"{result['checkpoint']}: {result['tokens']} masked tokens in {result['blocks']} "
                f"blocks of {result['max_seq_length']}"
            )
            for key in ("loss", "perplexity", "accuracy", "top5_accuracy"):
                print(f"  {key:<15} {result[key]:.4f}")

    run_hydra_main(run)
