"""Continued pretraining (model.init_from) takes its own recipe, not the model preset's."""

from __future__ import annotations

import math

import pytest

from mlmkit import compose
from mlmkit.config.recipes import continued_lr, given_keys


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    """A saved 128-wide BertForMaskedLM (config and safetensors; no tokenizer needed to compose)."""
    from transformers import BertConfig, BertForMaskedLM

    path = tmp_path_factory.mktemp("bert") / "my-bert"
    config = BertConfig(
        vocab_size=100,
        hidden_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=256,
    )
    BertForMaskedLM(config).save_pretrained(path, safe_serialization=True)
    return path


def test_init_from_takes_the_continued_pretraining_recipe(bert_dir):
    quick = compose([])
    cfg = compose([f"model.init_from={bert_dir}"])
    assert quick.optim.lr == pytest.approx(3e-3) and quick.masking.mlm_probability == pytest.approx(
        0.40
    )
    # 1e-4 at batch 256 and width 768, scaled to batch 32 and width 128
    assert cfg.optim.lr == pytest.approx(1e-4 * math.sqrt(32 / 256) * 768 / 128, rel=1e-2)
    assert cfg.optim.warmup_fraction == pytest.approx(0.06)
    assert cfg.masking.mlm_probability == pytest.approx(0.15)
    assert cfg.model.name == "my-bert (continued)"


def test_what_the_command_line_sets_wins_over_the_recipe(bert_dir):
    cfg = compose(
        [
            f"model.init_from={bert_dir}",
            "optim.lr=5e-5",
            "optim.warmup_steps=50",
            "masking=mask40",
            "model.name=mine",
            "train.batch_size=64",
        ]
    )
    assert cfg.optim.lr == pytest.approx(5e-5) and cfg.optim.warmup_steps == 50
    assert cfg.optim.warmup_fraction is None
    assert cfg.masking.mlm_probability == pytest.approx(0.40) and cfg.model.name == "mine"
    cfg = compose(
        [f"model.init_from={bert_dir}", "masking.mlm_probability=0.3", "train.batch_size=64"]
    )
    assert cfg.masking.mlm_probability == pytest.approx(0.3)
    assert cfg.optim.lr == pytest.approx(continued_lr(128, 64), rel=1e-2)  # the batch the run takes


def test_the_rate_shrinks_with_width_and_grows_with_the_batch():
    assert continued_lr(768, 256) == pytest.approx(1e-4)
    assert continued_lr(1024, 256) < continued_lr(768, 256) < continued_lr(256, 256)
    assert continued_lr(768, 1024) == pytest.approx(2e-4)


def test_given_keys_reads_hydra_overrides():
    assert given_keys(["optim.lr=1", "+masking.x=2", "~model.name", "masking=bert"]) == {
        "optim.lr",
        "masking.x",
        "model.name",
        "masking",
    }


def test_rtd_takes_electras_rate_where_the_presets_is_higher_and_says_so():
    from mlmkit.config.compose import compose_command, finish
    from mlmkit.config.recipes import RTD_MAX_LR

    cfg, notes = finish(compose_command("config", ["objective=rtd"]), ["objective=rtd"])
    assert compose([]).optim.lr == pytest.approx(3e-3)  # bert-tiny's, tuned for MLM
    assert cfg.optim.lr == pytest.approx(RTD_MAX_LR) == pytest.approx(5e-4)
    assert len(notes) == 2 and "optim.lr=0.0005" in notes[0] and "instead of 0.003" in notes[0]
    # the command line wins; a preset's lower rate is kept; MLM runs keep the preset's
    assert compose(["objective=rtd", "optim.lr=2e-3"]).optim.lr == pytest.approx(2e-3)
    assert compose(["objective=rtd", "model=bert-base"]).optim.lr == pytest.approx(1e-4)
    assert compose(["objective=mlm"]).optim.lr == pytest.approx(3e-3)
    cfg, notes = finish(compose_command("config", ["model=bert-base"]), ["model=bert-base"])
    assert notes == []


def masking_of(cfg) -> tuple[float, float, float]:
    m = cfg.masking
    return m.mlm_probability, m.mask_replace_prob, m.random_replace_prob


def test_rtd_takes_electras_masking_unless_the_command_line_or_a_recipe_sets_one(bert_dir):
    """objective=rtd masks as ELECTRA did (15% chosen, 85% [MASK], the rest kept), not at the
    default preset's 40% with 80-10-10 (MLM's), and says so; a masking group, any masking
    setting or a recipe on the command line is the run's own; MLM keeps the default."""
    from mlmkit.config.compose import compose_command, finish

    cfg, notes = finish(compose_command("config", ["objective=rtd"]), ["objective=rtd"])
    assert masking_of(cfg) == (0.15, 0.85, 0.0)
    assert "ELECTRA's masking" in notes[1] and "instead of 0.4" in notes[1]
    assert masking_of(compose(["objective=mlm"])) == (0.40, 0.8, 0.1)
    assert masking_of(compose(["objective=rtd", "masking=bert"])) == (0.15, 0.8, 0.1)
    assert masking_of(compose(["objective=rtd", "masking.mlm_probability=0.3"])) == (0.3, 0.8, 0.1)
    assert masking_of(compose(["recipe=electra"])) == (0.15, 0.85, 0.0)  # the recipe's own
    # a setting that does not choose the masking (doctor's advice, on_device) leaves ELECTRA's
    assert masking_of(compose(["objective=rtd", "masking.on_device=true"])) == (0.15, 0.85, 0.0)
    continued = ["objective=rtd", f"model.init_from={bert_dir}"]  # a BERT continued
    cfg, notes = finish(compose_command("config", continued), continued)
    assert masking_of(cfg) == (0.15, 0.85, 0.0)
    assert "masking.mlm_probability=0.15 with" in notes[-1] and "instead of" not in notes[-1]
