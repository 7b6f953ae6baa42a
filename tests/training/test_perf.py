"""The FLOPs formula counts what the model computes; MFU is taken against a rate that bounds
the machine's matmuls (mlmkit.training.perf)."""

from __future__ import annotations

import json
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
    """The formula equals the matmul FLOPs torch counts in a forward + backward of the sparse
    head."""
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
    formula = tokens * model_flops_per_token(
        model.config, batch["input_ids"].size(1), rows / tokens
    )
    assert counted == pytest.approx(formula, rel=0.01)


def test_modernbert_flops_count_the_geglu_and_the_local_windows(tokenizer):
    """ModernBERT's GeGLU is three matrices' worth of products; its local layers' attention is
    counted over the window. With eager attention (every score computed, far ones masked)
    torch counts exactly the formula plus the masked scores of the local layers."""
    from torch.utils.flop_counter import FlopCounterMode

    h, i, s, v = 768, 1152, 512, 50368  # modernbert-base: 22 layers, 7 of them global
    expected = 3 * (
        22 * (8 * h * h + 6 * h * i) + 4 * h * (7 * s + 15 * 128) + 0.15 * (2 * h * h + 2 * h * v)
    )
    assert train_flops_per_token(
        22, h, i, v, s, 0.15, ffn_matrices=3, local_layers=15, local_window=128
    ) == pytest.approx(expected)
    model = _model(
        tokenizer,
        attn_implementation="eager",
        architecture="modernbert",
        num_hidden_layers=3,
        intermediate_size=96,
        local_attention=16,
    )  # global, local, local
    batch = _batches(tokenizer, _packed, n=1)[0]
    rows, tokens, seq = (
        batch["positions"].numel(),
        batch["input_ids"].numel(),
        batch["input_ids"].size(1),
    )
    with FlopCounterMode(display=False) as counter:
        out = MaskedLM(model)(**batch)
        out["loss_sum"].backward()
    formula = tokens * model_flops_per_token(model.config, seq, rows / tokens)
    masked_scores = tokens * 3 * 4 * 64 * (seq - 16) * 2  # two local layers, hidden 64
    assert counter.get_total_flops() == pytest.approx(formula + masked_scores, rel=0.01)


def test_throughput_meter_and_peak_memory():
    from transformers import BertConfig

    config = BertConfig(
        vocab_size=1024,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
    )
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

    hidden, ffn, vocab, tokens = {
        "test-tiny": (32, 64, 1024, 8 * 64),
        "bert-mini": (256, 1024, 8192, 32 * 128),
    }[preset]
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
    monkeypatch.setattr(
        perf,
        "_best_rate",
        lambda products, *a, **k: (
            timed.extend(fn().dtype for _, fn in products),
            real(products, *a, **k),
        )[1],
    )
    perf.reference_rate.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="mlmkit"):
            assert runtime.resolve_precision("bf16", use_cpu=True) == "bf16"
        assert (
            "bf16 emulated on this CPU" in caplog.text
            and "train.precision=auto or no" in caplog.text
        )
        assert runtime.resolve_precision("auto", use_cpu=True) == "no"
        rate, how = perf.reference_rate(torch.device("cpu"), "bf16", ((64, 32, 32),))
    finally:
        perf.reference_rate.cache_clear()
    assert rate > 0 and timed and set(timed) == {torch.float32}
    assert "float32" in how and "bf16 is emulated" in how


def test_mfu_never_reads_above_one_when_the_run_beats_its_reference(caplog):
    import logging

    from transformers import BertConfig

    config = BertConfig(
        vocab_size=1024,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
    )
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
    monkeypatch.setenv(
        "ATEN_CPU_CAPABILITY", "default" if isa == "avx2" else "avx2"
    )  # another rate
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


# -- MFU of real tokens, each attending within its own block ---------------------------------------


def _bert_config():
    from transformers import BertConfig

    return BertConfig(
        vocab_size=1024,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
    )


def test_model_flops_count_real_tokens_and_each_blocks_own_attention():
    """A padded batch of rows with 5, 9 and 12 real tokens (padded to 16), 6 of them predicted:
    26 tokens, whose attention scores 5^2 + 9^2 + 12^2 = 250 pairs a layer, not 3 x 16 x 16."""
    from mlmkit.training.perf import model_train_flops

    config = _bert_config()
    h, i, v, layers = 64, 256, 1024, 2
    by_hand = 3 * (
        26 * layers * (8 * h * h + 4 * h * i) + 4 * h * layers * 250 + 6 * (2 * h * h + 2 * h * v)
    )
    assert by_hand == 18_226_176
    assert model_train_flops(config, {5: 1, 9: 1, 12: 1}, predicted=6) == pytest.approx(by_hand)
    # the padded count it replaces: 48 positions, each attending to all 16
    padded = model_train_flops(config, {16: 3}, predicted=6)
    assert (
        padded == pytest.approx(48 * model_flops_per_token(config, 16, 6 / 48))
        and padded > 1.7 * by_hand
    )
    # a block of 16 holding documents of 4, 7 and 5 tokens, isolated: 16 + 49 + 25 = 90 pairs
    documents = 3 * (
        16 * layers * (8 * h * h + 4 * h * i) + 4 * h * layers * 90 + 6 * (2 * h * h + 2 * h * v)
    )
    assert model_train_flops(config, {4: 1, 7: 1, 5: 1}, predicted=6) == pytest.approx(documents)


def test_modernbert_local_layers_count_their_window_within_each_block():
    """ModernBERT, one global and two local layers of window 4: blocks of 3 and 8 tokens score
    3^2 + 8^2 = 73 pairs in the global layer and 3 x 3 + 8 x 4 = 41 in each local one."""
    from transformers import ModernBertConfig

    from mlmkit.training.perf import model_train_flops

    config = ModernBertConfig(
        vocab_size=1024,
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=96,
        global_attn_every_n_layers=3,
        local_attention=4,
    )
    assert list(config.layer_types).count("sliding_attention") == 2
    h, i, v = 64, 96, 1024
    by_hand = 3 * (
        11 * 3 * (8 * h * h + 6 * h * i) + 4 * h * (73 + 2 * 41) + 2 * (2 * h * h + 2 * h * v)
    )
    assert model_train_flops(config, {3: 1, 8: 1}, predicted=2) == pytest.approx(by_hand)


def test_the_meter_counts_real_tokens_per_second_and_the_blocks_flops():
    """tokens/s counts real tokens (padding is none), the model FLOPs those of each block; with
    two processes each is taken to have fed as many."""
    from mlmkit.training.perf import model_train_flops

    config = _bert_config()
    blocks = {5: 1, 9: 1, 12: 1}
    meter = ThroughputMeter(config, reference_flops=1e9)
    f = meter.figures(blocks, masked=12, seconds=2.0, world=2)
    assert f["tokens_per_s"] == 26  # 2 processes x 26 tokens / 2 s
    assert f["masked_tokens_per_s"] == 6
    flops = 2 * model_train_flops(config, blocks, predicted=6)
    assert f["model_tflops_per_s"] == pytest.approx(flops / 2.0 / 1e12)
    assert f["mfu"] == pytest.approx(flops / 2.0 / 1e9)


# -- the chips' datasheet peaks --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,tflops",
    [
        ("NVIDIA H200", 989),
        ("NVIDIA H200 NVL", 835),
        ("NVIDIA H100 80GB HBM3", 989),
        ("NVIDIA H100 PCIe", 756),
        ("NVIDIA H100 NVL", 835),
        ("NVIDIA A100-SXM4-80GB", 312),
        ("NVIDIA A10G", 70),
        ("NVIDIA GeForce RTX 4090", 165),
        ("NVIDIA GeForce RTX 3090", 71),
        ("NVIDIA GH200 480GB", 989),
        ("NVIDIA A10", 125),
        ("NVIDIA L40", 181),
        ("NVIDIA L40S", 362),
        ("NVIDIA L4", 121),
        ("Tesla T4", None),
    ],
)
def test_real_device_names_find_their_chips_peak(name, tflops):
    from mlmkit.training.perf import chip_peak

    peak = chip_peak(name)
    assert (peak / 1e12 if peak is not None else None) == tflops


def test_the_peak_of_the_cuda_device_is_looked_up_by_its_name(monkeypatch):
    """``chip_bf16_peak`` asks CUDA only for the device's name (stubbed here)."""
    from mlmkit.training import perf

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200 NVL")
    assert perf.chip_bf16_peak(torch.device("cuda", 0)) == (835e12, "NVIDIA H200 NVL")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA Quadro P1000")
    assert perf.chip_bf16_peak(torch.device("cuda", 0)) is None


# -- an implausible measured rate ------------------------------------------------------------------


def test_an_implausible_rate_is_never_stored_and_is_measured_again(monkeypatch, tmp_path):
    """A busy machine measured 0.04 TFLOP/s (printed as 0.0) and every later run inherited it:
    a rate that rounds to 0.0, or under a tenth of the best stored for this machine, is measured
    once more, is never stored, and is reported unreliable; a stored one is measured again."""
    from mlmkit.training import perf

    cpu, shapes, other = torch.device("cpu"), ((64, 32, 128),), ((64, 32, 256),)
    rates, calls = [], []

    def measure(device, precision, shapes):
        calls.append(shapes)
        return rates.pop(0), "measured"

    def stored(shapes):
        return perf.stored_reference_rate(tmp_path, cpu, "no", shapes, measure=measure)

    rates[:] = [4e10, 4.2e10]
    rate, how, reliable = stored(shapes)
    assert (rate, reliable, len(calls)) == (4.2e10, False, 2) and "not stored" in how
    assert not list((tmp_path / "matmul_rates").glob("*.json"))
    rates[:] = [2e12]
    assert stored(shapes)[::2] == (2e12, True) and len(calls) == 3
    assert stored(shapes)[0] == 2e12 and len(calls) == 3  # read back, not measured
    # other products on the same machine: 0.1 TFLOP/s is under a tenth of the 2 stored
    rates[:] = [1e11, 1.5e11]
    rate, how, reliable = stored(other)
    assert (rate, reliable, len(calls)) == (1.5e11, False, 5)
    rates[:] = [1.8e12]
    assert stored(other)[::2] == (1.8e12, True)
    # a rate an earlier mlmkit stored without these checks is measured again, and replaced
    for file in (tmp_path / "matmul_rates").glob("*.json"):
        entry = json.loads(file.read_text())
        entry["rate"] = 3e10
        file.write_text(json.dumps(entry))
    rates[:] = [2.1e12]
    assert stored(shapes)[::2] == (2.1e12, True) and len(calls) == 7


def test_a_run_says_its_mfu_is_unreliable_against_an_implausible_rate(
    monkeypatch, tmp_path, tokenizer
):
    from accelerate.state import AcceleratorState
    from runs import TINY

    from mlmkit.config import compose
    from mlmkit.training import lock, perf, setup
    from mlmkit.training.trainer import Trainer

    monkeypatch.setattr(
        perf, "reference_rate", lambda device, precision, shapes=(): (3e10, "measured")
    )
    tokenizer.save_pretrained(tmp_path / "tokenizer")
    cfg = compose(
        [
            *TINY,
            "data=builtin",
            f"paths.cache_dir={tmp_path / 'cache'}",
            f"tokenizer.name_or_path={tmp_path / 'tokenizer'}",
        ]
    )
    try:
        Trainer(cfg, tmp_path / "run").resume()  # a new run: its log is written from here on
    finally:
        setup.stop_logging()
        lock.release()
        AcceleratorState._reset_state(reset_partial_state=True)
    log = (tmp_path / "run" / "train.log").read_text()
    assert "MFU is taken against 0.03 TFLOP/s per process" in log
    assert "the MFU figures of this run are unreliable" in log
    assert not list((tmp_path / "cache" / "matmul_rates").glob("*.json"))
