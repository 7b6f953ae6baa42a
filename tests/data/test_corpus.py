"""Corpus loading, tokenizing and packing."""

from __future__ import annotations

import json

import pytest
from conftest import shared_file

from mlmkit.config import DataConfig
from mlmkit.data.packing import pack_ids, prepare_datasets
from mlmkit.data.sources import builtin_documents, load_corpus, resolve_files
from mlmkit.errors import DataError


def test_pack_ids_blocks_are_full_and_framed():
    docs = [[5] * 7, [6] * 3, [], [7] * 12]
    blocks = pack_ids(docs, cls_id=2, sep_id=3, max_seq_length=8)
    stream = [5] * 7 + [3] + [6] * 3 + [3] + [7] * 12 + [3]  # 25 ids -> 4 blocks of 6
    assert len(blocks) == 4
    for i, block in enumerate(blocks):
        assert len(block) == 8 and block[0] == 2 and block[-1] == 3
        assert block[1:-1] == stream[i * 6:(i + 1) * 6]
    # a document longer than a block runs on into the next block instead of being dropped
    assert blocks[2][1:-1] + blocks[3][1:-1] == stream[12:24]


def test_builtin_corpus_is_large_and_deterministic():
    from mlmkit.data import sources

    a = builtin_documents()
    a.append("changed by a caller")  # each call returns its own list
    sources._builtin_documents.cache_clear()  # parsed anew, as in another process
    b = builtin_documents()
    assert a[:-1] == b and b == builtin_documents()
    assert sum(len(d) for d in a) > 1_000_000
    assert any("for" in d and "statement" in d for d in a[:100])  # language-reference prose


def _write(tmp_path, name, content):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


PARAS = "\n\n".join(f"Paragraph number {i} talks about cats and dogs and birds." for i in range(60))


def test_local_formats_with_text_column(tmp_path):
    import pandas as pd

    txt = _write(tmp_path, "a.txt", PARAS)
    rows = [{"body": f"Row {i} holds some words about trains.", "id": i} for i in range(40)]
    jsonl = _write(tmp_path, "b.jsonl", "\n".join(json.dumps(r) for r in rows))
    pd.DataFrame(rows).to_csv(tmp_path / "c.csv", index=False)
    pd.DataFrame(rows).to_parquet(tmp_path / "d.parquet")
    cfg = DataConfig(source="files", train_files=[str(txt)], validation_files=[str(jsonl)],
                     text_column="body")
    corpus = load_corpus(cfg)
    assert len(corpus["train"]) == 60 and len(corpus["validation"]) == 40
    assert corpus["validation"][0]["text"].startswith("Row 0")
    (tmp_path / "e.json").write_text(json.dumps(rows))  # a JSON array of records
    for name in ("c.csv", "d.parquet", "e.json"):
        cfg = DataConfig(source="files", train_files=[str(tmp_path / name)], text_column="body")
        corpus = load_corpus(cfg)
        assert len(corpus["train"]) + len(corpus["validation"]) == 40
        assert len(corpus["validation"]) >= 1  # held out when no validation_files


def test_crlf_and_latin1_text_is_read(tmp_path):
    raw = "First para caf\xe9 here.\r\nstill first.\r\n\r\nSecond para.\r\n".encode("latin-1")
    path = _write(tmp_path, "x.txt", raw)
    cfg = DataConfig(source="files", train_files=[str(path)], validation_files=[str(path)])
    docs = load_corpus(cfg)["train"]["text"]
    assert docs == ["First para caf\ufffd here. still first.", "Second para."]


def test_missing_file_and_glob_name_the_setting(tmp_path):
    with pytest.raises(DataError, match="data.train_files"):
        resolve_files([str(tmp_path / "nope.txt")], "data.train_files")
    with pytest.raises(DataError, match="no file matches"):
        resolve_files([str(tmp_path / "*.jsonl")], "data.train_files")
    bad = _write(tmp_path, "x.docx", "hi")
    with pytest.raises(DataError, match="extension"):
        resolve_files([str(bad)], "data.train_files")


def test_missing_text_column_names_the_setting(tmp_path):
    path = _write(tmp_path, "a.jsonl", '{"body": "x y z"}\n{"body": "a b c"}\n')
    cfg = DataConfig(source="files", train_files=[str(path)])
    with pytest.raises(DataError, match="data.text_column"):
        load_corpus(cfg)


def test_binary_file_is_refused(tmp_path):
    path = _write(tmp_path, "a.txt", b"\x00\x01\x02binary" * 100)
    cfg = DataConfig(source="files", train_files=[str(path)])
    with pytest.raises(DataError, match="binary"):
        load_corpus(cfg)


def test_prepare_packs_and_caches(tmp_path, tokenizer, monkeypatch):
    path = shared_file("corpora/tinyshakespeare/input.txt")
    cfg = DataConfig(source="files", train_files=[str(path)], max_seq_length=64)
    packed = prepare_datasets(cfg, tokenizer, tmp_path)
    train = packed["train"]
    assert len(train) > 1000
    block = train[0]["input_ids"]
    assert block.shape == (64,)
    assert int(block[0]) == tokenizer.cls_token_id and int(block[-1]) == tokenizer.sep_token_id
    assert len(packed["validation"]) > 10
    # the second call reads the cache and tokenizes nothing
    import mlmkit.data.packing as data_mod

    def boom(*a, **k):
        raise AssertionError("tokenized again despite the cache")

    monkeypatch.setattr(data_mod, "pack_corpus", boom)
    again = prepare_datasets(cfg, tokenizer, tmp_path)
    assert len(again["train"]) == len(train)
    assert (again["train"][5]["input_ids"] == train[5]["input_ids"]).all()
    # a different block length is a different cache entry
    with pytest.raises(AssertionError, match="tokenized again"):
        prepare_datasets(DataConfig(source="files", train_files=[str(path)], max_seq_length=32),
                         tokenizer, tmp_path)


def test_corpus_too_small_for_one_block(tmp_path, tokenizer):
    path = _write(tmp_path, "tiny.txt", "one two three.\n\nfour five.")
    cfg = DataConfig(source="files", train_files=[str(path)], validation_files=[str(path)],
                     max_seq_length=128, cache=False)
    with pytest.raises(DataError, match="data.max_seq_length"):
        prepare_datasets(cfg, tokenizer, tmp_path)
