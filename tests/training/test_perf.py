"""The FLOPs formula counts what the model computes; MFU is taken against a rate that bounds
the machine's matmuls (mlmkit.training.perf)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from batches import SMALL, _batches, _model, _packed, _ragged, _train  # noqa: F401

from mlmkit.model.bert import MaskedLM
from mlmkit.training.perf import (
    ThroughputMeter,
    model_flops_per_token,
    peak_memory_gb,
    train_flops_per_token,
)

# -- the FLOPs formula ------------------------------------------------------------------

def test_flops_formula_by_hand():
    # bert-base, seq 128, 15% predicted: 3 x (12 x (8h^2 + 4hi + 4sh) + 0.15 x (2h^2 + 2hV))
    h, i, s, v = 768, 3072, 128, 30522
    expected = 3 * (12 * (8 * h * h + 4 * h * i + 4 * s * h) + 0.15 * (2 * h * h + 2 * h * v))
    assert train_flops_per_token(12, h, i, v, s, 0.15) == pytest.approx(expected)
    assert expected == pytest.approx(545.6e6, rel=1e-3)


def test_flops_formula_matches_counted_matmuls(tokenizer):
    """The formula equals the matmul FLOPs torch counts in a forward + backward of the sparse head."""
    from torch.utils.flop_counter import FlopCounterMode

    model = _model(tokenizer, attn_implementation="eager")  # attention as plain matmuls
    objective = MaskedLM(model)
    batch = _batches(tokenizer, _packed, n=1)[0]
    rows = batch["positions"].numel()  # chosen positions, bucketed: what the head computes
    tokens = batch["input_ids"].numel()
    with FlopCounterMode(display=False) as counter:
        out = objective(**batch)
        out["loss_sum"].backward()
    counted = counter.get_total_flops()
    formula = tokens * model_flops_per_token(model.config, batch["input_ids"].size(1), rows / tokens)
    assert counted == pytest.approx(formula, rel=0.01)


def test_modernbert_flops_count_the_geglu_and_the_local_windows(tokenizer):
    """ModernBERT's GeGLU is three matrices' worth of products; its local layers' attention is
    counted over the window. With eager attention (every score computed, far ones masked)
    torch counts exactly the formula plus the masked scores of the local layers."""
    from torch.utils.flop_counter import FlopCounterMode

    h, i, s, v = 768, 1152, 512, 50368  # modernbert-base: 22 layers, 7 of them global
    expected = 3 * (22 * (8 * h * h + 6 * h * i) + 4 * h * (7 * s + 15 * 128) + 0.15 * (2 * h * h + 2 * h * v))
    assert train_flops_per_token(22, h, i, v, s, 0.15, ffn_matrices=3, local_layers=15,
                                 local_window=128) == pytest.approx(expected)
    model = _model(tokenizer, attn_implementation="eager", architecture="modernbert", num_hidden_layers=3,
                   intermediate_size=96, local_attention=16)  # global, local, local
    batch = _batches(tokenizer, _packed, n=1)[0]
    rows, tokens, seq = batch["positions"].numel(), batch["input_ids"].numel(), batch["input_ids"].size(1)
    with FlopCounterMode(display=False) as counter:
        out = MaskedLM(model)(**batch)
        out["loss_sum"].backward()
    formula = tokens * model_flops_per_token(model.config, seq, rows / tokens)
    masked_scores = tokens * 3 * 4 * 64 * (seq - 16) * 2  # two local layers, hidden 64
    assert counter.get_total_flops() == pytest.approx(formula + masked_scores, rel=0.01)


def test_throughput_meter_and_peak_memory():
    from transformers import BertConfig

    config = BertConfig(vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=256)
    meter = ThroughputMeter(config, reference_flops=1e12)
    f = meter.figures({32: 200}, masked=960, seconds=2.0)  # 200 full rows of 32 tokens
    assert f["tokens_per_s"] == 3200 and f["masked_tokens_per_s"] == 480
    assert f["mfu"] == pytest.approx(3200 * model_flops_per_token(config, 32, 0.15) / 1e12)
    assert peak_memory_gb(torch.device("cpu")) > 0.01  # this process holds torch at least


def test_in_run_mfu_reference_times_the_benchmarks_squares_and_the_models_products(monkeypatch):
    """On a CPU the 1,024-square bf16 product can run at about half the 2,048-square rate:
    the run's reference takes the best of both sizes, as ``make bench`` does, and of the
    model's own products, within a time limit."""
    from mlmkit.training import perf

    timed = {}

    def fake(products, device, min_seconds, repeats, max_seconds=None):
        timed.update(flops=sorted({f for f, _ in products}), max_seconds=max_seconds)
        return 1.8e12

    monkeypatch.setattr(perf, "_best_rate", fake)
    monkeypatch.setattr(perf, "cpu_has_bf16", lambda: True)
    perf.reference_rate.cache_clear()
    try:
        rate, how = perf.reference_rate(torch.device("cpu"), "bf16", ((64, 32, 128),))
    finally:
        perf.reference_rate.cache_clear()
    assert rate == 1.8e12 and "bfloat16" in how
    assert timed["flops"] == sorted({2.0 * 1024**3, 2.0 * 2048**3, 2.0 * 64 * 32 * 128})
    assert 0 < timed["max_seconds"] <= 2.0


def _timed_linear_rate(shapes, dtype, seconds=0.3):
    """The best rate of the model's forward products, timed the plain way: ``F.linear``."""
    import time

    best = 0.0
    for m, k, n in shapes:
        x, w = torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype)
        F.linear(x, w)
        for _ in range(3):
            count, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds / 3:
                F.linear(x, w)
                count += 1
            best = max(best, 2.0 * m * k * n * count / (time.perf_counter() - start))
    return best


@pytest.mark.parametrize("preset", ["test-tiny", "bert-mini"])
def test_mfu_reference_bounds_the_models_own_matmuls_on_this_cpu(preset):
    """The reference a run takes MFU against, measured in the dtype the run computes in,
    is at least the rate of the model's own products timed here (within timing noise):
    a reference below it is what made MFU read 143% on an AVX2-only CPU."""
    import time

    from transformers import BertConfig

    from mlmkit.training import perf
    from mlmkit.training.runtime import resolve_precision

    hidden, ffn, vocab, tokens = {"test-tiny": (32, 64, 1024, 8 * 64),
                                  "bert-mini": (256, 1024, 8192, 32 * 128)}[preset]
    config = BertConfig(hidden_size=hidden, intermediate_size=ffn, vocab_size=vocab)
    shapes = perf.model_matmul_shapes(config, tokens, round(0.15 * tokens))
    assert (tokens, hidden, ffn) in shapes and (round(0.15 * tokens), hidden, vocab) in shapes
    precision = resolve_precision("auto", use_cpu=True)
    dtype = perf.compute_dtype(torch.device("cpu"), precision)
    # A shared 2-core machine's matmul rate swings by up to 2x from one 50 ms to the next
    # (bf16 on AMX most): a systematic shortfall fails every attempt, a noisy one not.
    seen = []
    for _ in range(3):
        perf.reference_rate.cache_clear()
        start = time.perf_counter()
        rate, how = perf.reference_rate(torch.device("cpu"), precision, shapes)
        took = time.perf_counter() - start
        perf.reference_rate.cache_clear()
        timed = _timed_linear_rate(shapes, dtype)
        assert str(dtype).replace("torch.", "") in how
        assert took < 4.0  # about 2 s; the bound leaves room for a busy machine
        seen.append(f"reference {rate / 1e9:.0f} GFLOP/s vs the model's products {timed / 1e9:.0f}")
        if rate >= 0.8 * timed:
            break
    else:
        raise AssertionError("; ".join(seen))


def test_emulated_bf16_is_never_timed_and_is_named(monkeypatch, caplog):
    """Where the CPU has no bf16 hardware, a forced bf16 run takes MFU against the fp32
    rate (emulated bf16 is no faster; a 2,048-square emulated product took 53 s on such a
    CPU) and the user is told that fp32 is faster."""
    import logging

    from mlmkit.training import perf, runtime

    monkeypatch.setattr(perf, "cpu_has_bf16", lambda: False)
    monkeypatch.setattr(runtime, "cpu_has_bf16", lambda: False)
    timed = []
    real = perf._best_rate
    monkeypatch.setattr(perf, "_best_rate", lambda products, *a, **k: (
        timed.extend(fn().dtype for _, fn in products), real(products, *a, **k))[1])
    perf.reference_rate.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="mlmkit"):
            assert runtime.resolve_precision("bf16", use_cpu=True) == "bf16"
        assert "bf16 emulated on this CPU" in caplog.text and "train.precision=auto or no" in caplog.text
        assert runtime.resolve_precision("auto", use_cpu=True) == "no"
        rate, how = perf.reference_rate(torch.device("cpu"), "bf16", ((64, 32, 32),))
    finally:
        perf.reference_rate.cache_clear()
    assert rate > 0 and timed and set(timed) == {torch.float32}
    assert "float32" in how and "bf16 is emulated" in how


def test_mfu_never_reads_above_one_when_the_run_beats_its_reference(caplog):
    import logging

    from transformers import BertConfig

    config = BertConfig(vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=256)
    meter = ThroughputMeter(config, reference_flops=1e6)  # far below what any step reaches
    with caplog.at_level(logging.WARNING, logger="mlmkit"):
        first = meter.figures({32: 200}, masked=960, seconds=2.0)
        slower = meter.figures({32: 100}, masked=480, seconds=2.0)
    assert first["mfu"] == 1.0 and slower["mfu"] == pytest.approx(0.5)
    assert meter.reference_flops == pytest.approx(first["model_tflops_per_s"] * 1e12)
    assert caplog.text.count("above the measured matmul rate") == 1


def test_the_measured_rate_is_stored_once_per_machine_and_settings(monkeypatch, tmp_path):
    """A run start measures the matmul rate once; later starts on the same machine, software,
    thread count and products read it; a changed setting, or a damaged file, measures again."""
    from mlmkit.training import perf

    calls = []

    def fake(products, device, min_seconds, repeats, max_seconds=None):
        calls.append(len(products))
        return 1e11 * len(calls)

    monkeypatch.setattr(perf, "_best_rate", fake)
    cpu, shapes = torch.device("cpu"), ((64, 32, 128),)

    def rate(**kw):
        perf.reference_rate.cache_clear()  # another process: nothing remembered in memory
        return perf.stored_reference_rate(tmp_path, cpu, "no", kw.get("shapes", shapes))

    first, how, reliable = rate()
    assert first == 1e11 and "stored" not in how and reliable and len(calls) == 1
    again, how, _ = rate()
    assert again == first and f"stored in {tmp_path / 'matmul_rates'}" in how and len(calls) == 1
    assert rate(shapes=((64, 32, 256),))[0] == 2e11  # other products: measured anew
    isa = os.environ.get("ATEN_CPU_CAPABILITY")  # avx2 under .ci/as-avx2
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default" if isa == "avx2" else "avx2")  # another rate
    assert rate()[0] == 3e11
    if isa is None:
        monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    else:
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", isa)
    for stored in (tmp_path / "matmul_rates").glob("*.json"):
        stored.write_text("{")  # damaged
    assert rate()[0] == 4e11 and rate()[0] == 4e11 and len(calls) == 4
    assert perf.stored_reference_rate(None, cpu, "no", shapes)[0] == 5e11  # no cache: measured
    perf.reference_rate.cache_clear()
