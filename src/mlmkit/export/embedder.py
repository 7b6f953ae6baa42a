"""The files that let sentence-transformers load an exported model dir as a sentence embedder.

sentence-transformers reads a model dir as a pipeline of modules listed in ``modules.json``:
here the transformer itself (its files are the dir's own config.json, model.safetensors and
tokenizer, at path ``""``) followed by mean pooling (``1_Pooling/config.json``): the mean of
the last layer's token states, padding excluded, the sentence vector that masked-token
pretraining trains (``mlmkit eval-sts`` scores the same vectors). ``sentence_bert_config.json``
holds the transformer module's settings (inputs longer than ``max_seq_length`` tokens are
cut), ``config_sentence_transformers.json`` the similarity the embeddings are meant for
(cosine). The dir's other readers (transformers' ``AutoModelForMaskedLM``,
``pipeline("fill-mask")``) ignore these files.

    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer("outputs/<run>/final")
    vectors = model.encode(["A man is playing a guitar.", "Someone plays the guitar."])
"""

from __future__ import annotations

import json
from pathlib import Path

POOLING_DIR = "1_Pooling"
# the module class names of the sentence-transformers format (the names every release reads)
TRANSFORMER_MODULE = "sentence_transformers.models.Transformer"
POOLING_MODULE = "sentence_transformers.models.Pooling"
POOLING_MODES = (
    "cls_token",
    "mean_tokens",
    "max_tokens",
    "mean_sqrt_len_tokens",
    "weightedmean_tokens",
    "lasttoken",
)


def embedder_files(
    hidden_size: int, max_seq_length: int, pooling: str = "mean_tokens"
) -> dict[str, dict | list]:
    """``{relative path: JSON content}`` of the sentence-transformers files."""
    if pooling not in POOLING_MODES:
        raise ValueError(f"pooling must be one of {', '.join(POOLING_MODES)}, got {pooling!r}")
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": TRANSFORMER_MODULE},
        {"idx": 1, "name": "1", "path": POOLING_DIR, "type": POOLING_MODULE},
    ]
    pooling_config = {
        "word_embedding_dimension": hidden_size,
        **{f"pooling_mode_{mode}": mode == pooling for mode in POOLING_MODES},
        "include_prompt": True,
    }
    return {
        "modules.json": modules,
        f"{POOLING_DIR}/config.json": pooling_config,
        "sentence_bert_config.json": {"max_seq_length": max_seq_length, "do_lower_case": False},
        "config_sentence_transformers.json": {
            "prompts": {},
            "default_prompt_name": None,
            "similarity_fn_name": "cosine",
        },
    }


def write_embedder_files(path: str | Path, hidden_size: int, max_seq_length: int) -> None:
    """Write the sentence-transformers files (mean pooling) into the model dir ``path``."""
    for name, content in embedder_files(hidden_size, max_seq_length).items():
        target = Path(path) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(content, indent=2) + "\n")
