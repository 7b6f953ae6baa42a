"""``mlmkit finetune checkpoint=<run> task=sst2|...|files [settings]``: fine-tuning on a GLUE
task or on your own files (``mlmkit.finetune``; settings: conf/finetune.yaml)."""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig

from mlmkit.cli.errors import exit_on_error, run_hydra_main
from mlmkit.cli.record import write_record
from mlmkit.config import CONFIG_PATH, FinetuneConfig, register_configs, to_config


def main() -> None:
    register_configs()

    @hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="finetune")
    def run(cfg: DictConfig) -> None:
        from accelerate import PartialState
        from hydra.core.hydra_config import HydraConfig

        from mlmkit.finetune.loop import finetune

        logging.basicConfig(
            level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%H:%M:%S"
        )
        results = []

        def job() -> None:
            ft = to_config(cfg, FinetuneConfig)
            run_dir = HydraConfig.get().runtime.output_dir
            results.append(finetune(ft, run_dir, on_open=lambda d: write_record(d, cfg)))

        exit_on_error(job)
        summary = results[0]
        headline = summary["headline"]
        if PartialState().is_main_process:
            saved = f"; the model: {summary['model']}" if summary["model"] else ""
            base = summary.get("baseline", {})
            against = (
                f"; baseline ({base['baseline']}): {base[headline]:.4f}" if headline in base else ""
            )
            print(
                f"{summary['task']} dev {headline}: {summary['eval_' + headline]:.4f} "
                f"({summary['init']} init, {summary['steps']} steps, {summary['seconds']} s)"
                f"{against}{saved}"
            )

    run_hydra_main(run)
