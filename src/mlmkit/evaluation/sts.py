"""Zero-shot semantic textual similarity (STS-B): the encoder as a sentence embedder.

    mlmkit eval-sts checkpoint=outputs/<run> data_dir=../shared/data/glue/STS-B
    mlmkit eval-sts checkpoint=outputs/<run> data_dir=... init=random    # random weights
    mlmkit eval-sts checkpoint=outputs/<run> data_dir=... pooling=cls    # the [CLS] state

Each sentence is embedded alone: the mean of the last layer's token states, padding
excluded (the pooling of the sentence-transformers files in a run's ``final/``), or the
``[CLS]`` state. The cosine of a pair's two embeddings is its predicted similarity; the
figures are Spearman's rank correlation (STS's headline metric) and Pearson's correlation
with the gold scores, over the pairs of ``split``. Nothing is trained.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from mlmkit.config import StsEvalConfig
from mlmkit.finetune.correlation import pearson, spearman
from mlmkit.finetune.reader import load_split
from mlmkit.model.architectures import parts_of
from mlmkit.model.classifier import masked_mean
from mlmkit.training.trained_model import load_model_and_tokenizer

log = logging.getLogger("mlmkit")


@torch.inference_mode()
def embed(
    encoder,
    tokenizer,
    sentences: list[str],
    pooling: str = "mean",
    batch_size: int = 64,
    max_seq_length: int = 128,
) -> torch.Tensor:
    """``(len(sentences), hidden)`` float32 embeddings from ``encoder`` (``BertModel``, ...)."""
    device = next(encoder.parameters()).device
    out = []
    for i in range(0, len(sentences), batch_size):
        enc = tokenizer(
            sentences[i : i + batch_size],
            truncation=True,
            max_length=max_seq_length,
            padding=True,
            return_tensors="pt",
        )
        enc = {
            k: v.to(device)
            for k, v in enc.items()
            if k in ("input_ids", "attention_mask", "token_type_ids")
        }
        hidden = encoder(**enc).last_hidden_state.float()
        out.append(
            masked_mean(hidden, enc["attention_mask"]) if pooling == "mean" else hidden[:, 0]
        )
    return torch.cat(out).cpu() if out else torch.empty(0)


def pair_similarities(encoder, tokenizer, pairs: list[list[str]], **kwargs) -> list[float]:
    """Return the cosine similarity of the embeddings of each pair's two sentences (each sentence
    embedded once)."""
    unique = list(dict.fromkeys(s for pair in pairs for s in pair))
    vectors = torch.nn.functional.normalize(embed(encoder, tokenizer, unique, **kwargs), dim=-1)
    row = {s: i for i, s in enumerate(unique)}
    a = vectors[[row[p[0]] for p in pairs]]
    b = vectors[[row[p[1]] for p in pairs]]
    return (a * b).sum(-1).tolist()


def load_encoder(cfg: StsEvalConfig):
    """Load ``(encoder, tokenizer, resolved path)``: the checkpoint's encoder (without the MLM
    head), or for ``init=random`` the same architecture with seeded random weights."""
    mlm, tokenizer, resolved = load_model_and_tokenizer(cfg.checkpoint)
    if cfg.init == "random":
        torch.manual_seed(cfg.seed)
        mlm = type(mlm)(mlm.config)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return parts_of(mlm).encoder(mlm).to(device).eval(), tokenizer, resolved


def evaluate_sts(cfg: StsEvalConfig) -> dict[str, Any]:
    """Return the zero-shot figures of ``cfg``; also written to ``cfg.output`` when set."""
    examples = load_split(cfg.task, "train" if cfg.split == "train" else "eval")
    encoder, tokenizer, resolved = load_encoder(cfg)
    t0 = time.perf_counter()
    max_length = min(cfg.max_seq_length, parts_of(encoder).positions(encoder.config))
    predicted = pair_similarities(
        encoder,
        tokenizer,
        [e["text"] for e in examples],
        pooling=cfg.pooling,
        batch_size=cfg.batch_size,
        max_seq_length=max_length,
    )
    gold = [e["label"] for e in examples]
    result = {
        "checkpoint": str(resolved),
        "init": cfg.init,
        "task": cfg.task.name,
        "split": cfg.split,
        "pooling": cfg.pooling,
        "pairs": len(examples),
        "spearman": spearman(predicted, gold),
        "pearson": pearson(predicted, gold),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    write_output(cfg.output, result)
    return result


def write_output(path: str | None, result: dict[str, Any]) -> None:
    """Write a command's figures as JSON at ``path`` (its ``output`` setting), if set."""
    if path:
        out = Path(path).expanduser()
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
