"""``mlmkit doctor [<overrides of a run>]``: what the run that command line describes will get on
this machine, in under a minute, and what to change.

1. The machine: the CPU kind or the GPU and how many, bf16 and TF32, the chip's datasheet peak
   or the matmul rate measured now; torch, transformers, accelerate, flash-attn.
2. Attention: which implementation the run resolves to, and which of SDPA's kernels (flash,
   memory-efficient, cuDNN, math) accept the run's shapes with no mask (packed rows), a
   key-padding mask (``data.packing=line_by_line``), a document mask (``data.packing=documents``)
   and ModernBERT's window, on this device and in the run's dtype; SDPA takes the first of
   flash, memory-efficient, math that accepts them.
3. A rehearsal: the run itself (``Trainer``, the same data, cache and settings) for a few steps
   in a scratch folder: tokens/s, MFU, peak memory, the share of the step spent waiting for
   batches, the host's reads of device values per step (each a wait for a GPU), and the share
   of padding, against what the preset should reach here.
4. Parity: on the run's own validation batches, the logits and loss of every attention path at
   hand (eager, SDPA, mlmkit's CPU kernel, flash-attn) against eager in fp32; the run's path in
   its mixed precision; packed rows with document isolation against each document alone.
5. Findings, one sentence each, with the setting to change.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import platform
import tempfile
import time
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mlmkit.config import Config
from mlmkit.model.bert import MaskedLM, flash_attn_available, resolve_attn_implementation
from mlmkit.model.documents import document_inputs
from mlmkit.training import setup
from mlmkit.training.perf import chip_bf16_peak, compute_dtype, measure_matmul_rate
from mlmkit.training.runtime import autocast_dtype, cpu_has_bf16, describe_cpu, unwrap
from mlmkit.training.step import train_step

log = logging.getLogger("mlmkit")

# What a run of each width reached here: MFU measured by `make bench-scaling` (docs/benchmarks.md,
# "Scaling") on a 2-core CPU with bf16 hardware at seq 128, and on a GPU the goal of bert-base at
# 128 tokens in bf16 (40%, what cramming and MosaicBERT report on A100s), less for narrow models.
EXPECTED_MFU = {
    "cpu": ((128, 0.068), (256, 0.151), (512, 0.234), (768, 0.347)),
    "cuda": ((128, 0.05), (256, 0.10), (512, 0.25), (768, 0.40)),
}
# a finding below this share of what is expected (a shared machine is noisy)
MFU_SLACK = 0.5
DATA_WAIT_LIMIT, PADDING_LIMIT = 0.10, 0.10
# tolerances of the parity checks: the largest logit difference over the largest logit, and
# the relative difference of the loss
FP32_TOLERANCE = {"logits": 1e-3, "loss": 1e-4}
MIXED_TOLERANCE = {"logits": 5e-2, "loss": 1e-2}


# ---- 1. the machine --------------------------------------------------------------------------


def machine_report(
    device: torch.device, precision: str, reference_flops: float | None = None
) -> dict[str, Any]:
    """Report the machine, its number formats and its peak (datasheet) or measured matmul rate
    (``reference_flops``: the rate the run's MFU is taken against, when it has one)."""
    import accelerate
    import transformers

    report: dict[str, Any] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "flash_attn": flash_attn_available(),
        "python": platform.python_version(),
        "precision": precision,
    }
    if device.type == "cuda":
        report.update(
            device=torch.cuda.get_device_name(device),
            gpus=torch.cuda.device_count(),
            bf16=torch.cuda.is_bf16_supported(),
            tf32=torch.backends.cuda.matmul.allow_tf32,
            capability=".".join(map(str, torch.cuda.get_device_capability(device))),
        )
        known = chip_bf16_peak(device)
        if known is not None:
            report.update(peak_tflops=known[0] / 1e12, peak="datasheet dense bf16")
            return report
    else:
        report.update(device=describe_cpu(), gpus=0, bf16=cpu_has_bf16(), tf32=False)
    dtype = compute_dtype(device, precision)
    rate = reference_flops or measure_matmul_rate(dtype, device, min_seconds=0.05, repeats=2)
    report.update(
        peak_tflops=rate / 1e12, peak=f"measured {str(dtype).replace('torch.', '')} matmul rate"
    )
    return report


# ---- 2. attention ------------------------------------------------------------------------------


def _backends():
    from torch.nn.attention import SDPBackend

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "memory-efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }


def sdpa_kernels(q: torch.Tensor, mask: torch.Tensor | None) -> list[str]:
    """List the SDPA kernels that accept ``q`` (as query, key and value) with ``mask``."""
    from torch.nn.attention import sdpa_kernel

    accepted = []
    for name, backend in _backends().items():
        try:
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
            accepted.append(name)
        except RuntimeError:
            continue
    return accepted


def attention_report(cfg: Config, device: torch.device, precision: str) -> dict[str, Any]:
    """Report the attention implementation of the run, and per kind of batch the SDPA kernels that
    accept it and the one SDPA takes."""
    m, seq = cfg.model, cfg.data.max_seq_length
    implementation = resolve_attn_implementation(m.attn_implementation, device.type, precision)
    heads = m.num_attention_heads
    dtype = compute_dtype(device, precision)
    q = torch.randn(2, heads, seq, m.hidden_size // heads, device=device, dtype=dtype)
    index = torch.arange(seq, device=device)
    cases = {
        "packed rows, no mask": None,
        "padded rows (key-padding mask)": (index < seq - 3)[None, None, None, :].expand(
            2, 1, 1, seq
        ),
        "documents (block-diagonal mask)": (
            (index[:, None] < seq // 2) == (index[None, :] < seq // 2)
        )[None, None],
    }
    if m.architecture == "modernbert":
        cases["ModernBERT's local layers (window)"] = (
            (index[:, None] - index[None, :]).abs() <= m.local_attention // 2
        )[None, None]
    kernels = {}
    for case, mask in cases.items():
        accepted = sdpa_kernels(q, mask)
        taken = next((k for k in ("flash", "memory-efficient", "math") if k in accepted), None)
        kernels[case] = {"accepted": accepted, "taken": taken}
    return {
        "implementation": implementation,
        "dtype": str(dtype).replace("torch.", ""),
        "kernels": kernels,
    }


# ---- 3. the rehearsal -------------------------------------------------------------------------

# What torch warns (c10/cuda/CUDAFunctions.cpp, warn_or_error_on_sync) at each synchronising CUDA
# call under torch.cuda.set_sync_debug_mode("warn"); a release build appends
# " (Triggered internally at ...)".
CUDA_SYNC_WARNING = "called a synchronizing CUDA operation"


def is_cuda_sync_warning(record: warnings.WarningMessage) -> bool:
    """Whether a caught warning is CUDA's report of a synchronising call (and not any other
    warning that mentions synchronisation)."""
    return issubclass(record.category, UserWarning) and str(record.message).startswith(
        CUDA_SYNC_WARNING
    )


class HostReads:
    """Counts the host's waits for the device while ``counting`` is set. On CUDA: every
    synchronising CUDA call torch reports (``torch.cuda.set_sync_debug_mode``: ``item``,
    ``nonzero``, boolean indexing, ...), that warning and no other; ``waits`` then lists each as
    ``file:line: text``, ``other_warnings`` the warnings caught that were not counted. On a CPU,
    where nothing waits: the reads of tensor values on the host (``item``, ``bool``, ``float``,
    ``int``, ``tolist``), each a wait on a GPU. With ``refuse`` such a read raises instead, on any
    device (the tests' guard of code that must not wait)."""

    NAMES = ("item", "__bool__", "__float__", "__int__", "tolist")

    def __init__(self, device_type: str, refuse: bool = False) -> None:
        self.device_type, self.count, self._counting, self.refuse = device_type, 0, False, refuse
        self._cuda = device_type == "cuda" and not refuse
        self._saved: dict[str, Any] = {}
        self.waits: list[str] = []
        self.other_warnings: list[str] = []

    @property
    def counting(self) -> bool:
        return self._counting

    @counting.setter
    def counting(self, on: bool) -> None:
        self._counting = on
        if self._cuda:
            torch.cuda.set_sync_debug_mode("warn" if on else "default")

    def __enter__(self) -> HostReads:
        if self._cuda:
            self._catch = warnings.catch_warnings(record=True)
            self._records = self._catch.__enter__()
            warnings.simplefilter("always")
            return self
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)
            self._saved[name] = torch.Tensor.__dict__.get(name)  # None: inherited

            def counted(tensor, *args, _original=original, _name=name, **kwargs):
                if self._counting and self.refuse:
                    raise RuntimeError(
                        f"a host read of a tensor's value (Tensor.{_name}) where none may be"
                    )
                if self._counting:
                    self.count += 1
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, counted)
        return self

    def __exit__(self, *exc) -> None:
        if self._cuda:
            self.counting = False
            self.waits, self.other_warnings = [], []
            for w in self._records:
                seen = f"{w.filename}:{w.lineno}: {w.message}"
                (self.waits if is_cuda_sync_warning(w) else self.other_warnings).append(seen)
            self.count = len(self.waits)
            self._catch.__exit__(*exc)
            return
        for name, own in self._saved.items():
            if own is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, own)

    @contextmanager
    def paused(self):
        counting = self.counting
        self.counting = False
        try:
            yield
        finally:
            self.counting = counting


class _WatchedStream:
    """The run's batch stream, counting padding and keeping the host-read count out of the
    loading."""

    def __init__(self, stream, reads: HostReads) -> None:
        self._stream, self._reads = stream, reads
        self.positions = self.padding = 0

    def __next__(self):
        with self._reads.paused():
            batch = next(self._stream)
            mask = batch.get("attention_mask")
            self.positions += batch["input_ids"].numel()
            if mask is not None:
                self.padding += int((mask == 0).sum())
        return batch

    def __getattr__(self, name):
        return getattr(self._stream, name)


def rehearsal_config(
    cfg: Config, run_dir: Path, steps: int, warmup: int, max_seconds: float
) -> Config:
    """``cfg`` for ``warmup + steps`` steps (or ``max_seconds``) in ``run_dir``: logged every
    step, no evaluation, checkpoint, tracker, probe or progress bar."""
    cfg = copy.deepcopy(cfg)
    t = cfg.train
    t.max_steps, t.max_tokens, t.max_time = warmup + steps, None, f"{max(int(max_seconds), 1)}s"
    t.log_every, t.eval_every, t.save_every, t.resume, t.progress = 1, 0, 0, None, False
    t.max_bad_steps = warmup + steps + 1  # a diverging run is a finding, not a stop
    cfg.optim.warmup_fraction = None
    cfg.logger = replace(cfg.logger, name="none")
    cfg.phases = []
    return cfg


def rehearse(
    cfg: Config, run_dir: Path, steps: int = 20, warmup: int = 3, max_seconds: float = 30.0
):
    """``(figures, trainer)`` of the run trained for ``steps`` timed steps after ``warmup``."""
    from accelerate.state import AcceleratorState

    from mlmkit.training.trainer import Trainer

    # one process, its own precision: whatever accelerate state this process held is dropped
    AcceleratorState._reset_state(reset_partial_state=True)
    trainer = Trainer(rehearsal_config(cfg, run_dir, steps, warmup, max_seconds), run_dir)
    device = trainer.accelerator.device
    # the loop's own step and log, without its other jobs (no evaluation, checkpoint or export)
    with HostReads(device.type) as reads:
        stream = trainer.state.stream = _WatchedStream(trainer.state.stream, reads)
        counted_steps = 0
        trainer.start_fit()
        while not trainer.done():
            reads.counting = trainer.state.step >= warmup
            result = train_step(trainer)
            counted_steps += reads.counting
            reads.counting = False
            trainer.log(result)  # rehearsal_config: every step
        trainer.end_fit()
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = [e for e in events if e.get("event") == "train" and e["step"] > warmup] or [
        e for e in events if e.get("event") == "train"
    ]
    seconds = [e["tokens_per_s"] and 1 / e["tokens_per_s"] for e in timed]
    tokens_per_s = len(timed) / max(sum(seconds), 1e-12)  # the harmonic mean: equal tokens a step
    figures = {
        "steps": len(timed),
        "tokens_per_s": tokens_per_s,
        "mfu": sum(e["mfu"] for e in timed) / len(timed),
        "peak_memory_gb": max(e["peak_memory_gb"] for e in timed),
        "data_wait_share": sum(e["data_wait_share"] for e in timed) / len(timed),
        "host_reads_per_step": reads.count / max(counted_steps, 1),
        "padding_share": stream.padding / max(stream.positions, 1),
        "loss": timed[-1]["loss"],
        "finite": all(math.isfinite(e["loss"]) for e in timed),
    }
    return figures, trainer


def expected_mfu(hidden: int, device_type: str) -> float | None:
    """Return what a model of this width should reach (``EXPECTED_MFU``, the nearest width below;
    None below the narrowest measured, where the embeddings and the optimizer dominate)."""
    table = EXPECTED_MFU["cuda" if device_type == "cuda" else "cpu"]
    return max((mfu for width, mfu in table if width <= hidden), default=None)


# ---- 4. parity ---------------------------------------------------------------------------------


def _paths(device: torch.device, run_path: str) -> list[str]:
    from mlmkit.model.kernels import register_cpu_attention

    paths = ["eager", "sdpa"]
    if device.type == "cpu":
        paths.append(register_cpu_attention())
    if flash_attn_available():
        paths.append("flash_attention_2")
    return list(dict.fromkeys(paths + [run_path]))


def _outputs(model, batches, device, autocast_dtype=None) -> tuple[torch.Tensor, float]:
    """(logits of the chosen positions of ``batches``, summed loss / chosen tokens)."""
    objective = MaskedLM(model).to(device).eval()
    logits, loss, count = [], 0.0, 0
    autocast = (
        torch.autocast(device.type, dtype=autocast_dtype)
        if autocast_dtype is not None
        else nullcontext()
    )
    with torch.no_grad(), autocast:
        for batch in batches:
            out = objective(**{k: v.to(device) for k, v in batch.items()})
            logits.append(out["logits"].float().cpu())
            loss += float(out["loss_sum"])
            count += int(out["n_tokens"])
    return torch.cat(logits), loss / max(count, 1)


def _differences(logits, loss, ref_logits, ref_loss) -> dict[str, float]:
    scale = float(ref_logits.abs().max().clamp(min=1e-6))
    finite = bool(torch.isfinite(logits).all()) and math.isfinite(loss)
    return {
        "logits": float((logits - ref_logits).abs().max()) / scale if finite else math.inf,
        "loss": abs(loss - ref_loss) / max(abs(ref_loss), 1e-6) if finite else math.inf,
        "finite": finite,
    }


@contextmanager
def exact_fp32():
    """Run fp32 matmuls and convolutions in full fp32 inside: TF32 off (the run turns it on for
    the whole process, ``runtime.apply_speed_settings``), the flags restored as they were after.
    Through the same flags the run sets (``allow_tf32``): torch refuses a mix of these and its
    newer ``fp32_precision`` settings."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = matmul.allow_tf32, cudnn.allow_tf32
    matmul.allow_tf32 = cudnn.allow_tf32 = False
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = saved


def parity_report(
    model,
    batches,
    device: torch.device,
    run_path: str,
    mixed: torch.dtype | None,
    sep_id: int | None,
) -> dict[str, Any]:
    """Each attention path at hand against eager in fp32 on ``batches``; the run's path in its
    mixed precision; document isolation against each document alone. The reference and every
    fp32 check run in full fp32 (``exact_fp32``), the mixed-precision ones as the run does."""
    base = copy.deepcopy(model).float().to(device)
    base.set_attn_implementation("eager")
    checks = {}
    with exact_fp32():
        ref_logits, ref_loss = _outputs(base, batches, device)
        for path in _paths(device, run_path):
            if path == "flash_attention_2":  # bf16/fp16 only
                continue
            variant = copy.deepcopy(base)
            variant.set_attn_implementation(path)
            checks[f"{path}, fp32"] = {
                **_differences(*_outputs(variant, batches, device), ref_logits, ref_loss),
                "tolerance": FP32_TOLERANCE,
            }
    if mixed is not None:  # the run's path, SDPA, and flash-attn (bf16/fp16 only) where installed
        for path in dict.fromkeys(
            [run_path, "sdpa", *(["flash_attention_2"] if flash_attn_available() else [])]
        ):
            variant = copy.deepcopy(base)
            variant.set_attn_implementation(path)
            name = str(mixed).replace("torch.", "")
            checks[f"{path}, {name} autocast"] = {
                **_differences(*_outputs(variant, batches, device, mixed), ref_logits, ref_loss),
                "tolerance": MIXED_TOLERANCE,
            }
    for check in checks.values():
        check["ok"] = check["finite"] and all(
            check[k] <= check["tolerance"][k] for k in ("logits", "loss")
        )
    report = {"reference": "eager, fp32", "reference_loss": ref_loss, "checks": checks}
    if sep_id is not None:
        with exact_fp32():
            report["documents"] = documents_check(base, batches[0]["input_ids"][0], sep_id, device)
    return report


def two_documents(row: torch.Tensor, sep_id: int) -> torch.Tensor:
    """Make a packed row of (at least) two documents from ``row`` (``[CLS] ... [SEP]``): a
    [SEP] put in after its first half, its last token dropped to keep its length."""
    half = row.numel() // 2
    return torch.cat([row[:half], torch.tensor([sep_id], dtype=row.dtype), row[half:-2], row[-1:]])


def documents_check(model, row: torch.Tensor, sep_id: int, device: torch.device) -> dict[str, Any]:
    """Compare the encoder's states of each document of a packed row, with isolation
    (``data.packing=documents``), against the document encoded alone (SDPA, fp32), on
    ``device``: a copy of ``model`` is moved there, ``model`` stays where it is."""
    model = copy.deepcopy(model).to(device)
    model.set_attn_implementation("sdpa")
    encoder = MaskedLM(model).parts.encoder(model).eval()
    if int((row == sep_id).sum()) < 2:
        row = two_documents(row, sep_id)
    ids = row.to(device)[None]
    ends = [int(i) + 1 for i in torch.nonzero(ids[0] == sep_id).flatten().tolist()]
    starts = [0] + ends[:-1]
    with torch.no_grad():
        packed = encoder(**document_inputs(model, ids, sep_id)).last_hidden_state[0]
        worst = 0.0
        for start, end in zip(starts, ends):
            alone = encoder(input_ids=ids[:, start:end]).last_hidden_state[0]
            worst = max(
                worst, float((packed[start:end] - alone).abs().max()) / float(alone.abs().max())
            )
    return {
        "documents": len(ends),
        "difference": worst,
        "tolerance": FP32_TOLERANCE["logits"],
        "ok": len(ends) > 0 and worst <= FP32_TOLERANCE["logits"],
    }


# ---- 5. findings -------------------------------------------------------------------------------


def findings(cfg: Config, device: torch.device, report: dict[str, Any]) -> list[str]:
    """One sentence per problem found, each naming the setting to change."""
    return (
        rehearsal_findings(cfg, device, report.get("rehearsal", {}))
        + parity_findings(report.get("parity", {}))
        + kernel_findings(cfg, device, report.get("attention", {}))
    )


def rehearsal_findings(cfg: Config, device: torch.device, r: dict[str, Any]) -> list[str]:
    if not r:
        return []
    out = []
    if not r["finite"]:
        out.append(
            f"The rehearsal's loss is not finite ({r['loss']}); lower optim.lr, set "
            "optim.max_grad_norm, or set train.precision=fp32 to see whether the mixed precision "
            "causes it."
        )
    if r["data_wait_share"] > DATA_WAIT_LIMIT:
        out.append(
            f"The step waits for batches {r['data_wait_share']:.0%} of its time; raise "
            f"train.num_workers (now {cfg.workers(device.type)}) or set masking.on_device=true."
        )
    if r["padding_share"] > PADDING_LIMIT:
        out.append(
            f"{r['padding_share']:.0%} of the positions the model computes are padding; set "
            "data.packing=concatenate (or documents, to keep documents apart) to fill every row."
        )
    if device.type == "cuda" and r["host_reads_per_step"] >= 1:
        out.append(
            f"The step makes the host wait for the GPU {r['host_reads_per_step']:.1f} times; set "
            "masking.on_device=false or another masking.strategy, and report it if that does not "
            "help."
        )
    expected = expected_mfu(cfg.model.hidden_size, device.type)
    if expected is not None and r["mfu"] < MFU_SLACK * expected:
        out.append(
            f"MFU {r['mfu']:.1%} is below half of the {expected:.0%} a model of width "
            f"{cfg.model.hidden_size} reaches on such a machine; check the findings above, "
            "then raise train.batch_size or set train.compile=true."
        )
    return out


def parity_findings(parity: dict[str, Any]) -> list[str]:
    out = []
    for name, check in parity.get("checks", {}).items():
        if not check["ok"]:
            path = name.split(",")[0]
            what = (
                "NaN or Inf"
                if not check["finite"]
                else (f"logits {check['logits']:.2e} and loss {check['loss']:.2e} apart")
            )
            out.append(
                f"The {name} attention path gives {what} against eager fp32 (tolerance "
                f"{check['tolerance']['logits']:.0e}); set model.attn_implementation to a path "
                f"that agrees{' (eager)' if path != 'eager' else ''} or train.precision=fp32."
            )
    documents = parity.get("documents")
    if documents and not documents["ok"]:
        out.append(
            f"Document isolation leaks between documents (states {documents['difference']:.2e} "
            "apart from each document alone); set data.packing=concatenate until it is fixed."
        )
    return out


def kernel_findings(cfg: Config, device: torch.device, attention: dict[str, Any]) -> list[str]:
    """On a GPU through SDPA: the run's masked batches keeping SDPA off its flash kernel."""
    if device.type != "cuda" or attention.get("implementation") != "sdpa":
        return []
    case = {
        "line_by_line": "padded rows (key-padding mask)",
        "documents": "documents (block-diagonal mask)",
    }.get(cfg.data.packing)
    if (
        cfg.model.architecture == "modernbert"
        and cfg.data.max_seq_length > cfg.model.local_attention // 2 + 1
    ):
        case = case or "ModernBERT's local layers (window)"
    taken = attention["kernels"].get(case, {}).get("taken") if case else None
    if not taken or taken == "flash":
        return []
    return [
        f"With {case}, SDPA takes its {taken} kernel, not flash; install flash-attn (its "
        "variable-length and window kernels need no mask) or set data.packing=concatenate."
    ]


# ---- the whole check ---------------------------------------------------------------------------


def parity_rows(batch: dict, rows: int) -> dict[str, torch.Tensor]:
    """Return a validation batch's first ``rows`` rows, on the CPU, with their chosen positions."""
    from mlmkit.model.bert import prediction_positions

    out = {
        k: v[:rows].cpu()
        for k, v in batch.items()
        if isinstance(v, torch.Tensor) and k not in ("positions", "targets")
    }
    out["positions"], out["targets"] = prediction_positions(out["labels"])
    return out


def run_doctor(
    cfg: Config,
    steps: int = 20,
    warmup: int = 3,
    max_seconds: float = 20.0,
    parity_batches: int = 2,
    parity_rows_per_batch: int = 8,
) -> dict[str, Any]:
    """Build the report of ``mlmkit doctor`` for the run ``cfg`` (see the module's docstring)."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mlmkit-doctor-") as scratch:
        run_dir = Path(scratch) / "run"
        try:
            figures, trainer = rehearse(cfg, run_dir, steps, warmup, max_seconds)
        finally:
            setup.stop_logging()  # its train.log goes with the scratch folder
        device = trainer.accelerator.device
        precision = trainer.accelerator.mixed_precision  # bf16 | fp16 | no
        report: dict[str, Any] = {
            "machine": machine_report(device, precision, trainer.meter.reference_flops),
            "attention": attention_report(cfg, device, precision),
            "rehearsal": {
                **figures,
                "expected_mfu": expected_mfu(cfg.model.hidden_size, device.type),
            },
        }
        model = unwrap(trainer.accelerator, trainer.objective).model
        weights = (
            "the run's (model.init_from)"
            if cfg.model.init_from
            else "transformers' standard random init"
        )
        if (
            not cfg.model.init_from
        ):  # a fresh start may zero layers whose paths parity must tell apart
            torch.manual_seed(0)
            model = type(model)(model.config)
        mixed = autocast_dtype(precision)
        if device.type == "cpu" and mixed == torch.float16:
            mixed = None
        batches = [
            parity_rows(b, parity_rows_per_batch) for b in trainer.eval_batches[:parity_batches]
        ]
        report["parity"] = parity_report(
            model,
            batches,
            device,
            report["attention"]["implementation"],
            mixed,
            trainer.tokenizer.sep_token_id,
        )
        report["parity"]["weights"] = weights
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(
        reset_partial_state=True
    )  # the rehearsal's precision goes with it
    report["findings"] = findings(cfg, device, report)
    report["seconds"] = round(time.perf_counter() - started, 1)
    return report


def format_report(report: dict[str, Any]) -> str:
    """Format the report as the lines ``mlmkit doctor`` prints."""
    m, a, r, p = report["machine"], report["attention"], report["rehearsal"], report["parity"]
    lines = [
        f"machine: {m['device']}; {m['gpus']} GPU(s); bf16 {'yes' if m['bf16'] else 'no'}, TF32 "
        f"{'on' if m['tf32'] else 'off'}; {m['peak']} {m['peak_tflops']:.2f} TFLOP/s",
        f"software: torch {m['torch']}, transformers {m['transformers']}, accelerate "
        f"{m['accelerate']}, flash-attn {'installed' if m['flash_attn'] else 'not installed'}; "
        f"precision {m['precision']}",
        f"attention: {a['implementation']} ({a['dtype']}); SDPA's kernels:",
    ]
    for case, k in a["kernels"].items():
        lines.append(
            f"  {case}: takes {k['taken']} (accepted: {', '.join(k['accepted']) or 'none'})"
        )
    expected = (
        f"expected about {r['expected_mfu']:.0%} here"
        if r["expected_mfu"] is not None
        else "no figure for this width"
    )
    lines += [
        f"rehearsal ({r['steps']} timed steps): {r['tokens_per_s']:,.0f} tokens/s, MFU "
        f"{r['mfu']:.1%} ({expected}), peak memory {r['peak_memory_gb']:.2f} GB, waiting for "
        f"batches {r['data_wait_share']:.1%}, host reads {r['host_reads_per_step']:.1f} a step, "
        f"padding {r['padding_share']:.1%}, loss {r['loss']:.3f}",
        f"parity against {p['reference']} (loss {p['reference_loss']:.4f}; weights: "
        f"{p['weights']}):",
    ]
    for name, c in p["checks"].items():
        lines.append(
            f"  {name}: logits {c['logits']:.1e}, loss {c['loss']:.1e} "
            f"(tolerance {c['tolerance']['logits']:.0e} / {c['tolerance']['loss']:.0e}) "
            f"{'ok' if c['ok'] else 'FAILS'}"
        )
    if "documents" in p:
        d = p["documents"]
        lines.append(
            f"  documents isolated vs alone ({d['documents']} documents): {d['difference']:.1e} "
            f"{'ok' if d['ok'] else 'FAILS'}"
        )
    lines.append("findings:" if report["findings"] else "findings: none")
    lines += [f"  - {f}" for f in report["findings"]]
    lines.append(f"({report['seconds']:.0f} s)")
    return "\n".join(lines)
