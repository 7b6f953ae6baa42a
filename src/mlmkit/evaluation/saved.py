"""Evaluate a trained model's masked language modeling on a corpus.

    mlmkit eval checkpoint=outputs/<run>              # its validation split
    mlmkit eval checkpoint=outputs/<run>/final files=[../shared/data/corpora/wikitext-2/valid.txt]
    accelerate launch -m mlmkit eval checkpoint=... data=files data.train_files=[...]

Prints loss, perplexity, masked-token accuracy and top-5 accuracy over the chosen tokens,
computed by the ``masked_lm`` metric module shipped in mlmkit (it loads offline). Masks are
BERT's 80-10-10 at ``masking.eval_mlm_probability``, fixed by ``masking.eval_seed``, so the
figures match the training run's eval events on the same data and are comparable across
models with the same tokenizer. Settings: conf/evaluate.yaml.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mlmkit.config import EvalConfig
from mlmkit.masking.collator import IGNORE_INDEX

log = logging.getLogger("mlmkit")
TOP_K = 5


@torch.no_grad()
def mlm_predictions(accelerator, objective, batches) -> dict[str, list]:
    """Per chosen token, over all ranks: its loss, the top-5 token ids and the original id."""
    from accelerate.utils import gather_object

    from mlmkit.evaluation.mlm import rank_share

    objective.eval()
    losses, top, refs = [], [], []
    device = accelerator.device
    for batch, counted in rank_share(batches, accelerator.process_index, accelerator.num_processes):
        batch = {k: v.to(device) for k, v in batch.items()}
        if bool(batch["attention_mask"].all()):
            batch["attention_mask"] = None  # fused SDPA kernels for unpadded blocks
        out = objective(**batch)
        if not counted:
            continue
        valid = out["targets"] != IGNORE_INDEX
        logits, targets = out["logits"][valid].float(), out["targets"][valid]
        losses += F.cross_entropy(logits, targets, reduction="none").tolist()
        top += logits.topk(min(TOP_K, logits.size(-1)), dim=-1).indices.tolist()
        refs += targets.tolist()
    gathered = gather_object([(losses, top, refs)])
    return {
        "losses": [x for part in gathered for x in part[0]],
        "predictions": [x for part in gathered for x in part[1]],
        "references": [x for part in gathered for x in part[2]],
    }


def eval_dataset(cfg: EvalConfig, tokenizer):
    """The packed blocks to evaluate: ``cfg.files`` whole, or the validation split of ``cfg.data``."""
    import datasets

    from mlmkit.data.corpus import load_files, pack_corpus, prepare_datasets, resolve_files

    if cfg.files:
        docs = load_files(resolve_files(cfg.files, "files"), cfg.data, "files")
        blocks = pack_corpus(datasets.DatasetDict({"validation": docs}), tokenizer,
                             cfg.data.max_seq_length, cfg.data.num_proc, cfg.data.packing)["validation"]
        if cfg.data.max_eval_samples is not None and len(blocks) > cfg.data.max_eval_samples:
            blocks = blocks.select(range(cfg.data.max_eval_samples))
        blocks = blocks.with_format("torch")
    else:
        blocks = prepare_datasets(cfg.data, tokenizer, Path(cfg.paths.cache_dir).expanduser())["validation"]
    if len(blocks) == 0:
        from mlmkit.errors import DataError

        raise DataError(f"The evaluation text packs into zero blocks of {cfg.data.max_seq_length} "
                        "tokens; add text or lower data.max_seq_length.")
    return blocks


def run_evaluation(cfg: EvalConfig) -> dict[str, Any]:
    """Evaluate ``cfg.checkpoint``; returns the figures (and writes ``cfg.output`` if set)."""

    from accelerate import Accelerator

    from mlmkit.errors import ConfigError
    from mlmkit.evaluation.metric_modules import load_metric
    from mlmkit.evaluation.mlm import fixed_eval_batches
    from mlmkit.model.bert import MaskedLM
    from mlmkit.model.loading import load_model_and_tokenizer
    from mlmkit.training.runtime import resolve_precision, runs_on_cpu

    use_cpu = runs_on_cpu()
    precision = resolve_precision(cfg.precision, use_cpu=use_cpu, setting="precision")
    accelerator = Accelerator(cpu=use_cpu, mixed_precision=precision)
    with accelerator.local_main_process_first():
        model, tokenizer, resolved = load_model_and_tokenizer(cfg.checkpoint)
        if cfg.data.max_seq_length > model.config.max_position_embeddings:
            raise ConfigError(
                f"data.max_seq_length ({cfg.data.max_seq_length}) is longer than the model's "
                f"{model.config.max_position_embeddings} positions; lower data.max_seq_length."
            )
        blocks = eval_dataset(cfg, tokenizer)
    batches = fixed_eval_batches(blocks, tokenizer, cfg.masking, cfg.batch_size)
    objective = accelerator.prepare(MaskedLM(model))
    found = mlm_predictions(accelerator, objective, batches)
    metric = load_metric("masked_lm")
    figures = metric.compute(**found)
    result = {"checkpoint": str(resolved), "blocks": len(blocks),
              "max_seq_length": cfg.data.max_seq_length, **figures}
    if accelerator.is_main_process and cfg.output:
        out = Path(cfg.output).expanduser()
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    return result
