"""Phases (mlmkit.training.phases and the ``phases`` setting): their settings, spans and
learning rates, the checks a resume makes, and the batch-size warmup."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlmkit import compose
from mlmkit.errors import ConfigError
from mlmkit.training.budget import Budget
from mlmkit.training.phases import BatchRamp, PhasePlan, begun_phases

BERT_90_10 = (
    "phases=[{name:short,share:0.9},{name:long,share:0.1,schedule:rewarm,warmup_steps:10,"
    "set:{data:{max_seq_length:512},train.batch_size:8}}]"
)


def _plan(*overrides: str, max_steps: int = 1000) -> PhasePlan:
    cfg = compose([f"train.max_steps={max_steps}", *overrides])
    return PhasePlan(cfg, Budget(cfg.optim, cfg.train.max_steps))


def test_each_phase_holds_the_run_settings_with_its_own_and_the_earlier_phases_changes():
    cfg = compose(
        [
            "model=bert-mini",
            "data.max_seq_length=128",
            "phases=[{name:a,share:0.5},"
            "{name:b,share:0.3,set:{data.max_seq_length:512,masking.mlm_probability:0.3}},"
            "{name:c,share:0.2,set:{masking:{mlm_probability:0.15}}}]",
        ]
    )
    a, b, c = cfg.phase_configs()
    assert (a.data.max_seq_length, a.masking.mlm_probability) == (128, cfg.masking.mlm_probability)
    assert (b.data.max_seq_length, b.masking.mlm_probability) == (512, 0.3)
    assert (c.data.max_seq_length, c.masking.mlm_probability) == (512, 0.15)  # b's length holds
    assert cfg.data.max_seq_length == 128 and all(p.phases == [] for p in (a, b, c))


@pytest.mark.parametrize(
    "phases,words",
    [
        ("[{name:a,share:0.9},{name:b,share:0.2}]", "add up to 1.1"),
        ("[{name:a,share:0.5},{name:a,share:0.5}]", "must differ"),
        ("[{name:'a b',share:1.0}]", "names a folder"),
        (
            "[{name:a,share:0.5},{name:b,share:0.5,schedule:cosine}]",
            "choose one of continue, rewarm",
        ),
        (
            "[{name:a,share:0.5},{name:b,share:0.5,set:{model.hidden_size:256}}]",
            "cannot change between phases",
        ),
        (
            "[{name:a,share:0.5},{name:b,share:0.5,set:{data.streaming:true}}]",
            "cannot change between phases",
        ),
        (
            "[{name:a,share:0.5},{name:b,share:0.5,set:{tokenizer.vocab_size:100}}]",
            "cannot change between phases",
        ),
        (
            "[{name:a,share:0.5},{name:b,share:0.5,set:{data.max_seq_lenth:100}}]",
            "data.max_seq_lenth is not a setting",
        ),
        (
            "[{name:a,share:0.5},{name:b,share:0.5,set:{data.max_seq_length:1024}}]",
            "phases[1] (b): data.max_seq_length (1024)",
        ),
        (
            "[{name:a,share:0.5},{name:b,share:0.5,set:{masking.mlm_probability:1.5}}]",
            "phases[1] (b): masking.mlm_probability",
        ),
        (
            "[{name:a,share:0.5},{name:b,share:0.5,set:{model.global_rope_theta:160000}}]",
            "ModernBERT setting",
        ),
    ],
)
def test_a_phase_list_that_cannot_run_is_refused_in_one_sentence_naming_the_setting(phases, words):
    with pytest.raises(ConfigError) as info:
        compose(["model=bert-mini", f"phases={phases}"])
    assert words in str(info.value)
    assert str(info.value).count(". ") <= 2 and "\n" not in str(info.value)


def test_modernbert_phases_may_raise_the_rope_theta():
    cfg = compose(
        [
            "model=modernbert-tiny",
            "phases=[{name:a,share:0.5},{name:b,share:0.5,"
            "set:{model.global_rope_theta:160000,data.max_seq_length:512}}]",
        ]
    )
    assert cfg.phase_configs()[1].model.global_rope_theta == 160000


def test_phase_boundaries_follow_the_shares_of_the_budget():
    plan = _plan(BERT_90_10)
    plan.begin(0, 0, 0.0)
    assert not plan.due(899) and plan.due(900)
    assert plan.span(0) == (0.0, pytest.approx(0.9)) and plan.span(1) == (pytest.approx(0.9), 1.0)
    plan.begin(900, 0, 0.0)
    assert plan.index == 1 and plan.name == "long" and plan.config().data.max_seq_length == 512
    assert not plan.due(999)  # the last phase runs to the end of the budget


def test_an_ended_phase_keeps_its_span_when_the_budget_grows():
    # a run of 1,000 steps in one phase, continued to 1,250 with a second one
    plan = _plan("phases=[{name:main,share:0.8},{name:long,share:0.2}]", max_steps=1250)
    plan.starts = [{"name": "main", "set": {}, "step": 0, "tokens": 0, "elapsed": 0.0}]
    assert plan.due(1000)  # 80% of 1,250
    plan.begin(1000, 0, 0.0)
    assert plan.span(0) == (0.0, pytest.approx(0.8)) and plan.span(1) == (pytest.approx(0.8), 1.0)


def test_learning_rate_of_each_schedule():
    lr_steps = "optim.warmup_steps=100"
    plan = _plan(
        lr_steps,
        "optim.schedule=linear",
        "phases=[{name:a,share:0.5},{name:b,share:0.3,schedule:rewarm,"
        "warmup_steps:10,lr:5e-4},{name:c,share:0.2,schedule:decay,lr:5e-4}]",
        "optim.lr=1e-3",
    )
    plan.begin(0, 0, 0.0)
    budget = plan.budget
    # continue: the run's own schedule (100 warmup steps, then linear decay over the run)
    assert plan.lr_factor(49) == pytest.approx(0.5) and plan.lr_factor(99) == pytest.approx(1.0)
    assert plan.lr_factor(499) == pytest.approx(budget.lr_factor(499))
    # rewarm: 10 steps of warmup to the phase's rate (half the run's), then a linear decay to 0 at
    # its end
    plan.begin(500, 0, 0.0)
    assert plan.lr_factor(500) == pytest.approx(0.05) and plan.lr_factor(509) == pytest.approx(0.5)
    assert plan.lr_factor(510) < 0.5 and plan.lr_factor(799) == pytest.approx(0.0, abs=1e-9)
    # decay: from the phase's rate down to optim.min_lr_ratio, 1-sqrt by default
    plan.begin(800, 0, 0.0)
    assert plan.lr_factor(800) == pytest.approx(
        0.5 * (1 - (1 / 200) ** 0.5)
    )  # the share its first step ends at
    assert plan.lr_factor(999) == pytest.approx(0.0, abs=1e-9)
    constant = _plan(
        "optim.lr=1e-3", "phases=[{name:a,share:0.5},{name:b,share:0.5,schedule:constant,lr:2e-4}]"
    )
    constant.begin(0, 0, 0.0)
    constant.begin(500, 0, 0.0)
    assert constant.lr_factor(500) == constant.lr_factor(999) == pytest.approx(0.2)


def test_a_token_budget_splits_phases_by_tokens():
    cfg = compose(
        [
            "train.max_steps=null",
            "train.max_tokens=10000",
            "phases=[{name:a,share:0.25},{name:b,share:0.75}]",
        ]
    )
    budget = Budget(cfg.optim, cfg.train.max_steps, cfg.train.max_tokens)
    plan = PhasePlan(cfg, budget)
    plan.begin(0, 0, 0.0)
    budget.finish_step(2400)
    assert not plan.due(1)
    budget.finish_step(200)
    assert plan.due(2)


def test_a_resume_keeps_the_phases_that_began(tmp_path):
    ckpt = Path(tmp_path / "step_0000900")
    cfg = compose([BERT_90_10])
    saved = {
        "starts": [
            {"name": "short", "set": {}, "step": 0, "tokens": 0, "elapsed": 0.0},
            {
                "name": "long",
                "set": {"data.max_seq_length": 512, "train.batch_size": 8},
                "step": 900,
                "tokens": 10,
                "elapsed": 1.0,
            },
        ]
    }
    assert [s["name"] for s in begun_phases(cfg, saved, ckpt)] == ["short", "long"]
    assert begun_phases(cfg, None, None) == []  # a new run
    # an unphased checkpoint was in the first phase, with the run's own settings
    assert begun_phases(cfg, None, ckpt)[0]["name"] == "short"
    changed = compose(
        ["phases=[{name:short,share:0.9},{name:long,share:0.1,set:{data.max_seq_length:256}}]"]
    )
    with pytest.raises(ConfigError, match="phase 1 of step_0000900 was 'long'"):
        begun_phases(changed, saved, ckpt)
    with pytest.raises(ConfigError, match="phases lists 1"):
        begun_phases(compose(["phases=[{name:short,share:1.0}]"]), saved, ckpt)
    with pytest.raises(ConfigError, match="resume with the run's phases list"):
        begun_phases(compose([]), saved, ckpt)


def test_the_batch_warmup_grows_the_accumulation_and_the_rate_with_it():
    ramp = BatchRamp(tokens=1000, start_batch=8, per_pass=8, target_accum=4)
    assert [ramp.accum(t) for t in (0, 249, 250, 500, 999, 1000, 10**6)] == [1, 1, 1, 2, 3, 4, 4]
    assert ramp.lr_ratio(0) == 0.25 and ramp.lr_ratio(1000) == 1.0
    assert BatchRamp(1000, None, 8, 4).start == 1 and BatchRamp(1000, 20, 8, 4).start == 3
    ramp.retarget(per_pass=4, target_accum=8)  # a phase halves the micro-batch, same global batch
    assert ramp.start == 2 and ramp.accum(10**6) == 8
    with pytest.raises(ConfigError, match="train.batch_warmup_start"):
        compose(["train.batch_warmup_start=0"])


def test_the_published_recipes_compose_with_their_phases():
    bert = compose(["recipe=bert"])
    assert (
        bert.model.name,
        bert.optim.lr,
        bert.optim.warmup_steps,
        bert.train.global_batch_size,
        bert.train.max_steps,
        bert.masking.mlm_probability,
        bert.model.hidden_dropout_prob,
        bert.model.attention_init,
        bert.model.output_bias_init,
    ) == ("bert-base", 1e-4, 10000, 256, 1_000_000, 0.15, 0.1, "normal", "zero")
    assert [(p.name, p.share) for p in bert.phases] == [("seq128", 0.9), ("seq512", 0.1)]
    assert [c.data.max_seq_length for c in bert.phase_configs()] == [128, 512]
    assert (
        compose(["recipe=bert", "model=bert-mini"]).model.name == "bert-mini"
    )  # the command line wins
    modern = compose(["recipe=modernbert"])
    stable, extension, decay = modern.phase_configs()
    assert (stable.data.max_seq_length, stable.model.global_rope_theta) == (1024, 10000.0)
    assert (
        extension.data.max_seq_length,
        extension.model.global_rope_theta,
        extension.train.global_batch_size,
    ) == (8192, 160000.0, 576)
    assert [p.schedule for p in modern.phases] == ["continue", "constant", "decay"]
    tokens = [p.share * modern.train.max_tokens / 1e9 for p in modern.phases]
    assert tokens == pytest.approx([1719, 250, 50], abs=0.5)
    assert (
        modern.masking.mlm_probability,
        modern.train.batch_warmup_start,
        modern.optim.beta2,
    ) == (0.3, 768, 0.98)


@pytest.mark.parametrize(
    "setting,words",
    [
        ("train.batch_warmup_tokens=1000", "set train.batch_warmup_tokens=0"),
        (
            "phases=[{name:a,share:0.5},{name:b,share:0.5,set:{train.batch_size:2}}]",
            "no phase may set train.batch_size",
        ),
    ],
)
def test_under_deepspeed_a_batch_that_would_change_is_refused(setting, words):
    """DeepSpeed fixes its micro-batch when its engine starts (the engine check, as accelerate
    reports DeepSpeed)."""
    from types import SimpleNamespace

    from mlmkit.training.setup import check_engine

    accelerator = SimpleNamespace(
        num_processes=1,
        distributed_type=SimpleNamespace(value="DEEPSPEED"),
        state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(deepspeed_config={})),
    )
    cfg = compose(["train.batch_size=4", setting])
    with pytest.raises(ConfigError, match=words):
        check_engine(accelerator, cfg.phase_configs()[0] if cfg.phases else cfg, cfg.phases)
    assert (
        check_engine(accelerator, compose(["train.batch_size=4"])) == 1
    )  # the run's own batch passes
