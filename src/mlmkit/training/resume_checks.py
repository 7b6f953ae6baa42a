"""What a resume may change, checked before anything in the run dir is written.

A checkpoint records the settings it was trained under (``settings`` in its loop state) and
the identity of its data (``corpus``: the corpus fingerprint, ``train_blocks``). A resume
compares them with the new command line:

- settings that give the checkpoint's weights or data position their meaning (the model's
  shape, the tokenizer, the data source, sequence length and packing, the seed that orders
  the data) must not change: the resume is refused with one sentence;
- settings a resume may change take effect and are listed in the log: the learning rate and
  the rest of the optimizer's settings (re-applied over the restored optimizer and schedule),
  budgets, intervals, the batch size (the data position is kept by samples seen), masking,
  precision.

Resuming from an explicit checkpoint that is older than the run's latest abandons the later
continuation: its checkpoints, ``final/`` and events are moved to ``retired/<time>/`` so that a
later ``train.resume=auto`` cannot return to it.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from mlmkit.config import Config
from mlmkit.config.schema import flat_settings
from mlmkit.errors import CheckpointError, ConfigError
from mlmkit.training.checkpoint_files import LOOP_STATE, list_checkpoints

log = logging.getLogger("mlmkit")

# model settings that change neither the shape nor the meaning of the weights
_MODEL_FREE = {
    "model.name",
    "model.init_from",
    "model.attn_implementation",
    "model.sparse_prediction",
    "model.hidden_dropout_prob",
    "model.attention_probs_dropout_prob",
    # the init only: a resume loads the checkpoint's weights
    "model.position_init",
    "model.attention_init",
    "model.output_bias_init",
}
# data settings that change neither the blocks nor their order
_DATA_FREE = {"data.pad_to_multiple_of", "data.num_proc", "data.max_eval_samples", "data.cache"}
# settings a resume does not look at
_IGNORED = {
    "train.resume",
    "train.progress",
    "train.num_workers",
    "train.reuse_cpu_memory",
    "phases",
}  # phases: checked by phases.begun_phases
_IGNORED_SECTIONS = ("paths.", "logger.")

# the model config fields that decide the shape of the weights (and, for ModernBERT, which
# layers attend locally, how far, and their rotary bases); a field the saved config lacks
# (type_vocab_size of a ModernBERT) is not compared
MODEL_SHAPE_KEYS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    "model_type",
    "layer_types",
    "local_attention",
    "rope_parameters",
    "hidden_dim",  # DistilBERT's FFN
    "embedding_size",  # ALBERT's and ELECTRA's factorised embeddings
    "num_hidden_groups",  # ALBERT's shared layers
    "relative_attention",  # DeBERTa's
)


def is_fixed(name: str) -> bool:
    """Return True for a setting a resume must not change (the seed orders the data and seeds the
    masks)."""
    if name == "train.seed":
        return True
    if name.startswith("model."):
        return name not in _MODEL_FREE
    if name.startswith("data."):
        return name not in _DATA_FREE
    return name.startswith("tokenizer.")


def saved_loop_state(resume_from: Path) -> dict[str, Any]:
    """Read the loop state of ``resume_from``, or of the newest older checkpoint whose loop state
    can be read (a damaged one is passed over here and when loading); empty when none can."""
    ckpt_dir = resume_from.parent
    candidates = [resume_from] + [
        p for p in reversed(list_checkpoints(ckpt_dir)) if p.name < resume_from.name
    ]
    for path in candidates:
        try:
            state = json.loads((path / LOOP_STATE).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(state, dict) and state:
            return state
    return {}


def _show(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def check_settings(cfg: Config, saved: dict[str, Any] | None, resume_from: Path) -> list[str]:
    """Refuse a resume that changes a fixed setting; return the changed settings that take
    effect, as ``"name old -> new"`` (logged by the caller)."""
    if not isinstance(saved, dict):  # a checkpoint written before settings were recorded
        return []
    new, old = flat_settings(asdict(cfg)), flat_settings(saved)
    changed = [
        k
        for k in sorted(new.keys() | old.keys())
        if k in new
        and k in old
        and new[k] != old[k]
        and k not in _IGNORED
        and not k.startswith(_IGNORED_SECTIONS)
    ]
    fixed = [k for k in changed if is_fixed(k)]
    if fixed:
        k = fixed[0]
        more = f" (and {', '.join(fixed[1:])})" if len(fixed) > 1 else ""
        raise ConfigError(
            f"train.resume: {k} was {_show(old[k])} when {resume_from.name} was written and is now "
            f"{_show(new[k])}{more}, but the checkpoint's weights and data position depend on it; "
            "resume with the run's own setting, or start a new run from its weights with "
            "model.init_from=<run>/final."
        )
    return [f"{k} {_show(old[k])} -> {_show(new[k])}" for k in changed]


def check_model_shape(run_model_dir: Path, config, resume_from: Path) -> None:
    """Refuse a resume whose model differs in shape from the run's ``model/config.json``."""
    path = run_model_dir / "config.json"
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # written again from this run's model
    current = config.to_dict()
    diff = [k for k in MODEL_SHAPE_KEYS if k in saved and saved[k] != current.get(k)]
    if diff:
        k = diff[0]
        raise ConfigError(
            f"train.resume: the model of {resume_from.name} has {k}={saved[k]} (the run's "
            f"{path.parent.name}/config.json) but the settings build {k}={current.get(k)}; resume "
            "with the run's model settings (model=..., tokenizer=...), or start a new run."
        )


def check_data(
    saved: dict[str, Any], corpus: str, train_blocks: int | None, resume_from: Path
) -> None:
    """Refuse a resume whose data position cannot carry over: another number of training
    blocks (map mode) or other streamed text; warn when the text changed but the position
    still carries over."""
    old_corpus, old_blocks = saved.get("corpus"), saved.get("train_blocks")
    if old_corpus is None or old_corpus == corpus:
        return
    if train_blocks is None or old_blocks != train_blocks:
        was = f"{old_blocks} training blocks" if old_blocks is not None else "another stream"
        now = f"{train_blocks}" if train_blocks is not None else "a different stream"
        raise ConfigError(
            f"train.resume: the training text changed since {resume_from.name} was written ({was}, "
            f"now {now}), so its data position cannot carry over; restore the files of "
            "data.train_files, or start a new run with model.init_from=<run>/final."
        )
    log.warning(
        "The training text changed since %s was written (same number of blocks); the run "
        "continues at the same position in the new text.",
        resume_from.name,
    )


def apply_optim_settings(optimizer, scheduler, optim, step_factor) -> None:
    """Re-apply the optimizer settings of this command line over the restored optimizer and
    schedule: the peak rate (``optim.lr``), weight decay, betas and eps. ``step_factor`` is
    the schedule's multiplier at the restored step."""
    inner = getattr(scheduler, "scheduler", scheduler)  # accelerate wraps the scheduler
    groups = optimizer.param_groups
    inner.base_lrs = [optim.lr for _ in groups]
    for i, group in enumerate(groups):
        group["initial_lr"] = optim.lr
        group["lr"] = optim.lr * step_factor
        group["betas"] = (optim.beta1, optim.beta2)
        group["eps"] = optim.eps
        group["weight_decay"] = optim.weight_decay if i == 0 else 0.0  # param_groups: decay first
    inner._last_lr = [g["lr"] for g in groups]


def retire_later(run_dir: Path, resume_from: Path, dropped_events: list[str]) -> Path | None:
    """Move the checkpoints after ``resume_from``, ``final/`` and ``dropped_events`` (the
    events after it) of an abandoned continuation to ``retired/<time>/``; returns that
    folder, or None when there was nothing later."""
    ckpt_dir = run_dir / "checkpoints"
    later = [p for p in list_checkpoints(ckpt_dir) if p.name > resume_from.name]
    final = run_dir / "final"
    if not later:  # final/ is then of this step or of another run's branch
        return None
    target = run_dir / "retired" / time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    try:
        (target / "checkpoints").mkdir(parents=True, exist_ok=True)
        for path in later:
            shutil.move(str(path), str(target / "checkpoints" / path.name))
        if final.exists():  # exported at the end of the abandoned continuation
            shutil.move(str(final), str(target / "final"))
        if dropped_events:
            (target / "metrics.jsonl").write_text("".join(e + "\n" for e in dropped_events))
    except OSError as exc:
        raise CheckpointError(
            f"Could not move the checkpoints after {resume_from.name} to {str(target)!r} "
            f"({exc.strerror or exc}); free disk space, or move them out of {str(ckpt_dir)!r} "
            "yourself."
        ) from None
    log.warning(
        "Resumed from %s, before the run's latest step: moved the abandoned continuation "
        "(%d checkpoint(s)%s) to %s.",
        resume_from.name,
        len(later),
        ", final/" if (target / "final").exists() else "",
        target,
    )
    return target
