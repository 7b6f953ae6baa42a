"""Masking strategies, checked statistically on real text (tens of thousands of tokens)."""

from __future__ import annotations

import pytest
import torch

from mlmkit.config import STRATEGIES, MaskingConfig
from mlmkit.data.packing import pack_ids
from mlmkit.data.sources import builtin_documents
from mlmkit.errors import ConfigError
from mlmkit.masking.collator import IGNORE_INDEX, MLMCollator


@pytest.fixture(scope="module")
def rows(tokenizer):
    """400 packed blocks of 128 real tokens from the built-in corpus (WordPiece ## words)."""
    docs = builtin_documents()[:600]
    enc = tokenizer(docs, add_special_tokens=False)["input_ids"]
    blocks = pack_ids(enc, tokenizer.cls_token_id, tokenizer.sep_token_id, 128)[:400]
    assert len(blocks) == 400
    return [{"input_ids": b} for b in blocks]


def _words(tokenizer, ids_row):
    """Word index per position by the ## rule (specials are words of their own)."""
    toks = tokenizer.convert_ids_to_tokens(ids_row)
    specials = set(tokenizer.all_special_tokens)
    word, out, prev = -1, [], None
    for t in toks:
        if not t.startswith("##") or prev in specials or t in specials:
            word += 1
        out.append(word)
        prev = t
    return out


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_share_split_and_specials(tokenizer, rows, strategy):
    batch = MLMCollator(tokenizer, seed=0, strategy=strategy)(rows)
    original = torch.tensor([r["input_ids"] for r in rows])
    chosen = batch["labels"] != IGNORE_INDEX
    specials = torch.isin(original, torch.tensor(tokenizer.all_special_ids))
    n_real = int((~specials).sum())
    share = int(chosen.sum()) / n_real
    tol = {"bernoulli": 0.006, "whole_word": 0.012, "span": 0.01, "fixed": 0.005}[strategy]
    assert abs(share - 0.15) < tol, share
    assert not chosen[specials].any()
    assert torch.equal(batch["labels"][chosen], original[chosen])
    masked = chosen & (batch["input_ids"] == tokenizer.mask_token_id)
    kept = chosen & (batch["input_ids"] == original)
    n = int(chosen.sum())
    # per-word and per-span decisions are coarser, so their split varies more
    tol_split = 0.02 if strategy in ("bernoulli", "fixed") else 0.05
    assert abs(masked.sum() / n - 0.8) < tol_split
    assert abs(kept.sum() / n - 0.1) < tol_split
    random = chosen & ~masked & ~kept
    assert not torch.isin(batch["input_ids"][random], torch.tensor(tokenizer.all_special_ids)).any()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_padding_never_chosen(tokenizer, strategy):
    rows = [
        {
            "input_ids": [tokenizer.cls_token_id]
            + list(range(200, 200 + n))
            + [tokenizer.sep_token_id]
        }
        for n in (5, 40, 90)
    ]
    batch = MLMCollator(tokenizer, mlm_probability=0.5, seed=1, strategy=strategy)(rows)
    pad = batch["attention_mask"] == 0
    assert pad.any()
    assert (batch["labels"][pad] == IGNORE_INDEX).all()


@pytest.mark.parametrize("strategy", ["whole_word", "span"])
def test_words_are_chosen_whole_with_one_decision(tokenizer, rows, strategy):
    batch = MLMCollator(tokenizer, seed=2, strategy=strategy)(rows[:100])
    split_words = 0
    multi_token_words = 0
    for r, labels, inputs in zip(rows[:100], batch["labels"], batch["input_ids"]):
        ids = r["input_ids"]
        words = _words(tokenizer, ids)
        by_word: dict[int, list[int]] = {}
        for pos, w in enumerate(words):
            by_word.setdefault(w, []).append(pos)
        for positions in by_word.values():
            if len(positions) < 2:
                continue
            flags = [bool(labels[p] != IGNORE_INDEX) for p in positions]
            if any(flags):
                multi_token_words += 1
                split_words += not all(flags)
                kinds = {
                    ("mask" if inputs[p] == tokenizer.mask_token_id else "other") for p in positions
                }
                assert len(kinds) == 1  # the 80-10-10 decision is made for the whole word
    assert multi_token_words > 20 and split_words == 0


def test_span_lengths_follow_the_clipped_geometric(tokenizer, rows):
    collator = MLMCollator(tokenizer, seed=3, strategy="span")
    batch = collator(rows)
    lengths = []
    for r, labels in zip(rows, batch["labels"]):
        words = _words(tokenizer, r["input_ids"])
        chosen_words = sorted({words[p] for p in range(len(words)) if labels[p] != IGNORE_INDEX})
        run = 1
        for a, b in zip(chosen_words, chosen_words[1:]):
            if b == a + 1:
                run += 1
            else:
                lengths.append(run)
                run = 1
        if chosen_words:
            lengths.append(run)
    mean = sum(lengths) / len(lengths)
    # SpanBERT's clipped geometric(0.2) has mean 3.8 words; adjacent spans merge and the
    # budget trims the last span, so the observed runs are a little longer or shorter
    assert 2.5 < mean < 5.0, mean
    assert max(lengths) > 5


def test_fixed_count_is_exact_and_constant_for_packed_rows(tokenizer, rows):
    batch = MLMCollator(tokenizer, mlm_probability=0.15, seed=4, strategy="fixed")(rows[:50])
    original = torch.tensor([r["input_ids"] for r in rows[:50]])
    inner_seps = (original[:, 1:-1] == tokenizer.sep_token_id).sum(dim=1)
    assert len(set(inner_seps.tolist())) > 1  # rows differ in real-token count...
    per_row = (batch["labels"] != IGNORE_INDEX).sum(dim=1)
    assert (per_row == round(0.15 * 126)).all()  # ...yet each predicts exactly the same count
    padded = MLMCollator(tokenizer, mlm_probability=0.5, seed=4, strategy="fixed")(
        [
            {"input_ids": [tokenizer.cls_token_id] + [300] * n + [tokenizer.sep_token_id]}
            for n in (4, 10)
        ]
    )
    assert (padded["labels"] != IGNORE_INDEX).sum(dim=1).tolist() == [2, 5]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_deterministic_from_seed(tokenizer, rows, strategy):
    a = MLMCollator(tokenizer, seed=5, strategy=strategy)(rows[:20])
    b = MLMCollator(tokenizer, seed=5, strategy=strategy)(rows[:20])
    c = MLMCollator(tokenizer, seed=6, strategy=strategy)(rows[:20])
    assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
    assert not torch.equal(a["labels"], c["labels"])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_masking_in_the_step_matches_the_dataloader_path(tokenizer, rows, strategy):
    """apply_mask=False + mask() (what on_device does) draws the same masks."""
    a = MLMCollator(tokenizer, seed=7, strategy=strategy)(rows[:16])
    pad_only = MLMCollator(tokenizer, seed=7, strategy=strategy, apply_mask=False)
    padded = pad_only(rows[:16])
    assert set(padded) == {"input_ids", "attention_mask"}
    masked, labels = pad_only.mask(padded["input_ids"], padded["attention_mask"])
    assert torch.equal(masked, a["input_ids"]) and torch.equal(labels, a["labels"])


@pytest.mark.parametrize("p", [0.3, 0.4])
def test_higher_rates(tokenizer, rows, p):
    batch = MLMCollator(tokenizer, mlm_probability=p, seed=8)(rows)
    original = torch.tensor([r["input_ids"] for r in rows])
    real = ~torch.isin(original, torch.tensor(tokenizer.all_special_ids))
    assert abs(int((batch["labels"] != IGNORE_INDEX).sum()) / int(real.sum()) - p) < 0.01


def test_rate_schedule_is_linear():
    m = MaskingConfig(mlm_probability=0.3, mlm_probability_end=0.15)
    assert m.probability_at(0, 101) == 0.3
    assert abs(m.probability_at(50, 101) - 0.225) < 1e-12
    assert abs(m.probability_at(100, 101) - 0.15) < 1e-12
    assert MaskingConfig().probability_at(77, 100) == 0.15


def test_bad_strategy_settings(tokenizer):
    with pytest.raises(ConfigError, match="strategy"):
        MLMCollator(tokenizer, strategy="random-words")
    with pytest.raises(ConfigError, match="span_p"):
        MaskingConfig(strategy="span", span_p=0.0)
    with pytest.raises(ConfigError, match="mlm_probability_end"):
        MaskingConfig(mlm_probability_end=1.2)


# -- scripts written without spaces ---------------------------------------------------------------

THAI = [
    "มนุษย์ทั้งหลายเกิดมามีอิสระและเสมอภาคกันในเกียรติศักดิ์และสิทธิ",
    "ทุกคนมีสิทธิในการดำรงชีวิตเสรีภาพและความมั่นคงแห่งตัวตน",
    "บุคคลใดจะถูกเหนี่ยวรั้งในภาวะทาสหรือภาวะจำยอมไม่ได้",
]
CHINESE = [
    "人人生而自由，在尊严和权利上一律平等。他们赋有理性和良心，并应以兄弟关系的精神相对待。",
    "人人有权享有生命、自由和人身安全。任何人不得使为奴隶或奴役；一切形式的奴隶制度和奴隶买卖，均应予以禁止。",
]


def _unspaced_rows(algorithm: str, texts: list[str], n: int = 300):
    from mlmkit.config import TokenizerConfig
    from mlmkit.data.tokenizer import train_tokenizer

    tok = train_tokenizer(
        TokenizerConfig(algorithm=algorithm, vocab_size=200, min_frequency=1), iter(texts * 20)
    )
    enc = tok([texts[i % len(texts)] for i in range(n)], add_special_tokens=False)["input_ids"]
    blocks = pack_ids(enc, tok.cls_token_id, tok.sep_token_id, 64)
    return tok, [{"input_ids": b} for b in blocks]


@pytest.mark.parametrize("algorithm", ["wordpiece", "unigram"])
@pytest.mark.parametrize("strategy", ["whole_word", "span"])
def test_a_clause_without_spaces_is_cut_into_words_of_at_most_max_word_tokens(algorithm, strategy):
    """A Thai clause is one pre-tokenized word of many sub-tokens: uncut, one choice
    masks all of them. Cut at masking.max_word_tokens, no word is longer, every word is
    masked whole, and the token share still averages mlm_probability."""
    tok, rows = _unspaced_rows(algorithm, THAI)
    uncut = MLMCollator(tok, seed=0, strategy=strategy, max_word_tokens=10**6)
    ids = torch.as_tensor([r["input_ids"] for r in rows])
    sizes = torch.bincount(
        uncut._word_ids(ids, uncut.continuation, uncut.special_lookup).reshape(-1)
    )
    assert sizes.max() >= 10  # the clause is one word of many sub-tokens

    collator = MLMCollator(tok, seed=0, strategy=strategy, max_word_tokens=4, mlm_probability=0.15)
    words = collator._word_ids(ids, collator.continuation, collator.special_lookup).reshape(-1)
    assert torch.bincount(words).max() <= 4
    shares = []
    for seed in range(4):
        collator = MLMCollator(
            tok, seed=seed, strategy=strategy, max_word_tokens=4, mlm_probability=0.15
        )
        batch = collator(rows)
        chosen = (batch["labels"] != IGNORE_INDEX).reshape(-1)
        real = ~collator.special_lookup[ids].reshape(-1)
        # a word (of at most 4 sub-tokens) is chosen whole or not at all
        per_word = torch.bincount(words, weights=chosen.float())
        size = torch.bincount(words, weights=real.float())
        assert torch.all((per_word == 0) | (per_word == size))
        shares.append(chosen.sum().item() / real.sum().item())
    assert abs(sum(shares) / len(shares) - 0.15) < 0.02, shares


def test_cjk_ideographs_start_words_in_a_unigram_vocabulary():
    """SentencePiece-style vocabularies mark a word's start with ▁, which Chinese, written
    without spaces, gives only once a sentence: each token of ideographs starts a word."""
    from mlmkit.masking.collator import continuation_lookup

    tok, rows = _unspaced_rows("unigram", CHINESE, n=40)
    cont = continuation_lookup(tok, len(tok))
    ids = torch.as_tensor([r["input_ids"] for r in rows])
    ideographs = [
        i for i in ids.reshape(-1).tolist() if "\u4e00" <= tok.decode([i]).strip()[:1] <= "\u9fff"
    ]
    assert len(ideographs) > 500 and not cont[ideographs].any()
    collator = MLMCollator(tok, seed=0, strategy="whole_word")
    words = collator._word_ids(ids, collator.continuation, collator.special_lookup)
    assert torch.bincount(words.reshape(-1)).float().mean() < 1.5  # about one token a word


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_masks_drawn_in_the_step_resume_from_the_checkpointed_generator(tokenizer, rows, strategy):
    """masking.on_device: the step masks from a generator of its own (on the device; here the
    CPU), whose state the loop state keeps, so a resumed run draws the masks it would have; and
    the masking waits for no host read (on a GPU each would be a wait for the device)."""
    from types import SimpleNamespace

    from host_reads import NoHostReads

    from mlmkit.training.state import TrainState

    def collator():
        return MLMCollator(tokenizer, seed=3, strategy=strategy, apply_mask=False)

    batches = [collator()(rows[i * 8 : (i + 1) * 8]) for i in range(3)]

    def loop_state(c):
        stub = SimpleNamespace(state_dict=dict, load_state_dict=lambda *a: None)
        return TrainState(
            SimpleNamespace(state_dict=dict, load_state_dict=lambda s: None),
            stub,
            c,
            rank=0,
            world=1,
            streaming=False,
        )

    first = collator()  # its first draw seeds the step's generator from the collator's (on the CPU)
    drawn = [first.mask_in_step(batches[0]["input_ids"], batches[0]["attention_mask"])]
    saved = loop_state(first).state_dict()
    assert saved["collator_step"][0] is not None
    with NoHostReads():
        drawn += [first.mask_in_step(b["input_ids"], b["attention_mask"]) for b in batches[1:]]
    resumed = collator()
    loop_state(resumed).load_state_dict(saved)
    again = [resumed.mask_in_step(b["input_ids"], b["attention_mask"]) for b in batches[1:]]
    for (ids, labels), (ids2, labels2) in zip(drawn[1:], again):
        assert torch.equal(ids, ids2) and torch.equal(labels, labels2)
    # a fresh collator of the same seed draws the same first masks; the step's draws are not
    # the dataloader's (another generator) but share their statistics
    assert torch.equal(collator().mask_in_step(batches[0]["input_ids"])[1], drawn[0][1])
    share = float((drawn[0][1] != IGNORE_INDEX).sum()) / float((batches[0]["input_ids"] > 4).sum())
    assert abs(share - 0.15) < 0.03
