"""``mlmkit eval checkpoint=<run dir | final/ | checkpoints/step_*> [settings]``: the MLM
figures of a model (``mlmkit.evaluation.mlm.run_evaluation``: the training loop's own
evaluation; settings: conf/evaluate.yaml)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from mlmkit.cli.errors import exit_on_error, run_hydra_main
from mlmkit.config import CONFIG_PATH, EvalConfig, register_configs, to_config


def main() -> None:
    register_configs()

    @hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="evaluate")
    def run(cfg: DictConfig) -> None:
        from accelerate import PartialState

        from mlmkit.evaluation.mlm import run_evaluation

        results = []
        exit_on_error(lambda: results.append(run_evaluation(to_config(cfg, EvalConfig))))
        result = results[0]
        if PartialState().is_main_process:
            print(f"{result['checkpoint']}: {result['tokens']} masked tokens in {result['blocks']} "
                  f"blocks of {result['max_seq_length']}")
            for key in ("loss", "perplexity", "accuracy", "top5_accuracy"):
                print(f"  {key:<15} {result[key]:.4f}")

    run_hydra_main(run)
