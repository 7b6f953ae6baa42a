"""The training loop: one function, read top to bottom.

set up (accelerator, data, tokenizer, model, optimizer) → resume → for each optimizer
step: gather the micro-batches, count the chosen tokens over all of them and all ranks,
forward/backward each micro-batch with its loss divided by that count, clip, step → log →
evaluate → checkpoint → stop at ``train.max_steps`` → export ``final/``.
"""

from __future__ import annotations

import base64
import logging
import math
import os
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from mlmkit.config import Config
from mlmkit.data.corpus import (
    corpus_fingerprint,
    load_corpus,
    prepare_datasets,
    warn_small_validation,
)
from mlmkit.data.tokenizer import get_tokenizer
from mlmkit.errors import ConfigError, DataError, Preempted, TrainingDiverged
from mlmkit.evaluation.mlm import evaluate, fixed_eval_batches, majority_baseline
from mlmkit.export.final import export_final, without_tied_copies
from mlmkit.masking.collator import IGNORE_INDEX, MLMCollator
from mlmkit.model.bert import (
    MaskedLM,
    build_model,
    count_parameters,
    prediction_positions,
    resolve_attn_implementation,
)
from mlmkit.model.loading import save_run_model_spec
from mlmkit.training.budget import Budget, parse_duration
from mlmkit.training.checkpoint import load_checkpoint, load_latest, resolve_resume, save_checkpoint
from mlmkit.training.metrics_log import MetricsLog
from mlmkit.training.optim import build_optimizer, build_scheduler
from mlmkit.training.perf import (
    ThroughputMeter,
    model_matmul_shapes,
    peak_memory_gb,
    reference_rate,
)
from mlmkit.training.runtime import (
    apply_speed_settings,
    compile_encoder,
    resolve_precision,
    runs_on_cpu,
)
from mlmkit.training.tracking import (
    finish_trackers_on_error,
    log_event,
    start_trackers,
    tracker_setup,
)

log = logging.getLogger("mlmkit")


class DropFullAttentionMask:
    """Collate, drop ``attention_mask`` when the batch has no padding, and find the chosen
    positions for the sparse head.

    Runs in the dataloader (on the CPU, no device synchronisation); without a mask,
    SDPA can use its fused kernels. Packed blocks never need one.
    """

    def __init__(self, collator: MLMCollator) -> None:
        self.collator = collator

    def __call__(self, examples):
        batch = self.collator(examples)
        if bool(batch["attention_mask"].all()):
            del batch["attention_mask"]
        if "labels" in batch:
            batch["positions"], batch["targets"] = prediction_positions(batch["labels"])
        return batch


class EpochBatchSampler(Sampler[list[tuple[int, int]]]):
    """Batches of (index, mask seed) for one rank: a seeded permutation per epoch, by rank.

    Rank r of w takes batches r, r + w, r + 2w, ... of the epoch's permutation, so ranks
    never overlap; ``skip`` batches at the start of the epoch are passed over (resume).
    Each row carries its own mask seed, a function of (seed, epoch, position in the
    epoch's order), so its masks are the same whichever dataloader worker collates it,
    after a resume, and for any split of a global batch: 2 processes x batch b draw the
    masks of 1 process x batch 2b.
    """

    def __init__(self, n: int, batch_size: int, rank: int, world: int, seed: int) -> None:
        self.n, self.batch_size, self.rank, self.world, self.seed = n, batch_size, rank, world, seed
        self.epoch = 0
        self.skip = 0

    def __len__(self) -> int:
        return self.n // (self.batch_size * self.world)

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        perm = torch.randperm(self.n, generator=g)
        base = (self.seed * 1_000_003 + self.epoch) * 1_000_003
        for b in range(self.skip, len(self)):
            start = (b * self.world + self.rank) * self.batch_size
            rows = perm[start:start + self.batch_size].tolist()
            yield [(i, (base + start + j) % 2**63) for j, i in enumerate(rows)]


class KeyedRows(torch.utils.data.Dataset):
    """Rows of a packed dataset fetched by (index, mask seed); the seed rides along."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> dict[str, Any]:
        index, mask_seed = key
        return {"input_ids": self.dataset[index]["input_ids"], "mask_seed": mask_seed}

    def __getitems__(self, keys: list[tuple[int, int]]) -> list[dict[str, Any]]:
        rows = self.dataset[[k[0] for k in keys]]["input_ids"]  # one fetch for the batch
        return [{"input_ids": r, "mask_seed": k[1]} for r, k in zip(rows, keys)]


class BatchStream:
    """Endless micro-batches over epochs, moved to the device; knows its position."""

    def __init__(self, loader: DataLoader, device: torch.device, epoch: int = 0, offset: int = 0) -> None:
        self.loader = loader
        self.sampler: EpochBatchSampler = loader.batch_sampler
        self.device = device
        self.epoch = epoch
        self.offset = offset  # micro-batches already taken in this epoch
        self._it = None

    def _start_epoch(self) -> None:
        self.sampler.epoch, self.sampler.skip = self.epoch, self.offset
        # the loader's generator only seeds workers; reseeding it per epoch keeps worker
        # seeds reproducible without touching torch's global RNG (which dropout uses)
        self.loader.generator.manual_seed(self.sampler.seed * 100_003 + self.epoch)
        self._it = iter(self.loader)

    def __next__(self) -> dict[str, torch.Tensor]:
        if self._it is None:
            self._start_epoch()
        try:
            batch = next(self._it)
        except StopIteration:
            self.epoch, self.offset = self.epoch + 1, 0
            self._start_epoch()
            batch = next(self._it)
        self.offset += 1
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset}


def forward_backward(accelerator, objective, micro: list[dict[str, torch.Tensor]]
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and backward every micro-batch of one optimizer step.

    The gradient left in the parameters is that of (sum of the token losses of the whole
    step) / (chosen tokens in the whole step, over all micro-batches and ranks): the
    count is summed first, then each micro-batch's summed loss is divided by it. Returns
    this rank's summed loss and the global count (device tensors; no host sync).
    """
    world = accelerator.num_processes
    n_local = sum((b["labels"] != IGNORE_INDEX).sum() for b in micro)
    n_global = accelerator.reduce(n_local.float(), reduction="sum")
    # DDP averages gradients over ranks; multiplying by world undoes that average.
    scale = world / n_global.clamp(min=1.0)
    loss_sum = torch.zeros((), device=n_global.device)
    for i, batch in enumerate(micro):
        last = i == len(micro) - 1
        with nullcontext() if last else accelerator.no_sync(objective):
            out = objective(**batch)
            accelerator.backward(out["loss_sum"] * scale)
        loss_sum += out["loss_sum"].detach()
    return loss_sum, n_global


class StopSignals:
    """Turns SIGTERM, SIGINT and SIGUSR1 (SLURM's warning) into a request to stop cleanly.

    The loop checks ``requested`` after each optimizer step, saves a checkpoint and exits
    with ``Preempted.exit_code``. A second SIGINT interrupts at once.
    """

    SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1")

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum, frame) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signum

    def __enter__(self) -> StopSignals:
        import threading

        if threading.current_thread() is threading.main_thread():
            for name in self.SIGNALS:
                if hasattr(signal, name):
                    sig = getattr(signal, name)
                    self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def requested(self, accelerator) -> bool:
        """True on every rank once any rank got a signal (ranks must stop at one step)."""
        if accelerator.num_processes == 1:
            return self.received is not None
        flag = torch.tensor(float(self.received is not None), device=accelerator.device)
        return bool(accelerator.reduce(flag, reduction="sum") > 0)


def grad_accum_steps(tc, world: int) -> int:
    """Micro-batches per optimizer step: ``train.grad_accum_steps``, or derived from
    ``train.global_batch_size`` = batch_size x processes x accumulation steps."""
    if tc.global_batch_size is None:
        return tc.grad_accum_steps
    per_pass = tc.batch_size * world
    if tc.global_batch_size % per_pass:
        raise ConfigError(
            f"train.global_batch_size ({tc.global_batch_size}) is not a multiple of "
            f"train.batch_size x processes ({tc.batch_size} x {world} = {per_pass}); change "
            "train.global_batch_size or train.batch_size."
        )
    derived = tc.global_batch_size // per_pass
    if tc.grad_accum_steps not in (1, derived):
        raise ConfigError(
            f"train.grad_accum_steps={tc.grad_accum_steps} disagrees with train.global_batch_size="
            f"{tc.global_batch_size} ({tc.batch_size} per device x {world} processes needs "
            f"{derived}); set only one of them."
        )
    return derived


def _shared_clock(accelerator, seconds: float) -> float:
    """The main process's ``seconds``, on every rank."""
    if accelerator.num_processes == 1:
        return seconds
    t = torch.tensor([seconds if accelerator.is_main_process else 0.0], dtype=torch.float64,
                     device=accelerator.device)
    return float(accelerator.reduce(t, reduction="sum"))


def _setup_logging(run_dir: Path, is_main: bool) -> None:
    level = logging.INFO if is_main else logging.WARNING
    log.setLevel(level)
    logging.getLogger("mlmkit").propagate = False
    acc_log = logging.getLogger("accelerate")
    acc_log.setLevel(logging.WARNING)  # per-file save/load chatter
    # Tied weights (embeddings = output projection) are stored once; accelerate says so on
    # every save, which is expected for BERT.
    logging.getLogger("accelerate.utils.other").addFilter(
        lambda record: "Removed shared tensor" not in record.getMessage()
    )
    for h in list(log.handlers):
        log.removeHandler(h)
    fmt = logging.Formatter("[%(asctime)s] %(message)s", "%H:%M:%S")
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(fmt)
    log.addHandler(stream)
    if is_main:
        fh = logging.FileHandler(run_dir / "train.log")
        fh.setFormatter(fmt)
        log.addHandler(fh)


def _shared_run_dir(run_dir: Path) -> Path:
    """All ranks use the main process's run dir (Hydra resolves it once per rank)."""
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    state = PartialState()  # already initialised by train()
    if state.num_processes == 1:
        return run_dir
    obj = [str(run_dir)]
    broadcast_object_list(obj, from_process=0)
    if obj[0] != str(run_dir):
        log.warning("Using the main process's run dir %s (this rank resolved %s)", obj[0], run_dir)
    return Path(obj[0])


def _check_writable(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"Cannot write to the run dir {str(run_dir)!r} ({exc.strerror}); "
            "set hydra.run.dir to a writable folder."
        ) from None


def _encode_state(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode()


def _decode_state(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8).clone()


def train(cfg: Config, run_dir: str | os.PathLike) -> dict[str, Any]:
    """Pretrain a masked language model as ``cfg`` says, writing everything to ``run_dir``.

    Returns the final evaluation metrics (``eval_loss``, ``eval_accuracy``, ...).
    """
    from accelerate import Accelerator, PartialState
    from accelerate.utils import ProjectConfiguration, gather_object, set_seed

    tc = cfg.train
    # CPU runs (ACCELERATE_USE_CPU=1, or no CUDA device) use gloo across processes.
    use_cpu = runs_on_cpu()
    state = PartialState(cpu=use_cpu)
    run_dir = _shared_run_dir(Path(run_dir))
    if state.is_main_process:
        _check_writable(run_dir)
    state.wait_for_everyone()
    _setup_logging(run_dir, state.is_main_process)

    # Where to start, decided before any expensive work.
    ckpt_dir = run_dir / "checkpoints"
    resume_from = resolve_resume(tc.resume, ckpt_dir)
    previous = [p for p in (run_dir / "metrics.jsonl", ckpt_dir, run_dir / "final") if p.exists()]
    if resume_from is None and previous and tc.resume != "auto":
        raise ConfigError(
            f"The run dir {str(run_dir)!r} already holds a run ({previous[0].name}); set "
            "train.resume=auto to continue it, or choose a new hydra.run.dir."
        )

    # ---- accelerator and speed settings (one place, see runtime.py) ----------------------
    apply_speed_settings(state.device.type, tc.reuse_cpu_memory)
    precision = resolve_precision(tc.precision, use_cpu=state.device.type == "cpu")
    log_with, project = tracker_setup(cfg.logger, run_dir)
    accelerator = Accelerator(
        cpu=use_cpu,
        mixed_precision=precision,
        step_scheduler_with_optimizer=False,  # we step the scheduler once per optimizer step
        log_with=log_with,
        project_config=ProjectConfiguration(**project),
    )
    set_seed(tc.seed)
    world = accelerator.num_processes
    log.info("Run dir %s | %d process(es) on %s | precision %s", run_dir, world,
             accelerator.device.type, precision)

    # ---- tokenizer and data (the main process of each node prepares, others reuse) -------
    cache_dir = Path(cfg.paths.cache_dir).expanduser()
    fingerprint = corpus_fingerprint(cfg.data)
    corpus = None

    def corpus_texts():
        nonlocal corpus
        corpus = load_corpus(cfg.data)
        for rows in corpus["train"].iter(batch_size=1000):
            yield from rows["text"]

    if cfg.data.streaming:  # tokenized and packed on the fly (streaming.py)
        from mlmkit.data import streaming

        with accelerator.local_main_process_first():
            tokenizer = get_tokenizer(cfg.tokenizer, lambda: streaming.iter_texts(cfg.data), fingerprint,
                                      cache_dir, init_from=cfg.model.init_from)
            train_set, val_set, baseline_set = streaming.setup_streaming(
                cfg.data, tokenizer, tc.batch_size, accelerator.process_index, world, tc.num_workers, tc.seed)
        log.info("Data: streamed, %d validation blocks of %d tokens; vocab %d", len(val_set),
                 cfg.data.max_seq_length, len(tokenizer))
    else:
        with accelerator.local_main_process_first():
            tokenizer = get_tokenizer(cfg.tokenizer, corpus_texts, fingerprint, cache_dir,
                                      init_from=cfg.model.init_from)
            packed = prepare_datasets(cfg.data, tokenizer, cache_dir, corpus=corpus, fingerprint=fingerprint)
        train_set, val_set = packed["train"], packed["validation"]
        baseline_set = train_set
        per_step = tc.batch_size * world
        if len(train_set) < per_step:
            raise DataError(
                f"The training set has {len(train_set)} blocks of {cfg.data.max_seq_length} tokens, "
                f"fewer than one batch ({tc.batch_size} x {world} processes); lower train.batch_size "
                "or add text."
            )
        log.info("Data: %d train blocks, %d validation blocks of %d tokens; vocab %d",
                 len(train_set), len(val_set), cfg.data.max_seq_length, len(tokenizer))
    accum = grad_accum_steps(tc, world)
    if accum > 1 and accelerator.distributed_type.value == "DEEPSPEED":
        raise ConfigError(
            f"With DeepSpeed, accumulate in DeepSpeed's own config (gradient_accumulation_steps) and "
            f"keep train.grad_accum_steps=1 (this run derives {accum}); lower "
            "train.global_batch_size or raise train.batch_size."
        )
    if accelerator.distributed_type.value == "DEEPSPEED":
        # No dataloader goes through accelerate's prepare (the loop feeds its own batches),
        # so DeepSpeed takes the micro-batch from its config.
        ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
        micro = ds_config.get("train_micro_batch_size_per_gpu", "auto")
        if micro == "auto":
            ds_config["train_micro_batch_size_per_gpu"] = tc.batch_size
        elif micro != tc.batch_size:
            raise ConfigError(
                f"The DeepSpeed config sets train_micro_batch_size_per_gpu={micro} but "
                f"train.batch_size={tc.batch_size}; make them equal, or set the DeepSpeed one to auto."
            )
    log.info("Batch: %d sequences per optimizer step = %d per device x %d process(es) x %d "
             "accumulation step(s)", tc.batch_size * world * accum, tc.batch_size, world, accum)
    warn_small_validation(len(val_set), tc.batch_size)

    # ---- model, objective, optimizer ------------------------------------------------------
    attn = resolve_attn_implementation(cfg.model.attn_implementation, accelerator.device.type, precision)
    model = build_model(cfg.model, tokenizer, cfg.data.max_seq_length, attn)
    log.info("Model %s: %.2fM parameters (%.2fM without embeddings), attention %s", cfg.model.name,
             count_parameters(model) / 1e6, count_parameters(model, embeddings=False) / 1e6, attn)
    if accelerator.is_main_process:  # config and tokenizer, so any checkpoint can be loaded
        save_run_model_spec(run_dir, model, tokenizer)
    if tc.compile:
        compile_encoder(model)
    block_tokens = tc.batch_size * cfg.data.max_seq_length  # one micro-batch's products
    shapes = model_matmul_shapes(model.config, block_tokens, round(cfg.masking.mlm_probability * block_tokens))
    peak_rate, peak_source = reference_rate(accelerator.device, precision, shapes)
    meter = ThroughputMeter(model.config, cfg.data.max_seq_length, peak_rate * world)  # all ranks
    log.info("MFU is taken against %.1f TFLOP/s per process (%s)", peak_rate / 1e12, peak_source)
    objective = MaskedLM(model, sparse_prediction=cfg.model.sparse_prediction)
    optimizer = build_optimizer(objective, cfg.optim, accelerator.device.type)
    budget = Budget(cfg.optim, tc.max_steps, tc.max_tokens, parse_duration(tc.max_time))
    scheduler = build_scheduler(optimizer, cfg.optim, tc.max_steps, factor=budget.lr_factor)

    m = cfg.masking
    collator = MLMCollator(
        tokenizer, m.mlm_probability, m.mask_replace_prob, m.random_replace_prob,
        seed=tc.seed * 1000 + accelerator.process_index, strategy=m.strategy, span_p=m.span_p,
        span_max_words=m.span_max_words, apply_mask=not m.on_device,
        pad_to_multiple_of=cfg.data.pad_to_multiple_of if cfg.data.packing == "line_by_line" else None,
    )
    # Our own sampler (not accelerate's prepared loader, which collates a batch ahead): it
    # shards by rank and gives every batch its own mask seed, so a resumed run sees the
    # same batches with the same masks, with or without dataloader workers.
    if cfg.data.streaming:
        stream = streaming.StreamingBatches(train_set, DropFullAttentionMask(collator), tc.num_workers,
                                            accelerator.device, accelerator.device.type == "cuda")
    else:
        train_loader = DataLoader(
            KeyedRows(train_set),
            batch_sampler=EpochBatchSampler(len(train_set), tc.batch_size, accelerator.process_index,
                                            world, tc.seed),
            collate_fn=DropFullAttentionMask(collator),
            num_workers=tc.num_workers,
            pin_memory=accelerator.device.type == "cuda",
            persistent_workers=False,
            prefetch_factor=4 if tc.num_workers > 0 else None,
            generator=torch.Generator(),
        )
        stream = BatchStream(train_loader, accelerator.device)
    eval_batches = fixed_eval_batches(val_set, tokenizer, m, tc.batch_size)
    baseline = majority_baseline(baseline_set, eval_batches, tokenizer)
    objective, optimizer, scheduler = accelerator.prepare(objective, optimizer, scheduler)

    # ---- resume ---------------------------------------------------------------------------
    metrics = MetricsLog(run_dir / "metrics.jsonl", enabled=accelerator.is_main_process)

    def record(event: dict[str, Any]) -> None:  # metrics.jsonl and the tracker
        metrics.write(event)
        log_event(accelerator, event)

    step, tokens_seen = 0, 0
    if resume_from is not None:
        if tc.resume == "auto":  # a damaged latest checkpoint falls back to the one before
            resume_from, restored = load_latest(accelerator, ckpt_dir, resume_from)
        else:
            restored = load_checkpoint(accelerator, resume_from)
        step, tokens_seen = restored["step"], restored["tokens_seen"]
        budget.load_state_dict(restored.get("budget", {"tokens": tokens_seen}))
        stream_state = restored["stream"]
        saved_world = restored.get("world_size", world)
        if bool(stream_state.get("streaming")) != cfg.data.streaming:
            raise ConfigError(f"The checkpoint was written with data.streaming="
                              f"{str(not cfg.data.streaming).lower()}; resume with the same setting.")
        if cfg.data.streaming:
            if saved_world != world:
                raise ConfigError(f"The checkpoint's stream was read by {saved_world} process(es); "
                                  f"resume a streaming run with {saved_world} processes.")
            stream.load_state_dict(stream_state["ranks"][accelerator.process_index])
        else:
            if saved_world != world:  # keep the position in the epoch by samples seen
                stream_state = {**stream_state, "offset": stream_state["offset"] * saved_world // world}
                log.warning("Resuming with %d process(es) from a checkpoint written by %d: the data "
                            "position is kept by samples seen, but the run will not match an "
                            "uninterrupted one exactly.", world, saved_world)
            stream.epoch, stream.offset = stream_state["epoch"], stream_state["offset"]
        collator_states = restored.get("collator", [])
        if accelerator.process_index < len(collator_states):  # used by masking.on_device
            collator.generator.set_state(_decode_state(collator_states[accelerator.process_index]))
        metrics.truncate_after(step)
        log.info("Resumed from %s at step %d", resume_from, step)
    else:
        metrics.truncate_after(-1)  # resume=auto without a checkpoint: the run starts over
    start_trackers(accelerator, cfg.logger, run_dir, asdict(cfg))
    if resume_from is None:
        record({"event": "baseline", "step": 0, **baseline})
        log.info("Baseline: always predicting %r scores eval accuracy %.4f",
                 baseline["baseline_token"], baseline["baseline_accuracy"])

    def loop_state() -> dict[str, Any]:
        return {
            "step": step,
            "tokens_seen": tokens_seen,
            "stream": {"streaming": True, "ranks": gather_object([stream.state_dict()])}
            if cfg.data.streaming else stream.state_dict(),
            "collator": gather_object([_encode_state(collator.generator.get_state())]),
            "world_size": world,
            "budget": budget.state_dict(),
        }

    def save() -> None:
        path = save_checkpoint(accelerator, ckpt_dir, step, loop_state(), tc.keep_last)
        log.info("Saved checkpoint %s", path)

    # ---- the loop ---------------------------------------------------------------------------
    progress = None
    if accelerator.is_main_process and tc.progress:
        from tqdm.auto import tqdm

        progress = tqdm(total=tc.max_steps, initial=step, desc="train", dynamic_ncols=True)
    time_base = budget.elapsed(step)  # training time before this process started (resume)
    objective.train()
    last_eval: dict[str, Any] = {}
    device = accelerator.device
    loss_acc = torch.zeros((), device=device)  # summed loss since the last log (this rank)
    masked_acc = torch.zeros((), device=device)  # chosen tokens since the last log (all ranks)
    tokens_since = 0
    t_log = time.perf_counter()
    t_start = t_log
    paused = 0.0  # seconds spent on evaluation and checkpoints since the last log

    with StopSignals() as signals, finish_trackers_on_error(accelerator):
        bad_steps = 0  # consecutive steps skipped for a non-finite gradient
        skipped_total = 0
        while not budget.done(step):
            mlm_probability = (m.probability_at(step, tc.max_steps) if budget.step_only
                               else m.rate_at(budget.progress(step)))
            collator.set_mlm_probability(mlm_probability)  # before the step's batches are collated
            micro = [next(stream) for _ in range(accum)]
            if m.on_device:  # the dataloader only padded; mask here, on the accelerator
                for batch in micro:
                    batch["input_ids"], batch["labels"] = collator.mask(batch["input_ids"],
                                                                        batch.get("attention_mask"))
            step_loss, n_global = forward_backward(accelerator, objective, micro)
            loss_acc += step_loss
            max_norm = cfg.optim.max_grad_norm if cfg.optim.max_grad_norm is not None else math.inf
            grad_norm = accelerator.clip_grad_norm_(objective.parameters(), max_norm)
            # DeepSpeed clips inside its engine and may report no norm
            grad_norm = torch.as_tensor(grad_norm if grad_norm is not None else 0.0)
            lr = scheduler.get_last_lr()[0]  # the rate this step used
            # A NaN/Inf loss or gradient skips the update. With fp16 the gradient scaler sees
            # overflows itself (skips the step and lowers its scale), so there only a
            # non-finite loss counts as a bad step.
            finite_grad = bool(torch.isfinite(grad_norm))
            scaler = accelerator.scaler is not None
            if finite_grad or scaler:
                optimizer.step()
            ok = bool(torch.isfinite(accelerator.reduce(step_loss, reduction="sum"))) if scaler else finite_grad
            if ok:
                bad_steps = 0
            else:
                bad_steps += 1
                skipped_total += 1
                log.warning("Step %d: non-finite loss or gradient (norm %s); update skipped "
                            "(%d in a row)", step + 1, float(grad_norm), bad_steps)
                if bad_steps >= tc.max_bad_steps:
                    raise TrainingDiverged(
                        f"{bad_steps} steps in a row had a non-finite loss or gradient (up to step "
                        f"{step + 1}); lower optim.lr, set optim.max_grad_norm, or use "
                        "train.precision=bf16 instead of fp16, then resume from the last checkpoint "
                        "with train.resume=auto."
                    )
            step_tokens = sum(b["input_ids"].numel() for b in micro) * world
            tokens_seen += step_tokens
            budget.finish_step(step_tokens)
            scheduler.step()  # the rate of the next step, from the budget used so far
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if budget.max_time and step % tc.log_every == 0:  # share the main process's clock
                budget.sync(step, _shared_clock(accelerator, time_base + time.perf_counter() - t_start))
            last = budget.done(step)
            tokens_since += step_tokens
            masked_acc += n_global
            if progress is not None:
                progress.update(1)

            if step % tc.log_every == 0 or last:  # the step's figures are fetched only here
                elapsed = max(time.perf_counter() - t_log - paused, 1e-9)
                total_loss = accelerator.reduce(loss_acc, reduction="sum")
                masked = float(masked_acc)
                event = {
                    "event": "train",
                    "step": step,
                    "loss": float(total_loss) / max(masked, 1.0),
                    "lr": lr,
                    "mlm_probability": mlm_probability,
                    "grad_norm": float(grad_norm),
                    "skipped_steps": skipped_total,
                    **meter.figures(tokens_since, masked, elapsed),  # tokens/s, masked tokens/s, MFU
                    "peak_memory_gb": peak_memory_gb(device),
                    "tokens_seen": tokens_seen,
                    "epoch": stream.epoch,
                    "elapsed_s": time_base + time.perf_counter() - t_start,
                    "global_batch_size": tc.batch_size * world * accum,
                }
                record(event)
                if progress is not None:  # tqdm shows the time left itself
                    progress.set_postfix(loss=f"{event['loss']:.3f}", lr=f"{event['lr']:.2e}",
                                         tok_s=f"{event['tokens_per_s']:.0f}", mfu=f"{event['mfu']:.0%}")
                if not math.isfinite(event["loss"]):
                    log.warning("Step %d: loss is %s", step, event["loss"])
                loss_acc.zero_()
                masked_acc.zero_()
                tokens_since = 0
                t_log, paused = time.perf_counter(), 0.0

            if (tc.eval_every and step % tc.eval_every == 0) or last:
                t0 = time.perf_counter()
                last_eval = evaluate(accelerator, objective, eval_batches)
                record({"event": "eval", "step": step, **last_eval})
                log.info("step %d | eval loss %.4f | perplexity %.2f | accuracy %.4f", step,
                         last_eval["eval_loss"], last_eval["eval_perplexity"], last_eval["eval_accuracy"])
                paused += time.perf_counter() - t0  # keep evaluation out of tokens/s

            stop = signals.requested(accelerator)
            if (tc.save_every and step % tc.save_every == 0) or last or stop:
                t0 = time.perf_counter()
                save()
                paused += time.perf_counter() - t0
            if stop:
                if progress is not None:
                    progress.close()
                name = signal.Signals(signals.received).name if signals.received else "a signal"
                raise Preempted(
                    f"Stopped by {name} at step {step} after saving a checkpoint; continue with "
                    "train.resume=auto in the same hydra.run.dir.", signum=signals.received,
                )

    if progress is not None:
        progress.close()

    # ---- export ---------------------------------------------------------------------------
    accelerator.wait_for_everyone()
    if not last_eval:  # resumed at max_steps: evaluate the restored weights
        last_eval = evaluate(accelerator, objective, eval_batches)
    if tc.export:
        # every rank takes part: FSDP and DeepSpeed ZeRO-3 gather the full weights here
        state = accelerator.get_state_dict(objective)
        if accelerator.is_main_process:
            plain = accelerator.unwrap_model(objective).model
            final = export_final(
                plain, tokenizer, run_dir / "final",
                config=asdict(cfg), summary={"step": step, "tokens_seen": tokens_seen, **last_eval, **baseline},
                state_dict=without_tied_copies(plain, {k.removeprefix("model."): v for k, v in state.items()}),
            )
            log.info("Exported %s", final)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return last_eval
