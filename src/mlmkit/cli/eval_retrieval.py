"""``mlmkit eval-retrieval checkpoint=<run dir | final/ | checkpoints/step_*>
data_dir=<BEIR folder>``: zero-shot retrieval with a model's sentence embeddings
(``mlmkit.evaluation.retrieval``; settings: conf/eval_retrieval.yaml)."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from mlmkit.cli.errors import exit_on_error, run_hydra_main
from mlmkit.config import CONFIG_PATH, RetrievalEvalConfig, register_configs, to_config


def main() -> None:
    register_configs()

    @hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="eval_retrieval")
    def run(cfg: DictConfig) -> None:
        from mlmkit.evaluation.retrieval import evaluate_retrieval

        results = []
        exit_on_error(
            lambda: results.append(evaluate_retrieval(to_config(cfg, RetrievalEvalConfig)))
        )
        r = results[0]
        print(
            f"{r['checkpoint']} ({r['init']} init, {r['pooling']} pooling) on {r['data_dir']} "
            f"{r['split']}, {r['queries']} queries, {r['documents']} documents: nDCG@10 "
            f"{r['ndcg@10']:.4f}, recall@100 {r['recall@100']:.4f}, MRR@10 {r['mrr@10']:.4f}"
        )

    run_hydra_main(run)
