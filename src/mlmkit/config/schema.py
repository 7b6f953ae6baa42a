"""Typed configuration for mlmkit.

These dataclasses are the schema of ``conf/``: Hydra composes the YAML files on
top of them (a misspelt key or a value of the wrong type stops composition), and
``__post_init__`` checks the values once the config is turned into objects. Every
field says what it means and in which unit.

Library code takes these objects, never a DictConfig, so each piece can be used
without Hydra: ``build_model(cfg.model, vocab_size)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace
from typing import Any

from mlmkit.errors import ConfigError


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


# Choices that several settings share, named once.
STRATEGIES = ("bernoulli", "whole_word", "span", "fixed")  # masking.strategy
PRECISIONS = ("auto", "no", "fp16", "bf16")  # train.precision, and precision= of eval and finetune
# task.metrics: the metric scripts shipped in mlmkit.finetune.metric_modules, one folder each
METRICS = ("accuracy", "f1", "matthews_correlation", "pearson", "spearman")
TASK_KINDS = ("classification", "regression", "tokens", "qa")  # task.kind
TOKEN_METRICS = ("f1", "accuracy")  # task.kind=tokens: entity F1 (conlleval), word accuracy
QA_METRICS = ("f1", "exact")  # task.kind=qa: the SQuAD v2.0 script's F1 and exact match
DEFAULT_MAX_STEPS = 3000  # train.max_steps when no budget is set


def check_model_source(checkpoint: str | None, init: str, verb: str) -> None:
    """Check a command's ``checkpoint`` (required) and ``init`` (pretrained | random)."""
    _check(
        bool(checkpoint),
        f"Say which model to {verb}: checkpoint=<run dir, its final/ dir or a checkpoint>.",
    )
    _check(init in ("pretrained", "random"), f"init must be pretrained or random, got {init!r}.")


def check_precision(value: str, setting: str) -> None:
    _check(value in PRECISIONS, f"{setting} must be auto, no, fp16 or bf16, got {value!r}.")


def check_masking(
    mlm_probability: float,
    mask_replace_prob: float,
    random_replace_prob: float,
    strategy: str = "bernoulli",
    span_p: float = 0.2,
    span_max_words: int = 10,
) -> None:
    """Check the masking settings' ranges, for ``MaskingConfig`` and for an ``MLMCollator`` made
    directly in Python (the one place they are checked)."""
    _check(
        0.0 < mlm_probability < 1.0,
        f"masking.mlm_probability must be in (0, 1), got {mlm_probability}.",
    )
    _check(
        0.0 <= mask_replace_prob <= 1.0 and 0.0 <= random_replace_prob <= 1.0,
        "masking.mask_replace_prob and masking.random_replace_prob must be in [0, 1].",
    )
    _check(
        mask_replace_prob + random_replace_prob <= 1.0 + 1e-9,
        "masking.mask_replace_prob + masking.random_replace_prob must not exceed 1 "
        f"(got {mask_replace_prob} + {random_replace_prob}).",
    )
    _check(
        strategy in STRATEGIES,
        f"masking.strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}.",
    )
    _check(0.0 < span_p <= 1.0, f"masking.span_p must be in (0, 1], got {span_p}.")
    _check(span_max_words >= 1, "masking.span_max_words must be at least 1.")


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(
    value: str | int | float | None, setting: str = "train.max_time"
) -> float | None:
    """Seconds in ``"24h"``, ``"1h30m"``, ``"90m"``, ``"45s"``, ``"2d"`` or a plain number."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip().lower().replace(" ", "")
        parts = re.findall(r"(\d+(?:\.\d+)?)([smhd])", text)
        if re.fullmatch(r"\d+(?:\.\d+)?", text):
            seconds = float(text)
        elif parts and "".join(n + u for n, u in parts) == text:
            seconds = sum(float(n) * _UNITS[u] for n, u in parts)
        else:
            raise ConfigError(
                f"{setting}={value!r} is not a duration; write e.g. 24h, 1h30m, 90m or 3600."
            )
    if seconds <= 0:
        raise ConfigError(f"{setting} must be positive, got {value!r}.")
    return seconds


@dataclass
class ModelConfig:
    """The encoder. A preset fills in the sizes; any size can be overridden."""

    name: str = "bert-tiny"  # a label for the run and the model card
    # bert: BertForMaskedLM (learned positions, post-norm, GELU FFN) | modernbert:
    # ModernBertForMaskedLM (Warner et al., 2024: rotary positions, pre-norm, GeGLU FFN, no
    # biases, local attention in all but every global_attn_every_n_layers-th layer)
    architecture: str = "bert"
    num_hidden_layers: int = 2  # transformer blocks
    hidden_size: int = 128  # width of the residual stream
    num_attention_heads: int = 2  # hidden_size must be divisible by this
    intermediate_size: int = 512  # FFN width (BERT: 4x hidden; ModernBERT: the GeGLU's width)
    max_position_embeddings: int = 512  # longest sequence (BERT: rows of the position table)
    # Dropout after attention/FFN and on attention weights. BERT used 0.1; mlmkit defaults
    # to 0.0 as cramming does (Geiping & Goldstein, 2023): single-pass pretraining rarely
    # overfits, and dropout costs time, on a CPU especially.
    hidden_dropout_prob: float = 0.0
    attention_probs_dropout_prob: float = 0.0
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02  # std of the truncated-normal init
    # BERT only (ModernBERT's rotary positions have no table): how the learned position table
    # starts. "sinusoidal": the sines and cosines of Vaswani et al. (2017), scaled to
    # initializer_range, so neighbouring positions start alike and attention can use word
    # order from the first steps (the table is still learned; the model is a plain
    # BertForMaskedLM). "normal": BERT's own init, like the other weights.
    position_init: str = "sinusoidal"
    # BERT only: how a new model's attention starts. "local": in every layer half the heads
    # (at least two) start as previous-token and next-token heads, read off the sinusoidal
    # position table, so the model uses its neighbours from the first steps (needs
    # position_init=sinusoidal); "normal": BERT's init for all heads.
    attention_init: str = "local"
    # How a new model's output bias starts. "unigram": the log of each token's frequency in
    # the training blocks, so the model predicts the unigram distribution from step 0 and
    # its first steps go to learning from the context; "zero": BERT's init.
    output_bias_init: str = "unigram"
    type_vocab_size: int = 2  # segment embeddings (kept for BERT compatibility)
    # ModernBERT only: the local layers' window in tokens (each token sees local_attention/2
    # on either side), every n-th layer (the first included) attends globally, and the
    # rotary base of the global and of the local layers.
    local_attention: int = 128
    global_attn_every_n_layers: int = 3
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0
    # Continued pretraining: a Hugging Face model dir (or hub name) to start from.
    # Its config, weights and tokenizer are used; the size fields above are ignored.
    init_from: str | None = None
    # With init_from: positions for sequences longer than the loaded model's (a context
    # extension, e.g. 512 -> 1024). A BERT's learned position table grows to this many rows,
    # each new row a copy of the learned row as many places back as the table was long (the
    # copy initialisation of Beltagy et al. (2020), Longformer); a ModernBERT (rotary) only
    # records the new length. null: the loaded model's.
    extend_positions_to: int | None = None
    # Attention kernel: "auto" (flash_attention_2 on CUDA in bf16/fp16 when flash-attn is
    # installed, so padding costs no attention; else sdpa), "sdpa" (torch
    # scaled_dot_product_attention, fused kernels), "flash_attention_2" or "eager".
    attn_implementation: str = "auto"
    # Round the vocabulary dimension of the embedding/output matrices up to a multiple of
    # this (fast matmul shapes); the tokenizer is unchanged and the extra ids are never used.
    # 1: no rounding. Not applied to model.init_from checkpoints.
    pad_vocab_multiple: int = 64
    # Compute the vocabulary projection only at the chosen (masked) positions.
    # Same loss and gradients as the full head; several times faster.
    sparse_prediction: bool = True

    def __post_init__(self) -> None:
        _check(self.num_hidden_layers > 0, "model.num_hidden_layers must be at least 1.")
        _check(
            self.hidden_size > 0
            and self.num_attention_heads > 0
            and self.hidden_size % self.num_attention_heads == 0,
            f"model.hidden_size ({self.hidden_size}) must be a positive multiple of "
            f"model.num_attention_heads ({self.num_attention_heads}).",
        )
        _check(self.intermediate_size > 0, "model.intermediate_size must be positive.")
        _check(self.max_position_embeddings > 0, "model.max_position_embeddings must be positive.")
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            v = getattr(self, key)
            _check(0.0 <= v < 1.0, f"model.{key} must be in [0, 1), got {v}.")
        _check(
            self.attn_implementation in ("auto", "sdpa", "flash_attention_2", "eager"),
            "model.attn_implementation must be auto, sdpa, flash_attention_2 or eager, got "
            f"{self.attn_implementation!r}.",
        )
        _check(self.pad_vocab_multiple >= 1, "model.pad_vocab_multiple must be at least 1.")
        _check(
            self.position_init in ("sinusoidal", "normal"),
            f"model.position_init must be sinusoidal or normal, got {self.position_init!r}.",
        )
        _check(
            self.attention_init in ("local", "normal"),
            f"model.attention_init must be local or normal, got {self.attention_init!r}.",
        )
        _check(
            self.attention_init != "local"
            or self.position_init == "sinusoidal"
            or self.architecture != "bert"
            or self.init_from is not None,  # a new model only
            "model.attention_init=local starts its heads from the sinusoidal position table; "
            "set model.position_init=sinusoidal or model.attention_init=normal.",
        )
        _check(
            self.output_bias_init in ("unigram", "zero"),
            f"model.output_bias_init must be unigram or zero, got {self.output_bias_init!r}.",
        )
        _check(
            self.architecture in ("bert", "modernbert"),
            f"model.architecture must be bert or modernbert, got {self.architecture!r}.",
        )
        _check(
            self.local_attention >= 2 and self.local_attention % 2 == 0,
            "model.local_attention must be an even number of at least 2, got "
            f"{self.local_attention}.",
        )
        _check(
            self.global_attn_every_n_layers >= 1,
            "model.global_attn_every_n_layers must be at least 1.",
        )
        _check(
            self.global_rope_theta > 0 and self.local_rope_theta > 0,
            "model.global_rope_theta and model.local_rope_theta must be positive.",
        )


@dataclass
class TokenizerConfig:
    """Where the tokenizer comes from: a Hugging Face tokenizer, or WordPiece trained here."""

    # A local tokenizer dir or a hub name. null: train WordPiece on the training corpus
    # (or use the tokenizer of model.init_from when that is set).
    name_or_path: str | None = None
    algorithm: str = "wordpiece"  # when training: wordpiece (BERT) | bpe (byte-level) | unigram
    vocab_size: int = 8192  # vocabulary size when training (special tokens included)
    lowercase: bool = True  # lowercase the text (every mark kept: é, and Devanagari's vowel signs)
    # Strip accents too, as BERT-uncased (é -> e). Refused for a corpus in a script whose
    # marks are letters (Devanagari, Bengali, Tamil, Thai, ...).
    strip_accents: bool = False
    # With model.init_from: add up to this many whole words of the training corpus to the
    # model's WordPiece vocabulary, those that save the most tokens (count x (pieces - 1)),
    # found by a WordPiece trained on the corpus; their embeddings and output biases start
    # from the mean of their old pieces'. 0: keep the vocabulary.
    extend_vocab: int = 0
    min_frequency: int = 2  # a pair must occur this often to be merged
    # Train on at most this many characters of the corpus (null: all of it).
    max_train_chars: int | None = 50_000_000

    def __post_init__(self) -> None:
        _check(
            self.vocab_size >= 100,
            f"tokenizer.vocab_size must be at least 100, got {self.vocab_size}.",
        )
        _check(self.min_frequency >= 1, "tokenizer.min_frequency must be at least 1.")
        _check(
            self.extend_vocab >= 0,
            f"tokenizer.extend_vocab must be 0 or more, got {self.extend_vocab}.",
        )
        _check(
            self.max_train_chars is None or self.max_train_chars >= 1,
            "tokenizer.max_train_chars must be at least 1 (or null for the whole corpus).",
        )
        _check(
            self.algorithm in ("wordpiece", "bpe", "unigram"),
            f"tokenizer.algorithm must be wordpiece, bpe or unigram, got {self.algorithm!r}.",
        )


@dataclass
class SourceConfig:
    """One corpus of a weighted mix (``data.source=mix``)."""

    kind: str = "files"  # files | hub | builtin
    files: list[str] = field(default_factory=list)  # kind=files: paths or globs
    name: str | None = None  # kind=hub: dataset name on the Hub (or a local dataset dir)
    config: str | None = None  # kind=hub: the dataset's config (subset), e.g. "20231101.en"
    split: str = "train"  # kind=hub: the split to read
    text_column: str = "text"  # column holding the text
    weight: float = 1.0  # share of documents drawn from this source (normalised over sources)


@dataclass
class DataConfig:
    """The corpus and how it becomes fixed-length blocks."""

    # "builtin": English prose from this Python installation (no download, ~2 MB);
    # "files": local text files listed in train_files (and validation_files);
    # "hub": a Hugging Face dataset (hub_name, hub_config, hub_split);
    # "mix": several sources interleaved with weights (sources).
    source: str = "builtin"
    train_files: list[str] = field(
        default_factory=list
    )  # paths or globs (.txt .jsonl .json .parquet .csv)
    validation_files: list[str] = field(default_factory=list)  # empty: hold out validation_split
    text_column: str = (
        "text"  # column holding the text in .jsonl/.json/.parquet/.csv and hub datasets
    )
    # How .txt files are cut into documents: "paragraph" (blank-line separated),
    # "line" (every line) or "document" (whole file).
    txt_sample_by: str = "paragraph"
    hub_name: str | None = None  # source=hub: dataset name, e.g. "Salesforce/wikitext"
    hub_config: str | None = None  # source=hub: config, e.g. "wikitext-103-raw-v1"
    hub_split: str = "train"  # source=hub: training split
    hub_validation_split: str | None = None  # source=hub: validation split (null: hold out)
    sources: list[SourceConfig] = field(default_factory=list)  # source=mix: the corpora and weights
    # source=mix: stop when the first source runs out ("first_exhausted", weights kept
    # exactly) or when all have (the smaller sources repeat: "all_exhausted").
    mix_stopping: str = "first_exhausted"
    validation_split: float = 0.05  # share of documents held out when no validation set (map mode)
    max_seq_length: int = 128  # tokens per block, [CLS] and [SEP] included
    # "concatenate": documents joined with [SEP] into full blocks (no padding);
    # "line_by_line": one document per sequence (long ones split), padded per batch;
    # "documents": the blocks of concatenate, with attention only within each document and
    # positions restarting at each one (mlmkit.model.documents).
    packing: str = "concatenate"
    pad_to_multiple_of: int | None = 8  # line_by_line: pad batch lengths to a multiple of this
    num_proc: int | None = None  # worker processes for tokenizing (null: one per core, at most 8)
    max_eval_samples: int | None = 1000  # cap on validation blocks (null: all)
    cache: bool = True  # keep the tokenized, packed dataset on disk and reuse it
    # Streaming: tokenize and pack on the fly from an iterable source (no preprocessing, no
    # cache, RAM bounded by shuffle_buffer); resumes at the position it reached.
    streaming: bool = False
    shuffle_buffer: int = 10_000  # streaming: blocks shuffled together (1: no shuffling)
    # streaming: the stream's shards, fixed for the run; a resume on any number of processes
    # and workers deals them out again (null: 12 per process x dataloader worker at the start)
    stream_shards: int | None = None
    # streaming without a validation set: the first this many documents are held out
    stream_validation_docs: int = 1000

    def __post_init__(self) -> None:
        _check(
            self.source in ("builtin", "files", "hub", "mix"),
            f"data.source must be 'builtin', 'files', 'hub' or 'mix', got {self.source!r}.",
        )
        if self.source == "files":
            _check(
                len(self.train_files) > 0,
                "data=files needs data.train_files=[path, ...] (files or globs).",
            )
        if self.source == "hub":
            _check(
                bool(self.hub_name),
                "data.source=hub needs data.hub_name (a Hugging Face dataset name).",
            )
        if self.source == "mix":
            _check(
                len(self.sources) > 0,
                "data.source=mix needs data.sources (a list of corpora with weights).",
            )
            for i, s in enumerate(self.sources):
                _check(
                    s.kind in ("files", "hub", "builtin"),
                    f"data.sources[{i}].kind must be files, hub or builtin, got {s.kind!r}.",
                )
                _check(
                    s.kind != "files" or len(s.files) > 0,
                    f"data.sources[{i}] (files) needs files=[...].",
                )
                _check(s.kind != "hub" or bool(s.name), f"data.sources[{i}] (hub) needs name.")
                _check(s.weight > 0, f"data.sources[{i}].weight must be positive, got {s.weight}.")
        _check(
            self.mix_stopping in ("first_exhausted", "all_exhausted"),
            "data.mix_stopping must be first_exhausted or all_exhausted, got "
            f"{self.mix_stopping!r}.",
        )
        _check(
            self.txt_sample_by in ("paragraph", "line", "document"),
            "data.txt_sample_by must be 'paragraph', 'line' or 'document', got "
            f"{self.txt_sample_by!r}.",
        )
        _check(
            0.0 < self.validation_split < 1.0,
            f"data.validation_split must be in (0, 1), got {self.validation_split}.",
        )
        _check(
            self.max_seq_length >= 8,
            f"data.max_seq_length must be at least 8, got {self.max_seq_length}.",
        )
        _check(
            self.packing in ("concatenate", "documents", "line_by_line"),
            f"data.packing must be concatenate, documents or line_by_line, got {self.packing!r}.",
        )
        _check(
            self.pad_to_multiple_of is None or self.pad_to_multiple_of >= 1,
            "data.pad_to_multiple_of must be at least 1 (or null).",
        )
        _check(
            self.num_proc is None or self.num_proc >= 1,
            "data.num_proc must be at least 1 (or null for automatic).",
        )
        _check(self.shuffle_buffer >= 1, "data.shuffle_buffer must be at least 1.")
        _check(
            self.stream_shards is None or self.stream_shards >= 1,
            "data.stream_shards must be at least 1 (or null).",
        )
        _check(self.stream_validation_docs >= 1, "data.stream_validation_docs must be at least 1.")


@dataclass
class MaskingConfig:
    """Which tokens are predicted, and what the model sees in their place."""

    # bernoulli (BERT) | whole_word | span (SpanBERT) | fixed (exactly p x real tokens per row)
    strategy: str = "bernoulli"
    mlm_probability: float = 0.15  # share of real tokens chosen for prediction
    mask_replace_prob: float = 0.8  # of the chosen: replaced by [MASK]
    random_replace_prob: float = 0.1  # of the chosen: replaced by a random token (rest unchanged)
    # Mask-rate schedule: move linearly from mlm_probability (step 0) to this (last step).
    mlm_probability_end: float | None = None
    span_p: float = 0.2  # span: geometric distribution of span lengths in words (SpanBERT: 0.2)
    span_max_words: int = 10  # span: longest span in words (SpanBERT: 10)
    # whole_word and span: a word of more sub-tokens is cut into words of at most this many
    # (a "word" of Thai, Lao, Khmer or Japanese kana, written without spaces, can be a clause).
    max_word_tokens: int = 8
    # Mask inside the training step on the accelerator instead of in the dataloader.
    on_device: bool = False
    # Evaluation masks: BERT's 80-10-10 at this rate, fixed by eval_seed, whatever the
    # training strategy, so runs with different strategies are comparable.
    eval_mlm_probability: float = 0.15
    eval_seed: int = 1234
    # Masked tokens the evaluation counts at least: a small validation set is masked again
    # with further seeds (up to EVAL_MAX_DRAWS draws), so that one standard error of the
    # accuracy is about half a point or less (10,000 tokens at 25%: 0.43 points).
    eval_min_masked_tokens: int = 10_000

    def __post_init__(self) -> None:
        check_masking(
            self.mlm_probability,
            self.mask_replace_prob,
            self.random_replace_prob,
            self.strategy,
            self.span_p,
            self.span_max_words,
        )
        _check(
            self.max_word_tokens >= 1,
            f"masking.max_word_tokens must be at least 1, got {self.max_word_tokens}.",
        )
        _check(
            self.eval_min_masked_tokens >= 0,
            f"masking.eval_min_masked_tokens must be 0 or more, got {self.eval_min_masked_tokens}.",
        )
        for key in ("eval_mlm_probability", "mlm_probability_end"):
            v = getattr(self, key)
            _check(v is None or 0.0 < v < 1.0, f"masking.{key} must be in (0, 1), got {v}.")

    def probability_at(self, step: int, total_steps: int) -> float:
        """Return the mask rate at optimizer step ``step`` of ``total_steps``."""
        return self.rate_at(min(1.0, step / max(1, total_steps - 1)))

    def rate_at(self, fraction: float) -> float:
        """Return the mask rate when ``fraction`` of the training budget is used."""
        if self.mlm_probability_end is None:
            return self.mlm_probability
        t = min(1.0, max(0.0, fraction))
        return self.mlm_probability + t * (self.mlm_probability_end - self.mlm_probability)


@dataclass
class OptimConfig:
    """AdamW with warmup and decay."""

    lr: float = 1e-3  # peak learning rate
    weight_decay: float = 0.01  # not applied to biases and LayerNorm weights
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-6
    max_grad_norm: float | None = 1.0  # gradient clipping (null: none)
    warmup_steps: int = 100  # optimizer steps of linear warmup from 0
    # Warmup as a share of the budget instead (e.g. 0.05 with train.max_time): the schedule
    # then follows the used share of the budget, not the step count.
    warmup_fraction: float | None = None
    schedule: str = "linear"  # decay after warmup: linear | cosine | constant | wsd
    min_lr_ratio: float = 0.0  # lr at the end of decay, as a share of lr
    # wsd (warmup-stable-decay): the peak until the last decay_fraction of the budget, then
    # a decay of decay_shape (1-sqrt | linear) to min_lr_ratio
    decay_fraction: float = 0.2
    decay_shape: str = "1-sqrt"

    def __post_init__(self) -> None:
        _check(self.lr > 0, f"optim.lr must be positive, got {self.lr}.")
        _check(self.weight_decay >= 0, "optim.weight_decay must not be negative.")
        _check(
            0 <= self.beta1 < 1 and 0 <= self.beta2 < 1,
            "optim.beta1 and optim.beta2 must be in [0, 1).",
        )
        _check(self.eps > 0, "optim.eps must be positive.")
        _check(
            self.max_grad_norm is None or self.max_grad_norm > 0,
            "optim.max_grad_norm must be positive (or null to disable clipping).",
        )
        _check(self.warmup_steps >= 0, "optim.warmup_steps must not be negative.")
        _check(
            self.warmup_fraction is None or 0.0 <= self.warmup_fraction < 1.0,
            "optim.warmup_fraction must be in [0, 1) (or null to use optim.warmup_steps).",
        )
        _check(
            self.schedule in ("linear", "cosine", "constant", "wsd"),
            f"optim.schedule must be linear, cosine, constant or wsd, got {self.schedule!r}.",
        )
        _check(
            0.0 < self.decay_fraction <= 1.0,
            f"optim.decay_fraction must be in (0, 1], got {self.decay_fraction}.",
        )
        _check(
            self.decay_shape in ("1-sqrt", "linear"),
            f"optim.decay_shape must be 1-sqrt or linear, got {self.decay_shape!r}.",
        )
        _check(0.0 <= self.min_lr_ratio <= 1.0, "optim.min_lr_ratio must be in [0, 1].")


@dataclass
class TrainConfig:
    """The loop: batch, precision, length, and the occasional jobs."""

    batch_size: int = 32  # sequences per device per micro-batch
    grad_accum_steps: int = 1  # micro-batches per optimizer step
    # Sequences per optimizer step over all processes. When set, grad_accum_steps is derived:
    # global_batch_size / (batch_size x processes), which must be a whole number.
    global_batch_size: int | None = None
    # Budgets: the run stops at the first one reached, with a checkpoint and the export. With
    # none set, DEFAULT_MAX_STEPS; a token or time budget alone is the only one (set max_steps
    # too for a cap on steps).
    max_steps: int | None = None  # optimizer steps
    max_tokens: int | None = None  # tokens seen (all processes, padding included)
    max_time: str | None = None  # training wall-clock time, e.g. 24h, 1h30m, 90m, 3600
    # Mixed precision: auto (bf16 where the hardware has it, else fp16 on CUDA, else none),
    # no, fp16 (CUDA only), bf16 (CUDA or CPU).
    precision: str = "auto"
    seed: int = 0
    log_every: int = 10  # optimizer steps between log events
    eval_every: int = 500  # optimizer steps between evaluations (0: only at the end)
    save_every: int = 500  # optimizer steps between checkpoints (0: only at the end)
    keep_last: int = 2  # checkpoints kept (older ones are deleted)
    # Resume: null (start fresh), "auto" (latest checkpoint in this run dir, if any)
    # or the path of a checkpoint folder.
    resume: str | None = None
    # dataloader worker processes (0: load and mask in the training process); null: 2 on a GPU,
    # so that the masking runs beside the step, and 0 on a CPU, whose cores the step uses
    num_workers: int | None = None
    # torch.compile the encoder (speed only; the first steps pay the compile time). Shapes
    # stay static with packed data; masking=fixed keeps the head's row count fixed as well.
    compile: bool = False
    # Recompute each encoder layer's activations in the backward instead of keeping them: less
    # memory for long contexts and large models, for about a third more compute (same results).
    gradient_checkpointing: bool = False
    # Training on a CPU: malloc keeps freed memory for reuse instead of mapping large blocks
    # anew every step (speed only: 1.13x on bert-mini in make bench; runtime.reuse_freed_memory).
    reuse_cpu_memory: bool = True
    # Consecutive steps with a non-finite loss or gradient (each skipped) before the run stops.
    max_bad_steps: int = 5
    # Batch-size warmup: the global batch grows linearly from batch_warmup_start sequences to
    # the run's (global_batch_size, or batch_size x processes x grad_accum_steps) over the first
    # batch_warmup_tokens tokens, by accumulating more micro-batches; the learning rate follows
    # the batch (0: off)
    batch_warmup_tokens: int = 0
    batch_warmup_start: int | None = (
        None  # sequences per step at the start (null: one micro-batch per process)
    )
    progress: bool = True  # show a progress bar
    export: bool = True  # write <run dir>/final/ at the end

    def __post_init__(self) -> None:
        _check(self.batch_size >= 1, f"train.batch_size must be at least 1, got {self.batch_size}.")
        _check(self.grad_accum_steps >= 1, "train.grad_accum_steps must be at least 1.")
        check_precision(self.precision, "train.precision")
        _check(self.log_every >= 1, "train.log_every must be at least 1.")
        _check(self.eval_every >= 0, "train.eval_every must not be negative.")
        _check(self.save_every >= 0, "train.save_every must not be negative.")
        _check(self.keep_last >= 1, "train.keep_last must be at least 1.")
        if self.max_steps is None and self.max_tokens is None and self.max_time is None:
            self.max_steps = DEFAULT_MAX_STEPS
        _check(self.max_steps is None or self.max_steps >= 1, "train.max_steps must be at least 1.")
        _check(
            self.max_tokens is None or self.max_tokens >= 1, "train.max_tokens must be at least 1."
        )
        parse_duration(self.max_time)
        _check(
            self.global_batch_size is None or self.global_batch_size >= self.batch_size,
            f"train.global_batch_size ({self.global_batch_size}) must be at least "
            f"train.batch_size ({self.batch_size}), the batch of one device.",
        )
        _check(
            self.num_workers is None or self.num_workers >= 0,
            "train.num_workers must not be negative.",
        )
        _check(self.max_bad_steps >= 1, "train.max_bad_steps must be at least 1.")
        _check(self.batch_warmup_tokens >= 0, "train.batch_warmup_tokens must not be negative.")
        _check(
            self.batch_warmup_start is None or self.batch_warmup_start >= 1,
            "train.batch_warmup_start must be at least 1 (or null for one micro-batch per "
            "process).",
        )

    def budget_description(self) -> str:
        """Which budget ends the run, in words, for the log."""
        budgets = []
        if self.max_steps is not None:
            budgets.append(f"{self.max_steps:,} steps (train.max_steps)")
        if self.max_tokens is not None:
            budgets.append(f"{self.max_tokens:,} tokens (train.max_tokens)")
        if self.max_time is not None:
            budgets.append(f"{self.max_time} of training (train.max_time)")
        if len(budgets) == 1:
            if self.max_steps == DEFAULT_MAX_STEPS:
                return f"Budget: {budgets[0]}, the default when no budget is set"
            return f"Budget: {budgets[0]}" + (", no step cap" if self.max_steps is None else "")
        return f"Budget: the first reached of {' and '.join(budgets)}"

    def accumulation_steps(self, world: int) -> int:
        """Micro-batches per optimizer step with ``world`` processes: ``grad_accum_steps``,
        or derived from ``global_batch_size`` = batch_size x processes x accumulation steps."""
        if self.global_batch_size is None:
            return self.grad_accum_steps
        per_pass = self.batch_size * world
        _check(
            self.global_batch_size % per_pass == 0,
            f"train.global_batch_size ({self.global_batch_size}) is not a multiple of "
            f"train.batch_size x processes ({self.batch_size} x {world} = {per_pass}); change "
            "train.global_batch_size or train.batch_size.",
        )
        derived = self.global_batch_size // per_pass
        _check(
            self.grad_accum_steps in (1, derived),
            f"train.grad_accum_steps={self.grad_accum_steps} disagrees with "
            f"train.global_batch_size={self.global_batch_size} ({self.batch_size} per device x "
            f"{world} processes needs {derived}); set only one of them.",
        )
        return derived


@dataclass
class PathsConfig:
    """Where shared, reusable files go (not the run's own files)."""

    # Trained tokenizers and tokenized datasets, keyed by what produced them.
    cache_dir: str = ".cache/mlmkit"


TRACKERS = ("tensorboard", "wandb", "mlflow", "none")


@dataclass
class LoggerConfig:
    """Where train and eval figures go besides metrics.jsonl (always written).

    Trackers run through accelerate's: TensorBoard writes to <run dir>/tensorboard, W&B to
    <run dir>/wandb, MLflow to a file store in <run dir>/mlruns unless MLFLOW_TRACKING_URI
    says otherwise. The full config is logged as hyperparameters.
    """

    name: str = "tensorboard"  # tensorboard | wandb | mlflow | none
    project: str = "mlmkit"  # W&B project / MLflow experiment / TensorBoard subfolder
    run_name: str | None = None  # default: the run dir's path below outputs/
    offline: bool = False  # W&B: write locally only (sync later with `wandb sync`)

    def __post_init__(self) -> None:
        _check(
            self.name in TRACKERS,
            f"logger={self.name!r} is not a tracker; choose one of {', '.join(TRACKERS)}.",
        )


@dataclass
class TaskConfig:
    """A fine-tuning task (``mlmkit.finetune``): a sentence(-pair) classification or regression
    task (GLUE's TSV files, the Hub, or your own TSV, CSV or JSONL files: conf/task/files.yaml),
    a tag per word (``kind: tokens``, CoNLL or CoNLL-U files: conf/task/ner.yaml, pos.yaml,
    tokens.yaml) or extractive question answering (``kind: qa``, SQuAD's JSON:
    conf/task/qa.yaml)."""

    name: str = "sst2"
    data_dir: str | None = (
        None  # folder of relative train_file and eval_file; null: the Hub dataset
    )
    # .csv: CSV; .jsonl / .json: one JSON object per line; any other name: TSV (as GLUE's, no
    # quoting)
    train_file: str | None = (
        "train.tsv"  # a path: absolute, or relative to data_dir (else the working dir)
    )
    eval_file: str | None = "dev.tsv"
    header: bool = True  # first line names the columns; else column_names does (TSV, CSV)
    column_names: list[str] = field(default_factory=list)
    text_columns: list[str] = field(default_factory=lambda: ["sentence"])  # one, or two for pairs
    label_column: str = "label"
    # label values, in class-id order; empty: the training file's values, sorted
    labels: list[str] = field(default_factory=lambda: ["0", "1"])
    # classification: labels are class names | regression: a real score (one output, MSE loss)
    # | tokens: a tag per word (CoNLL token<TAB>tag lines, or CoNLL-U's label_column: upos | xpos)
    # | qa: an answer span in a context, or none (SQuAD v1.1 / v2.0 JSON)
    kind: str = "classification"
    label_range: list[float] = field(default_factory=list)  # regression: [low, high] of the scores
    # the first one is the headline; empty: accuracy, or for regression spearman and pearson;
    # tokens: f1 (entities, as conlleval) | accuracy (words); empty: f1 for BIO tags, else
    # accuracy; qa: f1 and exact (the SQuAD v2.0 script's)
    metrics: list[str] = field(default_factory=lambda: ["accuracy"])
    hub_path: str | None = "nyu-mll/glue"  # used when data_dir is null; null: files only
    hub_name: str | None = "sst2"
    hub_eval_split: str = "validation"
    # with eval_file null: this share of the training file's examples (sentences; for qa whole
    # articles) is held out for evaluation, drawn with split_seed
    eval_share: float = 0.0
    split_seed: int = 0
    # qa: a context longer than the window is cut into windows that overlap by doc_stride tokens
    doc_stride: int = 32
    max_question_length: int = 32  # qa: longer questions keep their first tokens
    max_answer_length: int = 30  # qa: the longest answer span, in tokens
    n_best: int = 20  # qa: the start and end logits tried in each window
    # qa (v2.0): "no answer" when its score beats the best span's by more than this
    null_threshold: float = 0.0
    # qa (v2.0): also report the threshold that scores best on the evaluation set, and use it
    # (the figures are then tuned on the evaluation set: say so where they are reported)
    tune_null_threshold: bool = False

    def __post_init__(self) -> None:
        _check(
            1 <= len(self.text_columns) <= 2,
            "task.text_columns must name one column (single sentences) or two (pairs).",
        )
        _check(
            self.kind in TASK_KINDS,
            f"task.kind must be one of {', '.join(TASK_KINDS)}, got {self.kind!r}.",
        )
        _check(
            0.0 <= self.eval_share < 1.0,
            f"task.eval_share must be in [0, 1), got {self.eval_share}.",
        )
        if self.kind in ("tokens", "qa"):
            self._check_tokens_and_spans()
            return
        _check(
            self.kind == "regression" or len(self.labels) != 1,
            "task.labels must list at least two label values, or none to take them from "
            "the training file.",
        )
        _check(
            not self.label_range
            or (len(self.label_range) == 2 and self.label_range[0] < self.label_range[1]),
            f"task.label_range must be [low, high] with low < high, got {self.label_range}.",
        )
        _check(
            self.header or len(self.column_names) > 0,
            "task.header=false needs task.column_names=[...] naming the TSV columns.",
        )
        _check(
            bool(self.hub_path)
            or (bool(self.train_file) and (bool(self.eval_file) or self.eval_share > 0)),
            f"task={self.name} reads files only: set task.train_file=<file> and "
            "task.eval_file=<file> (.tsv, .csv or .jsonl), or task.eval_share to hold out a "
            "share of the training file.",
        )
        if not self.metrics:
            self.metrics = (
                ["accuracy"] if self.kind == "classification" else ["spearman", "pearson"]
            )
        for m in self.metrics:
            _check(
                m in METRICS,
                f"task.metrics: {m!r} is not a metric shipped with mlmkit ({', '.join(METRICS)}).",
            )
            _check(
                self.kind == "classification" or m in ("pearson", "spearman"),
                f"task.metrics: {m} scores classes, and task.kind=regression predicts a score; "
                "use spearman or pearson.",
            )

    def _check_tokens_and_spans(self) -> None:
        """Check a token task (kind tokens) and a span task (kind qa)."""
        formats = ".conll or .conllu" if self.kind == "tokens" else "SQuAD .json"
        _check(
            bool(self.train_file) and (bool(self.eval_file) or self.eval_share > 0),
            f"task={self.name} reads files: set task.train_file=<file> and "
            f"task.eval_file=<file> ({formats}), or task.eval_share to hold out a share of "
            "the training file.",
        )
        allowed = TOKEN_METRICS if self.kind == "tokens" else QA_METRICS
        if self.kind == "qa" and not self.metrics:
            self.metrics = list(QA_METRICS)
        for m in self.metrics:
            _check(
                m in allowed,
                f"task.metrics: {m!r} does not score task.kind={self.kind}; choose from "
                f"{', '.join(allowed)}.",
            )
        if self.kind == "qa":
            _check(
                self.doc_stride >= 0 and self.max_question_length >= 1,
                "task.doc_stride must not be negative and task.max_question_length must be "
                "at least 1.",
            )
            _check(
                self.max_answer_length >= 1 and self.n_best >= 1,
                "task.max_answer_length and task.n_best must be at least 1.",
            )


@dataclass
class ProbeConfig:
    """Linear probes during pretraining (``mlmkit.evaluation.probe``): every ``every`` steps the
    frozen encoder embeds a labelled task's sentences (mean-pooled) and a logistic regression
    fitted on them is scored on its dev set, logged as a ``probe`` event (metrics.jsonl, the
    trackers, ``mlmkit plot``); a new run probes its random init at step 0 too."""

    every: int = 0  # optimizer steps between probes (0: no probe)
    task: TaskConfig = field(default_factory=TaskConfig)  # a classification task (conf/task/)
    max_train_samples: int | None = 10000  # the first N training examples (null: all)
    max_eval_samples: int | None = None  # the first N dev examples (null: all)
    max_seq_length: int = 64  # longer sentences are truncated

    def __post_init__(self) -> None:
        _check(self.every >= 0, f"probe.every must not be negative, got {self.every}.")
        _check(
            self.task.kind == "classification",
            f"probe.task={self.task.name} is a {self.task.kind} task; a probe classifies "
            "sentences: choose a "
            "classification task (task@probe.task=sst2, cola, mrpc, qqp, mnli, qnli, rte, wnli or "
            "files).",
        )
        for name in ("max_train_samples", "max_eval_samples"):
            value = getattr(self, name)
            _check(
                value is None or value >= 2,
                f"probe.{name} must be at least 2 (or null for all), got {value}.",
            )
        _check(
            self.max_seq_length >= 8,
            f"probe.max_seq_length must be at least 8, got {self.max_seq_length}.",
        )


PHASE_SCHEDULES = ("continue", "rewarm", "constant", "decay")  # phases[].schedule
# what a phase may change (a section ending in "." covers its settings); the data settings
# of PHASE_FIXED name the validation text and how it is read, so they stay the run's
PHASE_SETTINGS = (
    "data.",
    "masking.",
    "train.batch_size",
    "train.global_batch_size",
    "train.grad_accum_steps",
    "model.global_rope_theta",
    "model.local_rope_theta",
)
PHASE_FIXED = (
    "data.streaming",
    "data.validation_files",
    "data.validation_split",
    "data.max_eval_samples",
)


@dataclass
class PhaseConfig:
    """One phase of a phased run (``phases``, ``mlmkit.training.phases``): a share of the run's
    budget in which the settings of ``set`` hold, on top of the run's own and those of the
    phases before it (a phase that sets ``data.max_seq_length: 512`` holds for the later ones
    until one changes it). The model and the optimizer's moments carry across."""

    name: str = "main"  # names the phase in metrics.jsonl and its export, phases/<name>/
    # share of the run's budget (steps, tokens or time, whichever ends the run); the shares of
    # the phases add up to 1
    share: float = 1.0
    # the learning rate in the phase: continue (the run's optim schedule goes on) | rewarm (a
    # warmup of warmup_steps, then optim.schedule's decay over the phase) | constant | decay
    # (from lr down to optim.min_lr_ratio over the phase, by optim.decay_shape)
    schedule: str = "continue"
    lr: float | None = None  # the phase's peak rate (null: optim.lr)
    # rewarm and constant: steps of linear warmup from the phase's start (null: rewarm takes
    # optim.warmup_steps, constant none)
    warmup_steps: int | None = None
    # settings that change from this phase on, as {section: {key: value}} or {"section.key": value}:
    # data.* (sequence length, files, packing; not data.streaming or the validation set),
    # masking.*, train.batch_size, train.global_batch_size, train.grad_accum_steps and, for
    # ModernBERT, model.global_rope_theta and model.local_rope_theta
    set: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check(
            re.fullmatch(r"[\w.-]+", self.name or "") is not None and self.name not in (".", ".."),
            f"phases: the name {self.name!r} must be letters, digits, '.', '-' or '_' (it names "
            "a folder, phases/<name>/).",
        )
        _check(
            self.share > 0, f"phases: {self.name} has share {self.share}; a share must be positive."
        )
        _check(
            self.schedule in PHASE_SCHEDULES,
            f"phases: {self.name} has schedule {self.schedule!r}; "
            f"choose one of {', '.join(PHASE_SCHEDULES)}.",
        )
        _check(
            self.lr is None or self.lr > 0,
            f"phases: {self.name} has lr {self.lr}; it must be positive.",
        )
        _check(
            self.warmup_steps is None or self.warmup_steps >= 0,
            f"phases: {self.name} has warmup_steps {self.warmup_steps}; it must not be negative.",
        )
        self.set = flat_settings(self.set or {})


def flat_settings(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten nested settings: ``{"data": {"max_seq_length": 512}}`` ->
    ``{"data.max_seq_length": 512}`` (dotted keys stay as they are)."""
    flat: dict[str, Any] = {}
    for key, value in dict(tree).items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flat_settings(value, name + "."))
        else:
            flat[name] = list(value) if isinstance(value, tuple) else value
    return flat


def with_settings(cfg: Any, settings: dict[str, Any], where: str) -> Any:
    """``cfg`` (a dataclass) with the dotted ``settings`` replaced, each section checked again."""
    changes: dict[str, dict[str, Any]] = {}
    for name, value in settings.items():
        section, _, key = name.partition(".")
        _check(hasattr(cfg, section) and bool(key), f"{where}: {name} is not a setting.")
        changes.setdefault(section, {})[key] = value
    updated = {}
    for section, values in changes.items():
        part = getattr(cfg, section)
        known = {f.name for f in fields(part)}
        for key in values:
            _check(
                key in known,
                f"{where}: {section}.{key} is not a setting; see "
                f"{type(part).__name__} in mlmkit/config/schema.py.",
            )
        try:
            updated[section] = replace(part, **values)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    try:
        return replace(cfg, **updated)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


OBJECTIVES = ("mlm", "rtd")  # objective.name


@dataclass
class ObjectiveConfig:
    """What pretraining learns from (``objective=rtd`` is short for ``objective.name=rtd``):
    masked-LM (``mlm``) or replaced-token detection (``rtd``, ELECTRA: Clark et al., 2020), where
    a smaller generator fills the chosen positions with its own samples and the model, a
    discriminator, learns from every position which tokens were replaced (``mlmkit.model.rtd``)."""

    name: str = "mlm"  # mlm | rtd
    # rtd: the generator's width, heads and FFN as a share of the model's (the paper's
    # generator size: 1/4 for ELECTRA-small, 1/3 for base); its layers are the model's
    generator_size: float = 0.25
    # rtd: the weight of the discriminator's loss in the total, MLM loss + weight x discriminator
    # loss (the paper's lambda: 50)
    discriminator_weight: float = 50.0

    def __post_init__(self) -> None:
        _check(
            self.name in OBJECTIVES,
            f"objective must be one of {', '.join(OBJECTIVES)}, got {self.name!r}.",
        )
        _check(
            0.0 < self.generator_size < 1.0,
            f"objective.generator_size={self.generator_size} makes a generator as wide as the "
            "model or wider; set it below 1 (the paper: 0.25 to 0.33).",
        )
        _check(
            self.discriminator_weight > 0,
            f"objective.discriminator_weight must be positive, got {self.discriminator_weight}.",
        )

    def generator_shape(self, hidden: int, heads: int, intermediate: int) -> tuple[int, int, int]:
        """Return the generator's (width, heads, FFN width) for a model of these sizes: each
        scaled by ``generator_size``, the width a multiple of the heads."""
        g_heads = max(1, round(heads * self.generator_size))
        width = max(g_heads, round(hidden * self.generator_size / g_heads) * g_heads)
        return width, g_heads, max(1, round(intermediate * self.generator_size))


@dataclass
class Config:
    """A whole run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    # Pretraining in phases (mlmkit.training.phases): e.g. BERT's 90% of the steps at 128 tokens
    # then 10% at 512; empty: one phase with the settings above
    phases: list[PhaseConfig] = field(default_factory=list)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)  # mlm | rtd

    def workers(self, device_type: str) -> int:
        """``train.num_workers``, resolved for a run on ``device_type``: null is 2 on CUDA and 0
        elsewhere, and 0 wherever a mask-rate schedule masks in the dataloader (workers cannot
        see the current step)."""
        if self.train.num_workers is not None:
            return self.train.num_workers
        schedule_in_loader = (
            self.masking.mlm_probability_end is not None and not self.masking.on_device
        )
        return 2 if device_type == "cuda" and not schedule_in_loader else 0

    def __post_init__(self) -> None:
        _check(
            self.masking.mlm_probability_end is None
            or self.masking.on_device
            or not self.train.num_workers,
            "masking.mlm_probability_end (a mask-rate schedule) needs train.num_workers=0 or "
            "masking.on_device=true, since worker processes cannot see the current step.",
        )
        _check(
            not self.tokenizer.extend_vocab or self.model.init_from,
            "tokenizer.extend_vocab adds words to the vocabulary of the model continued from; "
            "set model.init_from, or tokenizer.extend_vocab=0.",
        )
        if self.model.init_from is None:
            _check(
                self.data.max_seq_length <= self.model.max_position_embeddings,
                f"data.max_seq_length ({self.data.max_seq_length}) is larger than "
                f"model.max_position_embeddings ({self.model.max_position_embeddings}); "
                "lower data.max_seq_length or raise model.max_position_embeddings.",
            )
        if self.objective.name == "rtd":
            self._check_rtd()
        if self.phases:
            self.phase_configs()  # every phase checked before the run starts

    def _check_rtd(self) -> None:
        """Check the settings replaced-token detection cannot follow."""
        _check(
            self.model.architecture == "bert",
            f"objective=rtd trains a BERT discriminator and model={self.model.name} is a "
            f"{self.model.architecture}; choose a bert-* model or objective=mlm.",
        )
        _check(
            self.model.sparse_prediction,
            "objective=rtd samples the generator's tokens at the chosen positions only; set "
            "model.sparse_prediction=true.",
        )
        if self.model.init_from is None:
            m = self.model
            width = self.objective.generator_shape(
                m.hidden_size, m.num_attention_heads, m.intermediate_size
            )[0]
            _check(
                width < m.hidden_size,
                f"objective.generator_size={self.objective.generator_size} makes a generator "
                f"{width} wide, as wide as model.hidden_size ({m.hidden_size}); lower "
                "objective.generator_size.",
            )

    def phase_configs(self) -> list[Config]:
        """Return the settings of each phase: the run's, then every phase's ``set`` in turn (an
        empty list for a run without phases). Each is checked as a run's config is."""
        names = [p.name for p in self.phases]
        _check(
            len(set(names)) == len(names), f"phases: the names {names} must differ from each other."
        )
        total = sum(p.share for p in self.phases)
        _check(
            abs(total - 1.0) < 1e-6,
            f"phases: the shares add up to {total:g}; make them add up to 1 "
            "(each is the phase's share of the run's budget).",
        )
        configs, current = [], replace(self, phases=[])
        for i, phase in enumerate(self.phases):
            where = f"phases[{i}] ({phase.name})"
            for name in phase.set:
                _check(
                    name.startswith(PHASE_SETTINGS) and name not in PHASE_FIXED,
                    f"{where}: {name} cannot change between phases (a phase may set data.*, "
                    "masking.*, train.batch_size, train.global_batch_size, train.grad_accum_steps "
                    "and ModernBERT's model.global_rope_theta and model.local_rope_theta); set it "
                    "for the whole run instead.",
                )
                _check(
                    not name.startswith("model.") or self.model.architecture == "modernbert",
                    f"{where}: {name} is a ModernBERT setting and model={self.model.name} is a "
                    "BERT; remove it from the phase.",
                )
            current = with_settings(current, phase.set, where)
            configs.append(current)
        return configs


@dataclass
class EvalConfig:
    """``mlmkit eval``: MLM figures of a checkpoint on a corpus (conf/evaluate.yaml)."""

    # An exported model dir (a run's final/, any BertForMaskedLM dir), a run dir (its final/,
    # else its latest checkpoint) or a checkpoints/step_* folder of a run.
    checkpoint: str | None = None
    data: DataConfig = field(default_factory=DataConfig)
    # Text files evaluated whole (all their blocks, up to data.max_eval_samples); empty: the
    # validation split of ``data``, the one a training run with the same data evaluates on.
    files: list[str] = field(default_factory=list)
    masking: MaskingConfig = field(default_factory=MaskingConfig)  # eval_mlm_probability, eval_seed
    batch_size: int = 32
    precision: str = "auto"  # auto | no | fp16 | bf16
    output: str | None = None  # also write the figures to this JSON file
    paths: PathsConfig = field(default_factory=PathsConfig)

    def __post_init__(self) -> None:
        _check(
            bool(self.checkpoint),
            "Say which model to evaluate: checkpoint=<run dir, its final/ dir or a checkpoint>.",
        )
        _check(self.batch_size >= 1, "batch_size must be at least 1.")
        check_precision(self.precision, "precision")


@dataclass
class FinetuneConfig:
    """``mlmkit finetune``: sequence classification from a checkpoint (conf/finetune.yaml)."""

    checkpoint: str | None = None  # a model dir, a run dir or a checkpoints/step_* folder
    init: str = "pretrained"  # pretrained | random (same architecture, for comparison)
    task: TaskConfig = field(default_factory=TaskConfig)
    max_seq_length: int = 128  # longer inputs are truncated
    batch_size: int = 32
    # passes over the training set (fractions allowed); null: from the data's size, enough for
    # mlmkit.finetune.loop.AUTO_STEPS optimizer steps, within AUTO_EPOCHS
    epochs: float | None = None
    max_train_samples: int | None = None  # use the first N training examples
    lr: float | None = None  # null: by the encoder's width (mlmkit.finetune.loop.auto_lr)
    # the epoch with the best headline figure on the evaluation set is kept (its weights saved,
    # its figures reported), else the last
    keep_best: bool = True
    patience: int | None = 5  # stop after this many epochs without a better figure; null: never
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1  # share of the steps with linear warmup, then linear decay
    classifier_dropout: float = 0.1  # dropout before the classification layer
    # mean: mean of the token states, padding excluded (a briefly pretrained model's [CLS]
    # state is nearly constant) | cls: the [CLS] state (BERT)
    pooling: str = "mean"
    # Linear probing: the encoder stays as pretrained (frozen); only the pooler and the
    # classification layer train, so the score measures the pretrained representation.
    freeze_encoder: bool = False
    precision: str = "auto"  # auto | no | fp16 | bf16
    seed: int = 0
    save_model: bool = (
        True  # write the fine-tuned model to <run dir>/model (mlmkit predict reads it)
    )

    def __post_init__(self) -> None:
        check_model_source(self.checkpoint, self.init, "fine-tune")
        _check(
            self.batch_size >= 1
            and (self.epochs is None or self.epochs > 0)
            and (self.lr is None or self.lr > 0),
            "batch_size, epochs and lr must be positive (epochs and lr: or null, chosen from "
            "the data and the model).",
        )
        _check(
            self.patience is None or self.patience >= 1,
            f"patience must be at least 1 epoch (or null: never stop early), got {self.patience}.",
        )
        _check(0.0 <= self.warmup_ratio < 1.0, "warmup_ratio must be in [0, 1).")
        _check(
            self.pooling in ("cls", "mean"), f"pooling must be cls or mean, got {self.pooling!r}."
        )
        _check(
            self.max_seq_length >= 8,
            f"max_seq_length must be at least 8, got {self.max_seq_length}.",
        )
        _check(
            self.max_train_samples is None or self.max_train_samples >= 1,
            "max_train_samples must be at least 1 (or null for all), got "
            f"{self.max_train_samples}.",
        )
        _check(
            0.0 <= self.classifier_dropout < 1.0,
            f"classifier_dropout must be in [0, 1), got {self.classifier_dropout}.",
        )
        _check(
            self.weight_decay >= 0, f"weight_decay must not be negative, got {self.weight_decay}."
        )
        check_precision(self.precision, "precision")


@dataclass
class StsEvalConfig:
    """``mlmkit eval-sts``: zero-shot semantic similarity of a model's sentence embeddings
    (conf/eval_sts.yaml): Spearman and Pearson correlation of their cosine with gold scores."""

    checkpoint: str | None = None  # a model dir, a run dir or a checkpoints/step_* folder
    init: str = (
        "pretrained"  # pretrained | random (same architecture and tokenizer, for comparison)
    )
    task: TaskConfig = field(default_factory=TaskConfig)  # the file layout (conf/task/stsb.yaml)
    data_dir: str | None = None  # folder of the TSV files (task.data_dir); null: the Hub dataset
    split: str = "dev"  # dev (task.eval_file) | train (task.train_file)
    pooling: str = "mean"  # mean: token states averaged, padding excluded | cls: the [CLS] state
    max_seq_length: int = 128  # longer sentences are truncated
    batch_size: int = 64
    seed: int = 0  # the weights of init=random
    output: str | None = None  # also write the figures to this JSON file

    def __post_init__(self) -> None:
        check_model_source(self.checkpoint, self.init, "evaluate")
        _check(self.split in ("dev", "train"), f"split must be dev or train, got {self.split!r}.")
        _check(
            self.pooling in ("cls", "mean"), f"pooling must be cls or mean, got {self.pooling!r}."
        )
        _check(
            self.max_seq_length >= 8,
            f"max_seq_length must be at least 8, got {self.max_seq_length}.",
        )
        _check(self.batch_size >= 1, "batch_size must be at least 1.")
        _check(
            self.task.kind == "regression",
            f"eval-sts needs a task of similarity scores "
            f"(task.kind=regression, as task=stsb), got task={self.task.name}.",
        )
        _check(
            len(self.task.text_columns) == 2,
            "task.text_columns must name the two sentence columns of each pair.",
        )


GLUE_PROTOCOLS = ("bert", "modern")


@dataclass
class ScorecardConfig:
    """``mlmkit scorecard``: model dirs scored on a fixed suite of local tasks, each figure with
    its interval over fine-tuning seeds and dev examples (conf/scorecard.yaml;
    mlmkit.evaluation.scorecard says how)."""

    models: list[str] = field(default_factory=list)  # model dirs or finished run dirs
    random_init: bool = True  # a row for the first model's architecture from a random init
    suite: str = "fast"  # fast | full (mlmkit.evaluation.scorecard.SUITES)
    tasks: list[str] = field(default_factory=list)  # a subset of the suite's tasks; empty: all
    # your own labelled files as columns of their own: [{name, task, overrides, settings, metric}]
    own_tasks: list[dict[str, Any]] = field(default_factory=list)
    data_dir: str | None = None  # the suite's data, laid out as ../shared/data
    seeds: int = 3  # fine-tuning seeds per task and model
    bootstrap: int = 1000  # bootstrap replicates of each interval
    confidence: float = 0.95
    max_seq_length: int = 128
    batch_size: int = 32
    precision: str = "auto"
    cache_dir: str = ".cache/mlmkit"  # cells already scored are read from <cache_dir>/scorecard

    def __post_init__(self) -> None:
        _check(self.seeds >= 1, "seeds must be at least 1.")
        _check(self.bootstrap >= 100, "bootstrap must be at least 100 replicates.")
        _check(0.5 <= self.confidence < 1, "confidence must be in [0.5, 1), e.g. 0.95.")
        check_precision(self.precision, "precision")


@dataclass
class GlueConfig:
    """``mlmkit glue``: GLUE's tasks fine-tuned under one published protocol, the table a paper
    prints and its average (conf/glue.yaml; mlmkit.evaluation.glue says what each protocol is)."""

    checkpoint: str | None = None  # a model dir, a run dir or a checkpoints/step_* folder
    init: str = "pretrained"  # pretrained | random (the same architecture from scratch)
    # a folder of GLUE's task folders as GLUE's download writes them (CoLA/, SST-2/, MRPC/, ...);
    # null: the Hub's nyu-mll/glue
    data_dir: str | None = None
    tasks: list[str] = field(
        default_factory=lambda: ["cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte"]
    )
    protocol: str = (
        "bert"  # bert: Devlin et al. (2019) | modern: an lr grid, seeds' median,
        # RTE/MRPC/STS-B from MNLI
    )
    lrs: list[float] | None = None  # the learning rates tried per task (null: the protocol's)
    seeds: list[int] | None = None  # the seeds per learning rate (null: the protocol's)
    epochs: float | None = None  # passes over each task's training set (null: the protocol's)
    batch_size: int = 32
    max_seq_length: int = 128
    max_train_samples: int | None = (
        None  # the first N training examples of each task (a quick look)
    )
    pooling: str = "mean"  # mean | cls ([CLS], as BERT)
    precision: str = "auto"
    # tasks run side by side, each in a process of its own pinned to a GPU (dealt round-robin);
    # null: one per visible GPU, one at a time on a CPU or under accelerate launch
    parallel: int | None = None

    def __post_init__(self) -> None:
        check_model_source(self.checkpoint, self.init, "score")
        _check(
            self.protocol in GLUE_PROTOCOLS,
            f"protocol must be one of {', '.join(GLUE_PROTOCOLS)}, got {self.protocol!r}.",
        )
        _check(bool(self.tasks), "tasks is empty; list GLUE tasks, e.g. tasks=[sst2,rte].")
        _check(
            self.lrs is None or (len(self.lrs) > 0 and all(lr > 0 for lr in self.lrs)),
            "lrs must list positive learning rates (or be null for the protocol's).",
        )
        _check(
            self.seeds is None or len(self.seeds) > 0,
            "seeds must list at least one seed (or be null).",
        )
        _check(
            self.epochs is None or self.epochs > 0,
            "epochs must be positive (or null for the protocol's).",
        )
        _check(self.batch_size >= 1, "batch_size must be at least 1.")
        _check(
            self.pooling in ("cls", "mean"), f"pooling must be cls or mean, got {self.pooling!r}."
        )
        _check(
            self.max_seq_length >= 8,
            f"max_seq_length must be at least 8, got {self.max_seq_length}.",
        )
        _check(
            self.max_train_samples is None or self.max_train_samples >= 1,
            "max_train_samples must be at least 1 (or null for all).",
        )
        check_precision(self.precision, "precision")
        _check(
            self.parallel is None or self.parallel >= 1,
            f"parallel must be at least 1 (or null: one task per GPU), got {self.parallel}.",
        )


@dataclass
class RetrievalEvalConfig:
    """``mlmkit eval-retrieval``: zero-shot retrieval with a model's sentence embeddings on a
    BEIR-format folder (conf/eval_retrieval.yaml): nDCG@10, recall@100 and MRR@10 of the
    documents ranked by cosine similarity to each query."""

    checkpoint: str | None = None  # a model dir, a run dir or a checkpoints/step_* folder
    init: str = (
        "pretrained"  # pretrained | random (same architecture and tokenizer, for comparison)
    )
    data_dir: str | None = (
        None  # a BEIR-format folder: corpus.jsonl, queries.jsonl, qrels/<split>.tsv
    )
    split: str = "test"  # the relevance judgments qrels/<split>.tsv (test, dev or train)
    pooling: str = "mean"  # mean: token states averaged, padding excluded | cls: the [CLS] state
    # tokens kept of each query and document; null: the length the model dir's sentence-
    # transformers files cut at (a run's final/: its training blocks), else the model's
    # positions up to 512
    max_seq_length: int | None = None
    batch_size: int = 64
    seed: int = 0  # the weights of init=random
    output: str | None = None  # also write the figures to this JSON file

    def __post_init__(self) -> None:
        check_model_source(self.checkpoint, self.init, "evaluate")
        _check(
            bool(self.data_dir),
            "Say which BEIR-format folder to retrieve from: data_dir=<folder "
            "of corpus.jsonl, queries.jsonl and qrels/>.",
        )
        _check(
            re.fullmatch(r"[\w.-]+", self.split or "") is not None,
            "split must name a file of qrels/ without its .tsv (test, dev, train), got "
            f"{self.split!r}.",
        )
        _check(
            self.pooling in ("cls", "mean"), f"pooling must be cls or mean, got {self.pooling!r}."
        )
        _check(
            self.max_seq_length is None or self.max_seq_length >= 8,
            f"max_seq_length must be at least 8 (or null), got {self.max_seq_length}.",
        )
        _check(self.batch_size >= 1, "batch_size must be at least 1.")


PAIR_FILE_TYPES = (".jsonl", ".tsv")  # the files of mlmkit eval-pairs


@dataclass
class PairsEvalConfig:
    """``mlmkit eval-pairs``: minimal-pair acceptability (conf/eval_pairs.yaml): the share of
    pairs whose acceptable sentence the masked LM scores higher by pseudo-log-likelihood, per
    file and as the mean over files (BLiMP's headline figure)."""

    checkpoint: str | None = None  # a model dir, a run dir or a checkpoints/step_* folder
    init: str = (
        "pretrained"  # pretrained | random (same architecture and tokenizer, for comparison)
    )
    # JSONL (one object a line) or TSV (a header line) files, each line a pair of sentences
    files: list[str] = field(default_factory=list)
    good_field: str = "sentence_good"  # the field (TSV: column) of the acceptable sentence
    bad_field: str = "sentence_bad"  # the field (TSV: column) of the unacceptable sentence
    max_seq_length: int = 128  # tokens kept of each sentence, [CLS] and [SEP] included
    batch_size: int = 512  # masked copies of the sentences per forward pass
    precision: str = "auto"  # auto (bf16 where the hardware has it) | no | fp16 | bf16
    seed: int = 0  # the weights of init=random
    output: str | None = None  # also write the figures to this JSON file

    def __post_init__(self) -> None:
        check_model_source(self.checkpoint, self.init, "evaluate")
        _check(
            bool(self.files),
            "Say which files of minimal pairs to score: files=[a.jsonl,b.tsv] "
            "(JSONL or TSV, an acceptable and an unacceptable sentence a line).",
        )
        for name in self.files:
            _check(
                str(name).endswith(PAIR_FILE_TYPES),
                f"files: {name!r} is neither a .jsonl nor a "
                ".tsv file; set files=[...] to JSONL or TSV files of minimal pairs.",
            )
            _check(
                self.files.count(name) == 1,
                f"files names {name!r} more than once; list each file once in files=[...].",
            )
        _check(
            bool(self.good_field) and bool(self.bad_field) and self.good_field != self.bad_field,
            f"good_field and bad_field must name two different fields, got {self.good_field!r} "
            f"and {self.bad_field!r}.",
        )
        _check(
            self.max_seq_length >= 8,
            f"max_seq_length must be at least 8, got {self.max_seq_length}.",
        )
        _check(self.batch_size >= 1, "batch_size must be at least 1.")
        check_precision(self.precision, "precision")


EMBED_OBJECTIVES = ("pairs", "simcse", "same_document")  # mlmkit embed's objective
EMBED_LOSSES = ("mnrl", "cached_mnrl")  # in-batch negatives, plain or cached (GradCache)


@dataclass
class EmbedPairsConfig:
    """The training pairs of ``mlmkit embed objective=pairs``: local JSONL, CSV or TSV files
    (a header line names the columns), or a Hugging Face dataset."""

    files: list[str] = field(
        default_factory=list
    )  # .jsonl/.json, .csv or .tsv files (globs allowed)
    hub_name: str | None = None  # a Hub dataset (or a local dataset dir) instead of files
    hub_config: str | None = None
    hub_split: str = "train"
    anchor_column: str = "anchor"  # the query (or first sentence) of each pair
    positive_column: str = "positive"  # the text that belongs with the anchor
    negative_column: str | None = None  # a hard negative for the anchor (optional)
    max_pairs: int | None = None  # the first N pairs (after the held-out texts are dropped)

    def __post_init__(self) -> None:
        columns = [self.anchor_column, self.positive_column, self.negative_column]
        named = [c for c in columns if c]
        _check(
            bool(self.anchor_column) and bool(self.positive_column),
            "pairs.anchor_column and pairs.positive_column must name the columns of each pair.",
        )
        _check(
            len(set(named)) == len(named),
            "pairs.anchor_column, pairs.positive_column and "
            f"pairs.negative_column must name different columns, got {', '.join(named)}.",
        )
        _check(
            self.max_pairs is None or self.max_pairs >= 2,
            f"pairs.max_pairs must be at least 2 (or null: all), got {self.max_pairs}.",
        )


@dataclass
class EmbedConfig:
    """``mlmkit embed``: a model fine-tuned as a sentence embedder with in-batch negatives on
    sentence-transformers' trainer (conf/embed.yaml; mlmkit.embed.stage)."""

    checkpoint: str | None = None  # a model dir, a run dir or a checkpoints/step_* folder
    # pairs: the pairs of ``pairs``; simcse: each sentence of ``data``'s corpus paired with
    # itself, dropout the only noise (Gao et al., 2021); same_document: two neighbouring
    # sentences of one document of ``data``'s corpus
    objective: str = "pairs"
    pairs: EmbedPairsConfig = field(default_factory=EmbedPairsConfig)
    data: DataConfig = field(default_factory=DataConfig)  # the raw corpus of simcse, same_document
    max_texts: int | None = None  # simcse, same_document: at most this many training rows
    loss: str = "mnrl"  # mnrl: MultipleNegativesRankingLoss | cached_mnrl: its GradCache form
    mini_batch_size: int = 32  # cached_mnrl: rows embedded at once (memory), not the batch
    scale: float = 20.0  # the similarity scale of the loss (1 / temperature; 20 = 0.05)
    matryoshka_dims: list[int] = field(default_factory=list)  # e.g. [256, 128, 64]; empty: off
    gather_across_devices: bool = True  # several processes: every rank's rows are negatives
    dropout: float | None = None  # null: 0.1 for simcse, else the model's own
    max_seq_length: int | None = None  # tokens kept of a text; null: the model dir's, else 128
    batch_size: int = 64  # rows per device per step: each row's negatives are the others
    lr: float = 5e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1  # share of the steps with linear warmup, then linear decay
    epochs: float = 1.0  # passes over the training rows, when max_steps is null
    max_steps: int | None = None  # optimizer steps (over epochs)
    max_time: str | None = None  # training wall-clock time, e.g. 90m (the schedule keeps its steps)
    # held-out evaluation before, during and after training; the training rows that share a
    # text with it are dropped (overlap=drop) or refused (overlap=error)
    sts_dir: str | None = None  # an STS-B folder (task's layout), scored on its sts_split
    sts_split: str = "dev"
    task: TaskConfig = field(default_factory=TaskConfig)  # the STS files' layout (task=stsb)
    retrieval_dir: str | None = None  # a BEIR-format folder, scored on qrels/<retrieval_split>.tsv
    retrieval_split: str = "test"
    eval_every: int = 0  # optimizer steps between evaluations (0: before and after only)
    overlap: str = "drop"  # drop | error: training rows that share a text with the evaluation data
    log_every: int = 10
    save_every: int = 500  # optimizer steps between checkpoints (0: on a stop only)
    keep_last: int = 2
    resume: str | None = None  # null | auto (the latest checkpoint of this run dir) | a checkpoint
    precision: str = "auto"  # auto | no | fp16 | bf16
    seed: int = 0
    progress: bool = False  # the trainer's progress bar
    logger: LoggerConfig = field(default_factory=LoggerConfig)

    def __post_init__(self) -> None:
        check_model_source(self.checkpoint, "pretrained", "turn into an embedder")
        _check(
            self.objective in EMBED_OBJECTIVES,
            f"objective must be one of {', '.join(EMBED_OBJECTIVES)}, got {self.objective!r}.",
        )
        _check(
            self.objective != "pairs" or bool(self.pairs.files) or bool(self.pairs.hub_name),
            "objective=pairs needs training pairs: pairs.files=[pairs.jsonl] or "
            "pairs.hub_name=<dataset>; without pairs, objective=simcse or same_document trains "
            "on the raw corpus of data=.",
        )
        _check(
            self.loss in EMBED_LOSSES,
            f"loss must be one of {', '.join(EMBED_LOSSES)}, got {self.loss!r}.",
        )
        _check(
            self.batch_size >= 2,
            f"batch_size={self.batch_size}: in-batch negatives need at "
            "least 2 rows per batch (each row's negatives are the others); raise batch_size.",
        )
        _check(self.mini_batch_size >= 1, "mini_batch_size must be at least 1.")
        _check(self.scale > 0, f"scale must be positive, got {self.scale}.")
        _check(
            all(d >= 1 for d in self.matryoshka_dims),
            f"matryoshka_dims must be positive sizes, got {self.matryoshka_dims}.",
        )
        _check(
            self.dropout is None or 0.0 <= self.dropout < 1.0,
            f"dropout must be in [0, 1) (or null), got {self.dropout}.",
        )
        _check(
            self.max_seq_length is None or self.max_seq_length >= 8,
            f"max_seq_length must be at least 8 (or null), got {self.max_seq_length}.",
        )
        _check(self.lr > 0 and self.epochs > 0, "lr and epochs must be positive.")
        _check(
            self.weight_decay >= 0, f"weight_decay must not be negative, got {self.weight_decay}."
        )
        _check(0.0 <= self.warmup_ratio < 1.0, "warmup_ratio must be in [0, 1).")
        _check(
            self.max_steps is None or self.max_steps >= 1, "max_steps must be at least 1 (or null)."
        )
        parse_duration(self.max_time, "max_time")
        _check(
            self.max_texts is None or self.max_texts >= 2, "max_texts must be at least 2 (or null)."
        )
        _check(
            self.overlap in ("drop", "error"),
            f"overlap must be drop or error, got {self.overlap!r}.",
        )
        _check(
            self.eval_every >= 0 and self.save_every >= 0,
            "eval_every and save_every must not be negative.",
        )
        _check(
            self.log_every >= 1 and self.keep_last >= 1,
            "log_every and keep_last must be at least 1.",
        )
        _check(
            self.sts_split in ("dev", "train"),
            f"sts_split must be dev or train, got {self.sts_split!r}.",
        )
        _check(
            self.sts_dir is None
            or (self.task.kind == "regression" and len(self.task.text_columns) == 2),
            "sts_dir needs a task of scored sentence pairs (task=stsb).",
        )
        _check(
            re.fullmatch(r"[\w.-]+", self.retrieval_split or "") is not None,
            "retrieval_split must name a file of qrels/ without its .tsv, got "
            f"{self.retrieval_split!r}.",
        )
        check_precision(self.precision, "precision")
