"""Corpora as documents: the built-in corpus, local files in every format, the Hub and mixes,
and what a file that cannot be read gets (one sentence, or lines skipped with a count)."""

from __future__ import annotations

import codecs
import json
import logging
import os
import subprocess
import sys

import pytest
from helpers import warnings_of, write_file
from runs import (
    ROOT,  # noqa: E402
)

from mlmkit.config import DataConfig, SourceConfig
from mlmkit.data import streaming
from mlmkit.data.packing import (
    warn_small_validation,
)
from mlmkit.data.sources import (
    MAX_LINE_BYTES,
    builtin_documents,
    check_not_binary,
    iter_txt,
    load_corpus,
    resolve_files,
    wide_encoding,
)
from mlmkit.errors import DataError


def test_builtin_corpus_is_large_and_deterministic():
    from mlmkit.data import sources

    a = builtin_documents()
    a.append("changed by a caller")  # each call returns its own list
    sources._builtin_documents.cache_clear()  # parsed anew, as in another process
    b = builtin_documents()
    assert a[:-1] == b and b == builtin_documents()
    assert sum(len(d) for d in a) > 1_000_000
    assert any("for" in d and "statement" in d for d in a[:100])  # language-reference prose


PARAS = "\n\n".join(f"Paragraph number {i} talks about cats and dogs and birds." for i in range(60))


def test_local_formats_with_text_column(tmp_path):
    import pandas as pd

    txt = write_file(tmp_path, "a.txt", PARAS)
    rows = [{"body": f"Row {i} holds some words about trains.", "id": i} for i in range(40)]
    jsonl = write_file(tmp_path, "b.jsonl", "\n".join(json.dumps(r) for r in rows))
    pd.DataFrame(rows).to_csv(tmp_path / "c.csv", index=False)
    pd.DataFrame(rows).to_parquet(tmp_path / "d.parquet")
    cfg = DataConfig(
        source="files", train_files=[str(txt)], validation_files=[str(jsonl)], text_column="body"
    )
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
    path = write_file(tmp_path, "x.txt", raw)
    cfg = DataConfig(source="files", train_files=[str(path)], validation_files=[str(path)])
    docs = load_corpus(cfg)["train"]["text"]
    assert docs == ["First para caf\ufffd here. still first.", "Second para."]


def test_missing_file_and_glob_name_the_setting(tmp_path):
    with pytest.raises(DataError, match="data.train_files"):
        resolve_files([str(tmp_path / "nope.txt")], "data.train_files")
    with pytest.raises(DataError, match="no file matches"):
        resolve_files([str(tmp_path / "*.jsonl")], "data.train_files")
    bad = write_file(tmp_path, "x.docx", "hi")
    with pytest.raises(DataError, match="extension"):
        resolve_files([str(bad)], "data.train_files")


def test_missing_text_column_names_the_setting(tmp_path):
    path = write_file(tmp_path, "a.jsonl", '{"body": "x y z"}\n{"body": "a b c"}\n')
    cfg = DataConfig(source="files", train_files=[str(path)])
    with pytest.raises(DataError, match="data.text_column"):
        load_corpus(cfg)


def test_binary_file_is_refused(tmp_path):
    path = write_file(tmp_path, "a.txt", b"\x00\x01\x02binary" * 100)
    cfg = DataConfig(source="files", train_files=[str(path)])
    with pytest.raises(DataError, match="binary"):
        load_corpus(cfg)


ENGLISH = "The quick brown fox jumps over the lazy dog near the river bank.\n"


def _jsonl(path, good: int):
    lines = [json.dumps({"text": f"Row {i}: {ENGLISH.strip()}"}) for i in range(good)]
    lines[3:3] = ["not json at all", '{"text": "cut sho', "[1, 2, 3]"]  # three that do not parse
    lines += [json.dumps({"body": "no text column"})] * 2 + [json.dumps({"text": 7})]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(
    "encoding, name",
    [("utf-16", "UTF-16"), ("utf-16-le", "UTF-16"), ("utf-16-be", "UTF-16"), ("utf-32", "UTF-32")],
)
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


def test_map_mode_skips_json_lines_that_do_not_parse_with_a_count(tmp_path):
    path = _jsonl(tmp_path / "rows.jsonl", good=40)
    with warnings_of("mlmkit.data.sources") as warnings:
        corpus = load_corpus(DataConfig(source="files", train_files=[str(path)]))
    assert len(corpus["train"]) + len(corpus["validation"]) == 40  # trained on the rest
    assert any(
        "skipped 3 lines that are not JSON objects, 2 rows without the column 'text' and 1 "
        "whose 'text' is not text" in w
        for w in warnings
    ), warnings


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
    pd.DataFrame({"text": [{"a": "x y", "b": i} for i in range(50)]}).to_parquet(
        tmp_path / "structs.parquet"
    )
    (tmp_path / "objs.jsonl").write_text(
        "\n".join(json.dumps({"text": {"a": "x"}}) for _ in range(50))
    )
    for name in ("ints.parquet", "structs.parquet", "objs.jsonl"):
        cfg = DataConfig(source="files", train_files=[str(tmp_path / name)], streaming=streamed)
        with pytest.raises(DataError) as info:
            streaming.check_sources(cfg) if streamed else load_corpus(cfg)
        message = str(info.value)
        assert "the column 'text'" in message and name in message and "not text" in message, message


HUB_PRESETS = {
    "wikitext103": "Salesforce/wikitext",
    "wiki_books": "wikimedia/wikipedia",
    "c4": "allenai/c4",
    "fineweb_edu": "HuggingFaceFW/fineweb-edu",
}


def _compose(*overrides):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from mlmkit.config import register_configs, to_config

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return to_config(compose(config_name="config", overrides=list(overrides)))


def _one_sentence(msg: str) -> None:
    assert "\n" not in msg and msg.endswith(".") and ". " not in msg, msg


@pytest.mark.parametrize("preset", sorted(HUB_PRESETS))
def test_hub_presets_offline_stop_with_one_sentence(preset):
    cfg = _compose(f"data={preset}").data
    assert cfg.streaming == (preset in ("c4", "fineweb_edu"))
    with pytest.raises(DataError) as err:
        if cfg.streaming:
            from mlmkit.data.streaming import check_sources

            check_sources(cfg)
        else:
            load_corpus(cfg)
    msg = str(err.value)
    _one_sentence(msg)
    assert HUB_PRESETS[preset] in msg and "data=files" in msg and "data=builtin" in msg


def test_unreachable_hub_fails_fast_without_retries(tmp_path):
    """Not offline mode: the Hub's host refuses connections, as on a machine without network."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    }
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "data=wikitext103",
            f"paths.cache_dir={tmp_path}/c",
            f"hydra.run.dir={tmp_path}/run",
            "tokenizer.max_train_chars=1000",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert (
        len(errors) == 1 and "cannot be reached" in errors[0] and "Salesforce/wikitext" in errors[0]
    )
    assert "Traceback" not in proc.stderr and "Retrying" not in proc.stderr
    assert "thrown while requesting" not in proc.stderr  # huggingface_hub's retry chatter


def test_weighted_mix_in_map_mode(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.csv"
    a.write_text("\n\n".join(f"alpha number {i}." for i in range(2000)))
    b.write_text("body\n" + "\n".join(f"beta number {i}." for i in range(2000)))
    cfg = DataConfig(
        source="mix",
        sources=[
            SourceConfig(kind="files", files=[str(a)], weight=1.0),
            SourceConfig(kind="files", files=[str(b)], weight=3.0, text_column="body"),
        ],
    )
    corpus = load_corpus(cfg)
    docs = list(corpus["train"]["text"]) + list(corpus["validation"]["text"])
    share = sum(d.startswith("beta") for d in docs) / len(docs)
    assert 0.71 < share < 0.79  # stops at the first exhausted source, so b's 2000 are all used
    assert sum(d.startswith("beta") for d in docs) == 2000


def test_long_line_and_bad_bytes_are_cut_and_counted(tmp_path, caplog):
    words = ("lorem ipsum dolor sit amet " * (50 * MAX_LINE_BYTES // 27)).encode()
    path = tmp_path / "one_line.txt"
    path.write_bytes(b"caf\xe9 au lait\n\n" + words)  # a 50 MB line without a newline, Latin-1 byte
    stats: dict = {}
    docs = [d for d, _ in iter_txt(str(path), "paragraph", stats=stats)]
    assert docs[0] == "caf\ufffd au lait"
    assert len(docs) == 52 and all(len(d.encode()) <= MAX_LINE_BYTES for d in docs)
    assert " ".join(docs[1:]) == words.decode().strip()  # cut at spaces: no word lost or split
    assert stats == {"bad_bytes": 1, "cut": 50}
    with caplog.at_level(logging.WARNING, logger="mlmkit"):
        corpus = load_corpus(
            DataConfig(source="files", train_files=[str(path)], validation_files=[str(path)])
        )
    assert len(corpus["train"]) == 52
    lines = [r.getMessage() for r in caplog.records]
    assert any("1 bytes are not valid UTF-8" in m for m in lines)
    assert any("50 lines or documents longer than" in m for m in lines)


def test_other_bad_inputs_are_one_sentence(tmp_path, caplog):
    cases = {}
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n\n")
    cases["empty"] = DataConfig(source="files", train_files=[str(empty)])
    cases["glob"] = DataConfig(source="files", train_files=[str(tmp_path / "none*.txt")])
    nocol = tmp_path / "x.csv"
    nocol.write_text("body\nsome text\n")
    cases["column"] = DataConfig(source="files", train_files=[str(nocol)])
    for cfg in cases.values():
        with pytest.raises(DataError) as err:
            load_corpus(cfg)
        _one_sentence(str(err.value))
    with caplog.at_level(logging.WARNING, logger="mlmkit"):
        assert warn_small_validation(3, 8) and not warn_small_validation(8, 8)
    assert any(
        "has 3 sequences, fewer than one batch (8)" in r.getMessage() for r in caplog.records
    )
