"""Tokenizers keep every script: lowercasing never deletes marks, stripping accents is a
setting of its own (refused where the marks are letters), and the [UNK] share names its cause.

The sentences are Article 1 of the Universal Declaration of Human Rights in each language,
and the novel Sevasadan (../shared/data/corpora/hindi/) is the Hindi corpus."""

from __future__ import annotations

import logging

import pytest
from conftest import shared_file

from mlmkit.config import TokenizerConfig
from mlmkit.data.tokenizer import train_tokenizer, unk_report
from mlmkit.errors import ConfigError

UDHR = {
    "hindi": "सभी मनुष्यों को गौरव और अधिकारों के मामले में जन्मजात स्वतन्त्रता और समानता प्राप्त है।",
    "bengali": "সমস্ত মানুষ স্বাধীনভাবে সমান মর্যাদা এবং অধিকার নিয়ে জন্মগ্রহণ করে।",
    "tamil": "மனிதப் பிறவியினர் சகலரும் சுதந்திரமாகவே பிறக்கின்றனர்; அவர்கள் மதிப்பிலும் உரிமைகளிலும் சமமானவர்கள்.",
    "thai": "มนุษย์ทั้งหลายเกิดมามีอิสระและเสมอภาคกันในเกียรติศักดิ์และสิทธิ",
    "vietnamese": "Tất cả mọi người sinh ra đều được tự do và bình đẳng về nhân phẩm và quyền.",
    "german": "Alle Menschen sind frei und gleich an Würde und Rechten geboren.",
    "greek": "Όλοι οι άνθρωποι γεννιούνται ελεύθεροι και ίσοι στην αξιοπρέπεια και τα δικαιώματα.",
    "russian": "Все люди рождаются свободными и равными в своем достоинстве и правах.",
    "arabic": "يولد جميع الناس أحرارًا متساوين في الكرامة والحقوق.",
    "persian": "تمام افراد بشر آزاد به دنیا می\u200cآیند و از لحاظ حیثیت و حقوق با هم برابرند.",
    "chinese": "人人生而自由，在尊严和权利上一律平等。",
    "japanese": (
        "すべての人間は、生まれながらにして自由であり、かつ、尊厳と権利とについて平等である。"
    ),
    "korean": "모든 인간은 태어날 때부터 자유로우며 그 존엄과 권리에 있어 동등하다.",
}


def _hindi_lines() -> list[str]:
    text = shared_file("corpora/hindi/sevasadan.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip()]


def _same_text(a: str, b: str, form: str = "NFC") -> bool:
    """Equal, case and spacing aside (decoding spaces out punctuation and CJK ideographs), in
    Unicode normal form ``form``."""
    import unicodedata

    return "".join(unicodedata.normalize(form, a).lower().split()) == "".join(
        unicodedata.normalize(form, b).lower().split()
    )


@pytest.fixture(scope="module")
def hindi_lines():
    return _hindi_lines()


@pytest.mark.parametrize("algorithm", ["wordpiece", "unigram", "bpe"])
def test_a_trained_tokenizer_round_trips_every_script(algorithm, hindi_lines):
    """With the defaults (lowercase=true), every sentence comes back as it was written; the
    Hindi novel's held-out lines too (WordPiece BERT-uncased deleted their vowel signs). BPE
    and Unigram normalise to NFKC, as SentencePiece does: full-width punctuation comes back as
    its ASCII form."""
    form = "NFC" if algorithm == "wordpiece" else "NFKC"
    train, held_out = hindi_lines[:-200], hindi_lines[-200:]
    corpus = train[:4000] + [s for s in UDHR.values() for _ in range(3)]
    tok = train_tokenizer(
        TokenizerConfig(algorithm=algorithm, vocab_size=3000, min_frequency=1), iter(corpus)
    )
    for language, sentence in UDHR.items():
        ids = tok(sentence)["input_ids"]
        assert tok.unk_token_id not in ids, language
        assert _same_text(tok.decode(ids, skip_special_tokens=True), sentence, form), language
    kept = [
        _same_text(tok.decode(tok(line)["input_ids"], skip_special_tokens=True), line, form)
        for line in held_out
        if tok.unk_token_id not in tok(line)["input_ids"]
    ]
    assert len(kept) > 150 and all(kept)
    if algorithm == "wordpiece":  # the words of the issue, and the zero-width non-joiner of Persian
        for word in ("मनुष्यों", "स्वतन्त्रता", "Würde", "می\u200cآیند"):
            assert tok.backend_tokenizer.normalizer.normalize_str(word) == word.lower()


def test_strip_accents_is_refused_where_the_marks_are_letters(hindi_lines):
    with pytest.raises(ConfigError) as info:
        train_tokenizer(
            TokenizerConfig(vocab_size=500, strip_accents=True), iter(hindi_lines[:2000])
        )
    message = str(info.value)
    assert message.startswith("tokenizer.strip_accents=true would delete or change 1")  # about 19%
    assert "Devanagari" in message and message.endswith("set tokenizer.strip_accents=false.")


def test_strip_accents_is_refused_for_kana_whose_marks_voice_the_letter():
    with pytest.raises(ConfigError, match="Hiragana") as info:
        train_tokenizer(
            TokenizerConfig(vocab_size=200, min_frequency=1, strip_accents=True),
            iter([UDHR["japanese"]] * 30),
        )
    assert str(info.value).endswith("set tokenizer.strip_accents=false.")


@pytest.mark.parametrize("algorithm", ["wordpiece", "unigram"])
def test_strip_accents_on_latin_text_warns_with_the_share_it_changes(algorithm, caplog):
    texts = [UDHR["german"], UDHR["vietnamese"], "Le café est très bon."] * 20
    with caplog.at_level(logging.WARNING, logger="mlmkit.data.tokenizer"):
        tok = train_tokenizer(
            TokenizerConfig(
                algorithm=algorithm, vocab_size=300, min_frequency=1, strip_accents=True
            ),
            iter(texts),
        )
    (warning,) = [r.getMessage() for r in caplog.records if "strip_accents" in r.getMessage()]
    assert "tokenizer.strip_accents=true changes" in warning and "Latin" in warning
    share = float(warning.split("changes ")[1].split("%")[0])
    assert 5 < share < 20  # Vietnamese is dense with tone marks
    assert tok.backend_tokenizer.normalizer.normalize_str("Würde Tất") == "wurde tat"


def test_unk_share_above_one_percent_names_the_cause():
    """A script written without spaces gives WordPiece words of over 100 characters, each one
    [UNK]; a tokenizer of another script lacks the characters."""
    thai = [UDHR["thai"] * 3 for _ in range(30)]  # about 190 characters without a space
    tok = train_tokenizer(TokenizerConfig(vocab_size=300, min_frequency=1), iter(thai))
    ids = [i for t in thai for i in tok(t, add_special_tokens=False)["input_ids"]]
    unk = ids.count(tok.unk_token_id)
    line, warn = unk_report(tok, unk, len(ids), thai)
    assert warn and line.startswith("[UNK] is 100.00% of the tokens")
    assert (
        "run over 100 characters without a space" in line and "tokenizer.algorithm=unigram" in line
    )
    latin = train_tokenizer(
        TokenizerConfig(vocab_size=300, min_frequency=1), iter([UDHR["german"]] * 30)
    )
    ids = latin(UDHR["russian"], add_special_tokens=False)["input_ids"]
    line, warn = unk_report(
        latin, ids.count(latin.unk_token_id), len(ids), [UDHR["russian"]], trained_here=False
    )
    assert warn and "the vocabulary lacks" in line and "tokenizer.extend_vocab" in line
    line, warn = unk_report(latin, ids.count(latin.unk_token_id), len(ids), [UDHR["russian"]])
    assert warn and "too rare for the vocabulary" in line and "tokenizer.vocab_size" in line
    # Chinese has no spaces, but WordPiece's normaliser makes each ideograph a word: not a long-word
    # cause
    line, _ = unk_report(latin, 50, 1000, [UDHR["chinese"] * 10])
    assert "without a space (a script" not in line
    line, warn = unk_report(latin, 0, 1000)
    assert not warn and line == "[UNK] is 0.00% of the tokens of the held-out text (0 of 1,000)."
