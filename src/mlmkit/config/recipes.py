"""Apply the recipes composition takes before a run starts: continued pretraining, and
replaced-token detection's rate.

A model preset's rate and warmup are tuned to train its architecture from scratch
(bert-tiny's 3e-3 after 20 steps); applied to a pretrained model they wreck what it knows.
With ``model.init_from`` the run takes a continued-pretraining recipe instead, for each of
these settings the command line leaves unset:

- ``optim.lr``: 1e-4 at a batch of 256 sequences for a 768-wide model, the rate of
  task-adaptive pretraining of RoBERTa-base (Gururangan et al. (2020), 'Don't Stop
  Pretraining', Table 13), scaled by the square root of the run's global batch over 256
  (a smaller batch, a smaller step) and by 768 over the loaded model's width (smaller
  models take larger rates: Brown et al. (2020), Table 2.1, halve the rate from 768 to
  2048 wide).
- ``optim.warmup_fraction``: 6% of the budget, Gururangan et al.'s warmup.
- ``masking.mlm_probability``: 15%, the rate BERT and RoBERTa were pretrained with (the
  quick start's 40% suits a model trained from scratch), when the masking preset is the
  default one.
- ``model.name``: what was loaded, for the log and the model card.

With ``objective=rtd`` the peak rate is at most ``RTD_MAX_LR``, 5e-4, ELECTRA-Small's (Clark et
al. (2020), Table 6), where the command line leaves ``optim.lr`` unset: the small presets' rates
are tuned for MLM (bert-tiny's 3e-3), and at 3e-3 a new discriminator's last states collapsed to
one vector for every token and it learned nothing in 9,508 steps, where at 5e-4 it learned from
its first thousand (docs/electra.md). Its masking is ELECTRA's where the command line sets no
``masking`` group or setting and no recipe: 15% of the tokens chosen (Clark et al. (2020), Table
6), 85% of them ``[MASK]`` and the rest left as they are, no random tokens (google-research/
electra's ``pretrain_helpers.mask``), not the default preset's 40% with 80-10-10, which is MLM's.

The settings taken are logged and saved with the run's config, so the run says which
rate it trained at and why.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path

from omegaconf import DictConfig, open_dict

from mlmkit.config.families import check_continued, model_width

REFERENCE_LR = 1e-4  # Gururangan et al. (2020), Table 13 (TAPT, RoBERTa-base)
REFERENCE_BATCH = 256
REFERENCE_WIDTH = 768
WARMUP_FRACTION = 0.06
MLM_PROBABILITY = 0.15
RTD_MAX_LR = 5e-4  # ELECTRA-Small's peak rate: Clark et al. (2020), Table 6
# ELECTRA's masking: 15% chosen (Clark et al. (2020), Table 6), 85% of them [MASK], the rest kept
# (google-research/electra, pretrain/pretrain_helpers.py)
RTD_MASKING = {"mlm_probability": 0.15, "mask_replace_prob": 0.85, "random_replace_prob": 0.0}


def given_keys(overrides: Iterable[str]) -> set[str]:
    """Return the keys (``optim.lr``) and groups (``masking``) the command line sets."""
    keys = set()
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key:
            keys.add(key)
    return keys


def _given(name: str, keys: set[str]) -> bool:
    return any(key == name or key.startswith(name + ".") for key in keys)


def continued_lr(width: int, global_batch: int) -> float:
    """Return the continued-pretraining peak rate for a model ``width`` wide at ``global_batch``
    sequences."""
    return REFERENCE_LR * math.sqrt(global_batch / REFERENCE_BATCH) * REFERENCE_WIDTH / width


def _global_batch(cfg: DictConfig) -> int:
    train = cfg.train
    if train.get("global_batch_size"):
        return int(train.global_batch_size)
    return (
        int(train.batch_size) * int(train.grad_accum_steps) * int(os.environ.get("WORLD_SIZE", "1"))
    )


def model_label(init_from: str) -> str:
    """Name a model continued from ``init_from`` (a path's last part, or a Hub name)."""
    path = Path(init_from).expanduser()
    if path.exists():
        resolved = path.resolve()
        parts = [p for p in (resolved.parent.name, resolved.name) if p]
        name = "/".join(parts[-2:]) if resolved.name in ("final", "model") else resolved.name
    else:
        name = init_from
    return f"{name} (continued)"


def pretrained_width(init_from: str) -> int:
    """Read the width of the model at ``init_from`` from its config alone (a local dir's
    config.json as JSON, or the Hub's), refusing in one sentence a model mlmkit does not continue
    (``mlmkit.config.families``); the model layer loads the rest later."""
    return model_width(check_continued(init_from))


def apply_continued_pretraining(cfg: DictConfig, overrides: Iterable[str]) -> list[str]:
    """With ``model.init_from`` set, put the continued-pretraining recipe into ``cfg`` for each
    setting ``overrides`` leaves unset; returns one phrase per setting taken (nothing without
    ``init_from``). Reads the loaded model's config (its width), not its weights."""
    init_from = cfg.model.get("init_from")
    if not init_from:
        return []
    keys = given_keys(overrides)
    width = pretrained_width(str(init_from))
    taken = []
    with open_dict(cfg):
        if not _given("optim.lr", keys):
            batch = _global_batch(cfg)
            cfg.optim.lr = float(f"{continued_lr(width, batch):.3g}")
            taken.append(f"optim.lr={cfg.optim.lr:g} (1e-4 x sqrt({batch}/256) x 768/{width})")
        if not (_given("optim.warmup_fraction", keys) or _given("optim.warmup_steps", keys)):
            cfg.optim.warmup_fraction = WARMUP_FRACTION
            taken.append(f"optim.warmup_fraction={WARMUP_FRACTION:g}")
        if not _given("masking", keys):
            cfg.masking.mlm_probability = MLM_PROBABILITY
            taken.append(f"masking.mlm_probability={MLM_PROBABILITY:g}")
        if not _given("model.name", keys):
            cfg.model.name = model_label(str(init_from))
            taken.append(f"model.name={cfg.model.name!r}")
    return taken


def recipe_note(taken: list[str], init_from: str | None) -> str | None:
    """Return the log line for the settings ``apply_continued_pretraining`` took."""
    if not taken:
        return None
    return (
        f"Continued pretraining from {init_from}: the continued-pretraining recipe sets "
        f"{', '.join(taken)}; set any of them on the command line to override it."
    )


def apply_rtd_rate(cfg: DictConfig, overrides: Iterable[str]) -> str | None:
    """With ``objective=rtd``, lower a rate above ``RTD_MAX_LR`` to it where ``overrides`` leaves
    ``optim.lr`` unset; returns the log line for it, or None."""
    lr = float(cfg.optim.lr)
    if cfg.objective.name != "rtd" or lr <= RTD_MAX_LR or _given("optim.lr", given_keys(overrides)):
        return None
    with open_dict(cfg):
        cfg.optim.lr = RTD_MAX_LR
    return (
        f"objective=rtd: optim.lr={RTD_MAX_LR:g} (ELECTRA-Small's) instead of {lr:g}, a rate "
        f"tuned for MLM (at bert-tiny's 3e-3 a new discriminator collapsed: docs/electra.md); "
        f"set optim.lr on the command line to override it."
    )


# masking settings that do not choose what is masked: given alone, ELECTRA's masking still applies
MASKING_NOT_CHOSEN = (
    "masking.on_device",
    "masking.eval_seed",
    "masking.eval_mlm_probability",
    "masking.eval_min_masked_tokens",
)


def apply_rtd_masking(cfg: DictConfig, overrides: Iterable[str]) -> str | None:
    """With ``objective=rtd``, ELECTRA's masking (``RTD_MASKING``) where ``overrides`` sets no
    ``masking`` group or setting that chooses the masking (``MASKING_NOT_CHOSEN`` aside) and no
    ``recipe`` (a recipe sets its own); returns the log line for it, or None."""
    keys = given_keys(overrides) - set(MASKING_NOT_CHOSEN)
    if cfg.objective.name != "rtd" or _given("masking", keys) or _given("recipe", keys):
        return None
    before = f"{float(cfg.masking.mlm_probability):g}"
    with open_dict(cfg):
        for key, value in RTD_MASKING.items():
            cfg.masking[key] = value
    instead = "" if before == "0.15" else f" (instead of {before})"
    return (
        f"objective=rtd: ELECTRA's masking, masking.mlm_probability=0.15{instead} with "
        "mask_replace_prob=0.85 and random_replace_prob=0 (85% [MASK], the rest kept); set "
        "masking on the command line to override it."
    )
