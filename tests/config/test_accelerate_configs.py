"""conf/accelerate/: every launch config loads with accelerate's own config loader."""

from __future__ import annotations

import pytest
from accelerate.commands.config.config_args import load_config_from_file
from runs import ROOT

CONF = ROOT / "conf" / "accelerate"

EXPECTED = {  # file -> (distributed_type, processes, machines)
    "single_gpu": ("NO", 1, 1),
    "ddp_bf16": ("MULTI_GPU", 8, 1),
    "fsdp": ("FSDP", 8, 1),
    "deepspeed_zero2": ("DEEPSPEED", 8, 1),
    "deepspeed_zero3": ("DEEPSPEED", 8, 1),
    "multi_node": ("MULTI_GPU", 16, 2),
    "cpu_multi_process": ("MULTI_CPU", 2, 1),
}


def test_every_accelerate_config_is_listed():
    assert {p.stem for p in CONF.glob("*.yaml")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_accelerate_loads_the_config(name):
    cfg = load_config_from_file(str(CONF / f"{name}.yaml"))
    kind, processes, machines = EXPECTED[name]
    assert str(cfg.distributed_type).split(".")[-1] == kind
    assert (cfg.num_processes, cfg.num_machines) == (processes, machines)
    assert str(cfg.mixed_precision).split(".")[-1].lower() in ("bf16", "no")
    if name == "fsdp":
        f = cfg.fsdp_config
        # one unit per encoder layer: the class the objective names (BERT's or ModernBERT's)
        assert f["fsdp_version"] == 2 and "fsdp_transformer_layer_cls_to_wrap" not in f
        assert f["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
        assert (
            f["fsdp_state_dict_type"] == "SHARDED_STATE_DICT"
            and f["fsdp_reshard_after_forward"] is True
        )
        import importlib

        from mlmkit.model.architectures import MODEL_TYPES, architecture

        for model_type in MODEL_TYPES:  # the class named must exist, for every family
            module = model_type.replace("-", "_")
            assert hasattr(
                importlib.import_module(f"transformers.models.{module}.modeling_{module}"),
                architecture(model_type).layer_class,
            )
    if name.startswith("deepspeed"):
        assert cfg.deepspeed_config["zero_stage"] == int(name[-1])
        assert cfg.deepspeed_config["gradient_accumulation_steps"] == 1
    if name == "multi_node":
        assert cfg.main_process_ip and cfg.main_process_port == 29500
