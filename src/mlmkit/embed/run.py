"""``mlmkit embed``'s run: the contrastive stage (``mlmkit.embed.stage``), then
``<run dir>/final/``, a sentence-transformers folder with its model card, and ``results.json``.

``final/`` is what sentence-transformers saves (the encoder's config.json, model.safetensors and
tokenizer, ``modules.json``, ``1_Pooling/``, ``sentence_bert_config.json``), written whole
under another name and renamed; ``SentenceTransformer("<run dir>/final")`` loads it with
nothing of mlmkit installed. Its README.md names the base model and run, the training data,
what was held out and the figures before and after.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlmkit.config import EmbedConfig
from mlmkit.embed.stage import quiet_libraries, train_embedder

OBJECTIVES = {
    "pairs": "in-batch negatives on pairs (MultipleNegativesRankingLoss: each anchor's positive "
    "against the other rows' positives{negatives})",
    "simcse": "unsupervised SimCSE (Gao et al., 2021): each sentence paired with itself, dropout "
    "the only difference, the other sentences of the batch its negatives",
    "same_document": "neighbouring sentences of one document as pairs, the other rows of the "
    "batch as negatives",
}


def embed(
    cfg: EmbedConfig, run_dir: str | os.PathLike, on_open: Callable[[Path], None] | None = None
) -> dict[str, Any]:
    """Train ``cfg``'s embedder in ``run_dir`` and write ``final/`` and ``results.json`` (main
    process); returns the summary, with ``final`` the folder written. ``on_open(run_dir)``: called
    once every check has passed, before anything is written there."""
    from accelerate import PartialState

    from mlmkit.training import lock, setup

    run_dir = Path(run_dir)
    try:
        model, summary = train_embedder(cfg, run_dir, on_open)
        summary["final"] = str(run_dir / "final")
        if PartialState().is_main_process:
            with quiet_libraries(cfg.progress):
                write_final(model, run_dir / "final", summary)
            (run_dir / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
        PartialState().wait_for_everyone()
    finally:
        # the run dir's lock, taken at the start (a refused run's lock file as it was)
        lock.release()
        setup.stop_logging()
    return summary


def write_final(model, path: Path, summary: dict[str, Any]) -> Path:
    """Save the ``SentenceTransformer`` to ``path`` with mlmkit's model card, atomically."""
    tmp = path.with_name(f".tmp-{path.name}")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save(str(tmp), create_model_card=False)
    (tmp / "README.md").write_text(embedder_card(summary))
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)
    return path


def _figure_rows(summary: dict[str, Any]) -> str:
    """Return the card's table of held-out figures, before and after the stage."""
    before, after = summary.get("before") or {}, summary.get("after") or {}
    names = list(dict.fromkeys([*after, *before]))
    if not names:
        return "No held-out data was given (sts_dir, retrieval_dir), so none was scored."

    def cell(figures: dict[str, float], key: str) -> str:
        return f"{figures[key]:.4f}" if key in figures else "-"

    rows = [f"| {k} | {cell(before, k)} | {cell(after, k)} |" for k in names]
    return "| figure | before | after |\n| --- | --- | --- |\n" + "\n".join(rows)


def embedder_card(summary: dict[str, Any]) -> str:
    """Return the README.md of an embedder's ``final/``."""
    data = summary["data"]
    negatives = ", and the hard negative of its row" if data.get("hard_negatives") else ""
    objective = OBJECTIVES[summary["objective"]].format(negatives=negatives)
    cached = summary["loss"] == "cached_mnrl"
    loss = (
        "CachedMultipleNegativesRankingLoss (gradient caching)"
        if cached
        else "MultipleNegativesRankingLoss"
    )
    dims = summary.get("matryoshka_dims") or []
    matryoshka = (
        f"; MatryoshkaLoss over the first {', '.join(map(str, dims))} dimensions" if dims else ""
    )
    held_out = "; ".join(summary["held_out"]) or "none given"
    base_run = f" (pretraining run {summary['base_run']})" if summary.get("base_run") else ""
    ended = "ended by max_time" if summary["stopped_by"] == "max_time" else "all it planned"
    return f"""---
library_name: sentence-transformers
pipeline_tag: sentence-similarity
tags: [sentence-transformers, sentence-similarity, feature-extraction, mlmkit]
---

# Sentence embedder (mlmkit embed)

A {summary["model_type"]} encoder fine-tuned by mlmkit as a sentence embedder: mean pooling of
the last layer's token states, {summary["dimension"]} dimensions, cosine similarity, inputs cut
at {summary["max_seq_length"]} tokens.

- Base model: {summary["checkpoint"]}{base_run}.
- Objective: {objective}; {loss}, scale {summary["scale"]}{matryoshka}.
- Data: {data["rows"]} training rows from {data["source"]}; {data["dropped"]} left out for sharing
  a text with the held-out data.
- Held out (never trained on): {held_out}.
- Training: {summary["steps"]} optimizer steps ({ended}), batch
  {summary["batch_size"]} per process x {summary["processes"]}, lr {summary["lr"]}, dropout
  {summary["dropout"] if summary["dropout"] is not None else "as the base model's config"},
  {summary["seconds"]} s.

## Held-out figures

{_figure_rows(summary)}

STS: Spearman and Pearson correlation of the cosine similarities with the gold scores;
retrieval: nDCG@10, recall@100 and MRR@10 (sentence-transformers' evaluators).

## Use

```python
from sentence_transformers import SentenceTransformer

model = SentenceTransformer("path/to/this/dir")
vectors = model.encode(["A man is playing a guitar.", "Someone plays the guitar."])
model.similarity(vectors[:1], vectors[1:])  # cosine similarity
```
"""
