"""mlmkit tokenizer: a trained tokenizer dir that training can use."""

from __future__ import annotations

import pytest
from conftest import shared_file
from runs import run_cli


@pytest.mark.parametrize("algorithm", ["bpe", "unigram", "wordpiece"])
def test_tokenizer_command_writes_a_dir_training_can_use(tmp_path, algorithm):
    from mlmkit.data.tokenizer import load_tokenizer

    text = shared_file("corpora/tinyshakespeare/input.txt")
    out = tmp_path / "tok"
    proc = run_cli(
        "tokenizer",
        "data=files",
        f"data.train_files=[{text}]",
        f"tokenizer.algorithm={algorithm}",
        "tokenizer.vocab_size=800",
        f"out={out}",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tokenizer.name_or_path=" in proc.stdout
    tok = load_tokenizer(str(out))  # checks [CLS] [SEP] [PAD] [MASK] and a fast tokenizer
    assert 700 <= len(tok) <= 800
    ids = tok("To be, or not to be")["input_ids"]
    assert (
        ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id and tok.unk_token_id not in ids
    )
    # one text in 50 held out: its [UNK] share is printed and in the tokenizer's card
    held_out = next(line for line in proc.stdout.splitlines() if line.startswith("[UNK] is "))
    assert held_out in (out / "README.md").read_text() and "of the held-out text" in held_out
    bad = run_cli(
        "tokenizer",
        "data=files",
        f"data.train_files=[{tmp_path}/nothing*.txt]",
        f"out={tmp_path / 'tok2'}",
    )
    assert bad.returncode == 2 and bad.stderr.strip().startswith("Error: data.train_files: no file")
    assert not (tmp_path / "tok2").exists()  # nothing written by a refused command
