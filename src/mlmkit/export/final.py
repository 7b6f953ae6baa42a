"""Export a plain Hugging Face model dir: weights, config, tokenizer and a model card."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from mlmkit.export.embedder import write_embedder_files
from mlmkit.model.architectures import TITLES, ffn_size, parts_of
from mlmkit.model.bert import count_parameters
from mlmkit.training.runtime import save_model


def _origin_lines(config: dict[str, Any], summary: dict[str, Any]) -> str:
    """Return the card's lines on where the weights come from: the model continued, and for a
    phase's export (``phases/<name>/``) the phase, its settings, steps and tokens."""
    init_from = config.get("model", {}).get("init_from")
    lines = f"- Continued pretraining of: {init_from}.\n" if init_from else ""
    phase = config.get("phase")
    if phase:
        settings = (
            ", ".join(f"{k}={v}" for k, v in phase.get("set", {}).items())
            or "the run's own settings"
        )
        lines += (
            f"- Phase: {phase['name']} of a phased run ({phase['share']:.0%} of its budget, "
            f"learning rate {phase['schedule']}; {settings}): {summary.get('phase_steps')} steps, "
            f"{summary.get('phase_tokens')} tokens.\n"
        )
    return lines


def _usage_section(mask: str, hidden: int, length: int) -> str:
    """Return the card's "Use" section: fill-mask, the command line, sentence embeddings."""
    return f"""## Use

```python
from transformers import pipeline

fill = pipeline("fill-mask", model="path/to/this/dir")
fill("The {mask} of the function is returned.")
```

or from the command line: \
`mlmkit fill-mask path/to/this/dir "The {mask} of the function is returned."`

### Sentence embeddings

The dir is also a [sentence-transformers](https://www.sbert.net) model: the encoder followed by
mean pooling of the last layer's token states (padding excluded), {hidden} dimensions,
inputs cut at {length} tokens (`pip install sentence-transformers`).

```python
from sentence_transformers import SentenceTransformer

model = SentenceTransformer("path/to/this/dir")
vectors = model.encode(["A man is playing a guitar.", "Someone plays the guitar."])
model.similarity(vectors[:1], vectors[1:])  # cosine similarity
```

`mlmkit eval-sts checkpoint=path/to/this/dir data_dir=path/to/STS-B` scores these embeddings
zero-shot on STS-B."""


def _objective_lines(config: dict[str, Any], generator: bool) -> tuple[str, str]:
    """Return the card's objective (a phrase) and, for replaced-token detection, its paragraph
    on the discriminator and the generator (``generator``: written beside it)."""
    objective = config.get("objective") or {}
    if objective.get("name") != "rtd":
        return "masked language modeling", ""
    where = (
        "`generator/` in this dir is"
        if generator
        else "the run's `final/generator/` is (a checkpoint's export holds the discriminator only)"
    )
    return (
        "replaced-token detection (ELECTRA: Clark et al., 2020)",
        f"""
This dir is the discriminator: the encoder trained to tell, at every position, whether a small
generator replaced the token there (`objective=rtd`, generator size
{objective.get("generator_size")}, loss MLM + {objective.get("discriminator_weight")} x the
discriminator's). Fine-tune it, probe it or embed with it as any encoder. Its masked-LM head was
not trained, so fill-mask is the generator's: {where} a plain `ElectraForMaskedLM`
(`pipeline("fill-mask", model="<that dir>")`). The run's evaluations' masked-token figures are
the generator's, the `eval_rtd_*` ones the discriminator's.
""",
    )


def model_card(
    model, tokenizer, config: dict[str, Any], summary: dict[str, Any], generator: bool = False
) -> str:
    c = model.config
    mask = tokenizer.mask_token
    vocab = len(tokenizer)
    if c.vocab_size > vocab:  # rows padded for fast matmuls, never predicted
        vocab = f"{vocab} ({c.vocab_size} output rows, padded for fast matmuls)"
    metrics = "\n".join(
        f"| {k} | {v:.4f} |" if isinstance(v, float) else f"| {k} | {v} |"
        for k, v in summary.items()
    )
    data = config.get("data", {})
    source = data.get("source")
    family = TITLES.get(c.model_type, c.model_type)
    attention = ""
    if c.model_type == "modernbert":
        n_global = sum(kind == "full_attention" for kind in c.layer_types)
        attention = (
            f"; {n_global} global layers, the others attend within {c.local_attention} tokens, "
            "rotary positions, GeGLU FFN"
        )
    if source == "files":
        source = ", ".join(data.get("train_files", []))
    started = _origin_lines(config, summary)
    objective, discriminator = _objective_lines(config, generator)
    title = (
        "the discriminator of replaced-token detection"
        if discriminator
        else "masked language model"
    )
    unk = summary.get("validation_unk_share")
    unk_line = (
        f"- Tokenizer: {vocab} tokens; [UNK] is {unk:.2%} of the validation text's tokens.\n"
        if unk is not None
        else ""
    )
    return f"""---
library_name: transformers
pipeline_tag: fill-mask
tags: [{c.model_type}, fill-mask, mlmkit, sentence-transformers, feature-extraction]
---

# {config.get("model", {}).get("name", "bert")} ({title})

A {family} encoder pretrained with {objective} by mlmkit.
{discriminator}
- Objective: {objective}.
- Architecture: {type(model).__name__} (layers {c.num_hidden_layers}, hidden {c.hidden_size}, \
heads {c.num_attention_heads}, FFN {ffn_size(c)}, vocabulary {vocab}{attention}), \
{count_parameters(model) / 1e6:.2f}M parameters.
{started}- Data: {source}, blocks of {data.get("max_seq_length")} tokens.
{unk_line}- Training: {summary.get("step")} optimizer steps, \
{summary.get("tokens_seen")} tokens seen.

## Final evaluation (validation set, fixed masks)

| metric | value |
| --- | --- |
{metrics}

{_usage_section(mask, c.hidden_size, embedding_length(model, config))}

## Full config

```json
{json.dumps(config, indent=2, default=str)}
```
"""


def embedding_length(model, config: dict[str, Any]) -> int:
    """Return the longest input of the sentence embedder: the longest blocks the model was trained
    on (a phased run's longest phase)."""
    positions = parts_of(model).positions(model.config)  # RoBERTa's: 2 fewer than its rows
    trained = config.get("data", {}).get("max_seq_length") or positions
    for phase in config.get("phases") or []:
        trained = max(int(trained), int(phase.get("set", {}).get("data.max_seq_length") or 0))
    return min(int(trained), positions)


def without_tied_copies(model, state_dict: dict[str, Any]) -> dict[str, Any]:
    """``state_dict`` less the keys of parameters ``model`` ties to an earlier one.

    A sharded engine's gathered state dict holds tied weights (the decoder and the word
    embeddings) as separate copies, which ``save_pretrained`` would write twice; dropped
    here, the export is the same files an unsharded run writes.
    """
    first: dict[int, str] = {}
    aliases = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if first.setdefault(id(param), name) != name:
            aliases.add(name)
    return {k: v for k, v in state_dict.items() if k not in aliases}


def export_final(
    model,
    tokenizer,
    path: str | os.PathLike,
    config: dict[str, Any],
    summary: dict[str, Any],
    state_dict: dict[str, Any] | None = None,
    generator: tuple[Any, dict[str, Any]] | None = None,
) -> Path:
    """Write ``path`` (config.json, model.safetensors, tokenizer files, README.md, and the
    sentence-transformers files of ``export.embedder``) atomically.

    ``state_dict``: the full weights when the model itself is sharded (FSDP, DeepSpeed ZeRO-3);
    ``generator``: replaced-token detection's generator and its full weights, written to
    ``generator/`` inside ``path`` (``export_generator``).
    """
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tokenizer.model_max_length = parts_of(model).positions(model.config)
    # save_pretrained empties the dict it is given; the caller's may be written again (a phase's
    # export)
    save_model(
        model,
        tmp,
        safe_serialization=True,
        state_dict=dict(state_dict) if state_dict is not None else None,
    )
    tokenizer.save_pretrained(str(tmp))
    write_embedder_files(tmp, model.config.hidden_size, embedding_length(model, config))
    card = model_card(model, tokenizer, config, summary, generator=generator is not None)
    (tmp / "README.md").write_text(card)
    if generator is not None:
        export_generator(*generator, tokenizer, tmp / GENERATOR_DIR, config)
    if path.exists():
        shutil.rmtree(path)
    os.replace(tmp, path)
    return path


GENERATOR_DIR = "generator"  # replaced-token detection's generator, inside final/


def export_generator(generator, weights: dict[str, Any], tokenizer, path: Path, config) -> None:
    """Write replaced-token detection's generator to ``path`` as a plain fill-mask model dir
    (``ElectraForMaskedLM``: its embeddings, shared with the discriminator in training, stored in
    it as in any such model; its output layer tied to them), with the tokenizer and a card."""
    save_model(
        generator, path, safe_serialization=True, state_dict=without_tied_copies(generator, weights)
    )
    tokenizer.save_pretrained(str(path))
    c, name = generator.config, config.get("model", {}).get("name", "bert")
    millions = count_parameters(generator) / 1e6
    (path / "README.md").write_text(
        f"""---
library_name: transformers
pipeline_tag: fill-mask
tags: [electra, fill-mask, mlmkit]
---

# The generator of {name} (replaced-token detection)

The generator that mlmkit trained with the masked-LM loss beside the discriminator in the dir
above (`objective=rtd`; ELECTRA: Clark et al., 2020): its samples replaced the chosen tokens the
discriminator learned to detect. An `ElectraForMaskedLM` of {c.num_hidden_layers} layers, hidden
{c.hidden_size}, {c.num_attention_heads} head(s), FFN {c.intermediate_size}, embeddings
{c.embedding_size} wide (the discriminator's, shared in training), {millions:.2f}M parameters.

```python
from transformers import pipeline

fill = pipeline("fill-mask", model="path/to/this/dir")
fill("The {tokenizer.mask_token} of the function is returned.")
```
"""
    )
