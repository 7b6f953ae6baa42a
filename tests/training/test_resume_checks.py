"""Which settings a resume may change, and how the optimizer's settings are re-applied."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from mlmkit.config import Config
from mlmkit.errors import ConfigError
from mlmkit.training.resume_checks import apply_optim_settings, check_settings, saved_loop_state


def _changed(**sections) -> Config:
    cfg = Config()
    for section, values in sections.items():
        cfg = replace(cfg, **{section: replace(getattr(cfg, section), **values)})
    return cfg


@pytest.mark.parametrize(
    "section,values,setting",
    [
        ("model", {"num_hidden_layers": 4}, "model.num_hidden_layers"),
        ("tokenizer", {"lowercase": False}, "tokenizer.lowercase"),
        ("data", {"packing": "line_by_line"}, "data.packing"),
        ("data", {"train_files": ["other.txt"]}, "data.train_files"),
        ("train", {"seed": 7}, "train.seed"),
    ],
)
def test_a_change_the_checkpoint_depends_on_is_refused(section, values, setting):
    saved = asdict(Config())
    with pytest.raises(ConfigError, match=setting.replace(".", r"\.")):
        check_settings(_changed(**{section: values}), saved, Path("step_0000010"))


def test_changes_a_resume_may_make_are_listed():
    cfg = _changed(
        optim={"lr": 5e-4},
        train={"max_steps": 9000, "batch_size": 16, "progress": False},
        model={
            "attn_implementation": "eager",
            "position_init": "normal",
            "attention_init": "normal",
            "output_bias_init": "zero",
        },
        paths={"cache_dir": "/elsewhere"},
    )
    changes = check_settings(cfg, asdict(Config()), Path("step_0000010"))
    assert changes == [
        "model.attention_init local -> normal",
        "model.attn_implementation auto -> eager",
        "model.output_bias_init unigram -> zero",
        "model.position_init sinusoidal -> normal",
        "optim.lr 0.001 -> 0.0005",
        "train.batch_size 32 -> 16",
        "train.max_steps 3000 -> 9000",
    ]
    assert check_settings(cfg, None, Path("step_0000010")) == []  # a checkpoint without settings


def test_settings_come_from_the_newest_readable_loop_state(tmp_path):
    for step, text in [(5, json.dumps({"step": 5, "settings": {"a": 1}})), (10, "{")]:
        (tmp_path / f"step_{step:07d}").mkdir()
        (tmp_path / f"step_{step:07d}" / "loop_state.json").write_text(text)
    assert saved_loop_state(tmp_path / "step_0000010")["settings"] == {"a": 1}


def test_optimizer_settings_are_re_applied_over_the_restored_ones():
    model = torch.nn.Linear(4, 4)
    groups = [
        {"params": [model.weight], "weight_decay": 0.01},
        {"params": [model.bias], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5)
    restored = scheduler.state_dict()
    optim = replace(Config().optim, lr=2e-4, weight_decay=0.1, beta2=0.95)
    scheduler.load_state_dict(restored)
    apply_optim_settings(optimizer, scheduler, optim, 0.5)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([1e-4, 1e-4])
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.95)
    optimizer.step()
    scheduler.step()  # the schedule goes on from the new peak
    assert scheduler.get_last_lr() == pytest.approx([1e-4, 1e-4])
