"""Set a run up, in the order ``Trainer`` calls these: the run dir and the accelerator
(``start``), the tokenizer and data (``prepare_data``), the engine's batch checks
(``check_engine``), then the model and its objective (``build_run_model``), the throughput
meter (``build_meter``) and the optimizer with its schedule (``build_schedule``)."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelerate import Accelerator, PartialState
from accelerate.utils import ProjectConfiguration, broadcast_object_list, set_seed

from mlmkit.config import Config, parse_duration
from mlmkit.data import streaming
from mlmkit.data.packing import prepare_datasets, warn_small_validation
from mlmkit.data.sources import corpus_fingerprint, load_corpus
from mlmkit.data.tokenizer import get_tokenizer, load_base_tokenizer, load_tokenizer
from mlmkit.errors import ConfigError, DataError
from mlmkit.masking.collator import MLMCollator
from mlmkit.model.architectures import fit_tokenizer, parts_of
from mlmkit.model.bert import (
    MaskedLM,
    build_model,
    count_parameters,
    init_output_bias,
    resolve_attn_implementation,
)
from mlmkit.model.documents import isolation_sep_id
from mlmkit.model.objective import Objective
from mlmkit.model.rtd import ReplacedTokenDetection, build_generator, load_discriminator_head
from mlmkit.training import lock as run_lock
from mlmkit.training.budget import Budget
from mlmkit.training.checkpointer import Checkpointer
from mlmkit.training.optim import build_optimizer, build_scheduler
from mlmkit.training.perf import ThroughputMeter, model_matmul_shapes, stored_reference_rate
from mlmkit.training.phases import BatchRamp, PhasePlan
from mlmkit.training.runtime import (
    apply_speed_settings,
    checkpoint_activations,
    compile_encoder,
    resolve_precision,
    runs_on_cpu,
)
from mlmkit.training.tracking import tracker_setup
from mlmkit.training.trained_model import RUN_MODEL_DIR, save_run_model_spec

log = logging.getLogger("mlmkit")


def shared_run_dir(run_dir: Path) -> Path:
    """All ranks use the main process's run dir (Hydra resolves it once per rank)."""
    state = PartialState()
    if state.num_processes == 1:
        return run_dir
    obj = [str(run_dir)]
    broadcast_object_list(obj, from_process=0)
    if obj[0] != str(run_dir):
        log.warning("Using the main process's run dir %s (this rank resolved %s)", obj[0], run_dir)
    return Path(obj[0])


def check_writable(run_dir: Path) -> None:
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


def _not_shared_tensor_note(record: logging.LogRecord) -> bool:
    """Drop accelerate's note on every save that tied weights (embeddings = output projection)
    are stored once, which is expected for BERT."""
    return "Removed shared tensor" not in record.getMessage()


def setup_logging(run_dir: Path, is_main: bool) -> None:
    """Send the ``mlmkit`` log to stderr and, on the main process, to ``<run dir>/train.log``
    until ``stop_logging``."""
    log.setLevel(logging.INFO if is_main else logging.WARNING)
    log.propagate = False
    logging.getLogger("accelerate").setLevel(logging.WARNING)  # per-file save/load chatter
    other = logging.getLogger("accelerate.utils.other")
    if _not_shared_tensor_note not in other.filters:
        other.addFilter(_not_shared_tensor_note)
    stop_logging()
    for h in list(log.handlers):
        log.removeHandler(h)
    fmt = logging.Formatter("[%(asctime)s] %(message)s", "%H:%M:%S")
    handlers = [logging.StreamHandler(sys.stderr)]
    if is_main:
        handlers.append(RunLogFile(run_dir / "train.log"))
    for handler in handlers:
        handler.setFormatter(fmt)
        log.addHandler(handler)
        _RUN_HANDLERS.append(handler)


_RUN_HANDLERS: list[logging.Handler] = []  # what setup_logging added, for stop_logging


def stop_logging() -> None:
    """Detach and close the handlers ``setup_logging`` added (a run's end, in this process)."""
    while _RUN_HANDLERS:
        handler = _RUN_HANDLERS.pop()
        log.removeHandler(handler)
        handler.close()


class RunLogFile(logging.FileHandler):
    """``train.log``, written from ``open_run_dir`` on: the lines before (set-up, a refusal's
    reasons) wait in memory, so a command refused at set-up leaves the file as it was."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, delay=True)
        self.waiting: list[logging.LogRecord] | None = []

    def emit(self, record: logging.LogRecord) -> None:
        if self.waiting is not None:
            self.waiting.append(record)
        else:
            super().emit(record)

    def open_file(self) -> None:
        """Write the waiting lines, and every later one as it comes."""
        waiting, self.waiting = self.waiting or [], None
        for record in waiting:
            super().emit(record)


def open_run_dir(run_dir: Path, model=None, tokenizer=None) -> None:
    """On the main process, once every check of a command has passed: from here on the run
    writes into ``run_dir`` (its lock kept, its log written, the model's config and tokenizer
    saved to ``<run>/model/`` where none is). Before it, a refused command has written nothing."""
    run_lock.commit(run_dir)
    for handler in log.handlers:
        if isinstance(handler, RunLogFile):
            handler.open_file()
    if model is not None and not (run_dir / RUN_MODEL_DIR / "config.json").is_file():
        save_run_model_spec(run_dir, model, tokenizer)  # config and tokenizer: any checkpoint loads


def start(cfg: Config, run_dir: Path) -> tuple[Accelerator, Path, str, Checkpointer]:
    """(accelerator, the shared run dir, precision, the run's checkpoints): the run dir checked
    and logging to it, the checkpoint to resume from found (``Checkpointer``), speed settings
    applied (``runtime``), seeds set."""
    tc = cfg.train
    use_cpu = runs_on_cpu()  # several CPU processes talk over gloo
    state = PartialState(cpu=use_cpu)
    run_dir = shared_run_dir(Path(run_dir))
    if state.is_main_process:
        check_writable(run_dir)
        run_lock.acquire(run_dir)  # before anything is written: one run at a time
    state.wait_for_everyone()
    setup_logging(run_dir, state.is_main_process)
    checkpoints = Checkpointer(run_dir, tc.resume)  # before any expensive work
    apply_speed_settings(state.device.type, tc.reuse_cpu_memory)
    precision = resolve_precision(tc.precision, use_cpu=state.device.type == "cpu")
    log_with, project = tracker_setup(cfg.logger, run_dir)
    accelerator = Accelerator(
        cpu=use_cpu,
        mixed_precision=precision,
        step_scheduler_with_optimizer=False,  # the loop steps the scheduler once per optimizer step
        log_with=log_with,
        project_config=ProjectConfiguration(**project),
    )
    set_seed(tc.seed)
    log.info(
        "Run dir %s | %d process(es) on %s | precision %s",
        run_dir,
        accelerator.num_processes,
        accelerator.device.type,
        precision,
    )
    return accelerator, run_dir, precision, checkpoints


@dataclass
class Data:
    tokenizer: Any
    train_set: Any  # packed blocks (map mode) or a StreamingBlocks
    val_set: Any
    baseline_set: Any  # where the most frequent token is counted
    corpus: str  # the corpus fingerprint
    train_blocks: int | None  # map mode: blocks in the training set (None: streamed)


def _tokenizer(
    cfg: Config,
    texts,
    fingerprint: str,
    cache_dir: Path,
    run_tokenizer: Path | None,
    tokenizer=None,
):
    """Return the run's tokenizer: a resumed run keeps its own (``<run>/model/``); a new one gets
    ``get_tokenizer``'s; a phase takes the run's (``tokenizer``)."""
    if tokenizer is not None:
        return tokenizer
    if run_tokenizer is not None:
        return load_tokenizer(str(run_tokenizer), setting="the run's own tokenizer")
    return get_tokenizer(
        cfg.tokenizer, texts, fingerprint, cache_dir, init_from=cfg.model.init_from
    )


def prepare_data(
    cfg: Config, accelerator: Accelerator, run_tokenizer: Path | None = None, tokenizer=None
) -> Data:
    """Prepare the tokenizer and data: the main process of each node prepares them, the others reuse
    them. ``run_tokenizer``: the tokenizer dir of a resumed run; ``tokenizer``: the run's own, for
    the data of a later phase."""
    if cfg.data.streaming:
        return _prepare_streaming(cfg, accelerator, run_tokenizer, tokenizer)
    cache_dir = Path(cfg.paths.cache_dir).expanduser()
    fingerprint = corpus_fingerprint(cfg.data)
    corpus = {}

    def corpus_texts():  # read only when a tokenizer must be trained
        corpus["loaded"] = load_corpus(cfg.data)
        for rows in corpus["loaded"]["train"].iter(batch_size=1000):
            yield from rows["text"]

    with accelerator.local_main_process_first():
        tokenizer = _tokenizer(cfg, corpus_texts, fingerprint, cache_dir, run_tokenizer, tokenizer)
        packed = prepare_datasets(
            cfg.data, tokenizer, cache_dir, corpus=corpus.get("loaded"), fingerprint=fingerprint
        )
    train_set, val_set = packed["train"], packed["validation"]
    world, batch_size = accelerator.num_processes, cfg.train.batch_size
    if len(train_set) < batch_size * world:
        raise DataError(
            f"The training set has {len(train_set)} blocks of {cfg.data.max_seq_length} tokens, "
            f"fewer than one batch ({batch_size} x {world} processes); lower train.batch_size "
            "or add text."
        )
    log.info(
        "Data: %d train blocks, %d validation blocks of %d tokens; vocab %d",
        len(train_set),
        len(val_set),
        cfg.data.max_seq_length,
        len(tokenizer),
    )
    warn_small_validation(len(val_set), batch_size)
    return Data(tokenizer, train_set, val_set, train_set, fingerprint, len(train_set))


def _prepare_streaming(
    cfg: Config, accelerator: Accelerator, run_tokenizer: Path | None, tokenizer=None
) -> Data:
    cache_dir = Path(cfg.paths.cache_dir).expanduser()
    tc = cfg.train
    fingerprint = corpus_fingerprint(cfg.data)
    with accelerator.local_main_process_first():
        tokenizer = _tokenizer(
            cfg,
            lambda: streaming.iter_texts(cfg.data),
            fingerprint,
            cache_dir,
            run_tokenizer,
            tokenizer,
        )
        train_set, val_set, baseline_set = streaming.setup_streaming(
            cfg.data,
            tokenizer,
            tc.batch_size,
            accelerator.process_index,
            accelerator.num_processes,
            cfg.workers(accelerator.device.type),
            tc.seed,
        )
    log.info(
        "Data: streamed, %d validation blocks of %d tokens; vocab %d",
        len(val_set),
        cfg.data.max_seq_length,
        len(tokenizer),
    )
    warn_small_validation(len(val_set), tc.batch_size)
    return Data(tokenizer, train_set, val_set, baseline_set, fingerprint, None)


def check_engine(accelerator: Accelerator, cfg: Config, phases=()) -> int:
    """Return the accumulation steps of the run, checked against the engine. Under DeepSpeed nothing
    accumulates: an optimizer step is one micro-batch of train.batch_size per process, and
    DeepSpeed takes that micro-batch from its own config (``phases``: the run's, which may
    then not change the batch)."""
    tc, world = cfg.train, accelerator.num_processes
    accum = tc.accumulation_steps(world)
    if accelerator.distributed_type.value == "DEEPSPEED":
        if any(name.startswith("train.") for phase in phases for name in phase.set):
            raise ConfigError(
                "Under DeepSpeed the micro-batch is fixed when the engine starts, so no phase may "
                "set train.batch_size, train.global_batch_size or train.grad_accum_steps; keep "
                "the batch across phases, or train under DDP or FSDP."
            )
        if tc.batch_warmup_tokens:
            raise ConfigError(
                "train.batch_warmup_tokens grows the batch by accumulating micro-batches, "
                "and under DeepSpeed nothing accumulates; set train.batch_warmup_tokens=0."
            )
        ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
        ds_accum = ds_config.get("gradient_accumulation_steps", 1)
        if accum > 1 or ds_accum not in (1, "auto"):
            derived = (
                f"this run derives {accum}"
                if accum > 1
                else f"the DeepSpeed config sets {ds_accum}"
            )
            raise ConfigError(
                f"Under DeepSpeed nothing accumulates ({derived} accumulation steps): keep "
                "train.grad_accum_steps=1 and DeepSpeed's gradient_accumulation_steps at 1, and "
                "raise train.batch_size or lower train.global_batch_size for the batch you want."
            )
        # No dataloader goes through accelerate's prepare (the loop feeds its own batches),
        # so DeepSpeed takes the micro-batch from its config.
        micro = ds_config.get("train_micro_batch_size_per_gpu", "auto")
        if micro == "auto":
            ds_config["train_micro_batch_size_per_gpu"] = tc.batch_size
        elif micro != tc.batch_size:
            raise ConfigError(
                f"The DeepSpeed config sets train_micro_batch_size_per_gpu={micro} but "
                f"train.batch_size={tc.batch_size}; make them equal, or set the DeepSpeed one to "
                "auto."
            )
    log.info(
        "Batch: %d sequences per optimizer step = %d per device x %d process(es) x %d "
        "accumulation step(s)",
        tc.batch_size * world * accum,
        tc.batch_size,
        world,
        accum,
    )
    return accum


@dataclass
class RunModel:
    """The model a run trains and the objective around it (the loss at the chosen positions)."""

    model: Any  # the plain BertForMaskedLM or ModernBertForMaskedLM
    objective: Objective  # MaskedLM, or ReplacedTokenDetection (objective=rtd)


@dataclass
class Schedule:
    """What paces a run: the optimizer and its learning-rate schedule, the budget the schedule
    runs against, a phased run's plan and the batch-size warmup."""

    optimizer: Any
    scheduler: Any
    budget: Budget
    plan: PhasePlan | None = None  # a phased run's phases (the schedule follows them)
    ramp: BatchRamp | None = None  # the batch-size warmup


def build_run_model(
    cfg: Config,
    accelerator: Accelerator,
    precision: str,
    tokenizer,
    checkpoints: Checkpointer | None = None,
    token_counts: Any = None,
    run_cfg: Config | None = None,
) -> RunModel:
    """Build the model (a resumed run's must have the shape saved beside its checkpoint;
    ``open_run_dir`` saves its config and tokenizer to ``<run>/model/``) and its objective.
    ``token_counts``: the training blocks' token counts, where a new model's output bias starts
    from them (``model.output_bias_init=unigram``); ``cfg``: the settings of the phase the run
    starts in; ``run_cfg``: the run's (its longest phase sizes the positions)."""
    device = accelerator.device
    attn = resolve_attn_implementation(cfg.model.attn_implementation, device.type, precision)
    base = None  # tokenizer.extend_vocab: the tokenizer the model was made for
    if cfg.tokenizer.extend_vocab and cfg.model.init_from:
        base = load_base_tokenizer(cfg.tokenizer, cfg.model.init_from)
    longest = max(
        [cfg.data.max_seq_length] + [c.data.max_seq_length for c in run_cfg.phase_configs()]
        if run_cfg is not None and run_cfg.phases
        else [cfg.data.max_seq_length]
    )
    model = build_model(cfg.model, tokenizer, longest, attn, base_tokenizer=base)
    if cfg.data.packing == "documents" and parts_of(model).isolation is None:
        raise ConfigError(
            f"data.packing=documents isolates documents with a block-diagonal attention mask, "
            f"which transformers' {model.config.model_type} model does not take (it reads its "
            "mask as a padding mask); set data.packing=concatenate or line_by_line."
        )
    if base is not None:
        log.info(
            "Vocabulary: %d words of the corpus added to the %d ids of model.init_from's tokenizer "
            "(tokenizer.extend_vocab), their embeddings the mean of their old pieces' (those the "
            "old vocabulary cannot spell, all [UNK]: the average word's)",
            len(tokenizer) - len(base),
            len(base),
        )
    if (
        cfg.model.output_bias_init == "unigram"
        and token_counts is not None
        and (checkpoints is None or checkpoints.resume_from is None)
        and not cfg.model.init_from
    ):
        init_output_bias(model, token_counts)
    fit_tokenizer(tokenizer, model)  # saved and exported without token_type_ids for ModernBERT
    log.info(
        "Model %s: %.2fM parameters (%.2fM without embeddings), attention %s",
        cfg.model.name,
        count_parameters(model) / 1e6,
        count_parameters(model, embeddings=False) / 1e6,
        model.config._attn_implementation,
    )
    if checkpoints is not None:  # a resumed run's model has its checkpoint's shape
        checkpoints.check_model(model.config)
    if cfg.train.gradient_checkpointing:  # before compile, which traces the checkpointed layers
        checkpoint_activations(model, accelerator)
    if cfg.train.compile:
        compile_encoder(model)
    sep_id = isolation_sep_id(cfg.data.packing, tokenizer)
    if cfg.objective.name == "rtd":
        return RunModel(model, build_rtd(cfg, model, attn, sep_id))
    objective = MaskedLM(
        model, sparse_prediction=cfg.model.sparse_prediction, document_sep_id=sep_id
    )
    return RunModel(model, objective)


def build_rtd(cfg: Config, model, attn: str, sep_id: int | None) -> ReplacedTokenDetection:
    """Replaced-token detection's objective around ``model``, the discriminator: a new generator
    sharing its embeddings, and a discriminator head (a resume loads both from the checkpoint)."""
    o = cfg.objective
    generator = build_generator(model, o, attn)
    c = generator.config
    log.info(
        "Objective: replaced-token detection (objective=rtd); the generator: %d layers, hidden "
        "%d, %d head(s), FFN %d (objective.generator_size=%g), %.2fM parameters of its own, the "
        "embeddings shared; loss = MLM + %g x the discriminator's",
        c.num_hidden_layers,
        c.hidden_size,
        c.num_attention_heads,
        c.intermediate_size,
        o.generator_size,
        (count_parameters(generator) - count_parameters(generator.electra.embeddings)) / 1e6,
        o.discriminator_weight,
    )
    objective = ReplacedTokenDetection(
        model, generator, o.discriminator_weight, sep_id, cfg.masking.mlm_probability
    )
    if cfg.model.init_from:
        kept = load_discriminator_head(objective.discriminator_head, cfg.model.init_from)
        log.info(
            "Continued pretraining with objective=rtd: the discriminator starts from "
            "model.init_from=%s, the generator is new, the discriminator head %s",
            cfg.model.init_from,
            "is its own (a released ELECTRA discriminator's)" if kept else "is new",
        )
    return objective


def build_meter(
    cfg: Config, accelerator: Accelerator, precision: str, model, objective=None
) -> ThroughputMeter:
    """Build the throughput meter, its MFU against the rate this machine can reach (``perf``);
    ``objective``: where it holds a generator (``objective=rtd``), its FLOPs count too."""
    block_tokens = cfg.train.batch_size * cfg.data.max_seq_length  # one micro-batch's products
    shapes = model_matmul_shapes(
        model.config, block_tokens, round(cfg.masking.mlm_probability * block_tokens)
    )
    peak_rate, peak_source, reliable = stored_reference_rate(
        Path(cfg.paths.cache_dir).expanduser(), accelerator.device, precision, shapes
    )
    if reliable:
        log.info(
            "MFU is taken against %.1f TFLOP/s per process (%s)", peak_rate / 1e12, peak_source
        )
    else:
        log.warning(
            "MFU is taken against %.3g TFLOP/s per process (%s): this machine was busy while "
            "its matmul rate was measured, so the MFU figures of this run are unreliable.",
            peak_rate / 1e12,
            peak_source,
        )
    generator = getattr(objective, "generator", None)
    return ThroughputMeter(
        model.config,
        peak_rate * accelerator.num_processes,
        generator.config if generator is not None else None,
    )


def build_schedule(
    cfg: Config, accelerator: Accelerator, objective, run_cfg: Config | None = None, accum: int = 1
) -> Schedule:
    """Build the optimizer, the budget and the learning-rate schedule against it (a phased run's
    plan and a batch-size warmup shape it). ``run_cfg``: the run's settings, whose ``phases`` the
    schedule follows; ``accum``: the accumulation steps of the run's batch (a batch-size warmup
    starts below them)."""
    tc = cfg.train
    optimizer = build_optimizer(objective, cfg.optim, accelerator.device.type)
    budget = Budget(cfg.optim, tc.max_steps, tc.max_tokens, parse_duration(tc.max_time))
    log.info(tc.budget_description())
    plan = PhasePlan(run_cfg, budget) if run_cfg is not None and run_cfg.phases else None
    factor = plan.lr_factor if plan is not None else budget.lr_factor
    ramp = None
    if tc.batch_warmup_tokens:
        ramp = BatchRamp(
            tc.batch_warmup_tokens,
            tc.batch_warmup_start,
            tc.batch_size * accelerator.num_processes,
            accum,
        )
        log.info(
            "Batch warmup: %d to %d sequences per step over the first %s tokens "
            "(train.batch_warmup_tokens), the learning rate in proportion",
            ramp.start * ramp.per_pass,
            accum * ramp.per_pass,
            f"{tc.batch_warmup_tokens:,}",
        )
        factor = ramp.scaled(factor, budget)
    scheduler = build_scheduler(optimizer, cfg.optim, tc.max_steps, factor=factor)
    return Schedule(optimizer, scheduler, budget, plan, ramp)


def build_collator(cfg: Config, tokenizer, rank: int, generator=None) -> MLMCollator:
    """Build the run's collator (``generator``: a collator generator whose state it carries on from,
    at a phase's start)."""
    m = cfg.masking
    collator = MLMCollator(
        tokenizer,
        m.mlm_probability,
        m.mask_replace_prob,
        m.random_replace_prob,
        seed=cfg.train.seed * 1000 + rank,
        strategy=m.strategy,
        span_p=m.span_p,
        span_max_words=m.span_max_words,
        max_word_tokens=m.max_word_tokens,
        apply_mask=not m.on_device,
        draws=cfg.objective.name == "rtd",  # the generator's samples (model.rtd)
        pad_to_multiple_of=cfg.data.pad_to_multiple_of
        if cfg.data.packing == "line_by_line"
        else None,
    )
    if generator is not None:
        collator.generator.set_state(generator.get_state())
    return collator
