"""The GPU path on CUDA, with no flash-attn needed: SDPA against eager in bf16, fp16 with its
gradient scaler, compiled layers, the documents mask, exact resume of on-device masks, and a step
that waits for the GPU only at log steps. Skipped (with the reason) where no CUDA GPU is present;
``benchmarks/gpu_check.py`` runs them on one."""

from __future__ import annotations

import pytest
import torch
from batches import SMALL, _batches, _model, _packed, _ragged
from host_reads import NoHostReads

from mlmkit.config import ModelConfig
from mlmkit.model.bert import MaskedLM, build_model

pytestmark = pytest.mark.gpu

MODERN = ModelConfig(
    architecture="modernbert",
    num_hidden_layers=3,
    hidden_size=64,
    num_attention_heads=4,
    intermediate_size=96,
    local_attention=16,
    global_attn_every_n_layers=3,
    max_position_embeddings=512,
)


def _cuda(batch):
    return {k: v.cuda() for k, v in batch.items()}


def _loss(model, batch, dtype=torch.bfloat16):
    with torch.autocast("cuda", dtype=dtype):
        out = MaskedLM(model.cuda())(**batch)
    return out["loss_sum"].float() / out["n_tokens"]


@pytest.mark.parametrize("architecture", ["bert", "modernbert"])
@pytest.mark.parametrize("rows", [_packed, _ragged], ids=["packed", "padded"])
def test_sdpa_gives_eagers_loss_in_bf16(tokenizer, architecture, rows):
    batch = _cuda(_batches(tokenizer, rows, n=1, pad8=True)[0])
    losses = []
    for attn in ("eager", "sdpa"):
        torch.manual_seed(0)
        model = (
            build_model(MODERN, tokenizer, attn_implementation=attn)
            if architecture == "modernbert"
            else _model(tokenizer, attn_implementation=attn)
        )
        losses.append(_loss(model, batch))
    assert torch.isfinite(losses[1])
    torch.testing.assert_close(losses[0], losses[1], rtol=2e-2, atol=1e-2)


def _prepared(tokenizer, precision):
    from types import SimpleNamespace

    from accelerate import Accelerator

    from mlmkit.training.optim import build_optimizer

    accelerator = Accelerator(mixed_precision=precision)
    objective = MaskedLM(_model(tokenizer))
    optimizer = build_optimizer(
        objective,
        SimpleNamespace(weight_decay=0.01, lr=1e-3, beta1=0.9, beta2=0.98, eps=1e-6),
        "cuda",
    )
    return (accelerator, *accelerator.prepare(objective, optimizer))


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_step_learns_skips_and_waits_for_the_gpu_only_at_log_steps(tokenizer, precision):
    """bf16, and fp16 with its scaler: the loss falls over a few steps, none of which reads a
    device value on the host; a step with a non-finite gradient leaves the weights as they were."""
    from mlmkit.training.step import SkipCount, optimizer_step

    accelerator, objective, optimizer = _prepared(tokenizer, precision)
    batches = [_cuda(b) for b in _batches(tokenizer, _packed, n=2)]
    skips, losses = SkipCount(), []
    with NoHostReads():
        for i in range(12):
            result = optimizer_step(accelerator, objective, optimizer, 1e-3, [batches[i % 2]], 1.0)
            optimizer.zero_grad(set_to_none=True)
            skips.add(result.ok)
            losses.append(result.loss_sum / result.n_masked)
    assert float(losses[-1]) < float(losses[0]) and int(skips.counts[0]) == 0
    weight = objective.model.bert.embeddings.word_embeddings.weight
    before = weight.detach().clone()
    with torch.no_grad():
        objective.model.cls.predictions.transform.dense.weight[0, 0] = float("inf")
    result = optimizer_step(accelerator, objective, optimizer, 1e-3, [batches[0]], 1.0)
    assert not bool(result.ok) and torch.equal(weight.detach(), before)


def test_compiled_layers_give_the_uncompiled_loss(tokenizer, tmp_path, monkeypatch):
    from mlmkit.training.runtime import compile_encoder

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    batch = _cuda(_batches(tokenizer, _packed, n=1)[0])
    plain = _loss(_model(tokenizer), batch)
    model = _model(tokenizer).cuda()
    compile_encoder(model)
    torch.testing.assert_close(_loss(model, batch), plain, rtol=2e-2, atol=1e-2)


@pytest.mark.parametrize("config", [ModelConfig(**SMALL), MODERN], ids=["bert", "modernbert"])
def test_documents_attend_within_themselves_on_cuda(tokenizer, config):
    from mlmkit.training.doctor import documents_check

    torch.manual_seed(0)
    model = build_model(config, tokenizer, attn_implementation="sdpa")
    row = torch.tensor(_packed(tokenizer, n=1, length=48)[0]["input_ids"])
    result = documents_check(model, row, tokenizer.sep_token_id, torch.device("cuda"))
    assert result["documents"] >= 2 and result["ok"], result


def test_on_device_masks_resume_exactly_on_cuda(tokenizer):
    from mlmkit.masking.collator import MLMCollator

    def collator():
        return MLMCollator(tokenizer, seed=3, strategy="span", apply_mask=False)

    batches = [_cuda(collator()(_packed(tokenizer, seed=i))) for i in range(3)]
    first = collator()
    first.mask_in_step(batches[0]["input_ids"])
    saved = first.step_generator_state()
    with NoHostReads():
        drawn = [first.mask_in_step(b["input_ids"]) for b in batches[1:]]
    resumed = collator()
    resumed.load_step_generator_state(saved)
    again = [resumed.mask_in_step(b["input_ids"]) for b in batches[1:]]
    for (ids, labels), (ids2, labels2) in zip(drawn, again):
        assert ids.is_cuda and torch.equal(ids, ids2) and torch.equal(labels, labels2)


def _counted(what: str, reads) -> str:
    """What ``reads`` counted (each wait's place and text) and the warnings it caught and did not
    count; printed too, for ``pytest -rA`` or ``-s``."""
    lines = [
        f"{what}: {reads.count} counted",
        *(f"  counted: {w}" for w in reads.waits),
        *(f"  not counted: {w}" for w in reads.other_warnings),
    ]
    print(*lines, sep="\n")
    return "\n".join(lines)


def test_the_doctor_counts_every_wait_for_the_gpu():
    """On CUDA, mlmkit doctor counts synchronising calls through torch's sync debug mode: a
    nonzero and an item count, device-side work does not."""
    from mlmkit.training.doctor import HostReads

    x = torch.ones(64, device="cuda")
    with HostReads("cuda") as reads:
        reads.counting = True
        (x * 2).sum()
        reads.counting = False
    shown = _counted("device-side work", reads)
    assert reads.count == 0, shown
    with HostReads("cuda") as reads:
        reads.counting = True
        x.nonzero()
        x.sum().item()
        reads.counting = False
    shown = _counted("nonzero and item", reads)
    assert reads.count >= 2, shown


def test_side_by_side_workers_each_see_one_gpu_dealt_round_robin():
    """mlmkit glue's workers (parallel=3 here, more than most machines' GPUs): each sees one
    GPU as cuda:0, the visible GPUs taken in turn."""
    from mlmkit.evaluation.workers import job_place, pool, slot_devices, visible_gpus

    gpus = visible_gpus()
    with pool(3) as executor:
        places = [executor.submit(job_place) for _ in range(3)]
        seen = [executor.submit(visible_gpus) for _ in range(3)]
        places, seen = [f.result() for f in places], [f.result() for f in seen]
    assert {p["device"] for p in places} <= {f"cuda:{d}" for d in slot_devices(3, gpus)}
    assert all(len(s) == 1 and s[0] in gpus for s in seen)
