"""Documents to packed blocks of token ids (map mode; streaming is ``streaming.py``).

``pack_corpus(corpus, tokenizer, max_seq_length)`` tokenizes with the fast tokenizer
(``datasets.map``, batched, in parallel) and packs in the same pass. ``concatenate``: blocks
of exactly ``max_seq_length`` ids, ``[CLS] doc1 [SEP] doc2 [SEP] ... [SEP]``; documents
longer than a block run on into the next one, so no text is dropped except the tail of each
map batch that does not fill a block. ``line_by_line``: one ``[CLS] doc [SEP]`` per
document, longer ones split into several, padded at collation. ``prepare_datasets`` loads
(``sources.load_corpus``), packs and caches the result on disk, keyed by everything that
changes it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import weakref
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from mlmkit.config import DataConfig
from mlmkit.data import cache
from mlmkit.data.fingerprint import content, derive
from mlmkit.data.sources import PACK_VERSION, corpus_fingerprint, load_corpus
from mlmkit.data.tokenizer import tokenizer_fingerprint
from mlmkit.errors import DataError

if TYPE_CHECKING:
    import numpy as np
    import torch

log = logging.getLogger(__name__)


def pack_ids(
    docs: list[list[int]], cls_id: int, sep_id: int, max_seq_length: int
) -> list[list[int]]:
    """Concatenate documents (each followed by [SEP]) and cut into [CLS] ... [SEP] blocks.

    Every block has exactly ``max_seq_length`` ids; the tail that does not fill a block is
    dropped.
    """
    return pack_concat(docs, cls_id, sep_id, max_seq_length)[0].tolist()


def pack_concat(docs, cls_id: int, sep_id: int, max_seq_length: int, carry=()):
    """(blocks as an int32 array of shape [n, max_seq_length], the ids left over).

    ``carry`` (ids left over from the previous call) starts the stream, so a caller that
    passes the leftover back in loses no text at batch boundaries (streaming does).
    """
    import numpy as np

    body = max_seq_length - 2
    stream: list[int] = list(carry)
    for ids in docs:
        if ids:
            stream.extend(ids)
            stream.append(sep_id)
    n = len(stream) // body
    flat = np.asarray(stream, dtype=np.int32)
    blocks = np.empty((n, max_seq_length), dtype=np.int32)
    blocks[:, 0] = cls_id
    blocks[:, -1] = sep_id
    blocks[:, 1:-1] = flat[: n * body].reshape(n, body)
    return blocks, stream[n * body :]


def pack_lines(docs, cls_id: int, sep_id: int, max_seq_length: int) -> list[list[int]]:
    """One sequence per document, ``[CLS] doc [SEP]``; a longer document becomes several
    sequences (the last one shorter), never dropped and never merged with another."""
    body = max_seq_length - 2
    out = []
    for ids in docs:
        for i in range(0, len(ids), body):
            out.append([cls_id, *ids[i : i + body], sep_id])
    return out


_TEXT_BACKENDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def text_backend(tokenizer):
    """Return the tokenizer's Rust tokenizer, set to read a special token's string in the text
    ("[MASK]", "[CLS]" typed in a document) as plain text: a corpus never puts a special id
    where the model would be asked to predict text, or hide text from the masking."""
    backend = _TEXT_BACKENDS.get(tokenizer)
    if backend is None:
        from tokenizers import Tokenizer

        backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
        backend.encode_special_tokens = True
        _TEXT_BACKENDS[tokenizer] = backend
    return backend


def encode(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, without special tokens, offsets or masks (the fast path);
    special-token strings in the text are tokenized as text (``text_backend``)."""
    return [
        e.ids for e in text_backend(tokenizer).encode_batch_fast(texts, add_special_tokens=False)
    ]


PREDICTABLE_SAMPLE = 2000  # blocks looked at for a token that can be masked


def check_predictable(rows, tokenizer, setting: str) -> None:
    """Refuse data whose first blocks hold special tokens only (text of which the tokenizer
    knows nothing, [UNK] after [UNK]): no token could be masked, the loss would be 0 and the
    model would learn nothing."""
    import numpy as np

    special = np.asarray(sorted(set(tokenizer.all_special_ids)))
    for row in rows:
        ids = np.asarray(row).reshape(-1)
        if ids.size and not np.isin(ids, special).all():
            return
    raise DataError(
        f"{setting}: the text tokenizes to special tokens only "
        f"({', '.join(tokenizer.all_special_tokens)}), so no token can be masked and predicted; "
        "use a tokenizer that covers the text (tokenizer.name_or_path=null trains one on it), or "
        "add text."
    )


def id_rows(blocks, index: slice | list[int]) -> list[np.ndarray]:
    """Return rows ``index`` of a packed split's ``input_ids`` as numpy arrays, read from Arrow.

    None of datasets' torch or numpy formatters: datasets before 4.8.4 import
    ``torchvision.io.VideoReader`` in them, which torchvision 0.26 removed. Tensors are made where
    batches are collated."""
    import numpy as np

    column = blocks.with_format("arrow")[index]["input_ids"].combine_chunks()
    if len(column) == 0:
        return []
    offsets = column.offsets.to_numpy()
    ids = column.flatten().to_numpy().astype(np.int64)  # one writable copy for the rows
    return np.split(ids, offsets[1:-1] - offsets[0])


def _first_ids(blocks, max_blocks: int) -> torch.Tensor:
    """Return the first ``max_blocks`` of ``blocks`` (a packed split) as one flat tensor of ids."""
    import numpy as np
    import torch

    rows = id_rows(blocks, slice(0, max_blocks))
    return torch.from_numpy(np.concatenate(rows) if rows else np.zeros(0)).long()


def token_counts(train_set, tokenizer, max_blocks: int = 20_000) -> torch.Tensor:
    """How often each id occurs in the first ``max_blocks`` training blocks, special tokens
    counted 0 (one tensor of ``len(tokenizer)`` counts): the unigram output bias and the
    majority baseline come from them."""
    import torch

    counts = torch.bincount(_first_ids(train_set, max_blocks), minlength=len(tokenizer))[
        : len(tokenizer)
    ]
    counts[torch.tensor(tokenizer.all_special_ids, dtype=torch.long)] = 0
    return counts


def unk_tokens(blocks, tokenizer, max_blocks: int = 5_000) -> tuple[int, int]:
    """``([UNK] ids, ids that are not special tokens or [UNK])`` in the first ``max_blocks`` of
    ``blocks`` (a packed split)."""
    import torch

    ids = _first_ids(blocks, max_blocks)
    special = torch.tensor(tokenizer.all_special_ids, dtype=torch.long)
    unk = int((ids == tokenizer.unk_token_id).sum()) if tokenizer.unk_token_id is not None else 0
    return unk, unk + int((~torch.isin(ids, special)).sum())


def _tokenize_and_pack(
    batch: dict, tokenizer, max_seq_length: int, packing: str = "concatenate"
) -> dict:
    ids = encode(tokenizer, batch["text"])
    if packing == "line_by_line":
        return {
            "input_ids": pack_lines(
                ids, tokenizer.cls_token_id, tokenizer.sep_token_id, max_seq_length
            )
        }
    return {
        "input_ids": pack_concat(
            ids, tokenizer.cls_token_id, tokenizer.sep_token_id, max_seq_length
        )[0]
    }


def _auto_num_proc(n_docs: int, requested: int | None) -> int:
    if requested is not None:
        return requested
    if n_docs < 20_000:  # worker start-up costs more than it saves on small corpora
        return 1
    return max(1, min(8, os.cpu_count() or 1))


def pack_corpus(
    corpus,
    tokenizer,
    max_seq_length: int,
    num_proc: int | None = None,
    packing: str = "concatenate",
    cache_files: bool = True,
    key: str | None = None,
):
    """Tokenize and pack every split of ``corpus`` into blocks of ``max_seq_length`` ids.

    One pass per split (tokenize and pack in the same batch), int32 ids, no attention
    masks or token type ids: everything else is derived from the ids at collation. ``key``
    names the corpus (``sources.corpus_fingerprint``; by default a hash of its documents): each
    split's fingerprint, by which datasets names its cache of this step, derives from it.
    """
    import datasets

    if key is None:
        key = derive(*(content(ds["text"]) for ds in corpus.values()))

    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
    packed = {}
    for split, ds in corpus.items():
        procs = _auto_num_proc(len(ds), num_proc)
        if procs > 1:
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        packed[split] = ds.map(
            partial(
                _tokenize_and_pack,
                tokenizer=tokenizer,
                max_seq_length=max_seq_length,
                packing=packing,
            ),
            batched=True,
            batch_size=1000,
            num_proc=procs if procs > 1 else None,
            remove_columns=ds.column_names,
            features=features,
            load_from_cache_file=cache_files,
            new_fingerprint=derive(
                key,
                split,
                tokenizer_fingerprint(tokenizer),
                max_seq_length,
                packing,
                PACK_VERSION,
            ),
            desc=f"Tokenizing and packing {split}",
        )
    return datasets.DatasetDict(packed)


def cache_key(cfg: DataConfig, tokenizer, fingerprint: str | None = None) -> str:
    """Return the packed dataset's cache key: everything that changes the blocks."""

    key_src = json.dumps(
        {
            "corpus": fingerprint or corpus_fingerprint(cfg),
            "tokenizer": tokenizer_fingerprint(tokenizer),
            "max_seq_length": cfg.max_seq_length,
            "packing": "line_by_line"
            if cfg.packing == "line_by_line"
            else "concatenate",  # documents: the same blocks
            "pack": PACK_VERSION,
        },
        sort_keys=True,
    )
    return hashlib.sha256(key_src.encode()).hexdigest()[:16]


def _corpus_setting(cfg: DataConfig, split: str) -> str:
    """Return the setting that names the text of ``split``."""
    if split == "validation" and cfg.validation_files:
        return "data.validation_files"
    return {"files": "data.train_files", "hub": "data.hub_name", "mix": "data.sources"}.get(
        cfg.source, "data.source"
    )


def check_packed(packed, cfg: DataConfig) -> None:
    for split in ("train", "validation"):
        if len(packed[split]) == 0:
            setting = "data.train_files" if split == "train" else "data.validation_files"
            raise DataError(
                f"The {split} split packs into zero blocks of {cfg.max_seq_length} tokens; "
                f"add text ({setting}) or lower data.max_seq_length."
            )


def warn_small_validation(n_rows: int, batch_size: int) -> bool:
    """Warn (with the count) when the validation set is smaller than one batch."""
    if n_rows < batch_size:
        log.warning(
            "The validation set has %d sequences, fewer than one batch (%d): evaluation "
            "figures will be noisy; add validation text (data.validation_files or "
            "data.validation_split).",
            n_rows,
            batch_size,
        )
        return True
    return False


def prepare_datasets(
    cfg: DataConfig,
    tokenizer,
    cache_dir: str | os.PathLike,
    corpus=None,
    fingerprint: str | None = None,
):
    """Packed train/validation datasets, from the disk cache when nothing changed.

    The cache is written under a temporary name and renamed when complete, and only once
    both splits hold blocks, so an error or an interrupt never leaves a partial entry
    (``cache.write_entry``); a damaged entry is deleted with a warning and packed again.
    """
    key = cache_key(cfg, tokenizer, fingerprint)
    target = Path(cache_dir) / "data" / key
    packed = _load_cached(target) if cfg.cache else None
    if packed is None:
        if corpus is None:
            corpus = load_corpus(cfg)
        packed = pack_corpus(
            corpus,
            tokenizer,
            cfg.max_seq_length,
            cfg.num_proc,
            cfg.packing,
            key=fingerprint or corpus_fingerprint(cfg),
        )
        check_packed(packed, cfg)
        if cfg.cache:
            packed = _store(packed, target, cache_dir)
    check_packed(packed, cfg)
    for split in ("train", "validation"):
        check_predictable(
            packed[split][:PREDICTABLE_SAMPLE]["input_ids"], tokenizer, _corpus_setting(cfg, split)
        )
    if cfg.max_eval_samples is not None and len(packed["validation"]) > cfg.max_eval_samples:
        packed["validation"] = packed["validation"].select(
            range(cfg.max_eval_samples), new_fingerprint=derive(key, "first", cfg.max_eval_samples)
        )
    # rows as Python lists (no torch or numpy formatter of datasets'): tensors are made in the
    # collate function (datasets before 4.8.4 import torchvision.io.VideoReader in those
    # formatters, which torchvision 0.26 removed)
    return packed


def _load_cached(target: Path):
    """Return the packed dataset cached at ``target``, or None: there is none, or it was damaged
    (then deleted with a warning). Temporary folders of stopped preparations are removed."""
    import datasets

    cache.remove_orphans(target.parent)
    if not (target / "dataset_dict.json").is_file():
        return None
    damage = cache.damage(target)
    if damage is None:
        try:
            packed = datasets.load_from_disk(str(target))
        except Exception as exc:  # a cut or garbled Arrow file fails in pyarrow
            damage = cache.reason(exc)
        else:  # a file garbled after a whole record batch loads, with fewer rows
            damage = _missing_rows(packed, cache.read_info(target).get("rows", {}))
        if damage is None:
            log.info("Using cached packed dataset %s", target)
            return packed
    cache.discard(target, "packed dataset", damage)
    return None


def _store(packed, target: Path, cache_dir):
    """``packed`` written to the cache and read back from it (memory-mapped); on a full disk
    a warning, and ``packed`` as it is: the run trains from memory."""
    import datasets

    try:
        cache.write_entry(
            target,
            lambda folder: packed.save_to_disk(str(folder)),
            info={"rows": {split: len(ds) for split, ds in packed.items()}},
        )
    except OSError as exc:
        log.warning(
            "Could not cache the packed dataset under paths.cache_dir=%r (%s), so this "
            "run trains from memory; free disk space there or set paths.cache_dir to "
            "another folder.",
            str(cache_dir),
            cache.reason(exc),
        )
        return packed
    return datasets.load_from_disk(str(target))


def _missing_rows(packed, rows: dict[str, int]) -> str | None:
    for split, n in rows.items():
        found = len(packed[split]) if split in packed else 0
        if found != n:
            return f"its {split} split has {found} of {n} rows"
    return None
