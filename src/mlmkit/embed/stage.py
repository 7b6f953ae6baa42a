"""The contrastive stage: an encoder fine-tuned as a sentence embedder on sentence-transformers.

    mlmkit embed checkpoint=outputs/<run> pairs.files=[pairs.jsonl] sts_dir=<STS-B>
    mlmkit embed checkpoint=outputs/<run> objective=simcse data=files 'data.train_files=[a/*.txt]'
    mlmkit embed ... loss=cached_mnrl batch_size=1024 mini_batch_size=32  # big batch, little memory
    mlmkit embed ... 'matryoshka_dims=[128,64]'                             # truncatable embeddings

Everything that trains is sentence-transformers' own: the model is its ``Transformer`` module
(the checkpoint's encoder, without the MLM head) and mean pooling, the pooling the exported
``final/`` of a pretraining run declares and ``mlmkit eval-sts`` scores; the loss is
``MultipleNegativesRankingLoss`` (each row's positive against every other row's in the batch,
and its hard negative; with several processes the rows of every rank,
``gather_across_devices``), or ``CachedMultipleNegativesRankingLoss``, the same loss computed in
mini-batches by gradient caching (Gao et al., 2021, "Scaling Deep Contrastive Learning Batch
Size under Memory Limited Setup"), optionally inside ``MatryoshkaLoss`` (Kusupati et al., 2022);
batches never hold a text twice (its ``no_duplicates`` sampler); ``SentenceTransformerTrainer``
runs the steps, the schedule (linear warmup and decay), mixed precision, checkpoints, resume
and several processes; its ``EmbeddingSimilarityEvaluator`` and
``InformationRetrievalEvaluator`` score the held-out data before training, every
``eval_every`` steps and at the end. mlmkit adds what a run of its own has: the rows
(``mlmkit.embed.data``), the run folder (``metrics.jsonl`` events, ``train.log``, the trackers, a
lock), a time budget and clean stops on signals through the trainer's callbacks, and (in
``mlmkit.embed.run``) ``final/`` with its model card.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from mlmkit.config import EmbedConfig, LoggerConfig, parse_duration
from mlmkit.data.fingerprint import content, in_memory
from mlmkit.embed.data import EvalData, load_eval_data, training_rows
from mlmkit.errors import CheckpointError, ConfigError, Preempted
from mlmkit.evaluation.retrieval import FIGURES
from mlmkit.model.architectures import DROPOUT_CONFIG_KEYS, architecture
from mlmkit.training.checkpoint_files import is_checkpoint
from mlmkit.training.metrics_log import MetricsLog
from mlmkit.training.runtime import resolve_precision, runs_on_cpu, save_model
from mlmkit.training.signals import StopSignals
from mlmkit.training.tracking import log_with
from mlmkit.training.trained_model import load_model_and_tokenizer, resolve_model_path, run_settings

log = logging.getLogger("mlmkit")

MIN_VERSION = 6  # sentence-transformers' major version whose module layout this stage uses
SIMCSE_DROPOUT = 0.1  # the noise of unsupervised SimCSE (Gao et al., 2021), BERT's own rate
DEFAULT_LENGTH = 128  # tokens kept when neither the setting nor the model dir says
CHECKPOINTS = "checkpoints"  # <run dir>/checkpoints/checkpoint-<step>: the trainer's own
STATE_FILE = "mlmkit_embed_state.json"  # beside each checkpoint: the training seconds spent
# the dropout settings of a family's config beyond its hidden and attention dropout
# (``DROPOUT_CONFIG_KEYS`` of ``mlmkit.model.architectures``): ModernBERT's embeddings' own
EXTRA_DROPOUT_KEYS = {"modernbert": ("embedding_dropout",)}


def library():
    """Return the ``sentence_transformers`` module, or one sentence on what to install."""
    try:
        import sentence_transformers as st
    except ImportError:
        raise ConfigError(
            "mlmkit embed trains with sentence-transformers, which is not installed; "
            "pip install 'mlmkit[embeddings]' (or sentence-transformers)."
        ) from None
    major = int(st.__version__.split(".")[0])
    if major < MIN_VERSION:
        raise ConfigError(
            f"mlmkit embed needs sentence-transformers {MIN_VERSION} or later, found "
            f"{st.__version__}; pip install -U sentence-transformers."
        )
    return st


# ---- the model ----------------------------------------------------------------------------------


def check_base_model(cfg: EmbedConfig, run_dir: Path, is_main: bool) -> tuple[Path, Any]:
    """Return ``(resolved checkpoint, what base_model_dir writes)``: ``checkpoint`` found and
    loadable (a model dir: an encoder mlmkit knows, safetensors weights, a tokenizer; a training
    checkpoint: its model and tokenizer, loaded on the main process where ``<run dir>/base`` is
    not written yet), before anything is written."""
    from mlmkit.data.tokenizer import load_tokenizer
    from mlmkit.model.bert import load_pretrained_config
    from mlmkit.model.safety import require_safetensors

    resolved = resolve_model_path(cfg.checkpoint)
    if not is_checkpoint(resolved):
        load_pretrained_config(str(resolved), "checkpoint")
        require_safetensors(resolved, "checkpoint")
        load_tokenizer(str(resolved), "checkpoint")
        return resolved, None
    if is_main and not (run_dir / "base" / "config.json").is_file():
        mlm, tokenizer, _ = load_model_and_tokenizer(resolved)
        return resolved, (mlm, tokenizer)
    return resolved, None


def base_model_dir(resolved: Path, loaded: Any, run_dir: Path) -> tuple[Path, Any]:
    """``(model dir to start from, its config)``: the model dir itself, or for a training
    checkpoint its weights (``loaded`` by ``check_base_model``) written as one into
    ``<run dir>/base``."""
    from mlmkit.model.bert import load_pretrained_config

    if not is_checkpoint(resolved):
        return resolved, load_pretrained_config(str(resolved), "checkpoint")
    base = run_dir / "base"
    if loaded is not None:
        mlm, tokenizer = loaded
        tmp = run_dir / ".tmp-base"
        save_model(mlm, tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, base)
    _wait_for_everyone()
    return base, load_pretrained_config(str(base), "checkpoint")


def _wait_for_everyone() -> None:
    from accelerate import PartialState

    PartialState().wait_for_everyone()


def embedding_length(cfg: EmbedConfig, base: Path, resolved: Path, config) -> int:
    """Tokens kept of each text: ``max_seq_length``, else the model dir's sentence-transformers
    length (a run's ``final/``: its training blocks), else its run's blocks, else 128; never
    more than the model's positions."""
    length = cfg.max_seq_length
    if length is None:
        try:
            length = json.loads((base / "sentence_bert_config.json").read_text())["max_seq_length"]
        except (OSError, ValueError, KeyError, TypeError):
            found = run_settings(resolved)
            length = (found[1].get("data") or {}).get("max_seq_length") if found else None
    length = length if isinstance(length, int) and length > 0 else DEFAULT_LENGTH
    return min(length, architecture(config.model_type).positions(config))


def dropout_of(cfg: EmbedConfig, config) -> float | None:
    """Return the dropout to train with: the setting, else SimCSE's 0.1 for ``objective=simcse`` (a
    preset of mlmkit pretrains without dropout, which would leave SimCSE's two copies equal),
    else None: the model's own."""
    if cfg.dropout is not None:
        return cfg.dropout
    return SIMCSE_DROPOUT if cfg.objective == "simcse" else None


def dropout_keys(config) -> tuple[str, ...]:
    """Return the settings of ``config`` that set its model's dropout: its family's hidden and
    attention dropout (``DROPOUT_CONFIG_KEYS``; BERT's names for the families that share them)
    and, for ModernBERT, its embeddings'."""
    family = architecture(config.model_type).name
    keys = DROPOUT_CONFIG_KEYS.get(family, DROPOUT_CONFIG_KEYS["bert"])
    return (*keys, *EXTRA_DROPOUT_KEYS.get(family, ()))


def build_model(base: Path, length: int, dropout: float | None, config):
    """Build a ``SentenceTransformer``: the encoder of ``base`` and mean pooling, ``dropout`` on
    every dropout of the encoder where it is set."""
    st = library()
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers.utils import logging as hf_logging

    config_kwargs = {k: dropout for k in dropout_keys(config)} if dropout is not None else {}
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its report of the MLM head's weights left unused
    try:
        transformer = Transformer(str(base), max_seq_length=length, config_kwargs=config_kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)
    pooling = Pooling(transformer.get_embedding_dimension(), "mean")
    device = "cpu" if runs_on_cpu() else None
    return st.SentenceTransformer(modules=[transformer, pooling], device=device)


# ---- loss and evaluators ------------------------------------------------------------------------


def build_loss(cfg: EmbedConfig, model):
    """In-batch negatives (plain or cached), inside ``MatryoshkaLoss`` when dims are listed."""
    from sentence_transformers.sentence_transformer import losses

    several = int(os.environ.get("WORLD_SIZE", "1")) > 1  # one process: nothing to gather
    common = {"scale": cfg.scale, "gather_across_devices": cfg.gather_across_devices and several}
    if cfg.loss == "cached_mnrl":
        loss = losses.CachedMultipleNegativesRankingLoss(
            model, mini_batch_size=cfg.mini_batch_size, **common
        )
    else:
        loss = losses.MultipleNegativesRankingLoss(model, **common)
    if not cfg.matryoshka_dims:
        return loss
    return losses.MatryoshkaLoss(model, loss, matryoshka_dims(cfg, model))


def matryoshka_dims(cfg: EmbedConfig, model) -> list[int]:
    """``cfg.matryoshka_dims`` and the full dimension, largest first; a dim above the model's
    is an error."""
    full = model.get_embedding_dimension()
    too_big = [d for d in cfg.matryoshka_dims if d > full]
    if too_big:
        raise ConfigError(
            f"matryoshka_dims lists {too_big[0]}, more than the model's {full} "
            f"dimensions; list sizes up to {full}."
        )
    return sorted({*cfg.matryoshka_dims, full}, reverse=True)


def build_evaluators(cfg: EmbedConfig, data: EvalData, model) -> list:
    """sentence-transformers' evaluators of the held-out data: STS (and each Matryoshka
    dimension's), retrieval (nDCG@10, recall@100, MRR@10)."""
    from sentence_transformers.sentence_transformer import evaluation

    evaluators = []
    if data.sts:
        a, b, scores = (list(x) for x in zip(*data.sts))
        dims = matryoshka_dims(cfg, model)[1:] if cfg.matryoshka_dims else []
        for dim in [None, *dims]:
            evaluators.append(
                evaluation.EmbeddingSimilarityEvaluator(
                    a,
                    b,
                    scores,
                    batch_size=cfg.batch_size,
                    similarity_fn_names=["cosine"],
                    name=f"sts_{dim}d" if dim else "sts",
                    write_csv=False,
                    truncate_dim=dim,
                )
            )
    if data.beir is not None:
        evaluators.append(
            evaluation.InformationRetrievalEvaluator(
                queries=data.beir.queries,
                corpus=data.beir.corpus,
                relevant_docs=data.beir.relevant,
                mrr_at_k=[10],
                ndcg_at_k=[10],
                accuracy_at_k=[10],
                precision_recall_at_k=[100],
                map_at_k=[100],
                batch_size=cfg.batch_size,
                name="retrieval",
                write_csv=False,
            )
        )
    return evaluators


_STS_KEY = re.compile(r"^eval_(sts(?:_\d+d)?)_(spearman|pearson)_cosine$")
_RETRIEVAL_KEY = re.compile(r"^eval_retrieval_cosine_(" + "|".join(map(re.escape, FIGURES)) + ")$")


def figures(metrics: dict[str, Any]) -> dict[str, float]:
    """Return the held-out figures of the trainer's evaluation metrics, named as mlmkit's commands
    name them: ``sts_spearman``, ``sts_pearson`` (``sts_64d_spearman``, ...), ``retrieval_ndcg@10``,
    ``retrieval_recall@100``, ``retrieval_mrr@10``."""
    out = {}
    for key, value in metrics.items():
        if m := _STS_KEY.match(key):
            out[f"{m.group(1)}_{m.group(2)}"] = float(value)
        elif m := _RETRIEVAL_KEY.match(key):
            out[f"retrieval_{m.group(1)}"] = float(value)
    return out


# ---- the run folder: events, trackers, budget, signals --------------------------------------


class EventLog(TrainerCallback):
    """``train`` and ``eval`` events into ``metrics.jsonl`` and the log (main process)."""

    def __init__(self, metrics: MetricsLog) -> None:
        self.metrics, self.evals = metrics, []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs and "loss" in logs:
            event = {
                "event": "train",
                "step": state.global_step,
                "loss": float(logs["loss"]),
                "lr": float(logs.get("learning_rate", 0.0)),
                "epoch": float(logs.get("epoch", 0.0)),
            }
            if "grad_norm" in logs:
                event["grad_norm"] = float(logs["grad_norm"])
            self.metrics.write(event)
            log.info("step %d | loss %.4f | lr %.2e", state.global_step, event["loss"], event["lr"])

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        found = figures(metrics or {})
        if not found:
            return
        event = {"event": "eval", "step": state.global_step, **found}
        self.evals.append(event)
        if state.is_world_process_zero:
            self.metrics.write(event)
            log.info(
                "eval at step %d | %s",
                state.global_step,
                " | ".join(f"{k} {v:.4f}" for k, v in found.items()),
            )


class StopRequests(TrainerCallback):
    """Stop after the step, with a checkpoint, at the time budget or on a signal; every rank
    stops at the same step. Records the training seconds beside each checkpoint."""

    def __init__(self, max_time: float | None, spent: float, signals: StopSignals) -> None:
        self.max_time, self.spent, self.signals = max_time, spent, signals
        self.accelerator, self.started, self.reason = None, time.perf_counter(), None

    def seconds(self) -> float:
        """Training seconds so far, those before a resume included."""
        return self.spent + time.perf_counter() - self.started

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        time_up = self.max_time is not None and self.seconds() >= self.max_time
        signalled = self.signals.received is not None
        if self.accelerator is not None and self.accelerator.num_processes > 1:  # one verdict
            import torch

            flags = torch.tensor([float(time_up), float(signalled)], device=self.accelerator.device)
            summed = self.accelerator.reduce(flags, reduction="sum")
            time_up, signalled = (bool(x > 0) for x in summed)
        if time_up or signalled:
            self.reason = "signal" if signalled else "time"
            control.should_training_stop = control.should_save = True

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and folder.is_dir():
            (folder / STATE_FILE).write_text(json.dumps({"seconds": self.seconds()}) + "\n")


def tracker_callbacks(cfg: LoggerConfig, run_dir: Path, is_main: bool) -> tuple[list[str], list]:
    """``(report_to, callbacks)`` for the trainer: TensorBoard in ``<run dir>/tensorboard``, W&B
    in ``<run dir>/wandb`` (offline with ``logger.offline``), MLflow in ``<run dir>/mlruns``
    unless ``MLFLOW_TRACKING_URI`` says otherwise; the same names and project as pretraining."""
    name = log_with(cfg)  # None for logger=none; a missing package is one sentence
    if name is None:
        return [], []
    if name == "tensorboard":
        if not is_main:
            return [], []
        from torch.utils.tensorboard import SummaryWriter
        from transformers.integrations import TensorBoardCallback

        return [], [TensorBoardCallback(SummaryWriter(log_dir=str(run_dir / "tensorboard")))]
    if name == "wandb":
        os.environ.setdefault("WANDB_DIR", str(run_dir))
        os.environ.setdefault("WANDB_PROJECT", cfg.project)
        if cfg.offline:
            os.environ["WANDB_MODE"] = "offline"
    else:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        os.environ.setdefault("MLFLOW_TRACKING_URI", (run_dir / "mlruns").resolve().as_uri())
        os.environ.setdefault("MLFLOW_EXPERIMENT_NAME", cfg.project)
    return [name], []


def resume_checkpoint(cfg: EmbedConfig, run_dir: Path) -> Path | None:
    """Decide the trainer checkpoint to continue from (``resume``) before any work; a run dir
    that already holds a run is refused unless it is resumed."""
    from transformers.trainer_utils import get_last_checkpoint

    folder = run_dir / CHECKPOINTS
    if cfg.resume == "auto":
        found = get_last_checkpoint(str(folder)) if folder.is_dir() else None
        if found is None:
            log.info("resume=auto: no checkpoint in %s, starting from the base model", folder)
        return Path(found) if found else None
    if cfg.resume:
        path = Path(cfg.resume).expanduser()
        if not (path / "trainer_state.json").is_file():
            raise CheckpointError(
                f"resume={cfg.resume!r} is not a checkpoint of mlmkit embed (it "
                "has no trainer_state.json); use resume=auto or a "
                f"{CHECKPOINTS}/checkpoint-* folder."
            )
        return path
    previous = [p for p in (run_dir / "metrics.jsonl", folder, run_dir / "final") if p.exists()]
    if previous:
        raise ConfigError(
            f"The run dir {str(run_dir)!r} already holds a run ({previous[0].name}); "
            "set resume=auto to continue it, or choose a new hydra.run.dir."
        )
    return None


def checkpoint_state(checkpoint: Path | None) -> tuple[int, float]:
    """``(step, training seconds)`` a trainer checkpoint had reached (0, 0 for none)."""
    if checkpoint is None:
        return 0, 0.0
    step = json.loads((checkpoint / "trainer_state.json").read_text()).get("global_step", 0)
    try:
        seconds = float(json.loads((checkpoint / STATE_FILE).read_text())["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        seconds = 0.0
    return int(step), seconds


# ---- the trainer --------------------------------------------------------------------------------


def training_arguments(
    cfg: EmbedConfig, run_dir: Path, rows: int, report_to: list[str], evaluates: bool
):
    """``SentenceTransformerTrainingArguments`` of ``cfg``."""
    from sentence_transformers import SentenceTransformerTrainingArguments

    use_cpu = runs_on_cpu()
    precision = resolve_precision(cfg.precision, use_cpu=use_cpu, setting="precision")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return SentenceTransformerTrainingArguments(
        output_dir=str(run_dir / CHECKPOINTS),
        per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.lr,
        weight_decay=cfg.weight_decay,
        lr_scheduler_type="linear",
        warmup_steps=cfg.warmup_ratio,
        num_train_epochs=cfg.epochs,
        max_steps=cfg.max_steps or -1,
        logging_strategy="steps",
        logging_steps=cfg.log_every,
        eval_strategy="steps" if cfg.eval_every and evaluates else "no",
        eval_steps=cfg.eval_every or None,
        save_strategy="steps" if cfg.save_every else "no",
        save_steps=cfg.save_every or 500,
        save_total_limit=cfg.keep_last,
        seed=cfg.seed,
        data_seed=cfg.seed,
        use_cpu=use_cpu,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        batch_sampler="no_duplicates",
        dataloader_drop_last=rows >= cfg.batch_size * world,
        report_to=report_to or "none",
        run_name=str(run_dir),
        disable_tqdm=not cfg.progress,
        ddp_find_unused_parameters=False,
    )


def steps_planned(cfg: EmbedConfig, rows: int) -> int:
    """Optimizer steps the run takes without an earlier stop."""
    if cfg.max_steps:
        return cfg.max_steps
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_epoch = rows // (cfg.batch_size * world) if rows >= cfg.batch_size * world else 1
    return max(1, math.ceil(cfg.epochs * per_epoch))


@contextmanager
def quiet_libraries(progress: bool):
    """sentence-transformers' and transformers' own reports (each evaluation, each save) and,
    without ``progress``, their progress bars, held back while a run logs its own."""
    from transformers.utils import logging as hf_logging

    library_log = logging.getLogger("sentence_transformers")
    level, verbosity = library_log.level, hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    library_log.setLevel(logging.WARNING)
    hf_logging.set_verbosity_warning()
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():  # torch's notice on the all-gather the loss calls
            warnings.filterwarnings(
                "ignore", message=".*all_gather is deprecated", category=FutureWarning
            )
            yield
    finally:
        library_log.setLevel(level)
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def trainer_class():
    """``SentenceTransformerTrainer`` without its model card callback (its documented way to
    drop it: mlmkit writes the card), which would also embed training rows as card examples."""
    from sentence_transformers import SentenceTransformerTrainer

    class Trainer(SentenceTransformerTrainer):
        def add_model_card_callback(self, default_args_dict: dict[str, Any]) -> None:
            pass

    return Trainer


def build_trainer(
    cfg: EmbedConfig,
    run_dir: Path,
    model,
    rows: list[dict[str, str]],
    evaluators: list,
    callbacks: list,
    is_main: bool,
):
    """``SentenceTransformerTrainer`` on ``rows`` with ``cfg``'s loss and ``evaluators``; the
    library's own model card and printed logs give way to mlmkit's card and events."""
    from transformers import PrinterCallback

    report_to, trackers = tracker_callbacks(cfg.logger, run_dir, is_main)
    args = training_arguments(cfg, run_dir, len(rows), report_to, bool(evaluators))
    trainer = trainer_class()(
        model=model,
        args=args,
        train_dataset=in_memory(
            {name: [row[name] for row in rows] for name in (rows[0] if rows else {})}, content(rows)
        ),
        loss=build_loss(cfg, model),
        evaluator=evaluators or None,
        callbacks=[*callbacks, *trackers],
    )
    trainer.remove_callback(PrinterCallback)  # its printed dicts: the events' log lines instead
    return trainer


def eval_events(metrics: MetricsLog, this_run: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return the run's ``eval`` events: those in ``metrics.jsonl`` (a resumed run's earlier ones
    too), else those of this process."""
    if metrics.enabled and metrics.path.is_file():
        lines = metrics.path.read_text().splitlines()
        events = [json.loads(line) for line in lines if line.strip()]
        return [e for e in events if e.get("event") == "eval"]
    return this_run


def start_run(cfg: EmbedConfig, run_dir: Path) -> tuple[bool, Path | None]:
    """Check, log to and lock the run dir; return ``(main process?, checkpoint to resume)``."""
    from accelerate import PartialState

    from mlmkit.training.lock import acquire
    from mlmkit.training.setup import check_writable, setup_logging

    check_writable(run_dir)
    library()
    is_main = PartialState(cpu=runs_on_cpu()).is_main_process  # the first: CPU ranks over gloo
    setup_logging(run_dir, is_main)
    if is_main:
        acquire(run_dir)
    return is_main, resume_checkpoint(cfg, run_dir)


def train_embedder(
    cfg: EmbedConfig, run_dir: str | os.PathLike, on_open: Callable[[Path], None] | None = None
) -> tuple[Any, dict[str, Any]]:
    """Train ``cfg``'s embedder in ``run_dir``; returns the ``SentenceTransformer`` and the
    summary (figures before and after, the data, steps and seconds). Stopped by a signal, it
    saves a checkpoint and raises ``Preempted``. Nothing is written into ``run_dir`` before
    the checks pass (the resume, the model, the data); then ``on_open(run_dir)`` is called
    on the main process (the command line's record of its settings)."""
    from mlmkit.training.setup import open_run_dir

    run_dir = Path(run_dir)
    is_main, checkpoint = start_run(cfg, run_dir)
    resume_step, spent = checkpoint_state(checkpoint)
    resolved, loaded = check_base_model(cfg, run_dir, is_main)
    eval_data = load_eval_data(cfg)
    rows, about = training_rows(cfg, eval_data.texts())
    if is_main:
        open_run_dir(run_dir)
        if on_open is not None:
            on_open(run_dir)
    base, config = base_model_dir(resolved, loaded, run_dir)
    length, dropout = embedding_length(cfg, base, resolved, config), dropout_of(cfg, config)
    metrics = MetricsLog(run_dir / "metrics.jsonl", enabled=is_main)
    metrics.truncate_after(resume_step if checkpoint else -1)
    signals = StopSignals()
    events = EventLog(metrics)
    stops = StopRequests(parse_duration(cfg.max_time, "max_time"), spent, signals)
    with quiet_libraries(cfg.progress):
        model = build_model(base, length, dropout, config)
        evaluators = build_evaluators(cfg, eval_data, model)
        trainer = build_trainer(cfg, run_dir, model, rows, evaluators, [events, stops], is_main)
        stops.accelerator = trainer.accelerator
        log.info(
            "Embedder from %s: objective=%s, %d training rows from %s (%d left out as held "
            "out), %s, batch %d x %d process(es), %d steps, dropout %s, %d tokens per text",
            resolved,
            cfg.objective,
            about["rows"],
            about["source"],
            about["dropped"],
            cfg.loss,
            cfg.batch_size,
            trainer.accelerator.num_processes,
            steps_planned(cfg, len(rows)),
            "the model's own" if dropout is None else dropout,
            length,
        )
        with signals:
            run_training(trainer, checkpoint, evaluators, events, stops, run_dir)
    details = {
        "model_type": config.model_type,
        "held_out": eval_data.names,
        "max_seq_length": length,
        "dropout": dropout,
    }
    evals = eval_events(metrics, events.evals)
    return trainer.model, summarise(cfg, resolved, trainer, about, stops, evals, details)


def run_training(
    trainer,
    checkpoint: Path | None,
    evaluators: list,
    events: EventLog,
    stops: StopRequests,
    run_dir: Path,
) -> None:
    """Measure the held-out figures before (a fresh run), train, and measure them after; a
    signal ends it after its checkpoint with ``Preempted``."""
    if evaluators and checkpoint is None:
        trainer.evaluate()  # step 0
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    step = trainer.state.global_step
    if stops.reason == "signal":
        raise Preempted(
            f"Stopped by {stops.signals.name} at step {step} with a checkpoint in "
            f"{run_dir / CHECKPOINTS}; run it again with resume=auto "
            f"hydra.run.dir={run_dir} to continue.",
            stops.signals.received,
        )
    if evaluators and (not events.evals or events.evals[-1]["step"] != step):
        trainer.evaluate()


def summarise(
    cfg: EmbedConfig,
    resolved: Path,
    trainer,
    about: dict[str, Any],
    stops: StopRequests,
    evals: list[dict[str, Any]],
    details: dict[str, Any],
) -> dict[str, Any]:
    """Summarise the run: its base, data, training and held-out figures before and after
    (``details``: the model type, held-out data, length and dropout)."""
    found = run_settings(resolved)

    def figures_of(event: dict[str, Any] | None) -> dict[str, float]:
        return {k: v for k, v in (event or {}).items() if k not in ("event", "step")}

    return {
        "checkpoint": str(resolved),
        "base_run": str(found[0]) if found else None,
        **details,
        "objective": cfg.objective,
        "loss": cfg.loss,
        "scale": cfg.scale,
        "matryoshka_dims": matryoshka_dims(cfg, trainer.model) if cfg.matryoshka_dims else [],
        "data": about,
        "steps": trainer.state.global_step,
        "stopped_by": "max_time" if stops.reason == "time" else "steps",
        "seconds": round(stops.seconds(), 1),
        "processes": trainer.accelerator.num_processes,
        "batch_size": cfg.batch_size,
        "lr": cfg.lr,
        "dimension": trainer.model.get_embedding_dimension(),
        "before": figures_of(evals[0] if evals and evals[0]["step"] == 0 else None),
        "after": figures_of(evals[-1] if evals else None),
    }
