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
    return train_tokenizer(
        TokenizerConfig(vocab_size=2000, max_train_chars=400_000), iter(text.split("\n\n"))
    )


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
    saved = [
        counts[w] * (len(prose_tokenizer(w, add_special_tokens=False)["input_ids"]) - 1)
        for w in added
    ]
    assert saved == sorted(saved, reverse=True) and saved[-1] > 0  # ranked by the tokens they save
    for word in added[:20]:  # a new word is one token now
        assert extended(word, add_special_tokens=False)["input_ids"] == [new[word]]
    assert (
        "return" in added or "def" in added or "module" in added
    )  # Python's words, not Melville's
    before, after = tokens_per_word(prose_tokenizer, counts), tokens_per_word(extended, counts)
    assert after < 0.9 * before
    text = python_docs[0]  # the rest of the tokenization is the old one
    assert extended.decode(
        extended(text)["input_ids"], skip_special_tokens=True
    ) == prose_tokenizer.decode(prose_tokenizer(text)["input_ids"], skip_special_tokens=True)


def test_extension_needs_a_wordpiece_vocabulary(python_docs):
    unigram = train_tokenizer(
        TokenizerConfig(algorithm="unigram", vocab_size=200), iter(python_docs[:40])
    )
    with pytest.raises(ConfigError, match="tokenizer.extend_vocab=0"):
        extend_tokenizer(unigram, python_docs, 10)


@pytest.mark.parametrize("tied", [True, False])
def test_new_embeddings_start_from_the_mean_of_their_old_pieces(prose_tokenizer, python_docs, tied):
    """Each new row (and its output bias) starts as the mean of its old pieces'; a model whose
    output layer is untied from its embeddings is refused."""
    from transformers import BertConfig, BertForMaskedLM

    from mlmkit.model.bert import PADDED_VOCAB_BIAS, extend_embeddings

    torch.manual_seed(0)
    model = BertForMaskedLM(
        BertConfig(
            vocab_size=len(prose_tokenizer),
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            tie_word_embeddings=tied,
        )
    )
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
    assert torch.equal(weight[: len(prose_tokenizer)], old_weight) and torch.equal(
        bias[: len(prose_tokenizer)], old_bias
    )
    for word in added:
        pieces = [
            j
            for j in prose_tokenizer(word, add_special_tokens=False)["input_ids"]
            if j != prose_tokenizer.unk_token_id
        ]
        i = extended.get_vocab()[word]
        torch.testing.assert_close(weight[i], old_weight[pieces].mean(0))
        torch.testing.assert_close(bias[i], old_bias[pieces].mean())
    assert (bias[len(extended) :] == PADDED_VOCAB_BIAS).all()  # padding rows are never predicted
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
    assert (
        extended.convert_tokens_to_ids("<foo>") == old["<foo>"]
        and "<doc>" in extended.all_special_tokens
    )
    assert extended.mask_token_id == base.mask_token_id
    unknown = [
        w
        for w in ("naïve", "café", "crème", "brûlée")
        if base(w, add_special_tokens=False)["input_ids"] == [base.unk_token_id]
    ]
    assert unknown and set(unknown) <= set(added)


@pytest.fixture(scope="module")
def hindi():
    return (
        shared_file("corpora/hindi/sevasadan.txt")
        .read_text(encoding="utf-8")[:300_000]
        .split("\n\n")
    )


def test_an_extension_reports_the_unk_share_before_and_after(prose_tokenizer, hindi):
    """Tokens per word hide a script the old vocabulary cannot spell (one [UNK] a word is one
    token a word): the log gives the [UNK] share too, and the run's [UNK] warning after an
    extension advises more of it, not to set it."""
    import logging

    from mlmkit.data.tokenizer import unk_report
    from mlmkit.data.vocab import coverage

    records, logger = [], logging.getLogger("mlmkit.data.vocab")
    handler, level = logging.Handler(), logger.level
    handler.emit = records.append
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        extended, added = extend_tokenizer(prose_tokenizer, hindi, 200)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    counts = word_counts(prose_tokenizer, hindi)
    (per_word, unk_before), (_, unk_after) = (
        coverage(prose_tokenizer, counts),
        coverage(extended, counts),
    )
    assert (
        per_word < 1.2 and unk_before > 0.8 and unk_after < unk_before - 0.2
    )  # [UNK] nearly every word
    (line,) = [r.getMessage() for r in records if "Vocabulary extension" in r.getMessage()]
    assert f"[UNK] {100 * unk_before:.2f}% -> {100 * unk_after:.2f}% of the tokens" in line, line
    ids = [i for row in extended(hindi[-50:], add_special_tokens=False)["input_ids"] for i in row]
    report, warn = unk_report(
        extended,
        ids.count(extended.unk_token_id),
        len(ids),
        hindi[-50:],
        trained_here=False,
        extended=200,
    )
    assert (
        warn and "raise tokenizer.extend_vocab" in report and "add the corpus's words" not in report
    )


def test_words_the_old_vocabulary_cannot_spell_start_as_its_average_word(prose_tokenizer, hindi):
    """Hindi words, all [UNK] to an English vocabulary: their rows start as the mean of its
    ordinary rows (no Devanagari among them), its special tokens' left out, not as [UNK]'s row
    (``unspelt="unk"``: the earlier start); a Latin word with one [UNK] piece keeps its others'
    mean."""
    from transformers import BertConfig, BertForMaskedLM

    from mlmkit.model.bert import extend_embeddings

    extended, added = extend_tokenizer(prose_tokenizer, hindi, 100)
    unk = prose_tokenizer.unk_token_id
    assert all(
        prose_tokenizer(w, add_special_tokens=False)["input_ids"] == [unk] for w in added[:20]
    )
    special = set(prose_tokenizer.all_special_ids)
    ordinary = [i for i in range(len(prose_tokenizer)) if i not in special]
    starts = {}
    for unspelt in ("average", "unk"):
        torch.manual_seed(0)
        model = BertForMaskedLM(
            BertConfig(
                vocab_size=len(prose_tokenizer),
                hidden_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=64,
            )
        )
        model.cls.predictions.bias.data.normal_()
        old_weight = model.get_input_embeddings().weight.detach().clone()
        old_bias = model.cls.predictions.bias.detach().clone()
        extend_embeddings(model, extended, prose_tokenizer, unspelt=unspelt)
        i = extended.get_vocab()[added[0]]
        starts[unspelt] = model.get_input_embeddings().weight[i].detach().clone()
        bias = model.cls.predictions.bias[i]
        if unspelt == "unk":
            assert torch.equal(starts["unk"], old_weight[unk]) and bias == old_bias[unk]
        else:
            torch.testing.assert_close(starts["average"], old_weight[ordinary].mean(0))
            torch.testing.assert_close(bias, old_bias[ordinary].mean())
    assert not torch.allclose(starts["average"], starts["unk"])
