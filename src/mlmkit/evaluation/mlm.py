"""``mlmkit eval``: the MLM evaluation of a saved model, the training loop's own
(``training.validation.evaluate`` over the same fixed masks, ``fixed_eval_batches``): loss,
perplexity, masked-token accuracy and top-5 accuracy over the chosen tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlmkit.config import EvalConfig
from mlmkit.data.fingerprint import derive
from mlmkit.data.packing import PREDICTABLE_SAMPLE, check_predictable, pack_corpus, prepare_datasets
from mlmkit.data.sources import file_stats, load_files, resolve_files
from mlmkit.errors import ConfigError, DataError
from mlmkit.model.architectures import parts_of
from mlmkit.model.bert import MaskedLM
from mlmkit.model.documents import isolation_sep_id
from mlmkit.training.runtime import resolve_precision, runs_on_cpu
from mlmkit.training.trained_model import load_model_and_tokenizer
from mlmkit.training.validation import evaluate, fixed_eval_batches


def eval_dataset(cfg: EvalConfig, tokenizer):
    """Return the packed blocks to evaluate: ``cfg.files`` whole, or the validation split of
    ``cfg.data``."""
    import datasets

    if cfg.files:
        files = resolve_files(cfg.files, "files")
        key = derive("eval files", file_stats(files), cfg.data.text_column, cfg.data.txt_sample_by)
        docs = load_files(files, cfg.data, "files")
        blocks = pack_corpus(
            datasets.DatasetDict({"validation": docs}),
            tokenizer,
            cfg.data.max_seq_length,
            cfg.data.num_proc,
            cfg.data.packing,
            key=key,
        )["validation"]
        n = cfg.data.max_eval_samples
        if n is not None and len(blocks) > n:
            blocks = blocks.select(range(n), new_fingerprint=derive(key, "first", n))
    else:
        blocks = prepare_datasets(cfg.data, tokenizer, Path(cfg.paths.cache_dir).expanduser())[
            "validation"
        ]
    if len(blocks) == 0:
        raise DataError(
            f"The evaluation text packs into zero blocks of {cfg.data.max_seq_length} "
            "tokens; add text or lower data.max_seq_length."
        )
    if cfg.files:
        check_predictable(blocks[:PREDICTABLE_SAMPLE]["input_ids"], tokenizer, "files")
    return blocks


def run_evaluation(cfg: EvalConfig, data: str | None = None) -> dict[str, Any]:
    """``mlmkit eval``: evaluate ``cfg.checkpoint`` as the training loop does (``evaluate``);
    returns the figures (``loss``, ``perplexity``, ``accuracy``, ``top5_accuracy``,
    ``tokens``, ...; ``data``: what was scored, in words) and writes them to ``cfg.output`` if
    set."""

    from accelerate import Accelerator

    use_cpu = runs_on_cpu()
    precision = resolve_precision(cfg.precision, use_cpu=use_cpu, setting="precision")
    accelerator = Accelerator(cpu=use_cpu, mixed_precision=precision)
    with accelerator.local_main_process_first():
        model, tokenizer, resolved = load_model_and_tokenizer(cfg.checkpoint)
        positions = parts_of(model).positions(model.config)
        if cfg.data.max_seq_length > positions:
            raise ConfigError(
                f"data.max_seq_length ({cfg.data.max_seq_length}) is longer than the model's "
                f"{positions} positions; lower data.max_seq_length."
            )
        blocks = eval_dataset(cfg, tokenizer)
    batches = fixed_eval_batches(blocks, tokenizer, cfg.masking, cfg.batch_size)
    objective = accelerator.prepare(
        MaskedLM(model, document_sep_id=isolation_sep_id(cfg.data.packing, tokenizer))
    )
    figures = evaluate(accelerator, objective, batches)  # the figures of the training loop's eval
    if data is None:
        data = (
            f"files {', '.join(cfg.files)} (whole)"
            if cfg.files
            else f"the validation split of data={cfg.data.source}"
        )
    result = {
        "checkpoint": str(resolved),
        "data": data,
        "blocks": len(blocks),
        "max_seq_length": cfg.data.max_seq_length,
        **{key.removeprefix("eval_"): value for key, value in figures.items()},
    }
    if accelerator.is_main_process and cfg.output:
        out = Path(cfg.output).expanduser()
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    return result
