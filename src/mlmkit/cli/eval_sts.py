"""``mlmkit eval-sts checkpoint=<run dir | final/ | checkpoints/step_*> data_dir=<STS-B>``:
zero-shot sentence similarity of a model's embeddings (``mlmkit.evaluation.sts``;
settings: conf/eval_sts.yaml)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from mlmkit.cli.errors import exit_on_error, run_hydra_main
from mlmkit.config import CONFIG_PATH, StsEvalConfig, register_configs, to_config


def main() -> None:
    register_configs()

    @hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="eval_sts")
    def run(cfg: DictConfig) -> None:
        from mlmkit.evaluation.sts import evaluate_sts

        results = []
        exit_on_error(lambda: results.append(evaluate_sts(to_config(cfg, StsEvalConfig))))
        r = results[0]
        print(
            f"{r['checkpoint']} ({r['init']} init, {r['pooling']} pooling): {r['task']} "
            f"{r['split']}, {r['pairs']} pairs"
        )
        for key in ("spearman", "pearson"):
            print(f"  {key:<9} {r[key]:.4f}")

    run_hydra_main(run)
