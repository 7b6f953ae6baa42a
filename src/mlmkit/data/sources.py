"""Corpora as documents: ``load_corpus(cfg)`` gives a ``datasets.DatasetDict`` with ``train``
and ``validation`` splits (one ``text`` column) from the built-in corpus, local files
(text, JSON lines, Parquet, CSV), a Hugging Face dataset, or several of these interleaved
with weights; ``corpus_fingerprint`` names what was read, for the caches."""

from __future__ import annotations

import ast
import functools
import glob
import hashlib
import json
import logging
import os
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from mlmkit.config import DataConfig, SourceConfig
from mlmkit.data.fingerprint import derive, in_memory
from mlmkit.errors import DataError, MLMKitError, first_line

log = logging.getLogger(__name__)

SPLIT_SEED = 0  # the held-out validation split does not move with train.seed
PACK_VERSION = "v3"  # v3: special-token strings in the text are tokenized as text
# the documents read from .txt and .jsonl files: a change in how they are read changes this, so
# datasets' cache of what was read before is not taken for the new reading
READER_VERSION = "v1"
TEXT_EXTENSIONS = {
    ".txt": "text",
    ".text": "text",
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".csv": "csv",
}

# ----------------------------------------------------------------------------------------
# The built-in corpus: English prose shipped with every Python installation.
# ----------------------------------------------------------------------------------------

_SKIP_DIRS = {
    "site-packages",
    "dist-packages",
    "test",
    "tests",
    "idlelib",
    "__pycache__",
    "lib2to3",
    "turtledemo",
    "ensurepip",
    "pydoc_data",
    "config-3",
}
_MIN_DOCSTRING_CHARS = 200  # short docstrings are mostly signatures, not prose


def builtin_documents() -> list[str]:
    """Return the language-reference topics of ``pydoc_data`` and the standard library's docstrings.

    Docstrings are read with ``ast`` (no module is imported), in sorted file order, so the
    corpus is the same on every run of the same Python (about 1.7 MB on CPython 3.11). Read
    once per process (parsing the standard library takes a few seconds); each call returns a
    new list.
    """
    return list(_builtin_documents())


@functools.cache
def _builtin_documents() -> tuple[str, ...]:
    from pydoc_data.topics import topics

    docs = [topics[key].strip() for key in sorted(topics)]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(
            d for d in dirs if d not in _SKIP_DIRS and not d.startswith((".", "config-"))
        )
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            try:
                tree = ast.parse(Path(root, name).read_text(encoding="utf-8"))
            except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
                continue
            for node in ast.walk(tree):
                if isinstance(
                    node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
                ):
                    doc = ast.get_docstring(node)
                    if doc and len(doc) >= _MIN_DOCSTRING_CHARS:
                        docs.append(doc.strip())
    return tuple(docs)


# ----------------------------------------------------------------------------------------
# Local files
# ----------------------------------------------------------------------------------------


def resolve_files(patterns: list[str], setting: str) -> list[str]:
    """Expand paths and globs; every pattern must match at least one file."""
    files: list[str] = []
    for pattern in patterns:
        expanded = os.path.expanduser(str(pattern))
        matches = (
            sorted(glob.glob(expanded, recursive=True)) if glob.has_magic(expanded) else [expanded]
        )
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


def file_stats(files: list[str]) -> list[tuple[str, int, int]]:
    """Return each file's absolute path, size and modification time (what names its content)."""
    return [(os.path.abspath(f), os.path.getsize(f), os.stat(f).st_mtime_ns) for f in files]


MAX_LINE_BYTES = 1_000_000  # a line longer than this is cut (at a space) into documents


def _read_lines(path: str, start: int, stats: dict) -> Iterator[tuple[str, int, int, bool]]:
    """Yield (stripped line, its length in bytes, byte offset after it, whether it was cut) of a
    .txt file; a line longer than ``MAX_LINE_BYTES`` is cut at its last space."""
    with open(path, "rb") as fh:
        fh.seek(start)
        pos = start
        while True:
            raw = fh.readline(MAX_LINE_BYTES)
            if not raw:
                return
            cut = not raw.endswith(b"\n") and len(raw) == MAX_LINE_BYTES
            if cut:  # back off to the last space so no word or UTF-8 character is split
                space = raw.rfind(b" ")
                if space > 0:
                    fh.seek(pos + space + 1)
                    raw = raw[: space + 1]
                stats["cut"] = stats.get("cut", 0) + 1
            pos += len(raw)
            line = raw.decode("utf-8", errors="replace")
            if "\ufffd" in line:
                stats["bad_bytes"] = stats.get("bad_bytes", 0) + line.count("\ufffd")
            yield line.strip(), len(raw), pos, cut


def iter_txt(
    path: str, sample_by: str, start: int = 0, stats: dict | None = None
) -> Iterator[tuple[str, int]]:
    """Yield the documents of a .txt file with the byte offset after each, read line by line.

    Memory stays bounded whatever the file: a line longer than ``MAX_LINE_BYTES`` (say a
    50 MB file without a newline) is cut at a space into several documents, and so is a
    paragraph or a whole-file document grown past that size. Bytes that are not UTF-8 are
    replaced; ``stats`` counts them (``bad_bytes``) and the cuts (``cut``).
    """
    stats = stats if stats is not None else {}
    parts: list[str] = []
    size, pos = 0, start
    for line, n_bytes, pos, cut in _read_lines(path, start, stats):
        if sample_by == "line" or cut:
            if parts and sample_by != "line":  # a cut line closes the paragraph before it
                yield " ".join(parts), pos - n_bytes
                parts, size = [], 0
            if line:
                yield line, pos
            continue
        if not line:
            if parts and sample_by == "paragraph":
                yield " ".join(parts), pos
                parts, size = [], 0
            continue
        parts.append(line)
        size += len(line)
        if size >= MAX_LINE_BYTES:
            stats["cut"] = stats.get("cut", 0) + 1
            yield " ".join(parts), pos
            parts, size = [], 0
    if parts:
        yield " ".join(parts), pos


def warn_txt_stats(path: str, stats: dict) -> None:
    """One warning line per problem, with the count."""
    if stats.get("bad_bytes"):
        log.warning("%s: %d bytes are not valid UTF-8 and were replaced", path, stats["bad_bytes"])
    if stats.get("cut"):
        log.warning(
            "%s: %d lines or documents longer than %d bytes were cut into pieces",
            path,
            stats["cut"],
            MAX_LINE_BYTES,
        )


_BOMS = (
    (b"\xff\xfe\x00\x00", "UTF-32"),
    (b"\x00\x00\xfe\xff", "UTF-32"),  # before UTF-16's
    (b"\xff\xfe", "UTF-16"),
    (b"\xfe\xff", "UTF-16"),
)


def wide_encoding(head: bytes) -> str | None:
    """ "UTF-16" or "UTF-32" when the bytes ``head`` start with that encoding's byte-order
    mark, or look like UTF-16 without one (mostly ASCII text: a NUL in every other byte)."""
    for bom, name in _BOMS:
        if head.startswith(bom):
            return name
    if len(head) >= 16:
        even, odd = head[0::2], head[1::2]
        for zeros, chars in ((odd, even), (even, odd)):  # little- or big-endian
            printable = sum(32 <= b < 127 or b in (9, 10, 13) for b in chars)
            if zeros.count(0) >= 0.7 * len(zeros) and printable >= 0.9 * len(chars):
                return "UTF-16"
    return None


def check_not_binary(path: str, setting: str) -> None:
    """Refuse a file that is not UTF-8 text: UTF-16/UTF-32 (named), or binary (NUL bytes)."""
    with open(path, "rb") as fh:
        head = fh.read(8192)
    encoding = wide_encoding(head)
    if encoding:
        raise DataError(
            f"{setting}: {path!r} is {encoding} encoded; convert it to UTF-8 "
            f"(e.g. iconv -f {encoding} -t UTF-8)."
        )
    if b"\x00" in head:
        raise DataError(
            f"{setting}: {path!r} looks like a binary file (it contains NUL bytes); "
            "list only text files."
        )


# ----------------------------------------------------------------------------------------
# JSON lines and the type of a text column
# ----------------------------------------------------------------------------------------


def iter_jsonl(
    path: str, column: str, start: int = 0, stats: dict | None = None
) -> Iterator[tuple[str, int]]:
    """(text of ``column``, byte offset after its line) for each row of a .jsonl file.

    Lines that are not JSON objects, rows without the column and values that are not text
    are skipped and counted in ``stats`` (``bad_rows``, ``no_column``, ``not_text``).
    """
    stats = stats if stats is not None else {}
    pos = start
    with open(path, "rb") as fh:
        fh.seek(start)
        for raw in fh:
            pos += len(raw)
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except ValueError:
                row = None
            if not isinstance(row, dict):
                stats["bad_rows"] = stats.get("bad_rows", 0) + 1
                continue
            text = row.get(column)
            if text is None:
                stats["no_column"] = stats.get("no_column", 0) + 1
            elif not isinstance(text, str):
                stats["not_text"] = stats.get("not_text", 0) + 1
            elif text.strip():
                yield text.strip(), pos


def warn_jsonl_stats(path: str, column: str, stats: dict) -> None:
    """One warning with the counts of the rows ``iter_jsonl`` skipped."""
    if any(stats.get(k) for k in ("bad_rows", "no_column", "not_text")):
        log.warning(
            "%s: skipped %d lines that are not JSON objects, %d rows without the column %r "
            "and %d whose %r is not text",
            path,
            stats.get("bad_rows", 0),
            stats.get("no_column", 0),
            column,
            stats.get("not_text", 0),
            column,
        )


def _describe_value(value) -> str:
    if isinstance(value, bool):
        return "true/false values"
    if isinstance(value, (int, float)):
        return "numbers"
    if isinstance(value, dict):
        return "JSON objects"
    if isinstance(value, list):
        return "lists"
    return f"{type(value).__name__} values"


def _not_text(setting: str, path: str, column: str, what: str) -> DataError:
    return DataError(
        f"{setting}: the column {column!r} of {path!r} holds {what}, not text; set "
        "data.text_column to a column of text."
    )


def check_text_column(path: str, column: str, setting: str) -> None:
    """Refuse a .jsonl or .parquet file whose ``column`` is missing or holds no text (numbers,
    objects, ...): a .jsonl file by its first row with the column, a .parquet file by its
    schema. Other formats are checked when ``datasets`` reads them."""
    ext = Path(path).suffix.lower()
    if ext == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            schema = pq.read_schema(path)
        except Exception as exc:  # not Parquet, or cut short
            raise DataError(
                f"{setting}: could not read {path!r} as parquet "
                f"({first_line(exc)}); list only whole Parquet files."
            ) from None
        if column not in schema.names:
            raise DataError(
                f"{setting}: {path!r} has no column {column!r} (columns: "
                f"{', '.join(schema.names)}); set data.text_column."
            )
        kind = schema.field(column).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise _not_text(setting, path, column, f"{kind} values")
    elif ext == ".jsonl":
        keys = None  # the columns of the first row
        with open(path, "rb") as fh:
            for raw in fh:
                try:
                    row = json.loads(raw)
                except ValueError:
                    continue
                if isinstance(row, dict) and keys is None:
                    keys = list(row)
                if isinstance(row, dict) and row.get(column) is not None:
                    if not isinstance(row[column], str):
                        raise _not_text(setting, path, column, _describe_value(row[column]))
                    return
        if keys is not None:
            raise DataError(
                f"{setting}: {path!r} has no column {column!r} (columns: "
                f"{', '.join(keys)}); set data.text_column."
            )


def _txt_generator(files: list[tuple[str, int, int]], sample_by: str) -> Iterator[dict]:
    for path, _size, _mtime in files:
        stats: dict = {}
        for doc, _ in iter_txt(path, sample_by, stats=stats):
            yield {"text": doc}
        warn_txt_stats(path, stats)


def _jsonl_generator(files: list[tuple[str, int, int]], column: str) -> Iterator[dict]:
    for path, _size, _mtime in files:
        stats: dict = {}
        for doc, _ in iter_jsonl(path, column, stats=stats):
            yield {"text": doc}
        warn_jsonl_stats(path, column, stats)


def _offline_env() -> bool:
    return any(
        os.environ.get(k, "").lower() in ("1", "true", "yes", "on")
        for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def hub_error(name: str, config: str | None, exc: BaseException | None = None) -> DataError:
    """Return the one sentence for a hub dataset that cannot be loaded."""
    what = f"{name!r}" + (f" (config {config!r})" if config else "")
    if _offline_env():
        reason = "the Hub is switched off (HF_HUB_OFFLINE=1) and it is not in the local cache"
    elif not hub_reachable():
        reason = (
            "the Hugging Face Hub cannot be reached from this machine and it is not in the "
            "local cache"
        )
        exc = None
    else:
        reason = "the Hugging Face Hub does not have it or refused it"
    detail = ""
    if exc is not None and not _offline_env():
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:160].rstrip(".")
        detail = f" ({type(exc).__name__}: {first})"
    return DataError(
        f"Could not load the dataset {what}: {reason}{detail}; download it on a machine with "
        "internet and use data=files data.train_files=[...] (or data.hub_name=<local dataset "
        "dir>), or train on the built-in corpus with data=builtin."
    )


_REACHABLE: dict[str, bool] = {}


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hub's host answers a TCP connection within ``timeout`` (asked once)."""
    import socket
    from urllib.parse import urlparse

    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    if endpoint not in _REACHABLE:
        url = urlparse(endpoint)
        try:
            socket.create_connection(
                (url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=timeout
            ).close()
            _REACHABLE[endpoint] = True
        except OSError:
            _REACHABLE[endpoint] = False
    return _REACHABLE[endpoint]


def _offline_mode(on: bool):
    """Switch datasets and huggingface_hub to offline mode (cached data only) inside a block."""
    from contextlib import contextmanager

    @contextmanager
    def block():
        if not on:
            yield
            return
        import datasets.config
        import huggingface_hub.constants as hc

        saved = datasets.config.HF_HUB_OFFLINE, hc.HF_HUB_OFFLINE
        datasets.config.HF_HUB_OFFLINE = hc.HF_HUB_OFFLINE = True
        try:
            yield
        finally:
            datasets.config.HF_HUB_OFFLINE, hc.HF_HUB_OFFLINE = saved

    return block()


def load_hub(
    name: str,
    config: str | None,
    split: str,
    text_column: str,
    streaming: bool,
    setting: str = "data.hub_name",
):
    """Load a hub dataset (or a local dataset dir) reduced to one ``text`` column."""
    import datasets

    try:
        if any((Path(name) / f).is_file() for f in ("state.json", "dataset_dict.json")):
            ds = datasets.load_from_disk(name)
            if isinstance(ds, datasets.DatasetDict):
                ds = ds[split]
            if streaming:  # one stream shard per Arrow file, as the Hub's datasets have
                ds = ds.to_iterable_dataset(num_shards=max(1, len(ds.cache_files)))
        else:
            # An unreachable Hub is known in a second instead of after minutes of retries;
            # a dataset already in the local cache still loads.
            with _offline_mode(not _offline_env() and not hub_reachable()):
                ds = datasets.load_dataset(name, config, split=split, streaming=streaming)
    except MLMKitError:
        raise
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # connection, offline mode, missing dataset or config
        raise hub_error(name, config, exc) from None
    columns = ds.column_names or list((ds.features or {}).keys())
    if columns and text_column not in columns:
        raise DataError(
            f"{setting}: the dataset {name!r} has no column {text_column!r} (columns: "
            f"{', '.join(columns)}); set data.text_column."
        )
    return ds


def _load_structured(builder: str, files: list[str], text_column: str, setting: str):
    import datasets

    kwargs = {}
    if builder == "json":
        kwargs["field"] = None
    try:
        ds = datasets.load_dataset(builder, data_files=files, split="train", **kwargs)
    except Exception as exc:
        raise DataError(
            f"{setting}: could not read {files[0]!r} as {builder}: "
            f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}."
        ) from None
    if text_column not in ds.column_names:
        raise DataError(
            f"{setting}: {files[0]!r} has no column {text_column!r} (columns: "
            f"{', '.join(ds.column_names)}); set data.text_column."
        )
    feature = ds.features[text_column]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        kind = getattr(feature, "dtype", None) or type(feature).__name__.lower()
        raise _not_text(
            setting,
            files[0] if len(files) == 1 else ", ".join(files),
            text_column,
            f"{'objects' if kind in ('dict', 'struct') else kind} values",
        )
    return _text_only(ds, text_column, derive("files", builder, file_stats(files), text_column))


def load_files(files: list[str], cfg: DataConfig, setting: str):
    """One ``datasets.Dataset`` of documents (``text`` column) from local files."""
    import datasets

    by_builder: dict[str, list[str]] = {}
    for f in files:
        ext = Path(f).suffix.lower()
        by_builder.setdefault("jsonl" if ext == ".jsonl" else TEXT_EXTENSIONS[ext], []).append(f)
        if ext != ".parquet":
            check_not_binary(f, setting)
        check_text_column(f, cfg.text_column, setting)
    parts = []
    for builder, group in sorted(by_builder.items()):
        if builder in ("text", "jsonl"):  # read here: counted warnings for what is skipped
            # The stats (size, mtime) are in gen_kwargs so that datasets' own cache of this
            # step is invalidated when a file changes.
            generator, kwargs = (
                (_txt_generator, {"sample_by": cfg.txt_sample_by})
                if builder == "text"
                else (_jsonl_generator, {"column": cfg.text_column})
            )
            gen_kwargs = {"files": file_stats(group), **kwargs}
            try:
                parts.append(
                    datasets.Dataset.from_generator(
                        generator,
                        gen_kwargs=gen_kwargs,
                        features=datasets.Features({"text": datasets.Value("string")}),
                        fingerprint=derive("files", builder, gen_kwargs, READER_VERSION),
                    )
                )
            except ValueError:  # datasets refuses a generator that yields nothing
                raise DataError(
                    f"{setting}: {', '.join(map(repr, group))} "
                    f"hold{'s' if len(group) == 1 else ''} no text."
                ) from None
        else:
            parts.append(_load_structured(builder, group, cfg.text_column, setting))
    ds = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    if len(ds) == 0:
        raise DataError(f"{setting}: the files hold no text.")
    return ds


def _nonempty(batch: dict) -> list[bool]:
    return [bool(t and t.strip()) for t in batch["text"]]


def _text_only(ds, text_column: str, key: str):
    """Keep the text column (named ``text``), drop empty documents; ``key``: the fingerprint of
    what ``ds`` was read from, from which each step's is derived."""
    import datasets

    ds = ds.select_columns([text_column], new_fingerprint=derive(key, "select", text_column))
    if text_column != "text":
        ds = ds.rename_column(text_column, "text", new_fingerprint=derive(key, "rename"))
    ds = ds.filter(_nonempty, batched=True, new_fingerprint=derive(key, "nonempty"))
    return ds.cast_column("text", datasets.Value("string"), new_fingerprint=derive(key, "cast"))


def builtin_dataset():
    """Return the built-in corpus (``builtin_documents``) as a dataset of documents."""
    return in_memory(
        {"text": builtin_documents()},
        derive(_source_identity(SourceConfig(kind="builtin"), None), READER_VERSION),
    )


def load_source(src, cfg: DataConfig, setting: str):
    """Load the documents of one source of a mix (map mode)."""
    if src.kind == "builtin":
        return builtin_dataset()
    if src.kind == "hub":
        return _text_only(
            load_hub(src.name, src.config, src.split, src.text_column, False, setting),
            src.text_column,
            derive(_source_identity(src, cfg)),
        )
    from dataclasses import replace

    return load_files(
        resolve_files(src.files, setting), replace(cfg, text_column=src.text_column), setting
    )


def mix_probabilities(sources) -> list[float]:
    total = sum(s.weight for s in sources)
    return [s.weight / total for s in sources]


def load_corpus(cfg: DataConfig):
    """Load a DatasetDict of documents with ``train`` and ``validation`` splits."""
    import datasets

    validation = None
    if cfg.source == "builtin":
        train = builtin_dataset()
    elif cfg.source == "hub":
        train = _text_only(
            load_hub(cfg.hub_name, cfg.hub_config, cfg.hub_split, cfg.text_column, False),
            cfg.text_column,
            derive(_source_identity(_hub_source(cfg, cfg.hub_split), cfg)),
        )
        if cfg.hub_validation_split:
            validation = _text_only(
                load_hub(
                    cfg.hub_name, cfg.hub_config, cfg.hub_validation_split, cfg.text_column, False
                ),
                cfg.text_column,
                derive(_source_identity(_hub_source(cfg, cfg.hub_validation_split), cfg)),
            )
    elif cfg.source == "mix":
        parts = [load_source(s, cfg, f"data.sources[{i}]") for i, s in enumerate(cfg.sources)]
        train = (
            parts[0]
            if len(parts) == 1
            else datasets.interleave_datasets(
                parts,
                probabilities=mix_probabilities(cfg.sources),
                seed=SPLIT_SEED,
                stopping_strategy=cfg.mix_stopping,
            )
        )
    else:
        train = load_files(
            resolve_files(cfg.train_files, "data.train_files"), cfg, "data.train_files"
        )
    if cfg.validation_files:
        validation = load_files(
            resolve_files(cfg.validation_files, "data.validation_files"),
            cfg,
            "data.validation_files",
        )
    if validation is None:
        if len(train) < 2:
            raise DataError(
                "The corpus has a single document, so no validation split can be held out; "
                "set data.validation_files, or data.txt_sample_by=paragraph."
            )
        key = corpus_fingerprint(cfg)
        split = train.train_test_split(
            test_size=cfg.validation_split,
            seed=SPLIT_SEED,
            shuffle=True,
            train_new_fingerprint=derive(key, "train"),
            test_new_fingerprint=derive(key, "validation"),
        )
        train, validation = split["train"], split["test"]
    return datasets.DatasetDict({"train": train, "validation": validation})


def _hub_source(cfg: DataConfig, split: str) -> SourceConfig:
    """Return ``data=hub``'s dataset as a source of a mix (one split of it)."""
    return SourceConfig(
        kind="hub",
        name=cfg.hub_name,
        config=cfg.hub_config,
        split=split,
        text_column=cfg.text_column,
    )


def _source_identity(src, cfg: DataConfig | None) -> dict:
    if src.kind == "builtin":
        return {"builtin": sys.version, "stdlib": sysconfig.get_paths()["stdlib"]}
    if src.kind == "hub":
        return {
            "hub": src.name,
            "config": src.config,
            "split": src.split,
            "text_column": src.text_column,
            # a local dataset dir changes when it is rewritten
            "stats": file_stats(
                sorted(glob.glob(os.path.join(src.name, "**", "*.arrow"), recursive=True))
            )
            if os.path.isdir(src.name)
            else None,
        }
    return {
        "files": file_stats(resolve_files(src.files, "data.sources")),
        "text_column": src.text_column,
        "txt_sample_by": cfg.txt_sample_by,
    }


def corpus_fingerprint(cfg: DataConfig) -> str:
    """Hash the corpus's identity: files (with size and mtime), hub names, mix weights."""
    if cfg.source == "builtin":
        ident = _source_identity(SourceConfig(kind="builtin"), cfg)
    elif cfg.source == "hub":
        ident = {
            **_source_identity(_hub_source(cfg, cfg.hub_split), cfg),
            "validation_split_name": cfg.hub_validation_split,
        }
    elif cfg.source == "mix":
        ident = {
            "mix": [{**_source_identity(s, cfg), "weight": s.weight} for s in cfg.sources],
            "stopping": cfg.mix_stopping,
        }
    else:
        ident = {
            "train": file_stats(resolve_files(cfg.train_files, "data.train_files")),
            "text_column": cfg.text_column,
            "txt_sample_by": cfg.txt_sample_by,
        }
    ident["validation"] = (
        file_stats(resolve_files(cfg.validation_files, "data.validation_files"))
        if cfg.validation_files
        else None
    )
    ident["validation_split"] = cfg.validation_split
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------------------
# Tokenize and pack
# ----------------------------------------------------------------------------------------
