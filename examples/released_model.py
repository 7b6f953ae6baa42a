"""Lay out a masked-LM model of an encoder family as a released model folder is laid out
(config.json, model.safetensors, the tokenizer's files), from a seeded random init: something
``mlmkit train model.init_from=<folder>`` continues where no released weights can be
downloaded. It imports transformers alone, not mlmkit.

    python examples/released_model.py roberta ../shared/data/tokenizers/roberta-base out/roberta
    python examples/released_model.py xlm-roberta ../shared/data/tokenizers/xlm-roberta \
        out/xlmr --hidden 64 --ffn 256

The tokenizer folder is any one ``AutoTokenizer`` loads (../shared/data/tokenizers holds
RoBERTa's, XLM-R's and multilingual BERT's as released); the vocabulary is the tokenizer's, so
a 250,002-token XLM-R at width 64 is already 16 M parameters of embeddings.
"""

from __future__ import annotations

import argparse
from pathlib import Path

FAMILIES = (
    "roberta", "xlm-roberta", "camembert", "deberta-v2", "distilbert", "albert", "bert", "electra",
)  # fmt: skip


def family_settings(
    model_type: str, tokenizer, hidden: int, layers: int, heads: int, ffn: int,
    positions: int = 512, buckets: int = 256,
) -> dict:  # fmt: skip
    """Return the config settings of ``model_type`` at the given sizes for ``tokenizer`` (its
    vocabulary and special ids), the family's released layout otherwise: RoBERTa's ``positions``
    counted from ``padding_idx + 1``, DeBERTa-v3's relative attention in ``buckets`` position
    buckets, DistilBERT's own key names, ALBERT's and ELECTRA's embeddings as wide as the
    model."""
    vocab = max(tokenizer.get_vocab().values()) + 1
    size = {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "intermediate_size": ffn,
        "max_position_embeddings": positions,
        "pad_token_id": tokenizer.pad_token_id,
    }
    if model_type == "distilbert":
        size = {"dim": hidden, "n_layers": layers, "n_heads": heads, "hidden_dim": ffn}
        size |= {"vocab_size": vocab, "pad_token_id": tokenizer.pad_token_id}
        size["max_position_embeddings"] = positions
    if model_type in ("albert", "electra"):
        size["embedding_size"] = hidden
    if model_type in ("roberta", "xlm-roberta", "camembert"):
        # the tokens after the padding index and the row below it, as the released configs
        size["max_position_embeddings"] = positions + tokenizer.pad_token_id + 1
        size |= {"type_vocab_size": 1}
        size |= {"bos_token_id": tokenizer.cls_token_id, "eos_token_id": tokenizer.sep_token_id}
    if model_type == "deberta-v2":  # DeBERTa-v3's layout: relative attention, no absolute input
        size |= {"relative_attention": True, "position_buckets": buckets}
        size |= {"max_relative_positions": -1, "pos_att_type": ["p2c", "c2p"]}
        size |= {"position_biased_input": False, "norm_rel_ebd": "layer_norm"}
        size |= {"type_vocab_size": 0, "legacy": True}
    return size


def family_config(model_type: str, tokenizer, hidden: int, layers: int, heads: int, ffn: int):
    """Return a config of ``model_type`` at the given sizes for ``tokenizer`` (its settings:
    ``family_settings``)."""
    from transformers import AutoConfig

    settings = family_settings(model_type, tokenizer, hidden, layers, heads, ffn)
    return AutoConfig.for_model(model_type, **settings)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_type", choices=FAMILIES)
    p.add_argument("tokenizer", help="a tokenizer folder (AutoTokenizer.from_pretrained)")
    p.add_argument("out", type=Path, help="the model folder to write")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    config = family_config(
        args.model_type, tokenizer, args.hidden, args.layers, args.heads, args.ffn
    )
    torch.manual_seed(args.seed)
    model = AutoModelForMaskedLM.from_config(config)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"{args.out}: {type(model).__name__}, {params / 1e6:.1f} M parameters "
        f"(vocabulary {config.vocab_size:,} x width {args.hidden}), seed {args.seed}"
    )


if __name__ == "__main__":
    main()
