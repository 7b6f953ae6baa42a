"""Tokenizers: load a Hugging Face tokenizer, or train one (WordPiece, BPE, Unigram) and
cache it. ``mlmkit tokenizer`` (``mlmkit.cli.tokenizer``) trains one as a command."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from mlmkit.config import TokenizerConfig
from mlmkit.data import cache, scripts
from mlmkit.data.vocab import extend_tokenizer
from mlmkit.errors import ConfigError, TokenizerError

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
REQUIRED = ("cls_token", "sep_token", "pad_token", "mask_token")


def check_special_tokens(tokenizer, source: str) -> None:
    """Fail with one sentence if the tokenizer lacks a token BERT pretraining needs."""
    vocab = tokenizer.get_vocab()
    missing = [
        name
        for name in REQUIRED
        if getattr(tokenizer, name, None) is None or str(getattr(tokenizer, name)) not in vocab
    ]
    if missing and source.startswith("model.init_from"):
        names = ", ".join(name.replace("_token", "").upper() for name in missing)
        raise TokenizerError(
            f"The tokenizer of {source} has no {names} token, which masked-language-model "
            "training needs; add it to that tokenizer (its mask token is the one the model was "
            "pretrained with), or point tokenizer.name_or_path at the same vocabulary's tokenizer "
            "that has it."
        )
    if missing:
        names = ", ".join(name.replace("_token", "").upper() for name in missing)
        raise TokenizerError(
            f"The tokenizer from {source} has no {names} token; masked-language-model "
            "pretraining needs [CLS], [SEP], [PAD] and [MASK]: point tokenizer.name_or_path "
            "at a BERT-style tokenizer, or set it to null to train one."
        )
    if not getattr(tokenizer, "is_fast", False):
        raise TokenizerError(
            f"The tokenizer from {source} is not a fast (Rust) tokenizer; set "
            "tokenizer.name_or_path to a dir with a tokenizer.json."
        )


def load_tokenizer(name_or_path: str, setting: str = "tokenizer.name_or_path"):
    """Load a tokenizer from a local dir or a hub name, with one clear error on failure."""
    from transformers import AutoTokenizer

    local = Path(name_or_path).expanduser()
    looks_local = local.exists() or name_or_path.startswith((".", "/", "~"))
    if looks_local and not local.is_dir():
        raise TokenizerError(f"{setting}={name_or_path!r} is not a directory.")
    if looks_local and not any(
        (local / f).is_file() for f in ("tokenizer.json", "vocab.txt", "tokenizer_config.json")
    ):
        raise TokenizerError(
            f"{setting}={name_or_path!r} holds no tokenizer (no tokenizer.json, vocab.txt or "
            "tokenizer_config.json); point it at a saved Hugging Face tokenizer dir."
        )
    if looks_local:  # before transformers reads it: no custom code
        from mlmkit.model.safety import refuse_custom_code

        refuse_custom_code(local, setting, TokenizerError)
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(local) if looks_local else name_or_path, trust_remote_code=False
        )
    except Exception as exc:  # OSError, ValueError, connection errors from the hub
        where = "the local dir" if looks_local else "the Hugging Face Hub (is it reachable?)"
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0].rstrip(".")
        raise TokenizerError(
            f"Could not load a tokenizer from {setting}={name_or_path!r} via {where} ({detail}); "
            "use a local tokenizer dir, or set tokenizer.name_or_path=null to train one."
        ) from None
    check_special_tokens(tokenizer, f"{setting}={name_or_path!r}")
    _mask_takes_its_space(tokenizer)
    return tokenizer


def _mask_takes_its_space(tokenizer) -> None:
    """Let the mask token take the space before it, as the released RoBERTa tokenizer's
    tokenizer.json sets it (``lstrip``): transformers 5 builds a byte-level BPE from
    vocab.json and merges.txt with a plain ``<mask>``, so "The <mask> is" became ``The``, ``Ġ``,
    ``<mask>``: a lone space token that pretraining never puts before a mask, in fill-mask's
    inputs and in the exported tokenizer. A tokenizer whose pre-tokenizer drops that space
    (WordPiece, SentencePiece's Metaspace) is left as it is."""
    mask = tokenizer.mask_token
    if mask is None:
        return
    added = tokenizer.added_tokens_decoder.get(tokenizer.mask_token_id)
    if added is None or getattr(added, "lstrip", True):
        return
    if len(tokenizer.tokenize(f"a {mask}")) <= len(tokenizer.tokenize("a")) + 1:
        return
    from tokenizers import AddedToken

    token = AddedToken(mask, lstrip=True, rstrip=False, normalized=False, special=True)
    tokenizer.add_special_tokens({"mask_token": token})


def tokenizer_fingerprint(tokenizer) -> str:
    """Hash everything that changes how text becomes ids."""
    state = tokenizer.backend_tokenizer.to_str()
    return hashlib.sha256(state.encode()).hexdigest()[:16]


def _limited(texts: Iterable[str], max_chars: int | None) -> Iterator[str]:
    seen = 0
    for text in texts:
        if not text:
            continue
        yield text
        seen += len(text)
        if max_chars is not None and seen >= max_chars:
            return


# Control and format characters are deleted, as BERT's clean-up does, but for the zero-width
# non-joiner and joiner: Persian, Urdu, Hindi and Malayalam spell with them.
_CLEAN = r"[\x{0}\x{FFFD}[\p{C}&&[^\t\n\r\x{200C}\x{200D}]]]"
SAMPLE_CHARS = 1_000_000  # the corpus sample checked before training


def _normalizer(cfg: TokenizerConfig):
    """Build the tokenizer's normaliser. Lowercasing keeps every mark; accents go only with
    tokenizer.strip_accents. WordPiece: BERT's, CJK ideographs spaced out as words of their own;
    BPE and Unigram: NFKC first."""
    from tokenizers import Regex, normalizers

    if cfg.algorithm == "wordpiece":
        steps = [
            normalizers.Replace(Regex(_CLEAN), ""),
            normalizers.BertNormalizer(
                clean_text=False,
                handle_chinese_chars=True,
                strip_accents=cfg.strip_accents,
                lowercase=cfg.lowercase,
            ),
        ]
    else:
        steps = [normalizers.NFKC()]
        if cfg.strip_accents:
            steps += [normalizers.NFD(), normalizers.StripAccents(), normalizers.NFC()]
        if cfg.lowercase:
            steps.append(normalizers.Lowercase())
    return normalizers.Sequence(steps)


def check_normalizer(cfg: TokenizerConfig, sample: list[str]) -> None:
    """Refuse tokenizer.strip_accents where it would delete letters (the vowel signs and
    viramas of Devanagari, Thai, ...); where it only drops accents, warn with their share."""
    if not cfg.strip_accents or not sample:
        return
    total, lost = scripts.lost_characters(_normalizer(cfg).normalize_str, sample)
    letters = scripts.letters_lost(lost)
    if sum(letters.values()) > 0.001 * total:
        raise ConfigError(
            "tokenizer.strip_accents=true would delete or change "
            f"{sum(letters.values()) / total:.1%} of the corpus's characters, letters of its "
            f"script or their marks ({scripts.describe(letters)}); set "
            "tokenizer.strip_accents=false."
        )
    if lost:
        log.warning(
            "tokenizer.strip_accents=true changes %.2f%% of the corpus's characters (%s), "
            "as BERT-uncased does; set tokenizer.strip_accents=false to keep them.",
            100 * sum(lost.values()) / total,
            scripts.describe(lost),
        )


def _wrap(backend):
    """Wrap a trained backend as a transformers fast tokenizer with BERT's specials and template:
    its tokenizer.json (normaliser included) is what loads again."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    if backend.get_vocab_size() <= len(SPECIAL_TOKENS):
        raise TokenizerError(
            "The training corpus yielded no tokens to build a vocabulary from; "
            "check data.train_files (or data.text_column)."
        )
    cls_id, sep_id = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )


def _backend_and_trainer(cfg: TokenizerConfig):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if cfg.algorithm == "wordpiece":  # BERT's WordPiece: split at spaces and punctuation, ## pieces
        backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece(prefix="##")
        trainer = trainers.WordPieceTrainer(
            vocab_size=cfg.vocab_size,
            min_frequency=cfg.min_frequency,
            special_tokens=SPECIAL_TOKENS,
            continuing_subword_prefix="##",
            show_progress=False,
        )
    elif cfg.algorithm == "bpe":  # byte-level BPE, as RoBERTa
        backend = Tokenizer(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=cfg.vocab_size,
            min_frequency=cfg.min_frequency,
            special_tokens=SPECIAL_TOKENS,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
    else:  # Unigram, as SentencePiece
        backend = Tokenizer(models.Unigram())
        backend.pre_tokenizer = pre_tokenizers.Metaspace()
        backend.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(
            vocab_size=cfg.vocab_size,
            special_tokens=SPECIAL_TOKENS,
            unk_token="[UNK]",
            show_progress=False,
        )
    backend.normalizer = _normalizer(cfg)
    return backend, trainer


def _with_sample(texts: Iterator[str], chars: int) -> tuple[list[str], Iterator[str]]:
    """Return the first ``chars`` characters' worth of ``texts``, and the whole stream again."""
    import itertools

    sample, seen = [], 0
    for text in texts:
        sample.append(text)
        seen += len(text)
        if seen >= chars:
            break
    return sample, itertools.chain(sample, texts)


def train_tokenizer(cfg: TokenizerConfig, texts: Iterable[str]):
    """Train the tokenizer ``cfg.algorithm`` names on ``texts`` (read once, as a stream),
    after checking its normaliser against the start of the corpus."""
    sample, stream = _with_sample(_limited(texts, cfg.max_train_chars), SAMPLE_CHARS)
    check_normalizer(cfg, sample)
    backend, trainer = _backend_and_trainer(cfg)
    backend.train_from_iterator(stream, trainer=trainer)
    tokenizer = _wrap(backend)
    check_special_tokens(tokenizer, f"{cfg.algorithm} training")
    return tokenizer


def unk_report(
    tokenizer,
    unk: int,
    tokens: int,
    texts: Iterable[str] = (),
    trained_here: bool = True,
    extended: int = 0,
) -> tuple[str, bool]:
    """``(sentence, whether it is a warning)`` on the [UNK] share of held-out text: above 1%
    it names the likely cause, from ``texts`` (a sample of the text) where given;
    ``trained_here``: the tokenizer was trained on this corpus (else loaded); ``extended``: the
    words ``tokenizer.extend_vocab`` added to a loaded one."""
    share = unk / max(tokens, 1)
    line = f"[UNK] is {share:.2%} of the tokens of the held-out text ({unk:,} of {tokens:,})"
    if share <= 0.01:
        return f"{line}.", False
    limit = getattr(tokenizer.backend_tokenizer.model, "max_input_chars_per_word", None)
    words, over = scripts.long_words(_pre_tokenized(tokenizer, texts), limit) if limit else (0, 0)
    if over and over >= 0.005 * words:
        cause = (
            f"{over / words:.1%} of its words run over {limit} characters without a space (a "
            "script written without spaces?), and WordPiece makes each one [UNK]: train "
            "tokenizer.algorithm=unigram or bpe"
        )
    elif trained_here:
        cause = (
            "characters too rare for the vocabulary, or, in WordPiece, words of over "
            f"{limit or 100} characters without a space (each one [UNK]); raise "
            "tokenizer.vocab_size or train tokenizer.algorithm=unigram"
        )
    elif extended:
        cause = (
            f"words the extended vocabulary still lacks (tokenizer.extend_vocab={extended} adds "
            "whole words; the others keep the old pieces, [UNK] where the old vocabulary lacks "
            "their characters): raise tokenizer.extend_vocab, or train a tokenizer on this corpus "
            "(tokenizer.name_or_path=null, without model.init_from)"
        )
    else:
        cause = (
            "characters or words the vocabulary lacks (a tokenizer made for other text): train one "
            "on this corpus (tokenizer.name_or_path=null, without model.init_from), or, continuing "
            "a model, add the corpus's words with tokenizer.extend_vocab"
        )
    return f"{line}: likely {cause}.", True


def _pre_tokenized(tokenizer, texts: Iterable[str]) -> Iterator[str]:
    """``texts`` as the tokenizer's normaliser and pre-tokenizer cut them into words, joined by
    spaces (WordPiece's normaliser spaces out CJK ideographs, for one)."""
    backend = tokenizer.backend_tokenizer
    for text in texts:
        norm = backend.normalizer.normalize_str(text) if backend.normalizer else text
        if backend.pre_tokenizer is not None:
            yield " ".join(w for w, _ in backend.pre_tokenizer.pre_tokenize_str(norm))
        else:
            yield norm


def get_tokenizer(
    cfg: TokenizerConfig,
    texts: Callable[[], Iterable[str]],
    corpus_fingerprint: str,
    cache_dir: str | os.PathLike,
    init_from: str | None = None,
):
    """Return a run's tokenizer: ``cfg.name_or_path``, else ``init_from``'s, else a trained one.

    ``texts`` is called only when a tokenizer must be trained; the trained tokenizer is
    stored under ``cache_dir/tokenizers/<key>``, the key covering the corpus and settings.
    """
    if cfg.name_or_path or init_from:
        base = load_base_tokenizer(cfg, init_from)
        if not cfg.extend_vocab:
            return base
        key = {
            "base": tokenizer_fingerprint(base),
            "corpus": corpus_fingerprint,
            "extend_vocab": cfg.extend_vocab,
            "min_frequency": cfg.min_frequency,
            "max_train_chars": cfg.max_train_chars,
            "kind": "extend-v1",
        }
        return _cached(
            key,
            cache_dir,
            lambda: extend_tokenizer(
                base, _limited(texts(), cfg.max_train_chars), cfg.extend_vocab, cfg.min_frequency
            )[0],
        )

    key = {
        "corpus": corpus_fingerprint,
        "vocab_size": cfg.vocab_size,
        "lowercase": cfg.lowercase,
        "strip_accents": cfg.strip_accents,
        "min_frequency": cfg.min_frequency,
        "max_train_chars": cfg.max_train_chars,
        "kind": f"{cfg.algorithm}-v2",
    }  # v2: lowercasing keeps marks

    def train():
        log.info(
            "Training a %s tokenizer (vocab %d) on the training corpus",
            cfg.algorithm,
            cfg.vocab_size,
        )
        return train_tokenizer(cfg, texts())

    return _cached(key, cache_dir, train)


def load_base_tokenizer(cfg: TokenizerConfig, init_from: str | None):
    """Load the tokenizer a run starts from: ``tokenizer.name_or_path``'s, else
    ``model.init_from``'s (the one ``tokenizer.extend_vocab`` extends)."""
    if cfg.name_or_path:
        return load_tokenizer(cfg.name_or_path)
    return load_tokenizer(init_from, setting="model.init_from")


def _cached(key: dict, cache_dir, make: Callable[[], object]):
    """Return the tokenizer cached under ``cache_dir/tokenizers/<hash of key>``, else ``make()``'s,
    cached."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    target = Path(cache_dir) / "tokenizers" / digest
    cache.remove_orphans(target.parent)
    cached = _load_cached(target)
    if cached is not None:
        return cached
    tokenizer = make()
    try:
        placed = cache.write_entry(target, lambda folder: tokenizer.save_pretrained(str(folder)))
    except Exception as exc:  # a full disk: OSError, or the Rust writer's own error
        raise ConfigError(
            f"Could not save the trained tokenizer under paths.cache_dir={str(cache_dir)!r} "
            f"({cache.reason(exc)}); free disk space there or set paths.cache_dir to another "
            "folder."
        ) from None
    if not placed:
        # Another process cached this key while this one trained. Training breaks ties between
        # equally frequent merges differently in each process, so take the cached one: every run
        # with these settings then tokenizes alike.
        cached = _load_cached(target)
        return tokenizer if cached is None else cached
    return tokenizer


def _load_cached(target: Path):
    """Return the tokenizer cached at ``target``, or None: there is none, or it was damaged (then
    deleted with a warning)."""
    if not (target / "tokenizer.json").is_file():
        return None
    damage = cache.damage(target)
    if damage is None:
        from transformers import AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(target), trust_remote_code=False)
            check_special_tokens(tokenizer, f"the tokenizer cache {str(target)!r}")
        except Exception as exc:  # a garbled file fails in json, the Rust parser or the checks
            damage = cache.reason(exc)
        else:
            log.info("Using cached tokenizer %s", target)
            return tokenizer
    cache.discard(target, "tokenizer", damage)
    return None
