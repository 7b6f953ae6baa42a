"""Packing documents into blocks (map mode): full framed blocks, the cache of packed data, text
with special-token strings read as text, and text with nothing to predict refused."""

from __future__ import annotations

import pytest
from conftest import shared_file
from helpers import write_file

import mlmkit.data.packing as data_mod
from mlmkit.config import DataConfig
from mlmkit.data import streaming
from mlmkit.data.packing import (
    encode,
    pack_ids,
    pack_lines,
    prepare_datasets,
)
from mlmkit.errors import DataError


def test_pack_ids_blocks_are_full_and_framed():
    docs = [[5] * 7, [6] * 3, [], [7] * 12]
    blocks = pack_ids(docs, cls_id=2, sep_id=3, max_seq_length=8)
    stream = [5] * 7 + [3] + [6] * 3 + [3] + [7] * 12 + [3]  # 25 ids -> 4 blocks of 6
    assert len(blocks) == 4
    for i, block in enumerate(blocks):
        assert len(block) == 8 and block[0] == 2 and block[-1] == 3
        assert block[1:-1] == stream[i * 6 : (i + 1) * 6]
    # a document longer than a block runs on into the next block instead of being dropped
    assert blocks[2][1:-1] + blocks[3][1:-1] == stream[12:24]


def test_prepare_packs_and_caches(tmp_path, tokenizer, monkeypatch):
    path = shared_file("corpora/tinyshakespeare/input.txt")
    cfg = DataConfig(source="files", train_files=[str(path)], max_seq_length=64)
    packed = prepare_datasets(cfg, tokenizer, tmp_path)
    train = packed["train"]
    assert len(train) > 1000
    block = train[0]["input_ids"]
    assert isinstance(block, list) and len(block) == 64  # Python rows: no datasets formatter
    assert int(block[0]) == tokenizer.cls_token_id and int(block[-1]) == tokenizer.sep_token_id
    assert len(packed["validation"]) > 10
    # the second call reads the cache and tokenizes nothing

    def boom(*a, **k):
        raise AssertionError("tokenized again despite the cache")

    monkeypatch.setattr(data_mod, "pack_corpus", boom)
    again = prepare_datasets(cfg, tokenizer, tmp_path)
    assert len(again["train"]) == len(train)
    assert again["train"][5]["input_ids"] == train[5]["input_ids"]
    # a different block length is a different cache entry
    with pytest.raises(AssertionError, match="tokenized again"):
        prepare_datasets(
            DataConfig(source="files", train_files=[str(path)], max_seq_length=32),
            tokenizer,
            tmp_path,
        )


def test_corpus_too_small_for_one_block(tmp_path, tokenizer):
    path = write_file(tmp_path, "tiny.txt", "one two three.\n\nfour five.")
    cfg = DataConfig(
        source="files",
        train_files=[str(path)],
        validation_files=[str(path)],
        max_seq_length=128,
        cache=False,
    )
    with pytest.raises(DataError, match="data.max_seq_length"):
        prepare_datasets(cfg, tokenizer, tmp_path)


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
        assert len(set(row) - special) > 0


@pytest.mark.parametrize("streamed", [False, True])
def test_text_with_nothing_to_predict_is_refused(tokenizer, tmp_path, streamed):
    """Text the tokenizer knows nothing of becomes [UNK] after [UNK]: no token can be masked."""
    path = tmp_path / "unknown.txt"
    path.write_text("\n\n".join("\u4f60\u597d\u4e16\u754c " * 30 for _ in range(300)))
    cfg = DataConfig(
        source="files",
        train_files=[str(path)],
        max_seq_length=32,
        cache=False,
        streaming=streamed,
        stream_validation_docs=20,
        shuffle_buffer=8,
    )
    with pytest.raises(DataError) as info:
        if streamed:
            streaming.setup_streaming(cfg, tokenizer, 4, 0, 1, 0, 0)
        else:
            prepare_datasets(cfg, tokenizer, tmp_path / "cache")
    message = str(info.value)
    assert message.startswith("data.train_files:") and "special tokens only" in message, message


def test_line_by_line_splits_long_documents_and_never_drops():
    docs = [list(range(10, 35)), [7, 8], []]
    seqs = pack_lines(docs, cls_id=2, sep_id=3, max_seq_length=10)
    assert [len(s) for s in seqs] == [10, 10, 10, 3, 4]  # 25 ids: 8 + 8 + 8 + 1, then 2
    assert all(s[0] == 2 and s[-1] == 3 for s in seqs)
    assert [t for s in seqs[:4] for t in s[1:-1]] == docs[0]
