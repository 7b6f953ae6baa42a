"""Train a tokenizer on any data source, streaming through the corpus, and write a Hugging
Face tokenizer dir for ``tokenizer.name_or_path``::

    mlmkit tokenizer data=files 'data.train_files=[corpus/*.txt]' \\
        tokenizer.algorithm=bpe tokenizer.vocab_size=16000 out=tokenizers/bpe16k

Settings are those of the training config (``conf/``, ``data=...``, ``tokenizer.*``),
plus ``out=<dir>`` (required).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from pathlib import Path

from mlmkit.cli.errors import hydra_error_sentence
from mlmkit.config import Config, compose_command, to_config
from mlmkit.data.streaming import iter_texts
from mlmkit.data.tokenizer import train_tokenizer, unk_report
from mlmkit.errors import ConfigError, TokenizerError


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return 0
    out = [a.split("=", 1)[1] for a in args if a.startswith("out=")]
    overrides = [a for a in args if not a.startswith("out=")]
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not out or not out[-1]:
        raise TokenizerError("Say where to write the tokenizer with out=<dir>.")
    cfg = compose_training_config(overrides)
    target = check_out_dir(out[-1])  # before any training
    t0 = time.perf_counter()
    chars = 0
    held_out: list[
        str
    ] = []  # every HOLD_OUT-th text (its first 20,000 characters), for the [UNK] share
    held_chars = 0

    def texts():
        nonlocal chars, held_chars
        for i, text in enumerate(iter_texts(cfg.data)):
            if i % HOLD_OUT == HOLD_OUT - 1 and held_chars < HELD_OUT_CHARS:
                held_out.append(text[:20_000])
                held_chars += len(held_out[-1])
                continue
            chars += len(text)
            yield text

    tokenizer = train_tokenizer(cfg.tokenizer, texts())
    report, warn = held_out_report(tokenizer, held_out)

    def write(folder: Path) -> None:
        tokenizer.save_pretrained(str(folder))
        (folder / "README.md").write_text(tokenizer_card(cfg, tokenizer, chars, report))

    write_whole(target, write, out[-1])
    print(
        f"Trained a {cfg.tokenizer.algorithm} tokenizer of {len(tokenizer)} tokens on "
        f"{chars / 1e6:.1f}M characters in {time.perf_counter() - t0:.1f} s; wrote {target} "
        f"(use it with tokenizer.name_or_path={target})."
    )
    print(("Warning: " if warn else "") + report)
    return 0


HOLD_OUT, HELD_OUT_CHARS = 50, 2_000_000  # one text in 50 is held out, up to 2M characters


def held_out_report(tokenizer, held_out: list[str]) -> tuple[str, bool]:
    """Return the [UNK] share of the held-out texts, as a sentence (and whether it warns)."""
    if not held_out:
        return (
            "No text was held out to measure the [UNK] share (the corpus has under 50 texts).",
            False,
        )
    ids = [i for row in tokenizer(held_out, add_special_tokens=False)["input_ids"] for i in row]
    unk = sum(i == tokenizer.unk_token_id for i in ids)
    return unk_report(tokenizer, unk, len(ids), held_out)


def tokenizer_card(cfg: Config, tokenizer, chars: int, report: str) -> str:
    t = cfg.tokenizer
    return (
        f"# {t.algorithm} tokenizer trained by mlmkit\n\n"
        f"- Vocabulary: {len(tokenizer)} tokens; lowercase={t.lowercase}, "
        f"strip_accents={t.strip_accents}.\n"
        f"- Trained on {chars:,} characters ({cfg.data.source} data).\n"
        f"- Held out one text in {HOLD_OUT}: {report}\n"
    )


def compose_training_config(overrides: list[str]) -> Config:
    """Compose the training config with ``overrides`` applied (Hydra's compose, no run dir)."""
    try:
        return to_config(compose_command("config", overrides))
    except ConfigError:
        raise
    except Exception as exc:  # a misspelt override or group
        raise ConfigError(hydra_error_sentence(exc)) from None


def check_out_dir(out: str) -> Path:
    """``out=`` as a new (or empty) folder that can be written, checked before any training: a
    tokenizer already there is never overwritten."""
    target = Path(out).expanduser()
    if target.exists() and not target.is_dir():
        raise ConfigError(
            f"out={out!r} is an existing file; set out= to a folder for the tokenizer."
        )
    if target.is_dir() and any(target.iterdir()):
        raise ConfigError(
            f"out={out!r} is a folder that holds files already; set out= to a new folder, "
            "so that nothing there is overwritten."
        )
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        probe = target.parent / f".{target.name}.write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"Cannot write the tokenizer to out={out!r} ({exc.strerror or exc}); set "
            "out= to a writable folder."
        ) from None
    return target


def write_whole(target: Path, write, out: str) -> None:
    """``write(folder)`` into a folder beside ``target``, renamed to ``target`` once complete: a
    tokenizer dir is there whole or not at all."""
    partial = target.parent / f".{target.name}.partial-{os.getpid()}"
    try:
        partial.mkdir()
        write(partial)
        if target.is_dir():
            target.rmdir()  # empty (check_out_dir); a file written there since stops the rename
        os.rename(partial, target)
    except OSError as exc:  # a full disk, or out= filled meanwhile
        shutil.rmtree(partial, ignore_errors=True)
        raise ConfigError(
            f"Could not write the tokenizer to out={out!r} ({exc.strerror or exc}); "
            "free disk space there or set out= to a new folder."
        ) from None
