"""Tiny released models of every encoder family, laid out as a released model folder is
(config.json, model.safetensors, tokenizer files), with the real released tokenizer where
../shared/data/tokenizers has one (RoBERTa's byte-level BPE, XLM-R's SentencePiece) and one of
its kind trained here otherwise (WordPiece for BERT, DistilBERT and ELECTRA; a Unigram with
SentencePiece's word marks for DeBERTa-v3, ALBERT and CamemBERT). No released weights are
used: each model is built from its config at a tiny size with a fixed seed."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

from conftest import SHARED_DATA

# every model type mlmkit continues, and the tokenizer its folder gets
FAMILY_TOKENIZERS = {
    "bert": "wordpiece",
    "roberta": "roberta-base",
    "xlm-roberta": "xlm-roberta",
    "camembert": "unigram",
    "deberta-v2": "unigram",
    "distilbert": "wordpiece",
    "albert": "unigram",
    "electra": "wordpiece",
}
SIZE = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2}

TEXT = (
    "The quick brown fox jumps over the lazy dog near the river bank. "
    "A stitch in time saves nine, and the early bird catches the worm. "
    "Rivers run to the sea, and the sea returns the rain to the hills. "
)


@functools.cache
def _converted(path: str):
    """A released tokenizer, converted to a fast one once per process (XLM-R's 250,000 pieces
    take seconds)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def shared_tokenizer(name: str):
    """Load a released tokenizer of ../shared/data/tokenizers, or skip with the reason."""
    import pytest

    path = SHARED_DATA / "tokenizers" / name
    if not path.is_dir():
        pytest.skip(f"reference data {path} is absent (../shared/data is laid beside the project)")
    return copy.deepcopy(_converted(str(path)))


def trained_tokenizer(kind: str, model_type: str):
    """Train a small tokenizer of ``kind`` (wordpiece | unigram) with the family's special
    tokens, as its released tokenizer class."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = [TEXT * 3] * 20
    if model_type == "camembert":
        special = {"cls_token": "<s>", "sep_token": "</s>", "pad_token": "<pad>"}
        special |= {"unk_token": "<unk>", "mask_token": "<mask>", "bos_token": "<s>"}
        special |= {"eos_token": "</s>"}
    else:
        special = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]"}
        special |= {"unk_token": "[UNK]", "mask_token": "[MASK]"}
    tokens = list(dict.fromkeys(special.values()))
    if kind == "wordpiece":
        backend = Tokenizer(models.WordPiece(unk_token=special["unk_token"]))
        backend.normalizer = normalizers.BertNormalizer(lowercase=True)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece(prefix="##")
        trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=tokens)
    else:
        backend = Tokenizer(models.Unigram())
        backend.pre_tokenizer = pre_tokenizers.Metaspace()
        backend.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(
            vocab_size=300, special_tokens=tokens, unk_token=special["unk_token"]
        )
    backend.train_from_iterator(corpus, trainer)
    cls, sep = special["cls_token"], special["sep_token"]
    from tokenizers import processors

    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, backend.token_to_id(cls)), (sep, backend.token_to_id(sep))],
    )
    wrapped = PreTrainedTokenizerFast(tokenizer_object=backend, **special)
    return wrapped


def family_tokenizer(model_type: str):
    """The tokenizer a tiny released model of ``model_type`` is built with."""
    kind = FAMILY_TOKENIZERS[model_type]
    if kind in ("wordpiece", "unigram"):
        return trained_tokenizer(kind, model_type)
    return shared_tokenizer(kind)


def family_config(model_type: str, tokenizer, **settings):
    """A tiny config of ``model_type`` for ``tokenizer``: examples/released_model.py's layout
    of the family at SIZE, 128 positions, 32 DeBERTa position buckets and embeddings 16 wide."""
    from transformers import AutoConfig

    hidden, layers, heads = SIZE.values()
    size = released_layout().family_settings(
        model_type, tokenizer, hidden, layers, heads, 64, positions=128, buckets=32
    )
    if "embedding_size" in size:  # ALBERT's and ELECTRA's factorised embeddings
        size["embedding_size"] = 16
    size.update(settings)
    return AutoConfig.for_model(model_type, **size)


@functools.cache
def released_layout():
    """examples/released_model.py, the layout users build a released-model folder with."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "examples" / "released_model.py"
    spec = importlib.util.spec_from_file_location("released_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def released_model(folder: Path, model_type: str, seed: int = 0, **settings) -> Path:
    """Save a tiny ``model_type`` masked-LM model and its tokenizer in ``folder`` as a released
    model folder is laid out; returns the folder."""
    import torch
    from transformers import AutoModelForMaskedLM

    tokenizer = family_tokenizer(model_type)
    torch.manual_seed(seed)
    model = AutoModelForMaskedLM.from_config(family_config(model_type, tokenizer, **settings))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
