"""Train a tokenizer on any data source, streaming through the corpus, and write a Hugging
Face tokenizer dir for ``tokenizer.name_or_path``::

    mlmkit tokenizer data=files 'data.train_files=[corpus/*.txt]' \\
        tokenizer.algorithm=bpe tokenizer.vocab_size=16000 out=tokenizers/bpe16k

Settings are those of the training config (``conf/``, ``data=...``, ``tokenizer.*``),
plus ``out=<dir>`` (required).
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from mlmkit.cli.errors import hydra_error_sentence
from mlmkit.config import CONFIG_MODULE, Config, register_configs, to_config
from mlmkit.data.streaming import iter_texts
from mlmkit.data.tokenizer import train_tokenizer
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

    def texts():
        nonlocal chars
        for text in iter_texts(cfg.data):
            chars += len(text)
            yield text

    tokenizer = train_tokenizer(cfg.tokenizer, texts())
    try:
        tokenizer.save_pretrained(str(target))
    except OSError as exc:  # a full disk
        raise ConfigError(f"Could not write the tokenizer to out={out[-1]!r} ({exc.strerror or exc}); "
                          "free disk space there or set out= to another folder.") from None
    print(f"Trained a {cfg.tokenizer.algorithm} tokenizer of {len(tokenizer)} tokens on "
          f"{chars / 1e6:.1f}M characters in {time.perf_counter() - t0:.1f} s; wrote {target} "
          f"(use it with tokenizer.name_or_path={target}).")
    return 0


def compose_training_config(overrides: list[str]) -> Config:
    """The training config with ``overrides`` applied (Hydra's compose, no run dir)."""
    register_configs()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            return to_config(compose(config_name="config", overrides=overrides))
    except ConfigError:
        raise
    except Exception as exc:  # a misspelt override or group
        raise ConfigError(hydra_error_sentence(exc)) from None


def check_out_dir(out: str) -> Path:
    """``out=`` as a folder that can be written, checked before any training."""
    target = Path(out).expanduser()
    if target.exists() and not target.is_dir():
        raise ConfigError(f"out={out!r} is an existing file; set out= to a folder for the tokenizer.")
    try:
        target.mkdir(parents=True, exist_ok=True)
        probe = target / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"Cannot write the tokenizer to out={out!r} ({exc.strerror or exc}); set "
                          "out= to a writable folder.") from None
    return target
