"""Raw text to packed blocks of token ids.

Two steps, each usable on its own:

1. ``load_corpus(cfg)``: a ``datasets.DatasetDict`` with ``train`` and ``validation``
   splits of documents (one ``text`` column), from the built-in corpus or local files.
2. ``pack_corpus(corpus, tokenizer, max_seq_length)``: tokenize with the fast tokenizer
   (``datasets.map``, batched, in parallel) and pack the token stream into blocks of
   exactly ``max_seq_length`` ids: ``[CLS] doc1 [SEP] doc2 [SEP] ... [SEP]``. Documents
   longer than a block run on into the next one, so no text is dropped except the tail
   of each map batch that does not fill a block. Blocks need no padding.

``prepare_datasets`` does both and caches the packed result on disk, keyed by
everything that changes it.
"""

from __future__ import annotations

import ast
import glob
import hashlib
import json
import logging
import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from functools import partial
from pathlib import Path

from mlmkit.config import DataConfig
from mlmkit.errors import DataError

log = logging.getLogger(__name__)

SPLIT_SEED = 0  # the held-out validation split does not move with train.seed
PACK_VERSION = "concat-v1"
TEXT_EXTENSIONS = {".txt": "text", ".text": "text", ".jsonl": "json", ".json": "json",
                   ".parquet": "parquet", ".csv": "csv"}

# ----------------------------------------------------------------------------------------
# The built-in corpus: English prose shipped with every Python installation.
# ----------------------------------------------------------------------------------------

_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__",
              "lib2to3", "turtledemo", "ensurepip", "pydoc_data", "config-3"}
_MIN_DOCSTRING_CHARS = 200  # short docstrings are mostly signatures, not prose


def builtin_documents() -> list[str]:
    """The language-reference topics of ``pydoc_data`` and the standard library's docstrings.

    Docstrings are read with ``ast`` (no module is imported), in sorted file order, so the
    corpus is the same on every run of the same Python (about 1.7 MB on CPython 3.11).
    """
    from pydoc_data.topics import topics

    docs = [topics[key].strip() for key in sorted(topics)]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith((".", "config-")))
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            try:
                tree = ast.parse(Path(root, name).read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if doc and len(doc) >= _MIN_DOCSTRING_CHARS:
                        docs.append(doc.strip())
    return docs


# ----------------------------------------------------------------------------------------
# Local files
# ----------------------------------------------------------------------------------------


def resolve_files(patterns: list[str], setting: str) -> list[str]:
    """Expand paths and globs; every pattern must match at least one file."""
    files: list[str] = []
    for pattern in patterns:
        expanded = os.path.expanduser(str(pattern))
        matches = sorted(glob.glob(expanded, recursive=True)) if glob.has_magic(expanded) else [expanded]
        matches = [m for m in matches if os.path.isfile(m)]
        if not matches:
            raise DataError(f"{setting}: no file matches {pattern!r}.")
        for m in matches:
            ext = Path(m).suffix.lower()
            if ext not in TEXT_EXTENSIONS:
                raise DataError(
                    f"{setting}: {m!r} has extension {ext or '(none)'!r}; supported are "
                    f"{', '.join(sorted(TEXT_EXTENSIONS))}."
                )
        files.extend(matches)
    return files


def _file_stats(files: list[str]) -> list[tuple[str, int, int]]:
    return [(os.path.abspath(f), os.path.getsize(f), os.stat(f).st_mtime_ns) for f in files]


def _split_text(text: str, sample_by: str) -> list[str]:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if sample_by == "document":
        parts = [text]
    elif sample_by == "line":
        parts = text.split("\n")
    else:  # paragraph: blank-line separated; wrapped lines inside a paragraph are joined
        parts = [" ".join(p.split("\n")) for p in text.split("\n\n")]
    return [p.strip() for p in parts if p.strip()]


def _txt_generator(files: list[tuple[str, int, int]], sample_by: str) -> Iterator[dict]:
    for path, _size, _mtime in files:
        text = Path(path).read_bytes().decode("utf-8", errors="replace")
        bad = text.count("\ufffd")
        if bad:
            log.warning("%s: %d bytes are not valid UTF-8 and were replaced", path, bad)
        for part in _split_text(text, sample_by):
            yield {"text": part}


def _load_structured(builder: str, files: list[str], text_column: str, setting: str):
    import datasets

    kwargs = {}
    if builder == "json":
        kwargs["field"] = None
    try:
        ds = datasets.load_dataset(builder, data_files=files, split="train", **kwargs)
    except Exception as exc:
        raise DataError(f"{setting}: could not read {files[0]!r} as {builder}: "
                        f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}.") from None
    if text_column not in ds.column_names:
        raise DataError(
            f"{setting}: {files[0]!r} has no column {text_column!r} (columns: "
            f"{', '.join(ds.column_names)}); set data.text_column."
        )
    ds = ds.select_columns([text_column])
    if text_column != "text":
        ds = ds.rename_column(text_column, "text")
    ds = ds.filter(lambda batch: [bool(t and t.strip()) for t in batch["text"]], batched=True)
    return ds.cast_column("text", datasets.Value("string"))


def load_files(files: list[str], cfg: DataConfig, setting: str):
    """One ``datasets.Dataset`` of documents (``text`` column) from local files."""
    import datasets

    by_builder: dict[str, list[str]] = {}
    for f in files:
        by_builder.setdefault(TEXT_EXTENSIONS[Path(f).suffix.lower()], []).append(f)
    parts = []
    for builder, group in sorted(by_builder.items()):
        if builder == "text":
            for f in group:
                with open(f, "rb") as fh:
                    if b"\x00" in fh.read(8192):
                        raise DataError(
                            f"{setting}: {f!r} looks like a binary file (it contains NUL "
                            "bytes); list only text files."
                        )
            # The stats (size, mtime) are in gen_kwargs so that datasets' own cache of this
            # step is invalidated when a file changes.
            try:
                parts.append(datasets.Dataset.from_generator(
                    _txt_generator,
                    gen_kwargs={"files": _file_stats(group), "sample_by": cfg.txt_sample_by},
                    features=datasets.Features({"text": datasets.Value("string")}),
                ))
            except ValueError:  # datasets refuses a generator that yields nothing
                raise DataError(f"{setting}: {', '.join(map(repr, group))} hold no text.") from None
        else:
            parts.append(_load_structured(builder, group, cfg.text_column, setting))
    ds = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    if len(ds) == 0:
        raise DataError(f"{setting}: the files hold no text.")
    return ds


def load_corpus(cfg: DataConfig):
    """A DatasetDict of documents with ``train`` and ``validation`` splits."""
    import datasets

    if cfg.source == "builtin":
        train = datasets.Dataset.from_dict({"text": builtin_documents()})
        validation = None
    else:
        train = load_files(resolve_files(cfg.train_files, "data.train_files"), cfg, "data.train_files")
        validation = None
        if cfg.validation_files:
            validation = load_files(
                resolve_files(cfg.validation_files, "data.validation_files"), cfg,
                "data.validation_files",
            )
    if validation is None:
        if len(train) < 2:
            raise DataError(
                "The corpus has a single document, so no validation split can be held out; "
                "set data.validation_files, or data.txt_sample_by=paragraph."
            )
        split = train.train_test_split(test_size=cfg.validation_split, seed=SPLIT_SEED, shuffle=True)
        train, validation = split["train"], split["test"]
    return datasets.DatasetDict({"train": train, "validation": validation})


def corpus_fingerprint(cfg: DataConfig) -> str:
    """A hash of the corpus's identity: the files (with size and mtime) or the Python version."""
    if cfg.source == "builtin":
        ident = {"builtin": sys.version, "stdlib": sysconfig.get_paths()["stdlib"]}
    else:
        ident = {
            "train": _file_stats(resolve_files(cfg.train_files, "data.train_files")),
            "validation": _file_stats(resolve_files(cfg.validation_files, "data.validation_files"))
            if cfg.validation_files else None,
            "text_column": cfg.text_column,
            "txt_sample_by": cfg.txt_sample_by,
        }
    ident["validation_split"] = cfg.validation_split
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------------------
# Tokenize and pack
# ----------------------------------------------------------------------------------------


def pack_ids(docs: list[list[int]], cls_id: int, sep_id: int, max_seq_length: int) -> list[list[int]]:
    """Concatenate documents (each followed by [SEP]) and cut into [CLS] ... [SEP] blocks.

    Every block has exactly ``max_seq_length`` ids; the tail that does not fill a block is
    dropped.
    """
    body = max_seq_length - 2
    stream: list[int] = []
    for ids in docs:
        if ids:
            stream.extend(ids)
            stream.append(sep_id)
    n_blocks = len(stream) // body
    return [[cls_id, *stream[i * body:(i + 1) * body], sep_id] for i in range(n_blocks)]


def _tokenize_and_pack(batch: dict, tokenizer, max_seq_length: int) -> dict:
    enc = tokenizer(
        batch["text"], add_special_tokens=False, return_attention_mask=False,
        return_token_type_ids=False, verbose=False,
    )["input_ids"]
    return {"input_ids": pack_ids(enc, tokenizer.cls_token_id, tokenizer.sep_token_id, max_seq_length)}


def _auto_num_proc(n_docs: int, requested: int | None) -> int:
    if requested is not None:
        return requested
    if n_docs < 20_000:  # worker start-up costs more than it saves on small corpora
        return 1
    return max(1, min(8, os.cpu_count() or 1))


def pack_corpus(corpus, tokenizer, max_seq_length: int, num_proc: int | None = None):
    """Tokenize and pack every split of ``corpus`` into blocks of ``max_seq_length`` ids."""
    import datasets

    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
    packed = {}
    for split, ds in corpus.items():
        procs = _auto_num_proc(len(ds), num_proc)
        if procs > 1:
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        packed[split] = ds.map(
            partial(_tokenize_and_pack, tokenizer=tokenizer, max_seq_length=max_seq_length),
            batched=True,
            batch_size=1000,
            num_proc=procs if procs > 1 else None,
            remove_columns=ds.column_names,
            features=features,
            desc=f"Tokenizing and packing {split}",
        )
    return datasets.DatasetDict(packed)


def prepare_datasets(cfg: DataConfig, tokenizer, cache_dir: str | os.PathLike, corpus=None,
                     fingerprint: str | None = None):
    """Packed train/validation datasets, from the disk cache when nothing changed."""
    import datasets

    from mlmkit.tokenizer import tokenizer_fingerprint

    key_src = json.dumps({
        "corpus": fingerprint or corpus_fingerprint(cfg),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "max_seq_length": cfg.max_seq_length,
        "pack": PACK_VERSION,
    }, sort_keys=True)
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    target = Path(cache_dir) / "data" / key
    if cfg.cache and (target / "dataset_dict.json").is_file():
        log.info("Using cached packed dataset %s", target)
        packed = datasets.load_from_disk(str(target))
    else:
        if corpus is None:
            corpus = load_corpus(cfg)
        packed = pack_corpus(corpus, tokenizer, cfg.max_seq_length, cfg.num_proc)
        if cfg.cache:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=target.parent))
            try:
                packed.save_to_disk(str(tmp))
                os.replace(tmp, target)
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
            if (target / "dataset_dict.json").is_file():
                packed = datasets.load_from_disk(str(target))
    for split in ("train", "validation"):
        if len(packed[split]) == 0:
            setting = "data.train_files" if split == "train" else "data.validation_files"
            raise DataError(
                f"The {split} split packs into zero blocks of {cfg.max_seq_length} tokens; "
                f"add text ({setting}) or lower data.max_seq_length."
            )
    if cfg.max_eval_samples is not None and len(packed["validation"]) > cfg.max_eval_samples:
        packed["validation"] = packed["validation"].select(range(cfg.max_eval_samples))
    return packed.with_format("torch")
