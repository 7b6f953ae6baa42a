"""Fill the mask token in a sentence with a trained model ([MASK] for BERT, <mask> for RoBERTa).

mlmkit fill-mask outputs/my-run/final "The [MASK] of the function is returned."
mlmkit fill-mask outputs/continued-roberta/final "The <mask> of the function is returned."
"""

from __future__ import annotations

from pathlib import Path

from mlmkit.cli.errors import ArgumentParser
from mlmkit.errors import ConfigError, DataError

# the mask tokens of the families mlmkit trains (BERT's; RoBERTa's, XLM-R's, CamemBERT's)
MASK_TOKENS = ("[MASK]", "<mask>")


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
        other = next((m for m in MASK_TOKENS if m in text and m != mask), None)
        raise ConfigError(
            f"The text has no {mask} token to fill"
            + (f" ({other} is another model family's mask token)" if other else "")
            + f"; write this model's own, {mask}, where the word to predict goes."
        )
    if not 1 <= top_k <= len(fill.tokenizer):
        raise ConfigError(
            f"--top-k must be between 1 and the vocabulary size ({len(fill.tokenizer)}), "
            f"got {top_k}."
        )
    out = fill(text, top_k=top_k)
    return out[0] if out and isinstance(out[0], list) else out


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="mlmkit fill-mask", description=__doc__.split("\n")[0])
    parser.add_argument("model_dir", help="a model dir, e.g. outputs/<run>/final")
    parser.add_argument(
        "text", help="text with one mask token, the model's own: [MASK] (BERT), <mask> (RoBERTa)"
    )
    parser.add_argument("--top-k", type=int, default=5)
    args = parser.parse_args(argv)
    results = fill_mask(args.model_dir, args.text, args.top_k)
    for r in results:
        print(f"{r['score']:.4f}  {r['token_str']!s:<15} {r['sequence']}")
    return 0
