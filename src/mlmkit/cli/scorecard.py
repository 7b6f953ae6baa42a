"""``mlmkit scorecard models=[<run a>,<run b>] data_dir=<data> [suite=fast|full]``: did
pretraining pay? Models and a random init on a fixed suite, each figure with its interval
(``mlmkit.evaluation.scorecard``; settings: conf/scorecard.yaml)."""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig

from mlmkit.cli.errors import exit_on_error, run_hydra_main
from mlmkit.config import CONFIG_PATH, ScorecardConfig, register_configs, to_config


def main() -> None:
    register_configs()

    @hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="scorecard")
    def run(cfg: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig

        from mlmkit.evaluation.scorecard import scorecard

        logging.basicConfig(
            level=logging.INFO, format="[%(asctime)s] %(message)s", datefmt="%H:%M:%S"
        )
        out = Path(HydraConfig.get().runtime.output_dir)
        reports = []
        exit_on_error(lambda: reports.append(scorecard(to_config(cfg, ScorecardConfig), out)))
        report = reports[0]
        cached = sum(r["cached_cells"] for r in report["rows"])
        scored = sum(r["scored_cells"] for r in report["rows"])
        print("\n" + (out / "scorecard.md").read_text())
        print(
            f"{scored} cells scored, {cached} read from the cache; {out}/scorecard.md, .json, .png"
        )

    run_hydra_main(run)
