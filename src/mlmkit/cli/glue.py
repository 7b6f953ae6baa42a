"""``mlmkit glue checkpoint=<run> data_dir=<glue_data> [protocol=bert|modern]``: GLUE's tasks
under one protocol, the table and its average (``mlmkit.evaluation.glue``; settings:
conf/glue.yaml)."""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from mlmkit.cli.errors import exit_on_error, run_hydra_main
from mlmkit.cli.record import write_record
from mlmkit.config import CONFIG_PATH, GlueConfig, register_configs, to_config


def main() -> None:
    register_configs()

    @hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="glue")
    def run(cfg: DictConfig) -> None:
        from accelerate import PartialState
        from hydra.core.hydra_config import HydraConfig

        from mlmkit.evaluation.glue import glue

        logging.basicConfig(
            level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%H:%M:%S"
        )
        results = []
        run_dir = HydraConfig.get().runtime.output_dir
        exit_on_error(
            lambda: results.append(
                glue(to_config(cfg, GlueConfig), run_dir, on_open=lambda d: write_record(d, cfg))
            )
        )
        if PartialState().is_main_process:
            out = results[0]
            print(f"\n{out['table']}\n\nProtocol {out['protocol']}.")
            for name, task in out["tasks"].items():
                if task["skipped"]:
                    print(f"Skipped {name}: {task['skipped']}")
            print(f"Results: {run_dir}/results.json, results.md, glue.png")

    run_hydra_main(run)
