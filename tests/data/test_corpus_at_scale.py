"""Data at scale: hub presets offline, mixing, cache keys, packing modes, bad input,
tokenizer training as a command, and streaming through the trainer with resume."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
from conftest import shared_file
from runs import (
    ROOT,  # noqa: E402
    assert_same_losses,
    python_run,
)

import mlmkit.data.packing as data_mod
from mlmkit.config import DataConfig, SourceConfig
from mlmkit.data.packing import pack_lines, prepare_datasets, warn_small_validation
from mlmkit.data.sources import MAX_LINE_BYTES, iter_txt, load_corpus
from mlmkit.errors import DataError

HUB_PRESETS = {"wikitext103": "Salesforce/wikitext", "wiki_books": "wikimedia/wikipedia",
               "c4": "allenai/c4", "fineweb_edu": "HuggingFaceFW/fineweb-edu"}


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
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HOME=str(tmp_path / "hf"))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "data=wikitext103", f"paths.cache_dir={tmp_path}/c",
         f"hydra.run.dir={tmp_path}/run", "tokenizer.max_train_chars=1000"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "cannot be reached" in errors[0] and "Salesforce/wikitext" in errors[0]
    assert "Traceback" not in proc.stderr and "Retrying" not in proc.stderr
    assert "thrown while requesting" not in proc.stderr  # huggingface_hub's retry chatter


def test_weighted_mix_in_map_mode(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.csv"
    a.write_text("\n\n".join(f"alpha number {i}." for i in range(2000)))
    b.write_text("body\n" + "\n".join(f"beta number {i}." for i in range(2000)))
    cfg = DataConfig(source="mix", sources=[SourceConfig(kind="files", files=[str(a)], weight=1.0),
                                            SourceConfig(kind="files", files=[str(b)], weight=3.0,
                                                         text_column="body")])
    corpus = load_corpus(cfg)
    docs = list(corpus["train"]["text"]) + list(corpus["validation"]["text"])
    share = sum(d.startswith("beta") for d in docs) / len(docs)
    assert 0.71 < share < 0.79  # stops at the first exhausted source, so b's 2000 are all used
    assert sum(d.startswith("beta") for d in docs) == 2000


def test_cache_is_keyed_by_packing_and_files_and_left_clean(tmp_path, tokenizer, monkeypatch):
    path = tmp_path / "c.txt"
    path.write_text(shared_file("corpora/tinyshakespeare/input.txt").read_text()[:200_000])
    cfg = DataConfig(source="files", train_files=[str(path)], max_seq_length=64)
    prepare_datasets(cfg, tokenizer, tmp_path)
    calls = []
    real = data_mod.pack_corpus
    monkeypatch.setattr(data_mod, "pack_corpus", lambda *a, **k: calls.append(k or a[4:]) or real(*a, **k))
    prepare_datasets(cfg, tokenizer, tmp_path)
    assert calls == []  # reused
    lbl = prepare_datasets(DataConfig(source="files", train_files=[str(path)], max_seq_length=64,
                                      packing="line_by_line"), tokenizer, tmp_path)
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
        prepare_datasets(DataConfig(source="files", train_files=[str(tiny)], validation_files=[str(tiny)]),
                         tokenizer, tmp_path)
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == entries


def test_line_by_line_splits_long_documents_and_never_drops():
    docs = [list(range(10, 35)), [7, 8], []]
    seqs = pack_lines(docs, cls_id=2, sep_id=3, max_seq_length=10)
    assert [len(s) for s in seqs] == [10, 10, 10, 3, 4]  # 25 ids: 8 + 8 + 8 + 1, then 2
    assert all(s[0] == 2 and s[-1] == 3 for s in seqs)
    assert [t for s in seqs[:4] for t in s[1:-1]] == docs[0]


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
        corpus = load_corpus(DataConfig(source="files", train_files=[str(path)],
                                        validation_files=[str(path)]))
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
    assert any("has 3 sequences, fewer than one batch (8)" in r.getMessage() for r in caplog.records)


def _run(*args, timeout=300):
    return python_run(*args, timeout=timeout)


@pytest.mark.parametrize("algorithm", ["bpe", "unigram", "wordpiece"])
def test_tokenizer_command_writes_a_dir_training_can_use(tmp_path, algorithm):
    from mlmkit.data.tokenizer import load_tokenizer

    text = shared_file("corpora/tinyshakespeare/input.txt")
    out = tmp_path / "tok"
    proc = _run("-m", "mlmkit", "tokenizer", "data=files", f"data.train_files=[{text}]",
                f"tokenizer.algorithm={algorithm}", "tokenizer.vocab_size=800", f"out={out}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tokenizer.name_or_path=" in proc.stdout
    tok = load_tokenizer(str(out))  # checks [CLS] [SEP] [PAD] [MASK] and a fast tokenizer
    assert 700 <= len(tok) <= 800
    ids = tok("To be, or not to be")["input_ids"]
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id and tok.unk_token_id not in ids
    # one text in 50 held out: its [UNK] share is printed and in the tokenizer's card
    held_out = next(line for line in proc.stdout.splitlines() if line.startswith("[UNK] is "))
    assert held_out in (out / "README.md").read_text() and "of the held-out text" in held_out
    bad = _run("-m", "mlmkit", "tokenizer", "data=files", f"data.train_files=[{tmp_path}/nothing*.txt]",
               f"out={tmp_path / 'tok2'}")
    assert bad.returncode == 2 and bad.stderr.strip().startswith("Error: data.train_files: no file")
    assert not (tmp_path / "tok2").exists()  # nothing written by a refused command


TINY = ["model.num_hidden_layers=1", "model.hidden_size=32", "model.num_attention_heads=2",
        "model.intermediate_size=64", "data.max_seq_length=32", "data.max_eval_samples=32",
        "train.batch_size=4", "train.progress=false", "train.log_every=2", "optim.warmup_steps=2",
        "train.eval_every=6", "train.save_every=6", "train.max_steps=12", "data.streaming=true",
        "data.shuffle_buffer=16", "data.stream_validation_docs=50", "train.num_workers=2"]


def test_streaming_training_resumes_where_the_stream_was(tmp_path):
    """Train 12 steps streaming (with BPE and dataloader workers); then cut the run at its
    step-6 checkpoint and resume: steps 7-12 see the same batches (same losses)."""
    text = shared_file("corpora/tinyshakespeare/input.txt")
    tok = tmp_path / "tok"
    assert _run("-m", "mlmkit", "tokenizer", "data=files", f"data.train_files=[{text}]",
                "tokenizer.algorithm=bpe", "tokenizer.vocab_size=600", f"out={tok}").returncode == 0
    common = [str(ROOT / "train.py"), *TINY, "data=files", f"data.train_files=[{text}]",
              f"tokenizer.name_or_path={tok}", f"paths.cache_dir={tmp_path}/cache", "data.packing=line_by_line"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    proc = _run(*common, f"hydra.run.dir={whole}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    import shutil

    shutil.copytree(whole, cut)
    shutil.rmtree(cut / "checkpoints" / "step_0000012")
    shutil.rmtree(cut / "final")
    proc = _run(*common, f"hydra.run.dir={cut}", "train.resume=auto")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Resumed from" in proc.stderr and "step_0000006" in proc.stderr

    def losses(run):
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return [(e["step"], e["loss"]) for e in rows if e["event"] == "train"]

    assert len(losses(whole)) == 6
    assert_same_losses(losses(cut), losses(whole))
    state = json.loads((whole / "checkpoints" / "step_0000006" / "loop_state.json").read_text())
    assert state["stream"]["ranks"][0]["consumed"] == 6
    # a different worker count cannot continue the stream: one sentence, exit 2
    proc = _run(*common, f"hydra.run.dir={cut}", "train.resume=auto", "train.num_workers=0",
                "train.max_steps=14")
    assert proc.returncode == 2 and "train.num_workers=2" in proc.stderr.strip().splitlines()[-1]
