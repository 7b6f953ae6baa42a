"""What a tokenizer does to the characters of a corpus, script by script.

A normaliser that strips accents removes every combining mark. In Latin, Greek or Cyrillic
text those are accents (``é`` -> ``e``), and in Arabic or Hebrew optional vowel points, but in
the abugidas of South and Southeast Asia (Devanagari, Bengali, Tamil, Thai, ...) the vowel
signs and viramas are letters: without them ``मनुष्यों`` becomes ``मनषयो``. ``lost_characters``
measures what a normaliser deletes from sample text; ``letters_lost`` picks out the marks that
are letters of their script.
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Iterable

# Scripts whose combining marks (vowel signs, viramas, tone marks) spell the words: deleting them
# deletes letters. Named by the first word of the Unicode character names.
ABUGIDAS = frozenset(
    {
        "DEVANAGARI",
        "BENGALI",
        "GURMUKHI",
        "GUJARATI",
        "ORIYA",
        "TAMIL",
        "TELUGU",
        "KANNADA",
        "MALAYALAM",
        "SINHALA",
        "THAI",
        "LAO",
        "TIBETAN",
        "MYANMAR",
        "KHMER",
        "BALINESE",
        "JAVANESE",
        "SUNDANESE",
        "LIMBU",
        "TAI",
        "NEW",
        "BUGINESE",
        "CHAKMA",
        "SHARADA",
        "TIRHUTA",
        "KAITHI",
        "GRANTHA",
        "AHOM",
        "CHAM",
        "MEETEI",
        "SYLOTI",
        "KAYAH",
        "BRAHMI",
        "SAURASHTRA",
        "REJANG",
        "BATAK",
        "LEPCHA",
        "MODI",
        "TAKRI",
        "KHOJKI",
        "DOGRA",
        "NANDINAGARI",
        "SIDDHAM",
        "NEWA",
        "BHAIKSUKI",
        "MARCHEN",
        "TAGALOG",
        "HANUNOO",
        "BUHID",
        "TAGBANWA",
        "KHUDAWADI",
        "MAHAJANI",
    }
)
# Kana whose voicing marks are part of the letter (が is not か): stripping them changes the word.
SYLLABARIES = frozenset({"HIRAGANA", "KATAKANA"})


def script_of(ch: str) -> str:
    """Return a character's script: the first word of its Unicode name ("DEVANAGARI"), or "?"."""
    return unicodedata.name(ch, "?").split(" ", 1)[0]


def _chars(text: str) -> Counter:
    """Return the characters of ``text``, composed (NFC) and lowercased, whitespace left out."""
    return Counter(c for c in unicodedata.normalize("NFC", text).lower() if not c.isspace())


def lost_characters(normalize, texts: Iterable[str]) -> tuple[int, Counter]:
    """``(characters in texts, Counter of those that normalize(text) no longer has)``, case
    and whitespace aside; a character changed into another counts as lost (``é`` -> ``e``).
    ``normalize``: a str -> str function, such as a tokenizers normaliser's ``normalize_str``."""
    total, lost = 0, Counter()
    for text in texts:
        before = _chars(text)
        total += sum(before.values())
        lost.update(before - _chars(normalize(text)))
    return total, lost


def letters_lost(lost: Counter) -> Counter:
    """Return the part of ``lost`` that are letters: the characters of an abugida (vowel signs,
    viramas, or a letter changed with its mark) and voiced kana (が -> か)."""
    return Counter({c: n for c, n in lost.items() if script_of(c) in ABUGIDAS | SYLLABARIES})


def describe(lost: Counter, top: int = 3) -> str:
    """Name the scripts of ``lost``, most first, with an example: "DEVANAGARI (U+094D ्), ..."."""
    by_script: Counter = Counter()
    example: dict[str, str] = {}
    for c, n in lost.most_common():
        script = script_of(c)
        by_script[script] += n
        example.setdefault(script, c)
    return ", ".join(
        f"{s.title()} (U+{ord(example[s]):04X} {example[s]})" for s, _ in by_script.most_common(top)
    )


def long_words(texts: Iterable[str], max_chars: int) -> tuple[int, int]:
    """``(words, words over max_chars characters)`` of texts split at whitespace: WordPiece
    turns each such word, typical of scripts written without spaces, into one [UNK]."""
    words = over = 0
    for text in texts:
        for word in text.split():
            words += 1
            over += len(word) > max_chars
    return words, over
