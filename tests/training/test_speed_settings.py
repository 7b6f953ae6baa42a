"""Speed settings (mlmkit.training.runtime, the sparse head, the CPU kernels) change nothing
but speed."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from batches import SMALL, _batches, _model, _packed, _ragged, _train  # noqa: F401

from mlmkit.masking.collator import IGNORE_INDEX, MLMCollator
from mlmkit.model.bert import MaskedLM, padded_vocab_size, prediction_positions
from mlmkit.model.kernels import (
    cpu_sdpa_attention_forward,
    cross_entropy_sum,
    register_cpu_attention,
)

# -- the sparse head --------------------------------------------------------------------


@pytest.mark.parametrize("examples", [_packed, _ragged], ids=["packed", "padded"])
def test_sparse_head_with_positions_from_the_dataloader_equals_full_head(tokenizer, examples):
    """Loss and gradients of the head at the chosen positions (indices computed in the
    dataloader), on packed and on padded batches, equal those of the full head."""
    model = _model(tokenizer)
    batch = _batches(tokenizer, examples, n=1, pad8=True)[0]
    assert ("attention_mask" in batch) == (examples is _ragged)
    results = []
    for sparse, extra in ((True, {}), (False, {})):
        model.zero_grad()
        inputs = (
            batch
            if sparse
            else {k: v for k, v in batch.items() if k not in ("positions", "targets")}
        )
        out = MaskedLM(model, sparse_prediction=sparse)(**inputs, **extra)
        (out["loss_sum"] / out["n_tokens"]).backward()
        results.append(
            (
                out["loss_sum"].detach(),
                int(out["n_tokens"]),
                {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
            )
        )
    (l1, n1, g1), (l2, n2, g2) = results
    assert n1 == n2 == int((batch["labels"] != IGNORE_INDEX).sum())
    torch.testing.assert_close(l1, l2, rtol=1e-5, atol=1e-4)
    assert g1.keys() == g2.keys()
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], rtol=1e-4, atol=1e-6, msg=name)


def test_prediction_positions_are_bucketed_and_ignored_beyond_the_chosen(tokenizer):
    labels = torch.full((4, 32), IGNORE_INDEX)
    labels[0, 3], labels[2, 7], labels[3, 31] = 5, 6, 7
    positions, targets = prediction_positions(labels)
    assert positions.numel() == 64 and targets.numel() == 64
    assert positions[:3].tolist() == [3, 2 * 32 + 7, 3 * 32 + 31] and targets[:3].tolist() == [
        5,
        6,
        7,
    ]
    assert (targets[3:] == IGNORE_INDEX).all()


# -- attention ----------------------------------------------------------------------------


def test_padded_batch_reaches_sdpa_as_a_boolean_mask_and_packed_without_one(tokenizer, monkeypatch):
    seen = []
    original = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, *args, **kwargs):
        seen.append(attn_mask)
        return original(q, k, v, attn_mask, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    objective = MaskedLM(_model(tokenizer))
    objective(**_batches(tokenizer, _ragged, n=1, pad8=True)[0])
    assert seen and all(m is not None and m.dtype == torch.bool for m in seen)
    seen.clear()
    objective(**_batches(tokenizer, _packed, n=1)[0])
    assert seen and all(m is None for m in seen)  # no mask: SDPA's fused kernels


def test_pad_to_multiple_of_only_pads_batches_that_need_padding(tokenizer):
    collator = MLMCollator(tokenizer, seed=0, pad_to_multiple_of=8)
    equal = collator(_packed(tokenizer, n=4, length=30))
    assert equal["input_ids"].shape == (4, 30) and bool(equal["attention_mask"].all())
    ragged = collator(_ragged(tokenizer))
    assert ragged["input_ids"].shape == (4, 40)  # 33 rounded up to a multiple of 8


# -- each speed setting leaves a short run's loss where the plain run has it -------------


def test_vocab_padding_keeps_the_tokenizer_and_the_loss(tokenizer):
    plain = _model(tokenizer, pad_vocab_multiple=1)
    padded = _model(tokenizer, pad_vocab_multiple=64)
    v = plain.config.vocab_size
    assert v == padded_vocab_size(tokenizer) and padded.config.vocab_size == padded_vocab_size(
        tokenizer, 64
    )
    assert padded.config.vocab_size % 64 == 0 and padded.config.vocab_size > v
    # the same weights; the extra rows keep their own
    state = plain.state_dict()
    for key, value in padded.state_dict().items():
        if value.shape == state[key].shape:
            value.copy_(state[key])
        else:
            value[:v].copy_(state[key])
    batches = _batches(tokenizer, _packed)
    a = _train(MaskedLM(plain), batches)
    b = _train(MaskedLM(padded), batches)
    assert a[-1] < a[0]
    assert b == pytest.approx(a, rel=1e-5)  # the padding ids get probability 0
    with torch.no_grad():
        logits = padded(input_ids=batches[0]["input_ids"]).logits
    assert logits.argmax(-1).max() < v  # never predicted
    assert (padded.cls.predictions.bias[v:] < -1e3).all()


@pytest.mark.parametrize(
    "setting",
    [
        "sparse_head",
        "bf16",
        "pad_to_multiple_of_8",
        "no_full_mask",
        "fused_adamw",
        "cpu_bf16_attention",
    ],
)
def test_speed_setting_keeps_the_loss(tokenizer, setting):
    """Five AdamW steps with one speed setting on, from the same weights and batches, end at
    the loss of the plain run (fp32, full head, explicit masks, no extra padding)."""
    examples = _ragged if setting == "pad_to_multiple_of_8" else _packed
    plain_batches = _batches(tokenizer, examples, drop_mask=False)
    for b in plain_batches:
        b.setdefault("attention_mask", torch.ones_like(b["input_ids"]))
    batches = plain_batches
    sparse, autocast, fused, rel = False, False, False, 1e-4
    if setting == "fused_adamw":
        fused = True
    elif setting == "sparse_head":
        sparse = True
    elif setting in ("bf16", "cpu_bf16_attention"):
        autocast, rel = True, 0.02
    elif setting == "pad_to_multiple_of_8":  # the same masks, the batch padded as the collator pads
        batches = []
        for b in plain_batches:
            extra = -b["input_ids"].size(1) % 8
            assert extra > 0
            labels = F.pad(b["labels"], (0, extra), value=IGNORE_INDEX)
            positions, targets = prediction_positions(labels)
            batches.append(
                {
                    "input_ids": F.pad(b["input_ids"], (0, extra), value=tokenizer.pad_token_id),
                    "attention_mask": F.pad(b["attention_mask"], (0, extra), value=0),
                    "labels": labels,
                    "positions": positions,
                    "targets": targets,
                }
            )
        sparse = True
    elif setting == "no_full_mask":
        batches = _batches(tokenizer, examples)
        assert "attention_mask" not in batches[0]
    plain = _train(MaskedLM(_model(tokenizer), sparse_prediction=False), plain_batches)
    attn = (
        {"attn_implementation": register_cpu_attention()} if setting == "cpu_bf16_attention" else {}
    )
    fast = _train(
        MaskedLM(_model(tokenizer, **attn), sparse_prediction=sparse),
        batches,
        autocast=autocast,
        fused=fused,
    )
    assert plain[-1] < plain[0]  # the run learns, so the comparison means something
    assert fast == pytest.approx(plain, rel=rel)


@pytest.mark.slow
def test_compiled_encoder_keeps_the_loss_and_the_parameter_names(tokenizer, tmp_path, monkeypatch):
    from mlmkit.training.runtime import compile_encoder

    # A kernel cache of its own: inductor's shared one under /tmp outlives the run, and a
    # kernel built while the CPU was held to AVX2 (.ci/as-avx2) aborted a later native run.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))

    batches = _batches(tokenizer, _packed)
    plain = _train(MaskedLM(_model(tokenizer)), batches)
    model = _model(tokenizer)
    names = list(model.state_dict())
    compile_encoder(model)
    fast = _train(MaskedLM(model), batches)
    assert list(model.state_dict()) == names  # checkpoints and export unchanged
    assert fast == pytest.approx(plain, rel=1e-3)


@pytest.mark.parametrize("architecture", ["bert", "modernbert"])
def test_compiled_layers_leave_a_mask_that_hides_nothing_out_of_attention(
    tokenizer, architecture, monkeypatch
):
    """train.compile=true compiles each encoder layer, so transformers builds the attention mask
    outside the traced code: an all-ones mask reaches SDPA as None (its flash kernel stays open),
    as it does uncompiled; a padded batch still gets its mask. (Compiling the whole encoder
    passed an all-True (B, 1, S, S) mask.) Recorded at trace time with the eager backend."""
    from mlmkit.model.architectures import parts_of
    from mlmkit.training.runtime import compile_encoder

    seen, real = [], F.scaled_dot_product_attention

    def record(q, k, v, attn_mask=None, *args, **kwargs):
        seen.append(attn_mask is None)
        return real(q, k, v, attn_mask, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", record)
    torch._dynamo.reset()
    # a window wider than the rows: it hides nothing, and ModernBERT's local layers need no mask
    # either
    extra = (
        {"architecture": "modernbert", "local_attention": 128}
        if architecture == "modernbert"
        else {}
    )
    model = _model(tokenizer, **extra)
    compile_encoder(model, backend="eager")
    layers = model.config.num_hidden_layers
    for rows, masked in ((_packed, False), (_ragged, True)):
        batch = _batches(tokenizer, rows, n=1, drop_mask=False)[0]
        assert "attention_mask" in batch  # all ones for the packed rows
        seen.clear()
        with torch.no_grad():  # the encoder as transformers runs it, given a 2-D mask
            parts_of(model).encoder(model)(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
            )
        assert len(seen) == layers and set(seen) == {not masked}, (rows.__name__, seen)
    torch._dynamo.reset()


# -- gradient checkpointing (train.gradient_checkpointing) ------------------------------------


def checkpointing_on(model) -> bool:
    """transformers' flag that checkpointing is on (renamed from is_gradient_checkpointing)."""
    flag = getattr(model, "is_activation_checkpointing", None)
    return model.is_gradient_checkpointing if flag is None else flag


def _checkpointing_model(architecture, tokenizer, tmp_path):
    """A small masked-LM model of ``architecture`` (dropout on) and a tokenizer for it: BERT and
    ModernBERT built as mlmkit builds a preset, RoBERTa from a tiny released-model folder."""
    if architecture != "roberta":
        return _model(tokenizer, architecture=architecture), tokenizer
    from families import released_model
    from transformers import AutoTokenizer

    from mlmkit.model.bert import load_pretrained

    folder = released_model(tmp_path / "roberta", "roberta")
    return load_pretrained(str(folder)), AutoTokenizer.from_pretrained(str(folder))


def _forward_backward(objective, batch):
    """One seeded training step's forward and backward: the loss, the gradients, and the bytes
    the encoder's forward kept for the backward (torch's saved-tensor hooks see every tensor
    kept; the head's, the same either way, left out)."""
    from mlmkit.model.architectures import parts_of

    kept, counting = [0], [False]

    def pack(tensor):
        kept[0] += tensor.numel() * tensor.element_size() if counting[0] else 0
        return tensor

    encoder = parts_of(objective.model).encoder(objective.model)
    hooks = [
        encoder.register_forward_pre_hook(lambda *_: counting.__setitem__(0, True)),
        encoder.register_forward_hook(lambda *_: counting.__setitem__(0, False)),
    ]
    objective.train()
    torch.manual_seed(0)  # the same dropout draws in both runs
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = objective(**batch)
    for hook in hooks:
        hook.remove()
    loss = out["loss_sum"] / out["n_tokens"]
    loss.backward()
    grads = {n: p.grad for n, p in objective.named_parameters() if p.grad is not None}
    return loss.detach(), grads, kept[0]


@pytest.mark.parametrize("architecture", ["bert", "modernbert", "roberta"])
def test_gradient_checkpointing_keeps_loss_and_gradients_and_drops_the_kept_activations(
    tokenizer, tmp_path, architecture
):
    """train.gradient_checkpointing=true: transformers' checkpointing is on in every encoder
    layer, and on the sparse head's path (the encoder called directly) the forward keeps a
    fraction of the activations, while the loss and every gradient, dropout on, are the plain
    model's."""
    import copy

    from mlmkit.model.architectures import parts_of
    from mlmkit.training.runtime import checkpoint_activations

    plain, tok = _checkpointing_model(architecture, tokenizer, tmp_path)
    model = copy.deepcopy(plain)
    checkpoint_activations(model)
    assert checkpointing_on(model)  # transformers' own flag
    layers = parts_of(model).layers(model)
    assert all(layer.gradient_checkpointing for layer in layers)
    assert not any(layer.gradient_checkpointing for layer in parts_of(plain).layers(plain))
    batch = _batches(tok, _packed, n=1)[0]
    loss, grads, kept = _forward_backward(MaskedLM(plain), batch)
    loss_ckpt, grads_ckpt, kept_ckpt = _forward_backward(MaskedLM(model), batch)
    torch.testing.assert_close(loss_ckpt, loss, rtol=1e-5, atol=1e-6)
    assert grads_ckpt.keys() == grads.keys() and len(grads) == len(list(plain.parameters()))
    for name, grad in grads.items():
        torch.testing.assert_close(grads_ckpt[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert kept_ckpt < kept / 4, (kept_ckpt, kept)  # the checkpoints hold the layers' inputs


def test_gradient_checkpointing_is_refused_in_one_sentence_where_it_cannot_apply():
    """ALBERT's layers have no checkpointing in transformers; under FSDP with its own activation
    checkpointing the layers would be recomputed twice."""
    from types import SimpleNamespace

    from transformers import AlbertConfig, AlbertForMaskedLM, BertConfig, BertForMaskedLM

    from mlmkit.errors import ConfigError
    from mlmkit.training.runtime import checkpoint_activations

    tiny = dict(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
    albert = AlbertForMaskedLM(AlbertConfig(embedding_size=8, intermediate_size=32, **tiny))
    with pytest.raises(ConfigError, match=r"albert model .*train.gradient_checkpointing=false"):
        checkpoint_activations(albert)
    fsdp = SimpleNamespace(
        state=SimpleNamespace(fsdp_plugin=SimpleNamespace(activation_checkpointing=True))
    )
    bert = BertForMaskedLM(BertConfig(intermediate_size=32, **tiny))
    with pytest.raises(ConfigError, match="fsdp_activation_checkpointing: false"):
        checkpoint_activations(bert, fsdp)
    assert not checkpointing_on(bert)


@pytest.mark.slow
def test_compiled_checkpointed_layers_keep_the_loss(tokenizer):
    """train.compile=true after train.gradient_checkpointing=true compiles the checkpointed layers
    (traced through AOT autograd, as inductor's are): the plain run's losses."""
    from mlmkit.training.runtime import checkpoint_activations, compile_encoder

    torch._dynamo.reset()
    batches = _batches(tokenizer, _packed)
    plain = _train(MaskedLM(_model(tokenizer)), batches, steps=3)
    model = _model(tokenizer)
    checkpoint_activations(model)
    compile_encoder(model, backend="aot_eager")
    fast = _train(MaskedLM(model), batches, steps=3)
    assert fast == pytest.approx(plain, rel=1e-4)
    torch._dynamo.reset()


# -- the GPU path -------------------------------------------------------------------------


@pytest.mark.gpu
def test_flash_attention_varlen_equals_sdpa_on_padded_batches(tokenizer):
    from mlmkit.model.bert import flash_attn_available

    if not flash_attn_available():
        pytest.skip("needs a CUDA GPU and the flash-attn package")
    batch = {k: v.cuda() for k, v in _batches(tokenizer, _ragged, n=1, pad8=True)[0].items()}
    outs = []
    for attn in ("sdpa", "flash_attention_2"):
        objective = MaskedLM(_model(tokenizer, attn_implementation=attn)).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            outs.append(objective(**batch)["loss_sum"].float())
    torch.testing.assert_close(outs[0], outs[1], rtol=2e-2, atol=1e-2)


# -- the CPU kernels (mlmkit.model.kernels) -----------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_blockwise_cross_entropy_equals_torch(dtype):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(37, 301, generator=g) * 4).to(
        dtype
    )  # 37 rows: not a multiple of the block
    targets = torch.randint(0, 301, (37,), generator=g)
    targets[[3, 20, 36]] = IGNORE_INDEX
    a = logits.clone().requires_grad_()
    b = logits.clone().requires_grad_()
    ours = cross_entropy_sum(a, targets)
    ref = F.cross_entropy(b.float(), targets, ignore_index=IGNORE_INDEX, reduction="sum")
    assert ours.dtype == torch.float32 and ours.item() == pytest.approx(ref.item(), rel=1e-6)
    (ours * 0.5).backward()
    (ref * 0.5).backward()
    assert a.grad.dtype == dtype
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-6  # the same fp32 values, rounded to the dtype
    torch.testing.assert_close(a.grad.float(), b.grad.float(), rtol=tol, atol=tol * 1e-2)
    assert (a.grad[[3, 20, 36]] == 0).all()  # ignored rows get no gradient


def test_cpu_bf16_attention_is_sdpa_forward_with_a_more_exact_backward():
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, 4, 24, 16, generator=g).to(torch.bfloat16).requires_grad_() for _ in range(3)
    )
    grad = torch.randn(2, 24, 4, 16, generator=g).to(torch.bfloat16)
    module = torch.nn.Module()
    ours, _ = cpu_sdpa_attention_forward(module, q, k, v, None, scaling=0.25)
    ref = F.scaled_dot_product_attention(q, k, v, scale=0.25).transpose(1, 2)
    assert torch.equal(ours, ref)  # the same fused bf16 forward
    d_ours = torch.autograd.grad(ours, (q, k, v), grad)
    d_bf16 = torch.autograd.grad(ref, (q, k, v), grad)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    exact = F.scaled_dot_product_attention(q64, k64, v64, scale=0.25).transpose(1, 2)
    d_exact = torch.autograd.grad(exact, (q64, k64, v64), grad.double())
    for mine, bf16, ex in zip(d_ours, d_bf16, d_exact):
        assert mine.dtype == torch.bfloat16
        err, err_bf16 = (mine.double() - ex).abs().max(), (bf16.double() - ex).abs().max()
        assert err <= err_bf16 * 1.01 and err < 0.05


def test_cpu_bf16_attention_leaves_masks_and_inference_to_sdpa(monkeypatch):
    calls = []
    original = F.scaled_dot_product_attention
    monkeypatch.setattr(
        F,
        "scaled_dot_product_attention",
        lambda *a, **kw: (
            calls.append(kw.get("attn_mask", a[3] if len(a) > 3 else None)) or original(*a, **kw)
        ),
    )
    q = torch.randn(1, 2, 8, 4).to(torch.bfloat16)
    module = torch.nn.Module()
    mask = torch.ones(1, 1, 8, 8, dtype=torch.bool)
    cpu_sdpa_attention_forward(module, q, q, q, mask)
    with torch.no_grad():
        cpu_sdpa_attention_forward(module, q, q, q, None)
    assert len(calls) == 2 and calls[0] is mask
    calls.clear()
    cpu_sdpa_attention_forward(module, q.float().requires_grad_(), q.float(), q.float(), None)
    assert len(calls) == 1  # fp32: transformers' SDPA path


def test_auto_attention_on_cpu_picks_the_kernel_for_bf16_only():
    from mlmkit.model.bert import resolve_attn_implementation

    assert resolve_attn_implementation("auto", "cpu", "bf16") == "mlmkit_cpu_sdpa"
    assert resolve_attn_implementation("auto", "cpu", "no") == "sdpa"
    assert resolve_attn_implementation("sdpa", "cpu", "bf16") == "sdpa"


_FAULTS = """
import resource, sys, torch
from mlmkit.training.runtime import reuse_freed_memory
applied = reuse_freed_memory() if sys.argv[1] == "reuse" else False
faults = []
for _ in range(4):  # a 48 MB tensor made and freed every step, as the head's logits are
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.empty(12 * 2**20, dtype=torch.float32).fill_(1.0)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(applied, min(faults[1:]))
"""


@pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="tunes glibc's malloc; this is not glibc"
)
def test_reused_cpu_memory_takes_no_new_page_faults_for_a_block_made_every_step():
    """glibc maps a block over 32 MB anew at every allocation, so each step faults its pages
    in again (12,288 for 48 MB in 4 KB pages); with ``reuse_freed_memory`` the second and
    later allocations reuse the freed block."""
    out = {}
    for mode in ("default", "reuse"):
        proc = subprocess.run(
            [sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        applied, faults = proc.stdout.split()
        out[mode] = (applied == "True", int(faults))
    assert out["reuse"][0]
    assert out["default"][1] >= 20  # faulted in anew at every allocation (fewer with huge pages)
    assert out["reuse"][1] <= out["default"][1] // 20


def test_unwrap_takes_the_module_out_of_its_wrappers_as_accelerate_does():
    """mlmkit's unwrap (no DeepSpeed import where the run has no DeepSpeed) gives what
    accelerate's unwrap_model gives: the module itself, out of DataParallel, and a module
    accelerate compiled handed to accelerate."""
    from accelerate import Accelerator

    from mlmkit.training.runtime import full_state_dict, unwrap

    acc = Accelerator(cpu=True)
    inner = torch.nn.Linear(3, 2)
    for wrapped in (inner, torch.nn.DataParallel(torch.nn.DataParallel(inner))):
        assert unwrap(acc, wrapped) is inner is acc.unwrap_model(wrapped)
    compiled = torch.compile(torch.nn.DataParallel(inner))
    assert unwrap(acc, compiled) is acc.unwrap_model(compiled)
    weights = full_state_dict(acc, torch.nn.DataParallel(inner))
    assert (
        weights.keys()
        == acc.get_state_dict(torch.nn.DataParallel(inner)).keys()
        == {
            "weight",
            "bias",
        }
    )
