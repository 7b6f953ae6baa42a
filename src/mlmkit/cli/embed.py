"""``mlmkit embed checkpoint=<run | final/ | checkpoint | model dir> [settings]``: the encoder
fine-tuned as a sentence embedder on sentence-transformers (``mlmkit.embed.run``,
``mlmkit.embed.stage``; settings: conf/embed.yaml)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from mlmkit.cli.errors import exit_on_error, run_hydra_main
from mlmkit.cli.record import write_record
from mlmkit.config import CONFIG_PATH, EmbedConfig, register_configs, to_config


def main() -> None:
    register_configs()

    @hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="embed")
    def run(cfg: DictConfig) -> None:
        from accelerate import PartialState
        from hydra.core.hydra_config import HydraConfig

        from mlmkit.embed.run import embed

        results = []
        exit_on_error(
            lambda: results.append(
                embed(
                    to_config(cfg, EmbedConfig),
                    HydraConfig.get().runtime.output_dir,
                    on_open=lambda d: write_record(d, cfg),
                )
            )
        )
        r = results[0]
        if PartialState().is_main_process:
            print(
                f"{r['objective']} on {r['data']['rows']} rows, {r['steps']} steps, "
                f"{r['seconds']} s: {r['final']}"
            )
            for key, after in r["after"].items():
                before = r["before"].get(key)
                shown = "-" if before is None else f"{before:.4f}"
                print(f"  {key:<22} {shown} -> {after:.4f}")

    run_hydra_main(run)
