"""``mlmkit eval-pairs checkpoint=<run dir | final/ | checkpoints/step_*>
files=[<pairs.jsonl>,...]``: minimal-pair acceptability by pseudo-log-likelihood
(``mlmkit.evaluation.pairs``; settings: conf/eval_pairs.yaml)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from mlmkit.cli.errors import exit_on_error, run_hydra_main
from mlmkit.config import CONFIG_PATH, PairsEvalConfig, register_configs, to_config


def main() -> None:
    register_configs()

    @hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="eval_pairs")
    def run(cfg: DictConfig) -> None:
        from mlmkit.evaluation.pairs import evaluate_pairs

        results = []
        exit_on_error(lambda: results.append(evaluate_pairs(to_config(cfg, PairsEvalConfig))))
        r = results[0]
        for name, figures in r["files"].items():
            print(f"{name}: accuracy {figures['accuracy']:.4f} over {figures['pairs']} pairs")
        count = len(r["files"])
        print(
            f"{r['checkpoint']} ({r['init']} init): accuracy {r['accuracy']:.4f} over {r['pairs']} "
            f"pairs in {count} file{'' if count == 1 else 's'}"
        )

    run_hydra_main(run)
