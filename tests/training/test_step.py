"""The optimizer step: a non-finite update is skipped on the device, with no host wait, and the
skipped steps are counted there until a log step reads them."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
import torch
from host_reads import NoHostReads
from torch import nn

from mlmkit.errors import TrainingDiverged
from mlmkit.model.objective import Objective as StepObjective
from mlmkit.training.optim import build_optimizer
from mlmkit.training.step import SkipCount, optimizer_step, skips_on_device


class Objective(StepObjective):
    """A tiny masked-LM objective: ``loss_sum`` over the labelled positions; ``poison`` makes
    the loss NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16)
        self.poison = False

    def forward(self, input_ids, labels, **_):
        logits = self.head(self.embed(input_ids))
        loss = nn.functional.cross_entropy(
            logits.view(-1, 16), labels.view(-1), ignore_index=-100, reduction="sum"
        )
        return {"loss_sum": loss * float("nan") if self.poison else loss}


def _batch():
    ids = torch.arange(12).view(3, 4) % 16
    return [
        {"input_ids": ids, "labels": torch.where(ids % 3 == 0, ids, torch.full_like(ids, -100))}
    ]


@pytest.fixture
def parts():
    from accelerate import Accelerator

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    objective = Objective()
    optimizer = build_optimizer(
        objective,
        SimpleNamespace(weight_decay=0.01, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8),
        "cpu",
    )
    objective, optimizer = accelerator.prepare(objective, optimizer)
    yield accelerator, objective, optimizer
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)  # the next in-process run sets its own


def test_a_nonfinite_step_is_skipped_on_the_device_without_a_host_read(parts):
    accelerator, objective, optimizer = parts
    assert skips_on_device(optimizer)  # mlmkit's fused AdamW
    objective.poison = True
    before = {k: v.clone() for k, v in objective.state_dict().items()}
    with NoHostReads():
        result = optimizer_step(
            accelerator, objective, optimizer, 1e-2, _batch(), max_grad_norm=1.0
        )
        skips = SkipCount()
        skips.add(result.ok)
    assert isinstance(result.ok, torch.Tensor) and not bool(result.ok)
    for k, v in objective.state_dict().items():
        assert torch.equal(v, before[k]), k  # weights untouched, weight decay included
    # the optimizer's moments and step count stay as if the step had not happened
    for state in optimizer.optimizer.state.values():
        assert (
            float(state["step"]) == 0.0
            and not state["exp_avg"].any()
            and not state["exp_avg_sq"].any()
        )
    assert not hasattr(optimizer.optimizer, "found_inf")
    objective.poison = False
    optimizer.zero_grad()
    with NoHostReads():
        result = optimizer_step(
            accelerator, objective, optimizer, 1e-2, _batch(), max_grad_norm=1.0
        )
    assert bool(result.ok)
    assert not torch.equal(objective.head.weight, before["head.weight"])
    assert all(float(s["step"]) == 1.0 for s in optimizer.optimizer.state.values())


def test_another_optimizer_skips_after_one_host_read(parts):
    accelerator, objective, _ = parts
    plain = accelerator.prepare(torch.optim.SGD(objective.parameters(), lr=0.1))
    assert not skips_on_device(plain)
    objective.poison = True
    before = objective.head.weight.detach().clone()
    result = optimizer_step(accelerator, objective, plain, 0.1, _batch(), max_grad_norm=None)
    assert not bool(result.ok) and torch.equal(objective.head.weight, before)


def _settle(skips, bad_steps=0, max_bad_steps=3):
    state = SimpleNamespace(step=10, bad_steps=bad_steps, skipped_steps=0)
    skips.settle(state, max_bad_steps, torch.tensor(float("nan")))
    return state


def test_skipped_steps_are_counted_on_the_device_and_read_at_settle():
    skips = SkipCount()
    with NoHostReads():
        for ok in (False, True, False, False):
            skips.add(torch.tensor(ok))
    state = _settle(skips)
    assert (state.skipped_steps, state.bad_steps) == (3, 2)
    # the streak carries over a log step: two more make four in a row, past max_bad_steps=3
    skips.add(torch.tensor(False))
    with pytest.raises(TrainingDiverged, match=r"3 steps in a row \(train.max_bad_steps is 3\)"):
        _settle(skips)
    # a good step ends a streak, and a window of good steps reads as none skipped
    skips = SkipCount()
    for ok in (False, False, True, True):
        skips.add(torch.tensor(ok))
    assert _settle(skips).bad_steps == 0
    skips.add(torch.tensor(True))
    assert (lambda s: (s.skipped_steps, s.bad_steps))(_settle(skips)) == (0, 0)
    _settle(SkipCount())  # nothing added: nothing read


# -- FSDP2 under accelerate < 1.16: the clipping returns a DTensor norm --------------------------


@pytest.fixture
def one_rank_group():
    """A one-process gloo group and its CPU mesh (what FSDP2 shards over), torn down after."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)
        dist.destroy_process_group()


def test_a_dtensor_gradient_norm_is_read_as_a_plain_tensor(one_rank_group):
    """FSDP2 shards the parameters as DTensors; accelerate before 1.16 returned the norm of
    torch's clipping as it came, a DTensor, so the skip flag and the skip counts computed from it
    were DTensors too, and the first log step's ``tolist`` failed. The step reads the norm whole."""
    from accelerate import Accelerator
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    class AccelerateBefore116(Accelerator):
        """accelerate's FSDP2 clipping before 1.16: torch's norm over the DTensor gradients."""

        def clip_grad_norm_(self, parameters, max_norm, norm_type=2):
            return torch.nn.utils.clip_grad_norm_(list(parameters), max_norm, norm_type=norm_type)

    torch.manual_seed(0)
    accelerator = AccelerateBefore116(cpu=True)
    objective = Objective()
    fully_shard(objective, mesh=one_rank_group)
    assert isinstance(objective.head.weight, DTensor)
    optimizer = build_optimizer(
        objective,
        SimpleNamespace(weight_decay=0.01, lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8),
        "cpu",
    )
    assert skips_on_device(optimizer)
    objective(**_batch()[0])["loss_sum"].backward()
    assert isinstance(
        accelerator.clip_grad_norm_(objective.parameters(), 1.0), DTensor
    )  # the old return
    optimizer.zero_grad()

    skips, results = SkipCount(), []
    for poison in (False, True, False):
        objective.poison = poison
        before = objective.head.weight.full_tensor().clone()
        result = optimizer_step(
            accelerator, objective, optimizer, 1e-2, _batch(), max_grad_norm=1.0
        )
        optimizer.zero_grad(set_to_none=True)
        skips.add(result.ok)
        results.append(result)
        assert not isinstance(result.grad_norm, DTensor) and not isinstance(result.ok, DTensor)
        changed = not torch.equal(objective.head.weight.full_tensor(), before)
        assert changed == (not poison)  # the poisoned step is skipped, the others update
    assert float(results[0].grad_norm) > 0 and not torch.isfinite(results[1].grad_norm)
    state = _settle(skips, max_bad_steps=3)  # the log step's read
    assert (state.skipped_steps, state.bad_steps) == (1, 0)


# -- DeepSpeed: the engine steps inside the backward ----------------------------------------------


@pytest.fixture(scope="module")
def deepspeed_on_cpu():
    """A factory of (accelerator, engine, optimizer) under accelerate's DeepSpeed ZeRO-2 on one CPU
    process (DeepSpeed's CPU accelerator, as tests/engine_on_cpu.py switches to it). The module's
    engines share one process group (DeepSpeed keeps a clone of the first), torn down at the end."""
    pytest.importorskip(
        "deepspeed", reason="the dev extra installs deepspeed (pip install -e '.[dev]')"
    )
    import socket

    import torch.distributed as dist
    from accelerate.state import AcceleratorState

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    made = []

    def make(precision, check_grad_overflow=True):
        from accelerate import Accelerator
        from accelerate.state import PartialState
        from accelerate.utils import DeepSpeedPlugin, DistributedType

        AcceleratorState._reset_state(reset_partial_state=True)  # this engine's precision
        accelerator = Accelerator(cpu=True, mixed_precision=precision)
        plugin = DeepSpeedPlugin(zero_stage=2, gradient_clipping=1.0)
        plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = 3
        if precision == "bf16":
            plugin.deepspeed_config["bf16"] = {
                "enabled": True,
                "check_grad_overflow": check_grad_overflow,
            }
        plugin.set_mixed_precision(precision)
        for state in (PartialState(), accelerator.state):
            state.distributed_type = DistributedType.DEEPSPEED
        accelerator.state.deepspeed_plugins = {"default": plugin}
        plugin.select(_from_accelerator_state=True)
        accelerator.deepspeed_engine_wrapped = (
            None  # as Accelerator.__init__ starts it under DeepSpeed
        )
        torch.manual_seed(0)
        objective = Objective()
        optimizer = torch.optim.AdamW(objective.parameters(), lr=1e-2)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        engine, optimizer, _ = accelerator.prepare(objective, optimizer, schedule)
        made.append(engine)
        return accelerator, engine, optimizer

    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        # gloo's allreduce, not the shared-memory op DeepSpeed would build (a minute of C++)
        patch.setattr(importlib.import_module("deepspeed.comm.torch"), "build_shm_op", lambda: None)
        try:
            yield make
        finally:
            for engine in made:
                engine.destroy()
            AcceleratorState._reset_state(reset_partial_state=True)
            if dist.is_initialized():
                dist.destroy_process_group()


@pytest.mark.parametrize(
    "precision,check",
    [("bf16", True), ("no", True), ("bf16", False)],
    ids=["bf16", "fp32", "bf16-unchecked"],
)
def test_under_deepspeed_the_step_reports_what_the_engine_did(
    deepspeed_on_cpu, caplog, precision, check
):
    """accelerate's DeepSpeed backward steps the engine, so mlmkit's own skip could skip nothing:
    a step counts as skipped exactly when the engine skipped it (ZeRO checks the gradient in fp32,
    and in bf16 unless ``bf16.check_grad_overflow`` is false, as older DeepSpeed's bf16 did not,
    and counts the skip in its ``skipped_steps``); a non-finite update the engine applied is no
    skip, but a warning."""
    import logging

    accelerator, engine, optimizer = deepspeed_on_cpu(precision, check)
    module = engine.module
    skips = SkipCount()
    for poison in (False, True):
        module.poison = poison
        before = module.head.weight.detach().float().clone()
        skipped_before = engine.skipped_steps
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="mlmkit"):
            result = optimizer_step(
                accelerator, engine, optimizer, 1e-2, _batch(), max_grad_norm=1.0
            )
        skips.add(result.ok)
        engine_skipped = engine.skipped_steps > skipped_before
        assert result.ok is (not engine_skipped)
        assert (not torch.equal(module.head.weight.detach().float(), before)) is result.ok
        applied_nonfinite = "DeepSpeed applied an update whose gradient norm is" in caplog.text
        assert applied_nonfinite is (poison and result.ok)
    assert not torch.isfinite(result.grad_norm)
    if not check:  # this engine lets the NaN through, and the step says so instead of a skip
        assert result.ok and not torch.isfinite(module.head.weight).all()
    assert _settle(skips).skipped_steps == engine.skipped_steps
