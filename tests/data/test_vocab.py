"""Vocabulary extension for continued pretraining: the words added, the embeddings grown."""

from __future__ import annotations

import pytest
import torch
from conftest import shared_file

from mlmkit.config import TokenizerConfig
from mlmkit.data.sources import builtin_documents
from mlmkit.data.tokenizer import train_tokenizer
from mlmkit.data.vocab import extend_tokenizer, tokens_per_word, word_counts
from mlmkit.errors import ConfigError


@pytest.fixture(scope="module")
def prose_tokenizer():
    """A WordPiece tokenizer of English prose (Moby Dick): the old vocabulary."""
    text = shared_file("corpora/gutenberg/melville-moby_dick.txt").read_text(encoding="utf-8")
    return train_tokenizer(TokenizerConfig(vocab_size=2000, max_train_chars=400_000), iter(text.split("\n\n")))


@pytest.fixture(scope="module")
def python_docs():
    return builtin_documents()[:1500]  # pydoc topics and docstrings: the new domain


def test_extension_adds_the_domain_words_that_save_the_most_tokens(prose_tokenizer, python_docs):
    extended, added = extend_tokenizer(prose_tokenizer, python_docs, 300)
    old, new = prose_tokenizer.get_vocab(), extended.get_vocab()
    assert 200 < len(added) <= 300 and len(new) == len(old) + len(added)
    assert all(new[t] == i for t, i in old.items())  # every old id keeps its meaning
    assert sorted(new[w] for w in added) == list(range(len(old), len(old) + len(added)))
    assert not set(added) & set(old)
    counts = word_counts(prose_tokenizer, python_docs)
    saved = [counts[w] * (len(prose_tokenizer(w, add_special_tokens=False)["input_ids"]) - 1) for w in added]
    assert saved == sorted(saved, reverse=True) and saved[-1] > 0  # ranked by the tokens they save
    for word in added[:20]:  # a new word is one token now
        assert extended(word, add_special_tokens=False)["input_ids"] == [new[word]]
    assert "return" in added or "def" in added or "module" in added  # Python's words, not Melville's
    before, after = tokens_per_word(prose_tokenizer, counts), tokens_per_word(extended, counts)
    assert after < 0.9 * before
    text = python_docs[0]  # the rest of the tokenization is the old one
    assert extended.decode(extended(text)["input_ids"], skip_special_tokens=True) == \
        prose_tokenizer.decode(prose_tokenizer(text)["input_ids"], skip_special_tokens=True)


def test_extension_needs_a_wordpiece_vocabulary(python_docs):
    unigram = train_tokenizer(TokenizerConfig(algorithm="unigram", vocab_size=200), iter(python_docs[:40]))
    with pytest.raises(ConfigError, match="tokenizer.extend_vocab=0"):
        extend_tokenizer(unigram, python_docs, 10)


@pytest.mark.parametrize("tied", [True, False])
def test_new_embeddings_start_from_the_mean_of_their_old_pieces(prose_tokenizer, python_docs, tied):
    """Each new row (and its output bias) starts as the mean of its old pieces'; a model whose
    output layer is untied from its embeddings is refused."""
    from transformers import BertConfig, BertForMaskedLM

    from mlmkit.model.bert import PADDED_VOCAB_BIAS, extend_embeddings

    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=len(prose_tokenizer), hidden_size=32, num_hidden_layers=1,
                                       num_attention_heads=2, intermediate_size=64, tie_word_embeddings=tied))
    extended, added = extend_tokenizer(prose_tokenizer, python_docs, 50)
    if not tied:
        with pytest.raises(ConfigError, match="untied: set tokenizer.extend_vocab=0"):
            extend_embeddings(model, extended, prose_tokenizer, multiple=64)
        return
    model.cls.predictions.bias.data.normal_()
    old_weight = model.get_input_embeddings().weight.detach().clone()
    old_bias = model.cls.predictions.bias.detach().clone()
    assert extend_embeddings(model, extended, prose_tokenizer, multiple=64) == len(added)
    weight, bias = model.get_input_embeddings().weight, model.cls.predictions.bias
    assert weight.shape[0] % 64 == 0 and weight.shape[0] >= len(extended)
    assert model.get_output_embeddings().weight.data_ptr() == weight.data_ptr()  # still tied
    assert torch.equal(weight[: len(prose_tokenizer)], old_weight) and torch.equal(bias[: len(prose_tokenizer)], old_bias)
    for word in added:
        pieces = prose_tokenizer(word, add_special_tokens=False)["input_ids"]
        i = extended.get_vocab()[word]
        torch.testing.assert_close(weight[i], old_weight[pieces].mean(0))
        torch.testing.assert_close(bias[i], old_bias[pieces].mean())
    assert (bias[len(extended):] == PADDED_VOCAB_BIAS).all()  # padding rows are never predicted
    ids = extended(python_docs[0][:200], return_tensors="pt")["input_ids"]
    assert model(ids).logits.shape[-1] == weight.shape[0]


def test_added_tokens_keep_their_ids_and_unknown_words_are_added(prose_tokenizer, python_docs):
    """Tokens added to a base outside its WordPiece vocabulary keep their ids (a rebuilt
    tokenizer would renumber them onto the new words), and a word the base makes one [UNK]
    is added too: it is recovered."""
    import copy

    base = copy.deepcopy(prose_tokenizer)
    base.add_tokens(["<foo>"])
    base.add_special_tokens({"additional_special_tokens": ["<doc>"]})
    texts = python_docs[:300] + ["a naïve café serves crème brûlée"] * 200
    extended, added = extend_tokenizer(base, texts, 200)
    old, new = base.get_vocab(), extended.get_vocab()
    assert all(new[t] == i for t, i in old.items()) and len(set(new.values())) == len(new)
    assert extended.convert_tokens_to_ids("<foo>") == old["<foo>"] and "<doc>" in extended.all_special_tokens
    assert extended.mask_token_id == base.mask_token_id
    unknown = [w for w in ("naïve", "café", "crème", "brûlée") if base(w, add_special_tokens=False)["input_ids"] == [base.unk_token_id]]
    assert unknown and set(unknown) <= set(added)
