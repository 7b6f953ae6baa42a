"""The cache under paths.cache_dir: damaged entries are rebuilt, a full disk is one sentence
(tokenizer) or a warning (packed data, kept in memory), a killed writer's folder is removed."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import shared_file
from runs import (
    ROOT,  # noqa: E402
    limited_file_size,
)

import mlmkit.data.packing as data_mod
import mlmkit.data.packing as packing
from mlmkit.config import DataConfig, TokenizerConfig
from mlmkit.data import cache
from mlmkit.data.packing import prepare_datasets
from mlmkit.data.tokenizer import get_tokenizer, tokenizer_fingerprint
from mlmkit.errors import ConfigError, DataError

TEXTS = [
    f"The quick brown fox number {i} jumps over the lazy dog near the river bank."
    for i in range(300)
]
TOKENIZER = TokenizerConfig(vocab_size=120, min_frequency=1)


@pytest.fixture
def warnings_logged():
    """The messages of the warnings mlmkit logs during the test."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("mlmkit")
    logger.addHandler(handler)
    yield _Messages(records)
    logger.removeHandler(handler)


class _Messages:
    def __init__(self, records: list[logging.LogRecord]) -> None:
        self.records = records

    def all(self) -> list[str]:
        return [r.getMessage() for r in self.records]


@pytest.fixture(scope="module")
def corpus():
    import datasets

    from mlmkit.data.sources import builtin_documents

    docs = builtin_documents()
    return datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": docs[:1500]}),
            "validation": datasets.Dataset.from_dict({"text": docs[1500:1600]}),
        }
    )


def _prepare(tokenizer, cache_dir, corpus):
    return prepare_datasets(
        DataConfig(max_seq_length=64),
        tokenizer,
        cache_dir,
        corpus=corpus,
        fingerprint="test-corpus",
    )


def _entry(cache_dir, kind: str):
    entries = list((cache_dir / kind).iterdir())
    assert len(entries) == 1 and not entries[0].name.startswith("."), entries  # no temporary folder
    return entries[0]


def _shorter_stream(arrow):
    """The Arrow file as a valid stream of half its rows, padded with zeros to its size:
    it loads, with rows missing."""
    import pyarrow as pa

    size = arrow.stat().st_size
    table = pa.ipc.open_stream(pa.BufferReader(arrow.read_bytes())).read_all()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table.slice(0, len(table) // 2), max_chunksize=100)
    data = sink.getvalue().to_pybytes()
    arrow.write_bytes(data + bytes(size - len(data)))


@pytest.mark.parametrize("damage", ["cut", "rows missing", "cut, no manifest"])
def test_a_damaged_packed_entry_is_deleted_and_packed_again(
    tmp_path, tokenizer, corpus, damage, warnings_logged, monkeypatch
):
    first = _prepare(tokenizer, tmp_path, corpus)
    rows, last = len(first["train"]), first["train"][-1]["input_ids"]
    del first  # its Arrow file is memory-mapped: damaged below, as between two runs
    entry = _entry(tmp_path, "data")
    arrow = next(entry.glob("train/*.arrow"))
    if damage == "rows missing":
        _shorter_stream(arrow)
    else:
        if damage == "cut, no manifest":  # an entry written before manifests: found when loaded
            (entry / cache.MANIFEST).unlink()
        arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
    again = _prepare(tokenizer, tmp_path, corpus)
    [warning] = warnings_logged.all()
    assert warning.startswith(f"The cached packed dataset {entry} is damaged (")
    assert warning.endswith("); deleting it and building it again.")
    assert len(again["train"]) == rows and again["train"][-1]["input_ids"] == last
    # the rebuilt entry is whole: the next run reads it and packs nothing
    monkeypatch.setattr(packing, "pack_corpus", lambda *a, **k: pytest.fail("packed again"))
    assert len(_prepare(tokenizer, tmp_path, corpus)["train"]) == rows
    assert len(warnings_logged.all()) == 1 and _entry(tmp_path, "data") == entry


@pytest.mark.parametrize("damage", ["cut", "garbled"])
def test_a_damaged_tokenizer_entry_is_deleted_and_trained_again(tmp_path, damage, warnings_logged):
    calls = []

    def texts():
        calls.append(1)
        return iter(TEXTS)

    first = get_tokenizer(TOKENIZER, texts, "corpus-1", tmp_path)
    entry = _entry(tmp_path, "tokenizers")
    path = entry / "tokenizer.json"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "cut" else b"#" * len(data))
    again = get_tokenizer(TOKENIZER, texts, "corpus-1", tmp_path)
    [warning] = warnings_logged.all()
    assert warning.startswith(f"The cached tokenizer {entry} is damaged (")
    assert len(calls) == 2 and len(again) == len(first)
    # whole again: read, not trained
    assert tokenizer_fingerprint(
        get_tokenizer(TOKENIZER, texts, "corpus-1", tmp_path)
    ) == tokenizer_fingerprint(again)
    assert len(calls) == 2 and len(warnings_logged.all()) == 1


def test_a_tokenizer_another_process_cached_first_is_the_one_returned(tmp_path):
    """Two runs that train the same tokenizer at once: the one that caches second gets the
    cached tokenizer, not its own (their ties between merges may differ)."""
    import shutil

    other = TokenizerConfig(vocab_size=120, min_frequency=1)
    # what the other process trained and cached under the same key, from other text
    first = get_tokenizer(other, lambda: iter(t.upper() for t in TEXTS), "corpus-1", tmp_path / "a")
    [winner] = (tmp_path / "a" / "tokenizers").iterdir()

    def texts():  # the other process finishes while this one trains
        shutil.copytree(winner, tmp_path / "b" / "tokenizers" / winner.name)
        return iter(TEXTS)

    mine = get_tokenizer(other, texts, "corpus-1", tmp_path / "b")
    alone = get_tokenizer(other, lambda: iter(TEXTS), "corpus-1", tmp_path / "c")
    assert tokenizer_fingerprint(alone) != tokenizer_fingerprint(first)  # the texts differ
    assert tokenizer_fingerprint(mine) == tokenizer_fingerprint(first)
    assert tokenizer_fingerprint(
        get_tokenizer(other, lambda: iter(TEXTS), "corpus-1", tmp_path / "b")
    ) == tokenizer_fingerprint(mine)


def test_a_full_disk_while_caching_the_tokenizer_is_one_sentence(tmp_path):
    with limited_file_size(1_000), pytest.raises(ConfigError) as info:
        get_tokenizer(TOKENIZER, lambda: iter(TEXTS), "corpus-1", tmp_path)
    message = str(info.value)
    assert message.startswith(
        f"Could not save the trained tokenizer under paths.cache_dir={str(tmp_path)!r} ("
    )
    assert "File too large" in message and message.endswith(
        "set paths.cache_dir to another folder."
    )
    assert list((tmp_path / "tokenizers").iterdir()) == []  # the partial entry is gone
    get_tokenizer(TOKENIZER, lambda: iter(TEXTS), "corpus-1", tmp_path)  # with space: cached
    assert (_entry(tmp_path, "tokenizers") / "tokenizer.json").is_file()


def test_a_full_disk_while_caching_packed_data_warns_and_trains_from_memory(
    tmp_path, tokenizer, corpus, warnings_logged
):
    with limited_file_size(20_000):
        packed = _prepare(tokenizer, tmp_path, corpus)
    [warning] = warnings_logged.all()
    assert warning.startswith(
        f"Could not cache the packed dataset under paths.cache_dir={str(tmp_path)!r} "
        "(File too large)"
    )
    assert list((tmp_path / "data").iterdir()) == []  # the partial entry is gone
    assert len(packed["train"]) > 100 and len(packed["train"][0]["input_ids"]) == 64
    cached = _prepare(tokenizer, tmp_path, corpus)  # with space: cached
    assert len(cached["train"]) == len(packed["train"]) and _entry(tmp_path, "data")


WRITER = (
    "import sys, time\n"
    "from pathlib import Path\n"
    "from mlmkit.data import cache\n"
    "def fill(folder):\n"
    "    (folder / 'tokenizer.json').write_text('{')\n"
    "    print(folder, flush=True)\n"
    "    time.sleep(120)\n"
    "cache.write_entry(Path(sys.argv[1]), fill)\n"
)


def test_the_folder_of_a_killed_preparation_is_removed_not_a_running_ones(tmp_path):
    target = tmp_path / "tokenizers" / ("0" * 16)
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(target)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    folder = writer.stdout.readline().strip()
    assert folder, writer.communicate()[1][-2000:]
    try:
        cache.remove_orphans(target.parent, min_age_s=0)
        assert os.path.isdir(folder)  # still being written: kept
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.communicate()
    fresh = target.parent / f".{'1' * 16}-abcdefgh"  # a writer that has not locked it yet
    fresh.mkdir()
    old = time.time() - 600
    os.utime(folder, (old, old))
    get_tokenizer(TOKENIZER, lambda: iter(TEXTS), "corpus-1", tmp_path)
    assert not os.path.exists(folder) and fresh.is_dir()


def test_cache_is_keyed_by_packing_and_files_and_left_clean(tmp_path, tokenizer, monkeypatch):
    path = tmp_path / "c.txt"
    path.write_text(shared_file("corpora/tinyshakespeare/input.txt").read_text()[:200_000])
    cfg = DataConfig(source="files", train_files=[str(path)], max_seq_length=64)
    prepare_datasets(cfg, tokenizer, tmp_path)
    calls = []
    real = data_mod.pack_corpus
    monkeypatch.setattr(
        data_mod, "pack_corpus", lambda *a, **k: calls.append(k or a[4:]) or real(*a, **k)
    )
    prepare_datasets(cfg, tokenizer, tmp_path)
    assert calls == []  # reused
    lbl = prepare_datasets(
        DataConfig(
            source="files", train_files=[str(path)], max_seq_length=64, packing="line_by_line"
        ),
        tokenizer,
        tmp_path,
    )
    assert len(calls) == 1 and len({len(r) for r in lbl["train"]["input_ids"][:200]}) > 1
    os.utime(path, ns=(1, 1))  # same content, other mtime: tokenized again
    prepare_datasets(cfg, tokenizer, tmp_path)
    assert len(calls) == 2
    entries = sorted(p.name for p in (tmp_path / "data").iterdir())
    assert len(entries) == 3 and not any(e.startswith(".") for e in entries)
    # a corpus that packs to zero blocks leaves no entry behind
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("one two.\n\nthree.")
    with pytest.raises(DataError, match="zero blocks"):
        prepare_datasets(
            DataConfig(source="files", train_files=[str(tiny)], validation_files=[str(tiny)]),
            tokenizer,
            tmp_path,
        )
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == entries
