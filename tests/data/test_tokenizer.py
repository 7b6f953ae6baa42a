"""Tokenizers: WordPiece training with BERT's specials, caching, loading, checks."""

from __future__ import annotations

import pytest

from mlmkit.config import TokenizerConfig
from mlmkit.data.tokenizer import get_tokenizer, load_tokenizer, tokenizer_fingerprint
from mlmkit.errors import TokenizerError

TEXTS = [
    f"The quick brown fox number {i} jumps over the lazy dog near the river bank."
    for i in range(300)
]


def test_trained_wordpiece_has_bert_specials_and_template(tokenizer):
    for tok in ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]"):
        assert tok in tokenizer.get_vocab()
    enc = tokenizer("Hello World")["input_ids"]
    assert enc[0] == tokenizer.cls_token_id and enc[-1] == tokenizer.sep_token_id
    assert tokenizer.decode(enc, skip_special_tokens=True) == "hello world"  # lowercased
    assert tokenizer.is_fast
    assert 1000 < len(tokenizer) <= 2000


def test_trained_tokenizer_is_cached(tmp_path):
    calls = []

    def texts():
        calls.append(1)
        return iter(TEXTS)

    cfg = TokenizerConfig(vocab_size=120, min_frequency=1)
    a = get_tokenizer(cfg, texts, "corpus-1", tmp_path)
    b = get_tokenizer(cfg, texts, "corpus-1", tmp_path)
    assert len(calls) == 1  # trained once, then loaded from the cache
    assert tokenizer_fingerprint(a) == tokenizer_fingerprint(b)
    get_tokenizer(cfg, texts, "corpus-2", tmp_path)  # another corpus: trained again
    assert len(calls) == 2


def test_load_from_local_dir_round_trip(tmp_path, tokenizer):
    tokenizer.save_pretrained(tmp_path / "tok")
    loaded = load_tokenizer(str(tmp_path / "tok"))
    assert loaded("a sentence")["input_ids"] == tokenizer("a sentence")["input_ids"]
    cfg = TokenizerConfig(name_or_path=str(tmp_path / "tok"))
    assert len(get_tokenizer(cfg, lambda: iter(()), "x", tmp_path)) == len(tokenizer)


def test_tokenizer_without_mask_is_refused(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "[PAD]": 1, "a": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]")
    tok.save_pretrained(tmp_path / "nomask")
    with pytest.raises(TokenizerError, match=r"\[MASK\]|MASK") as info:
        load_tokenizer(str(tmp_path / "nomask"))
    assert "tokenizer.name_or_path" in str(info.value)


def test_missing_dir_and_unreachable_hub_give_one_sentence(tmp_path):
    with pytest.raises(TokenizerError, match="tokenizer.name_or_path"):
        load_tokenizer(str(tmp_path / "does-not-exist"))
    # HF_HUB_OFFLINE=1 in the tests: a hub name cannot be fetched
    with pytest.raises(TokenizerError, match="Hub"):
        load_tokenizer("some-org/some-tokenizer-that-is-not-cached")


@pytest.mark.parametrize("name", ["roberta-base", "xlm-roberta", "bert-base-multilingual-cased"])
def test_the_mask_token_takes_the_space_before_it_as_released(tmp_path, name):
    """RoBERTa's released vocab.json and merges.txt, loaded as mlmkit loads a tokenizer: "The
    <mask> is here." puts the mask right after "The", with no lone space token between (which
    transformers 5 leaves there), and the saved folder keeps it; the SentencePiece and
    WordPiece tokenizers already drop that space."""
    from conftest import shared_file

    folder = shared_file(f"tokenizers/{name}").resolve()
    tokenizer = load_tokenizer(str(folder))
    mask = tokenizer.mask_token
    ids = tokenizer(f"The {mask} is here.", add_special_tokens=False)["input_ids"]
    assert ids[1] == tokenizer.mask_token_id, tokenizer.convert_ids_to_tokens(ids)
    assert ids[2:] == tokenizer(" is here.", add_special_tokens=False)["input_ids"][-len(ids[2:]) :]
    tokenizer.save_pretrained(tmp_path)
    again = load_tokenizer(str(tmp_path))
    assert again(f"The {mask} is here.", add_special_tokens=False)["input_ids"] == ids
    assert len(again) == len(tokenizer)
