"""mlmkit doctor: the report of a run on this machine, and each finding when its cause is planted
(a slow loader, padded batches, a broken attention path, a NaN) and not otherwise."""

from __future__ import annotations

import json
import time

import pytest
from runs import TINY

from mlmkit.config import compose
from mlmkit.training.doctor import format_report, run_doctor


def _doctor(tmp_path, *overrides, steps=4):
    cfg = compose(
        [*TINY, "data=builtin", f"paths.cache_dir={tmp_path.parent / 'doctor-cache'}", *overrides]
    )
    return run_doctor(cfg, steps=steps, warmup=2, max_seconds=20)


def _finding(report, words: str) -> list[str]:
    return [f for f in report["findings"] if words in f]


def test_a_sound_run_gets_a_full_report_and_no_finding(tmp_path, capsys):
    from mlmkit.cli import main

    out = tmp_path / "doctor.json"
    # bert-mini (its own sizes): a step long enough beside its batches' loading (about 3%)
    assert (
        main(
            [
                "doctor",
                "model=bert-mini",
                "tokenizer.vocab_size=1000",
                "tokenizer.max_train_chars=300000",
                "data.max_seq_length=64",
                "data.max_eval_samples=64",
                "train.batch_size=32",
                "data=builtin",
                f"paths.cache_dir={tmp_path.parent / 'doctor-cache'}",
                "--steps",
                "6",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["findings"] == [] and "findings: none" in printed
    assert report["machine"]["torch"] and report["machine"]["peak_tflops"] > 0
    kernels = report["attention"]["kernels"]
    assert kernels["packed rows, no mask"]["taken"] in ("flash", "memory-efficient", "math")
    r = report["rehearsal"]
    assert r["steps"] >= 1 and r["tokens_per_s"] > 0 and r["finite"] and r["padding_share"] == 0.0
    assert r["host_reads_per_step"] == 0  # the step waits for the device only at log steps
    checks = report["parity"]["checks"]
    assert {"eager, fp32", "sdpa, fp32"} <= set(checks) and all(c["ok"] for c in checks.values())
    assert report["parity"]["documents"]["ok"] and report["parity"]["documents"]["documents"] >= 2
    assert "rehearsal (" in printed and "parity against eager, fp32" in printed


def test_a_modernbert_run_reports_its_window_kernel(tmp_path):
    report = _doctor(
        tmp_path,
        "model=modernbert-tiny",
        "model.num_hidden_layers=3",
        "model.hidden_size=64",
        "model.num_attention_heads=2",
        "model.intermediate_size=96",
        "model.local_attention=16",
        "model.global_attn_every_n_layers=3",
    )
    assert "ModernBERT's local layers (window)" in report["attention"]["kernels"]
    # a 64-wide model's step is so short that its batches' loading can pass the data-wait limit on
    # a slow machine (10% seen): that finding is a matter of timing, tested on its own below
    timing = "The step waits for batches"
    assert [f for f in report["findings"] if not f.startswith(timing)] == []
    assert all(c["ok"] for c in report["parity"]["checks"].values())


def test_a_slow_loader_and_padding_are_found(tmp_path, monkeypatch):
    from mlmkit.data.loader import DropFullAttentionMask

    collate = DropFullAttentionMask.__call__

    def slow(self, examples):
        time.sleep(0.05)
        return collate(self, examples)

    monkeypatch.setattr(DropFullAttentionMask, "__call__", slow)
    from mlmkit.data.sources import builtin_documents

    # one sentence a line: short rows of many lengths, padded to the longest of each batch
    sentences = [
        s.strip() + "." for doc in builtin_documents()[:200] for s in doc.split(". ") if s.strip()
    ]
    lines = tmp_path / "sentences.txt"
    lines.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    report = _doctor(
        tmp_path,
        "data=files",
        f"data.train_files=[{lines}]",
        "data.txt_sample_by=line",
        "data.packing=line_by_line",
    )
    assert _finding(report, "waits for batches") and _finding(report, "train.num_workers")
    assert _finding(report, "are padding") and _finding(report, "data.packing=concatenate")
    assert report["rehearsal"]["padding_share"] > 0.1


@pytest.mark.parametrize("fault", ["wrong", "nan"])
def test_a_broken_attention_path_is_found(tmp_path, monkeypatch, fault):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def broken(module, query, key, value, attention_mask, **kwargs):
        out, weights = sdpa(module, query, key, value, attention_mask, **kwargs)
        return (out * 1.5 if fault == "wrong" else out * float("nan")), weights

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, "sdpa", broken)
    report = _doctor(tmp_path, "model.attn_implementation=eager")
    checks = report["parity"]["checks"]
    assert not checks["sdpa, fp32"]["ok"] and checks["eager, fp32"]["ok"]
    [finding] = _finding(report, "The sdpa, fp32 attention path")
    assert "model.attn_implementation" in finding
    assert ("NaN or Inf" in finding) == (fault == "nan")


def test_a_nan_is_found(tmp_path):
    report = _doctor(tmp_path, "optim.lr=1e20", "optim.warmup_steps=0", "optim.max_grad_norm=null")
    assert not report["rehearsal"]["finite"]
    [finding] = _finding(report, "loss is not finite")
    assert "optim.lr" in finding and "loss is not finite" in format_report(report)


def test_gpu_findings_follow_their_causes():
    """On a GPU: a mask that keeps SDPA off flash, and host waits in the step, each found when
    present and not otherwise (the report's figures planted, as a GPU would give them)."""
    import torch

    from mlmkit.training.doctor import kernel_findings, rehearsal_findings

    cuda = torch.device("cuda")
    padded = compose(["data.packing=line_by_line"])
    kernels = {
        "padded rows (key-padding mask)": {"taken": "memory-efficient"},
        "packed rows, no mask": {"taken": "flash"},
    }
    [finding] = kernel_findings(padded, cuda, {"implementation": "sdpa", "kernels": kernels})
    assert "memory-efficient kernel, not flash" in finding and "data.packing=concatenate" in finding
    assert kernel_findings(compose([]), cuda, {"implementation": "sdpa", "kernels": kernels}) == []
    assert (
        kernel_findings(padded, cuda, {"implementation": "flash_attention_2", "kernels": kernels})
        == []
    )
    assert (
        kernel_findings(padded, torch.device("cpu"), {"implementation": "sdpa", "kernels": kernels})
        == []
    )
    sound = {
        "finite": True,
        "loss": 5.0,
        "data_wait_share": 0.01,
        "padding_share": 0.0,
        "host_reads_per_step": 0.0,
        "mfu": 0.45,
    }
    assert rehearsal_findings(compose(["model=bert-base"]), cuda, sound) == []
    [finding] = rehearsal_findings(
        compose(["model=bert-base"]), cuda, {**sound, "host_reads_per_step": 2.0}
    )
    assert "wait for the GPU 2.0 times" in finding
    [finding] = rehearsal_findings(compose(["model=bert-base"]), cuda, {**sound, "mfu": 0.1})
    assert "below half of the 40%" in finding and "train.batch_size" in finding


def test_a_setting_it_cannot_compose_is_one_sentence(capsys):
    from mlmkit.cli import main

    assert main(["doctor", "model=bert-huge"]) == 2
    err = capsys.readouterr().err
    assert "model=bert-huge is not a preset" in err and "Traceback" not in err
    assert main(["doctor", "train.bach_size=3"]) == 2
    assert "bach_size" in capsys.readouterr().err


def test_the_fp32_reference_runs_without_tf32_and_the_flags_come_back(tokenizer, monkeypatch):
    """A run turns TF32 on for the whole process (on a GPU: fp32 matmuls at about 1e-3 relative
    error), so the parity check's fp32 reference and fp32 paths turn it off while they run and
    restore the flags as they were, also when a check fails."""
    import torch
    from batches import _batches, _model, _ragged

    from mlmkit.training import doctor

    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = matmul.allow_tf32, cudnn.allow_tf32
    seen = []
    real_outputs = doctor._outputs

    def outputs(model, batches, device, autocast_dtype=None):
        seen.append((autocast_dtype, matmul.allow_tf32, cudnn.allow_tf32))
        return real_outputs(model, batches, device, autocast_dtype)

    monkeypatch.setattr(doctor, "_outputs", outputs)
    try:
        matmul.allow_tf32 = cudnn.allow_tf32 = (
            True  # as runtime.apply_speed_settings leaves them on a GPU
        )
        with doctor.exact_fp32():
            assert (matmul.allow_tf32, cudnn.allow_tf32) == (False, False)
        assert (matmul.allow_tf32, cudnn.allow_tf32) == (True, True)
        with pytest.raises(RuntimeError, match="a failing check"), doctor.exact_fp32():
            raise RuntimeError("a failing check")
        assert (matmul.allow_tf32, cudnn.allow_tf32) == (True, True)
        cudnn.allow_tf32 = False  # each flag comes back as it was
        with doctor.exact_fp32():
            pass
        assert (matmul.allow_tf32, cudnn.allow_tf32) == (True, False)

        cudnn.allow_tf32 = True
        batches = _batches(tokenizer, _ragged, n=1, drop_mask=False)
        report = doctor.parity_report(
            _model(tokenizer),
            batches,
            torch.device("cpu"),
            "sdpa",
            torch.bfloat16,
            tokenizer.sep_token_id,
        )
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = saved
    fp32 = [flags for dtype, *flags in seen if dtype is None]
    mixed = [flags for dtype, *flags in seen if dtype is not None]
    assert len(fp32) >= 3 and all(
        flags == [False, False] for flags in fp32
    )  # reference, eager, sdpa, ...
    assert mixed and all(
        flags == [True, True] for flags in mixed
    )  # the run's own precision, as it runs
    assert report["checks"]["sdpa, fp32"]["ok"] and report["documents"]["ok"]


def test_the_documents_check_runs_a_copy_of_the_model_on_the_device_it_checks(
    tokenizer, monkeypatch
):
    """On the H200 the check was given the model on the CPU and fed it CUDA ids. Here the model
    is on the CPU and the check is asked for ``meta`` (the one other device every torch has): the
    copy it builds its encoder from is on ``meta``, weights and buffers, and the caller's model
    stays on the CPU. (On ``meta`` the check itself cannot finish, so it stops at that point.)"""
    import torch
    from batches import _model, _packed

    from mlmkit.training import doctor

    class Reached(Exception):
        pass

    seen = []

    def masked_lm(model):
        seen.append({t.device for t in [*model.parameters(), *model.buffers()]})
        raise Reached

    monkeypatch.setattr(doctor, "MaskedLM", masked_lm)
    model = _model(tokenizer)
    row = torch.tensor(_packed(tokenizer, n=1, length=48)[0]["input_ids"])
    with pytest.raises(Reached):
        doctor.documents_check(model, row, tokenizer.sep_token_id, torch.device("meta"))
    assert seen == [{torch.device("meta")}]
    assert {t.device for t in [*model.parameters(), *model.buffers()]} == {torch.device("cpu")}


def test_the_doctor_counts_cudas_sync_warnings_and_no_other(monkeypatch):
    """On CUDA the doctor counts the warning torch gives at each synchronising call in sync debug
    mode "warn" (c10/cuda/CUDAFunctions.cpp), with the place it came from; another warning that
    mentions synchronising is no wait for the GPU and is not counted (on the H200 one was). Driven
    without a GPU: the warnings emitted as torch words them, the debug mode only recorded."""
    import warnings

    import torch

    from mlmkit.training.doctor import HostReads

    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    cuda = "called a synchronizing CUDA operation"
    with HostReads("cuda") as reads:
        reads.counting = True
        for text in (
            f"{cuda} (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:176.)",
            "the processes are synchronized before the checkpoint is written",
            cuda,
        ):
            warnings.warn(text, stacklevel=1)  # the place: this file
        reads.counting = False
    assert reads.count == 2
    assert modes[0] == "warn" and modes[-1] == "default"
    assert [w.split(": ", 1)[1].split(" (")[0] for w in reads.waits] == [cuda, cuda]
    assert all(w.startswith(f"{__file__}:") for w in [*reads.waits, *reads.other_warnings])
    assert [w.split(": ", 1)[1] for w in reads.other_warnings] == [
        "the processes are synchronized before the checkpoint is written"
    ]
