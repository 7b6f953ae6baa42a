"""What the corpus readers make of flawed text: UTF-16 named as such, JSON lines that do not
parse skipped with a count (map mode and streaming), a text column that holds no text
refused, special-token strings in the text read as text, and text the tokenizer cannot
represent (nothing to predict) refused."""

from __future__ import annotations

import codecs
import json
import logging
from contextlib import contextmanager

import pytest

from mlmkit.config import DataConfig, OptimConfig
from mlmkit.data import streaming
from mlmkit.data.packing import encode, prepare_datasets
from mlmkit.data.sources import check_not_binary, load_corpus, wide_encoding
from mlmkit.errors import DataError

ENGLISH = "The quick brown fox jumps over the lazy dog near the river bank.\n"


@contextmanager
def warnings_of(name: str):
    """The warning messages logged by ``name`` inside the block (whatever propagation the
    ``mlmkit`` logger has been given by a run in this process)."""
    records: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger(name)
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


@pytest.mark.parametrize("encoding, name", [("utf-16", "UTF-16"), ("utf-16-le", "UTF-16"),
                                            ("utf-16-be", "UTF-16"), ("utf-32", "UTF-32")])
def test_utf16_and_utf32_text_is_named_not_called_binary(tmp_path, encoding, name):
    path = tmp_path / "wide.txt"
    path.write_bytes(ENGLISH.encode(encoding) * 50)
    with pytest.raises(DataError) as info:
        check_not_binary(str(path), "data.train_files")
    message = str(info.value)
    assert f"is {name} encoded; convert it to UTF-8" in message and "wide.txt" in message
    assert "binary" not in message


def test_wide_encoding_leaves_utf8_and_binary_alone():
    assert wide_encoding(ENGLISH.encode("utf-8") * 20) is None
    assert wide_encoding("Grüße, naïve café ".encode() * 20) is None
    assert wide_encoding(b"\x00\x01" * 100) is None  # binary: no text in either byte
    assert wide_encoding(codecs.BOM_UTF16_LE + "ab".encode("utf-16-le")) == "UTF-16"


def _jsonl(path, good: int):
    lines = [json.dumps({"text": f"Row {i}: {ENGLISH.strip()}"}) for i in range(good)]
    lines[3:3] = ["not json at all", '{"text": "cut sho', "[1, 2, 3]"]  # three that do not parse
    lines += [json.dumps({"body": "no text column"})] * 2 + [json.dumps({"text": 7})]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_map_mode_skips_json_lines_that_do_not_parse_with_a_count(tmp_path):
    path = _jsonl(tmp_path / "rows.jsonl", good=40)
    with warnings_of("mlmkit.data.sources") as warnings:
        corpus = load_corpus(DataConfig(source="files", train_files=[str(path)]))
    assert len(corpus["train"]) + len(corpus["validation"]) == 40  # trained on the rest
    assert any("skipped 3 lines that are not JSON objects, 2 rows without the column 'text' and 1 "
               "whose 'text' is not text" in w for w in warnings), warnings


def test_streaming_skips_the_same_lines_with_the_same_count(tmp_path):
    path = _jsonl(tmp_path / "rows.jsonl", good=40)
    source = streaming.FilesSource([str(path)], "text", "paragraph")
    with warnings_of("mlmkit.data.sources") as warnings:
        docs = list(source.docs(None))
    assert len(docs) == 40
    assert any("skipped 3 lines that are not JSON objects" in w for w in warnings), warnings


@pytest.mark.parametrize("streamed", [False, True])
def test_a_text_column_of_numbers_or_objects_is_refused_naming_column_and_file(tmp_path, streamed):
    import pandas as pd

    pd.DataFrame({"text": list(range(50))}).to_parquet(tmp_path / "ints.parquet")
    pd.DataFrame({"text": [{"a": "x y", "b": i} for i in range(50)]}).to_parquet(tmp_path / "structs.parquet")
    (tmp_path / "objs.jsonl").write_text("\n".join(json.dumps({"text": {"a": "x"}}) for _ in range(50)))
    for name in ("ints.parquet", "structs.parquet", "objs.jsonl"):
        cfg = DataConfig(source="files", train_files=[str(tmp_path / name)], streaming=streamed)
        with pytest.raises(DataError) as info:
            streaming.check_sources(cfg) if streamed else load_corpus(cfg)
        message = str(info.value)
        assert "the column 'text'" in message and name in message and "not text" in message, message


def test_special_token_strings_in_the_text_are_read_as_text(tokenizer, tmp_path):
    special = set(tokenizer.all_special_ids)
    ids = encode(tokenizer, ["[MASK] [CLS] hello [SEP] [PAD]"])[0]
    assert ids and not special & set(ids)
    assert tokenizer.mask_token_id in tokenizer("a [MASK] b")["input_ids"]  # fill-mask still works
    # a corpus of nothing but such strings trains on them as text: every block has targets
    path = tmp_path / "specials.txt"
    path.write_text("\n\n".join("[MASK] [CLS] [SEP] [MASK] [UNK]" for _ in range(400)))
    cfg = DataConfig(source="files", train_files=[str(path)], max_seq_length=32, cache=False)
    packed = prepare_datasets(cfg, tokenizer, tmp_path / "cache")
    for row in packed["train"][:50]["input_ids"]:
        assert len(set(row.tolist()) - special) > 0


@pytest.mark.parametrize("streamed", [False, True])
def test_text_with_nothing_to_predict_is_refused(tokenizer, tmp_path, streamed):
    """Text the tokenizer knows nothing of becomes [UNK] after [UNK]: no token can be masked."""
    path = tmp_path / "unknown.txt"
    path.write_text("\n\n".join("\u4f60\u597d\u4e16\u754c " * 30 for _ in range(300)))
    cfg = DataConfig(source="files", train_files=[str(path)], max_seq_length=32, cache=False,
                     streaming=streamed, stream_validation_docs=20, shuffle_buffer=8)
    with pytest.raises(DataError) as info:
        if streamed:
            streaming.setup_streaming(cfg, tokenizer, 4, 0, 1, 0, 0)
        else:
            prepare_datasets(cfg, tokenizer, tmp_path / "cache")
    message = str(info.value)
    assert message.startswith("data.train_files:") and "special tokens only" in message, message


def test_a_warmup_as_long_as_the_step_budget_warns_naming_both_settings():
    from mlmkit.training.budget import Budget

    with warnings_of("mlmkit.training.budget") as warnings:
        Budget(OptimConfig(warmup_steps=4), max_steps=4)
        Budget(OptimConfig(warmup_steps=10), max_steps=4)
        Budget(OptimConfig(warmup_steps=3), max_steps=4)  # shorter: no warning
    assert len(warnings) == 2
    assert all("optim.warmup_steps" in w and "train.max_steps" in w for w in warnings)
