"""Budgets (steps, tokens, time), the schedule against them, and the global batch."""

from __future__ import annotations

import pytest
from helpers import warnings_of
from runs import events, run_train

from mlmkit.config import OptimConfig, TrainConfig
from mlmkit.config.schema import DEFAULT_MAX_STEPS
from mlmkit.errors import ConfigError
from mlmkit.training.budget import Budget, parse_duration
from mlmkit.training.optim import lr_lambda


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("24h", 86400),
        ("1h30m", 5400),
        ("90m", 5400),
        ("45s", 45),
        ("2d", 172800),
        ("3600", 3600),
        (120, 120),
        ("0.5h", 1800),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["soon", "10x", "-5", "1h-30m", "0"])
def test_bad_duration_names_the_setting(bad):
    with pytest.raises(ConfigError, match="train.max_time"):
        TrainConfig(max_time=bad)


def test_step_budget_keeps_the_step_schedule():
    cfg = OptimConfig(warmup_steps=10, schedule="cosine", min_lr_ratio=0.1)
    budget = Budget(cfg, max_steps=100)
    assert [budget.lr_factor(s) for s in range(100)] == [lr_lambda(s, cfg, 100) for s in range(100)]


def test_token_budget_warms_up_and_decays_to_its_end():
    budget = Budget(
        OptimConfig(warmup_fraction=0.1, schedule="linear"), max_steps=None, max_tokens=100_000
    )
    factors = []
    step = 0
    while not budget.done(step):
        factors.append(budget.lr_factor(step))
        budget.finish_step(1000)
        step += 1
    assert step == 100  # stopped at the token budget
    peak = factors.index(max(factors))
    assert peak == 9 and factors[peak] == pytest.approx(1.0)  # 10% warmup
    assert all(a < b for a, b in zip(factors[:peak], factors[1 : peak + 1]))  # rising
    assert all(a > b for a, b in zip(factors[peak:-1], factors[peak + 1 :]))  # decaying
    assert factors[-1] == pytest.approx(0.0, abs=1e-9)  # reaches the end of the decay


def test_time_budget_follows_the_shared_clock():
    budget = Budget(OptimConfig(warmup_steps=0, schedule="linear"), max_steps=None, max_time=100.0)
    budget.sync(10, 20.0)  # 2 s per step, as the main process measured
    assert budget.elapsed(15) == pytest.approx(30.0)
    assert budget.progress(15) == pytest.approx(0.3)
    assert budget.lr_factor(15) == pytest.approx(1 - 32 / 100)  # the next step ends at 32 s
    assert not budget.done(49) and budget.done(50)
    restored = Budget(OptimConfig(warmup_steps=0), max_steps=None, max_time=100.0)
    restored.load_state_dict(budget.state_dict())
    assert restored.elapsed(15) == budget.elapsed(15)


@pytest.mark.parametrize("shape,at_90", [("1-sqrt", 1 - 0.5**0.5), ("linear", 0.5)])
def test_wsd_holds_the_peak_then_decays_in_the_last_share(shape, at_90):
    cfg = OptimConfig(warmup_steps=10, schedule="wsd", decay_fraction=0.2, decay_shape=shape)
    factors = [lr_lambda(s, cfg, 100) for s in range(101)]
    assert factors[9] == 1.0 and all(f == 1.0 for f in factors[10:81])  # stable to 80%
    assert factors[90] == pytest.approx(at_90) and factors[100] == pytest.approx(0.0)
    assert all(a > b for a, b in zip(factors[80:100], factors[81:101]))


def test_wsd_on_a_time_budget_decays_in_the_last_share_of_the_time():
    budget = Budget(
        OptimConfig(warmup_steps=0, schedule="wsd", decay_fraction=0.25, decay_shape="linear"),
        max_steps=None,
        max_time=100.0,
    )
    budget.sync(10, 10.0)  # 1 s per step
    assert budget.lr_factor(70) == 1.0  # the step ends at 71 s: stable
    assert budget.lr_factor(86) == pytest.approx(1 - 12 / 25)  # ends at 87 s, 12 s into the decay


@pytest.mark.slow
def test_a_wsd_run_extended_from_its_stable_phase_keeps_the_peak(tmp_path, cache_dir):
    """Resumed from a stable-phase checkpoint with a larger budget: no second warmup, and the
    decay moves to the last share of the new budget."""
    run = tmp_path / "run"
    args = [
        "optim.schedule=wsd",
        "optim.decay_fraction=0.2",
        "optim.warmup_steps=5",
        "optim.lr=1e-3",
        "train.save_every=10",
        "train.eval_every=0",
        "train.log_every=1",
    ]
    run_train(run, cache_dir, *args, "train.max_steps=20")
    run_train(
        run,
        cache_dir,
        *args,
        "train.max_steps=40",
        f"train.resume={run / 'checkpoints' / 'step_0000010'}",
    )
    lrs = {e["step"]: e["lr"] for e in events(run, "train")}
    assert sorted(lrs) == list(range(1, 41))
    cfg = OptimConfig(warmup_steps=5, schedule="wsd", decay_fraction=0.2)
    # the lr logged at step s is the one step s used, set after s - 1 steps
    assert [lrs[s] for s in range(11, 41)] == pytest.approx(
        [1e-3 * lr_lambda(s - 1, cfg, 40) for s in range(11, 41)]
    )
    assert all(lrs[s] == pytest.approx(1e-3) for s in range(11, 33))


def test_global_batch_derives_accumulation():
    assert TrainConfig(batch_size=8, global_batch_size=64).accumulation_steps(world=2) == 4
    assert TrainConfig(batch_size=8, grad_accum_steps=3).accumulation_steps(world=2) == 3
    with pytest.raises(
        ConfigError, match=r"not a multiple of train.batch_size x processes \(8 x 3 = 24\)"
    ):
        TrainConfig(batch_size=8, global_batch_size=64).accumulation_steps(world=3)
    with pytest.raises(ConfigError, match="set only one of them"):
        TrainConfig(batch_size=8, global_batch_size=64, grad_accum_steps=2).accumulation_steps(
            world=2
        )


def test_a_token_or_time_budget_alone_is_the_only_budget():
    assert TrainConfig().max_steps == TrainConfig(max_steps=None).max_steps == DEFAULT_MAX_STEPS
    assert TrainConfig(max_time="24h").max_steps is None
    assert TrainConfig(max_tokens=10**9).max_steps is None
    assert TrainConfig(max_time="24h", max_steps=500).max_steps == 500
    assert (
        TrainConfig(max_time="24h").budget_description()
        == "Budget: 24h of training (train.max_time), no step cap"
    )
    assert TrainConfig().budget_description() == (
        "Budget: 3,000 steps (train.max_steps), the default when no budget is set"
    )
    assert TrainConfig(max_tokens=10**6, max_steps=20).budget_description() == (
        "Budget: the first reached of 20 steps (train.max_steps) and 1,000,000 tokens "
        "(train.max_tokens)"
    )


@pytest.mark.slow
def test_token_and_time_budgets_stop_with_checkpoint_and_export(tmp_path, cache_dir):
    run = tmp_path / "tokens"  # 8 x 64 tokens per micro-batch, 2 micro-batches per step
    run_train(
        run,
        cache_dir,
        "train.max_steps=null",
        "train.max_tokens=10000",
        "train.global_batch_size=16",
        "optim.warmup_fraction=0.2",
        "train.log_every=1",
        "logger=none",
    )
    train = events(run, "train")
    assert [e["step"] for e in train] == list(range(1, 11))  # 10 x 1024 tokens >= 10000
    assert train[-1]["tokens_seen"] == 10240 and train[-1]["global_batch_size"] == 16
    lrs = [e["lr"] for e in train]
    assert lrs.index(max(lrs)) == 1 and lrs[-1] < 0.2 * max(lrs)  # warmup 20%, then decay
    assert (run / "checkpoints" / "step_0000010").is_dir() and (
        run / "final" / "config.json"
    ).is_file()
    assert (
        "16 sequences per optimizer step = 8 per device x 1 process(es) x 2"
        in (run / "train.log").read_text()
    )

    run = tmp_path / "time"
    run_train(
        run,
        cache_dir,
        "train.max_steps=100000",
        "train.max_time=4s",
        "train.log_every=2",
        "logger=none",
        "optim.warmup_steps=2",
    )
    train = events(run, "train")
    assert 2 < train[-1]["step"] < 100000 and train[-1]["elapsed_s"] >= 3.0
    assert train[-1]["lr"] < 0.5 * max(e["lr"] for e in train)  # decayed against the clock
    assert events(run, "eval")[-1]["step"] == train[-1]["step"]
    assert (run / "final" / "config.json").is_file()

    # one process reads its clock at every step: the run stops within a step or two of its
    # budget, not at the first log step (here 1,000 steps) that a multi-process run waits for
    run = tmp_path / "time-one-process"
    run_train(
        run,
        cache_dir,
        "train.max_steps=100000",
        "train.max_time=2s",
        "train.log_every=1000",
        "train.eval_every=0",
        "logger=none",
        "optim.warmup_steps=2",
    )
    last = events(run, "train")[-1]
    seconds_per_step = last["elapsed_s"] / last["step"]
    assert 2.0 <= last["elapsed_s"] <= 2.0 + 2 * seconds_per_step + 1.0, (
        last
    )  # a second for a busy machine


def _deepspeed(world: int, **ds_config):
    """What check_engine reads of an accelerator running DeepSpeed."""
    from types import SimpleNamespace

    plugin = SimpleNamespace(
        deepspeed_config={"train_micro_batch_size_per_gpu": "auto", **ds_config}
    )
    return SimpleNamespace(
        num_processes=world,
        distributed_type=SimpleNamespace(value="DEEPSPEED"),
        state=SimpleNamespace(deepspeed_plugin=plugin),
    )


def test_nothing_accumulates_under_deepspeed():
    from mlmkit.config import Config
    from mlmkit.training.setup import check_engine

    accelerator = _deepspeed(2, gradient_accumulation_steps=1)
    assert (
        check_engine(accelerator, Config(train=TrainConfig(batch_size=8, global_batch_size=16)))
        == 1
    )
    assert (
        accelerator.state.deepspeed_plugin.deepspeed_config["train_micro_batch_size_per_gpu"] == 8
    )
    with pytest.raises(ConfigError, match="nothing accumulates .this run derives 4"):
        check_engine(_deepspeed(2), Config(train=TrainConfig(batch_size=8, global_batch_size=64)))
    with pytest.raises(ConfigError, match="the DeepSpeed config sets 8"):
        check_engine(
            _deepspeed(2, gradient_accumulation_steps=8), Config(train=TrainConfig(batch_size=8))
        )


def test_a_warmup_as_long_as_the_step_budget_warns_naming_both_settings():
    from mlmkit.training.budget import Budget

    with warnings_of("mlmkit.training.budget") as warnings:
        Budget(OptimConfig(warmup_steps=4), max_steps=4)
        Budget(OptimConfig(warmup_steps=10), max_steps=4)
        Budget(OptimConfig(warmup_steps=3), max_steps=4)  # shorter: no warning
    assert len(warnings) == 2
    assert all("optim.warmup_steps" in w and "train.max_steps" in w for w in warnings)
