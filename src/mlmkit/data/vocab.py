"""Vocabulary extension for continued pretraining (``tokenizer.extend_vocab``).

An existing BERT's WordPiece vocabulary splits the words of a new domain into many pieces
(``tokenization`` is one piece, ``subprocess`` three). ``extend_tokenizer`` trains a WordPiece
on the domain corpus, keeps the whole words it learned that the old vocabulary lacks, ranks
them by the tokens they save on the corpus (count x (old pieces - 1)), and adds the best ones
to the old vocabulary, after its last id: every old id keeps its meaning, and WordPiece's
longest match takes a new word whole. ``model.bert.extend_embeddings`` then grows the
embeddings and the tied output layer, each new row starting from the mean of the old pieces
of its word (a word the old vocabulary cannot spell, all [UNK]: from the average word's).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable

from mlmkit.errors import ConfigError

log = logging.getLogger(__name__)

SAMPLE_CHARS = 20_000_000  # the corpus read to count words and train the new pieces


def _backend_model_type(tokenizer) -> str:
    return json.loads(tokenizer.backend_tokenizer.to_str())["model"]["type"]


def word_counts(tokenizer, texts: Iterable[str]) -> Counter:
    """How often each word occurs, as the tokenizer's normaliser and pre-tokenizer cut them."""
    backend = tokenizer.backend_tokenizer
    counts: Counter = Counter()
    for text in texts:
        norm = backend.normalizer.normalize_str(text) if backend.normalizer else text
        words = (
            backend.pre_tokenizer.pre_tokenize_str(norm)
            if backend.pre_tokenizer
            else [(w, None) for w in norm.split()]
        )
        counts.update(w for w, _ in words)
    return counts


def tokens_per_word(tokenizer, counts: Counter) -> float:
    """Sub-tokens per word over ``counts`` (words weighted by their count)."""
    return coverage(tokenizer, counts)[0]


def coverage(tokenizer, counts: Counter) -> tuple[float, float]:
    """``(sub-tokens per word, the share of those that are [UNK])`` over ``counts`` (words
    weighted by their count): a vocabulary that cannot spell a script makes each of its words
    one [UNK], one token a word, so tokens per word alone hides it."""
    words = list(counts)
    pieces = tokenizer(words, add_special_tokens=False)["input_ids"] if words else []
    tokens = sum(len(ids) * counts[w] for ids, w in zip(pieces, words))
    unk = sum(ids.count(tokenizer.unk_token_id) * counts[w] for ids, w in zip(pieces, words))
    return tokens / max(sum(counts.values()), 1), unk / max(tokens, 1)


def extend_tokenizer(
    tokenizer,
    texts: Iterable[str],
    count: int,
    min_frequency: int = 2,
    sample_chars: int | None = SAMPLE_CHARS,
):
    """Return ``(extended tokenizer, the words added)``: at most ``count`` whole words of ``texts``,
    absent from ``tokenizer``'s WordPiece vocabulary, that save the most tokens there (a word it
    makes one [UNK] counts one token a use: it is recovered)."""
    kind = _backend_model_type(tokenizer)
    if kind != "WordPiece":
        raise ConfigError(
            f"tokenizer.extend_vocab adds words to a WordPiece vocabulary (BERT's), and this "
            f"tokenizer is {kind}; set tokenizer.extend_vocab=0."
        )
    sample, seen = _sample(texts, sample_chars)
    counts = word_counts(tokenizer, sample)
    vocab = tokenizer.get_vocab()
    candidates = _domain_words(tokenizer, sample, counts, count, min_frequency)
    pieces = tokenizer(candidates, add_special_tokens=False)["input_ids"] if candidates else []
    # tokens saved; a word that was one [UNK] saves none but is recovered: counted as one a use
    unk = tokenizer.unk_token_id
    saved = {
        w: counts[w] * max(len(p) - 1, 1)
        for w, p in zip(candidates, pieces)
        if len(p) > 1 or p == [unk]
    }
    added = sorted(saved, key=lambda w: (-saved[w], w))[:count]
    extended = _with_words(tokenizer, added)
    (before, unk_before), (after, unk_after) = (
        coverage(tokenizer, counts),
        coverage(extended, counts),
    )
    log.info(
        "Vocabulary extension: %d words added to the %d of model.init_from's tokenizer; on %.1fM "
        "characters of the corpus, tokens per word %.3f -> %.3f, [UNK] %.2f%% -> %.2f%% of the "
        "tokens",
        len(added),
        len(vocab),
        seen / 1e6,
        before,
        after,
        100 * unk_before,
        100 * unk_after,
    )
    return extended, added


def _sample(texts: Iterable[str], sample_chars: int | None) -> tuple[list[str], int]:
    """Return the first texts up to ``sample_chars`` characters (all: None) and their length."""
    sample, seen = [], 0
    for text in texts:
        if text:
            sample.append(text)
            seen += len(text)
        if sample_chars is not None and seen >= sample_chars:
            break
    return sample, seen


def _domain_words(tokenizer, sample: list[str], counts, count: int, min_frequency: int) -> list:
    """Return the whole words of new pieces learned on ``sample`` (with the old normaliser and
    pre-tokenizer) that ``tokenizer``'s vocabulary lacks and the sample uses often enough."""
    from tokenizers import Tokenizer, trainers

    vocab = tokenizer.get_vocab()
    learner = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    learner.post_processor = None
    trainer = trainers.WordPieceTrainer(
        vocab_size=max(4 * count, 1000),
        min_frequency=min_frequency,
        special_tokens=list(tokenizer.all_special_tokens),
        continuing_subword_prefix="##",
        show_progress=False,
    )
    learner.train_from_iterator(sample, trainer=trainer)
    return [
        w
        for w in learner.get_vocab()
        if not w.startswith("##") and w not in vocab and counts[w] >= min_frequency and len(w) > 1
    ]


def _with_words(tokenizer, added: list[str]):
    """Return a copy of ``tokenizer`` whose vocabulary ends with ``added``, every old token at its
    id; refused in one sentence where that cannot be."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    vocab = tokenizer.get_vocab()
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    for token in state.get("added_tokens", []):  # kept at their ids: added tokens outside the
        state["model"]["vocab"].setdefault(
            token["content"], token["id"]
        )  # vocab would be renumbered
    next_id = max(vocab.values()) + 1
    for i, word in enumerate(added):
        state["model"]["vocab"][word] = next_id + i
    extended = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(state)),
        unk_token=tokenizer.unk_token,
        cls_token=tokenizer.cls_token,
        sep_token=tokenizer.sep_token,
        pad_token=tokenizer.pad_token,
        mask_token=tokenizer.mask_token,
        extra_special_tokens=[
            str(t) for t in getattr(tokenizer, "extra_special_tokens", None) or []
        ],
        model_input_names=list(tokenizer.model_input_names),
        model_max_length=tokenizer.model_max_length,
    )
    new_vocab = extended.get_vocab()
    if any(new_vocab.get(t) != i for t, i in vocab.items()) or len(set(new_vocab.values())) != len(
        new_vocab
    ):
        raise ConfigError(
            "tokenizer.extend_vocab could not add words to this tokenizer without renumbering its "
            "tokens; set tokenizer.extend_vocab=0."
        )
    return extended
