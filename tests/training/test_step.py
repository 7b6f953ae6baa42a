"""The optimizer step: a non-finite update is skipped on the device, with no host wait, and the
skipped steps are counted there until a log step reads them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from host_reads import NoHostReads
from torch import nn

from mlmkit.errors import TrainingDiverged
from mlmkit.training.optim import build_optimizer
from mlmkit.training.step import SkipCount, optimizer_step, skips_on_device


class Objective(nn.Module):
    """A tiny masked-LM objective: ``loss_sum`` over the labelled positions; ``poison`` makes
    the loss NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16)
        self.poison = False

    def forward(self, input_ids, labels, **_):
        logits = self.head(self.embed(input_ids))
        loss = nn.functional.cross_entropy(logits.view(-1, 16), labels.view(-1), ignore_index=-100,
                                           reduction="sum")
        return {"loss_sum": loss * float("nan") if self.poison else loss}


def _batch():
    ids = torch.arange(12).view(3, 4) % 16
    return [{"input_ids": ids, "labels": torch.where(ids % 3 == 0, ids, torch.full_like(ids, -100))}]


@pytest.fixture
def parts():
    from accelerate import Accelerator

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    objective = Objective()
    optimizer = build_optimizer(objective, SimpleNamespace(weight_decay=0.01, lr=1e-2, beta1=0.9,
                                                           beta2=0.999, eps=1e-8), "cpu")
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
        result = optimizer_step(accelerator, objective, optimizer, 1e-2, _batch(), max_grad_norm=1.0)
        skips = SkipCount()
        skips.add(result.ok)
    assert isinstance(result.ok, torch.Tensor) and not bool(result.ok)
    for k, v in objective.state_dict().items():
        assert torch.equal(v, before[k]), k  # weights untouched, weight decay included
    # the optimizer's moments and step count stay as if the step had not happened
    for state in optimizer.optimizer.state.values():
        assert float(state["step"]) == 0.0 and not state["exp_avg"].any() and not state["exp_avg_sq"].any()
    assert not hasattr(optimizer.optimizer, "found_inf")
    objective.poison = False
    optimizer.zero_grad()
    with NoHostReads():
        result = optimizer_step(accelerator, objective, optimizer, 1e-2, _batch(), max_grad_norm=1.0)
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
