"""Shared pieces of the throughput benchmarks: mlmkit's own loop and transformers' Trainer on
the same BertConfig sizes, tokenizer and packed data, timed over the same steps.

mlmkit runs through ``mlmkit.train`` (the real loop, its default speed settings) and is
timed from its own ``train`` events; the Trainer is timed by a callback at step ends. Both
leave out the first ``warmup`` steps (kernel selection, allocator warm-up, compilation).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from mlmkit.config import (
    Config,
    DataConfig,
    LoggerConfig,
    MaskingConfig,
    ModelConfig,
    OptimConfig,
    PathsConfig,
    TokenizerConfig,
    TrainConfig,
)
from mlmkit.training.perf import measure_matmul_rate, train_flops_per_token

# layers, hidden, heads (FFN 4x hidden), as in conf/model/
PRESETS = {
    "bert-tiny": (2, 128, 2),
    "bert-mini": (4, 256, 4),
    "bert-small": (4, 512, 8),
    "bert-medium": (8, 512, 8),
    "bert-base": (12, 768, 12),
}


SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "corpora")
REAL_TEXT = [
    os.path.join(SHARED, "gutenberg", "*.txt"),
    os.path.join(SHARED, "wikitext-2", "valid.txt"),
]


def quiet_logging() -> None:
    """Warnings only, and errors only from the libraries' own chatter."""
    logging.basicConfig(level=logging.WARNING)
    for name in ("transformers", "accelerate", "datasets"):
        logging.getLogger(name).setLevel(logging.ERROR)


def data_config(seq: int) -> DataConfig:
    """13 Gutenberg books and WikiText-2 (7 MB; a full 30,522-token WordPiece vocabulary) from
    ../shared/data where present, else the built-in corpus (1.7 MB; ~9,800 tokens)."""
    if os.path.isdir(SHARED):
        return DataConfig(
            source="files",
            train_files=[os.path.abspath(f) for f in REAL_TEXT],
            max_seq_length=seq,
            max_eval_samples=32,
        )
    print(f"{SHARED} is absent: using the built-in corpus (smaller vocabulary)")
    return DataConfig(max_seq_length=seq, max_eval_samples=32)


@dataclass
class Result:
    name: str
    tokens_per_s: float
    predicted_share: float  # chosen tokens / tokens
    steps: int
    seconds: float
    # dataloader worker processes mlmkit's run started, and how (None: not counted)
    workers: dict | None = None


@contextmanager
def counting_workers():
    """Yield a dict that counts the dataloader worker processes started in this process while
    the block runs (``started``) and how they were started (``start_method``: fork, spawn or
    forkserver): a run asked for workers can then show it had them (a DataLoader given
    ``num_workers=0``, or never iterated, starts none)."""
    from torch.utils.data import dataloader

    found: dict = {"started": 0, "start_method": None}
    cls = dataloader._MultiProcessingDataLoaderIter
    original = cls.__init__

    def init(self, loader):
        original(self, loader)
        context = loader.multiprocessing_context
        found["started"] += len(self._workers)
        found["start_method"] = (
            context.get_start_method()
            if context is not None
            else multiprocessing.get_start_method()
        )

    cls.__init__ = init
    try:
        yield found
    finally:
        cls.__init__ = original


def mlmkit_config(
    preset: str,
    seq: int,
    batch: int,
    steps: int,
    warmup: int,
    vocab: int,
    dropout: float = 0.0,
    log_every: int = 1,
    precision: str = "auto",
    compile: bool = False,
    strategy: str = "bernoulli",
) -> Config:
    layers, hidden, heads = PRESETS[preset]
    return Config(
        model=ModelConfig(
            name=preset,
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            intermediate_size=4 * hidden,
            max_position_embeddings=max(512, seq),
            hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=dropout,
        ),
        tokenizer=TokenizerConfig(vocab_size=vocab),
        data=data_config(seq),
        masking=MaskingConfig(strategy=strategy),
        optim=OptimConfig(lr=5e-4, warmup_steps=10),
        train=TrainConfig(
            batch_size=batch,
            max_steps=warmup + steps,
            log_every=log_every,
            eval_every=0,
            save_every=0,
            progress=False,
            export=False,
            precision=precision,
            compile=compile,
        ),
        paths=PathsConfig(cache_dir=".cache/mlmkit"),
        logger=LoggerConfig(name="none"),  # the Trainer runs with report_to="none" too
    )


def tokenizer_and_data(cfg: Config):
    """The tokenizer and packed datasets ``mlmkit.train`` uses for ``cfg`` (cached on disk)."""
    from pathlib import Path

    from mlmkit.data.packing import prepare_datasets
    from mlmkit.data.sources import corpus_fingerprint, load_corpus
    from mlmkit.data.tokenizer import get_tokenizer

    cache = Path(cfg.paths.cache_dir)
    fingerprint = corpus_fingerprint(cfg.data)
    corpus = load_corpus(cfg.data)

    def texts():
        for rows in corpus["train"].iter(batch_size=1000):
            yield from rows["text"]

    tokenizer = get_tokenizer(cfg.tokenizer, texts, fingerprint, cache)
    packed = prepare_datasets(cfg.data, tokenizer, cache, corpus=corpus, fingerprint=fingerprint)
    return tokenizer, packed


def _train_child(cfg: Config, run_dir: str) -> None:
    quiet_logging()
    import mlmkit

    with counting_workers() as workers:
        mlmkit.train(cfg, run_dir)
    with open(os.path.join(run_dir, "workers.json"), "w", encoding="utf-8") as f:
        json.dump(workers, f)


def run_mlmkit(name: str, cfg: Config, warmup: int) -> Result:
    """Train with ``mlmkit.train`` and time the steps after ``warmup`` from its log events.

    The run has a process of its own, so that mlmkit's process-wide settings (malloc keeping
    freed memory on a CPU, ``train.reuse_cpu_memory``) do not carry over to the Trainer runs
    measured beside it, whichever order the rounds take. Its dataloader workers (``train.
    num_workers``) start as that process starts them: by spawn, pickling what they receive.
    """
    from mlmkit.training.metrics_log import read_metrics

    with tempfile.TemporaryDirectory() as run_dir:
        child = multiprocessing.get_context("spawn").Process(
            target=_train_child, args=(cfg, run_dir)
        )
        child.start()
        child.join()
        if child.exitcode != 0:
            raise SystemExit(f"{name}: mlmkit.train failed (exit code {child.exitcode}).")
        events = [e for e in read_metrics(run_dir) if e["event"] == "train" and e["step"] > warmup]
        with open(os.path.join(run_dir, "workers.json"), encoding="utf-8") as f:
            workers = json.load(f)
    per_log = cfg.train.batch_size * cfg.data.max_seq_length * cfg.train.log_every
    tokens = per_log * len(events)
    seconds = sum(per_log / e["tokens_per_s"] for e in events)
    masked = sum(e["masked_tokens_per_s"] * per_log / e["tokens_per_s"] for e in events)
    return Result(
        name, tokens / seconds, masked / tokens, cfg.train.max_steps - warmup, seconds, workers
    )


def run_trainer(
    name: str,
    cfg: Config,
    tokenizer,
    train_set,
    warmup: int,
    bf16: bool,
    dropout: float = 0.1,
    workers: int = 0,
) -> Result:
    """transformers' Trainer + DataCollatorForLanguageModeling with their defaults on a fresh
    ``BertForMaskedLM`` of the same sizes (BertConfig defaults otherwise: dropout 0.1)."""
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        DataCollatorForLanguageModeling,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    m = cfg.model
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=m.hidden_size,
        num_hidden_layers=m.num_hidden_layers,
        num_attention_heads=m.num_attention_heads,
        intermediate_size=m.intermediate_size,
        max_position_embeddings=m.max_position_embeddings,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = BertForMaskedLM(config)
    steps = cfg.train.max_steps
    stamps: dict[int, float] = {}

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step in (warmup, steps):
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                stamps[state.global_step] = time.perf_counter()

    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=cfg.train.batch_size,
            max_steps=steps,
            learning_rate=5e-4,
            warmup_steps=10,
            bf16=bf16,
            use_cpu=not torch.cuda.is_available(),
            logging_steps=10_000,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            seed=0,
            dataloader_num_workers=workers,
        )
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=train_set,
            data_collator=DataCollatorForLanguageModeling(tokenizer),
            callbacks=[Clock()],
        )
        trainer.train()
    seconds = stamps[steps] - stamps[warmup]
    tokens = (steps - warmup) * cfg.train.batch_size * cfg.data.max_seq_length
    share = 0.15 * (cfg.data.max_seq_length - 2) / cfg.data.max_seq_length  # the collator's rate
    return Result(name, tokens / seconds, share, steps - warmup, seconds)


def bf16_native(device: str) -> bool:
    """Whether ``device`` runs bf16 matmuls in hardware (a CPU without AVX512-BF16 or AMX
    emulates them, tens of times slower than fp32)."""
    from mlmkit.training.runtime import cpu_has_bf16

    return device != "cpu" or cpu_has_bf16()


def matmul_rates(device: str) -> dict[str, float]:
    """bf16 and fp32 matmul rates (FLOP/s) measured now on ``device``; where bf16 is
    emulated its rate is not timed (nan: one 2048-square product takes most of a minute)."""
    bf16 = measure_matmul_rate(torch.bfloat16, device) if bf16_native(device) else float("nan")
    return {"bf16": bf16, "fp32": measure_matmul_rate(torch.float32, device)}


def flops_per_token(cfg: Config, vocab: int, predicted_share: float) -> float:
    m = cfg.model
    return train_flops_per_token(
        m.num_hidden_layers,
        m.hidden_size,
        m.intermediate_size,
        vocab,
        cfg.data.max_seq_length,
        predicted_share,
    )


def machine() -> str:
    from mlmkit.training.runtime import cpu_has_bf16, cpu_name

    if torch.cuda.is_available():
        return (
            f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda}), torch {torch.__version__}"
        )
    kind = "bf16 hardware" if cpu_has_bf16() else "no bf16 hardware (bf16 emulated)"
    return f"{cpu_name()} ({kind}), {torch.get_num_threads()} threads, torch {torch.__version__}"


def write_summary(out, **figures) -> None:
    """Write ``out/summary.json``: the machine, its CPU kind and ``figures``."""
    import json

    from mlmkit.training.runtime import describe_cpu

    record = {"machine": machine(), "cpu": describe_cpu(), **figures}
    (out / "summary.json").write_text(json.dumps(record, indent=2) + "\n")
