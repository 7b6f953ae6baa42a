"""Fill the [MASK] in a sentence with a trained model.

mlmkit fill-mask outputs/my-run/final "The [MASK] of the function is returned."
"""

from __future__ import annotations

from pathlib import Path

from mlmkit.cli.errors import ArgumentParser
from mlmkit.errors import ConfigError, DataError


def fill_mask(model_dir: str, text: str, top_k: int = 5) -> list[dict]:
    from transformers import pipeline

    from mlmkit.data.tokenizer import load_tokenizer
    from mlmkit.model.architectures import fit_tokenizer
    from mlmkit.model.bert import load_pretrained

    path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise DataError(
            f"{model_dir!r} is not a model dir (no config.json); pass the final/ folder of a run."
        )
    # mlmkit's loaders: no custom code, weights from safetensors only, one sentence on failure
    model = load_pretrained(str(path), setting="model_dir")
    tokenizer = load_tokenizer(str(path), setting="model_dir")
    fit_tokenizer(tokenizer, model)
    fill = pipeline("fill-mask", model=model, tokenizer=tokenizer, trust_remote_code=False)
    mask = fill.tokenizer.mask_token
    if mask not in text:
        raise ConfigError(f"The text has no {mask} token to fill.")
    if not 1 <= top_k <= len(fill.tokenizer):
        raise ConfigError(
            f"--top-k must be between 1 and the vocabulary size ({len(fill.tokenizer)}), "
            f"got {top_k}."
        )
    out = fill(text, top_k=top_k)
    return out[0] if out and isinstance(out[0], list) else out


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="mlmkit fill-mask", description=__doc__.split("\n")[1])
    parser.add_argument("model_dir", help="a model dir, e.g. outputs/<run>/final")
    parser.add_argument("text", help="text with one [MASK]")
    parser.add_argument("--top-k", type=int, default=5)
    args = parser.parse_args(argv)
    results = fill_mask(args.model_dir, args.text, args.top_k)
    for r in results:
        print(f"{r['score']:.4f}  {r['token_str']!s:<15} {r['sequence']}")
    return 0
