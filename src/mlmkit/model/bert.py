"""The encoder: a plain ``BertForMaskedLM`` or ``ModernBertForMaskedLM`` on SDPA
(``model.architecture``; their parts in ``architectures``), loaded from a model dir or from
a training checkpoint's weights, and the training objective around it."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from mlmkit.config import ModelConfig
from mlmkit.config.families import check_continued
from mlmkit.errors import CheckpointError, ConfigError, first_line
from mlmkit.masking.collator import IGNORE_INDEX
from mlmkit.model.architectures import architecture, parts_of, transformers_class
from mlmkit.model.documents import document_inputs, padding_inputs, varlen_inputs
from mlmkit.model.kernels import cross_entropy_sum, register_cpu_attention
from mlmkit.model.objective import Objective

log = logging.getLogger(__name__)

POSITION_BUCKET = 64  # the sparse head's row count is padded to a multiple of this
# the weights of an objective's other parts, beside its .model (replaced-token detection's)
OBJECTIVE_PARTS = ("generator.", "discriminator_head.")


def padded_vocab_size(tokenizer, multiple: int = 1) -> int:
    """Round the tokenizer's id range up to a multiple of ``multiple``.

    Matrix kernels run fastest when the vocabulary dimension of the embedding and output
    matrices is a multiple of 64; the extra rows are never an input and never a target,
    and the tokenizer itself is unchanged.
    """
    vocab = max(len(tokenizer), max(tokenizer.get_vocab().values()) + 1)
    return -(-vocab // multiple) * multiple


def bert_config(cfg: ModelConfig, tokenizer):
    """Build the transformers config (``BertConfig`` or ``ModernBertConfig``, as
    ``cfg.architecture`` says) for a preset, with the tokenizer's vocabulary (padded to a
    multiple of ``cfg.pad_vocab_multiple``) and special ids."""
    vocab_size = padded_vocab_size(tokenizer, cfg.pad_vocab_multiple)
    return architecture(cfg.architecture).config(cfg, vocab_size, tokenizer)


def flash_attn_available() -> bool:
    """Return True where the flash-attn package is installed and a CUDA GPU is present."""
    import importlib.util

    return torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None


def resolve_attn_implementation(name: str, device_type: str = "cpu", precision: str = "no") -> str:
    """Return the transformers attention implementation for ``model.attn_implementation``.

    ``auto``: ``flash_attention_2`` on CUDA in bf16/fp16 with flash-attn installed (padded
    batches then run through flash-attn's variable-length kernel, padding costs no
    attention), else ``sdpa``; on a CPU in bf16, ``mlmkit_cpu_sdpa`` (``mlmkit.model.kernels``:
    the same fused bf16 forward, with the faster fp32 fused backward).
    """
    if name != "auto":
        if name == "flash_attention_2" and not flash_attn_available():
            raise ConfigError(
                "model.attn_implementation=flash_attention_2 needs a CUDA GPU and the "
                "flash-attn package; use model.attn_implementation=auto or sdpa."
            )
        return name
    if device_type == "cuda" and precision in ("bf16", "fp16") and flash_attn_available():
        return "flash_attention_2"
    if device_type == "cpu" and precision == "bf16":
        return register_cpu_attention()
    return "sdpa"


def family_attention(family, attn_implementation: str) -> str:
    """Return the attention ``family`` runs for ``attn_implementation``: eager where transformers
    gives the family no SDPA (DeBERTa; ``Family.sdpa_reason``), else the one asked for."""
    if family.sdpa or attn_implementation == "eager":
        return attn_implementation
    log.info("Attention: eager, not %s: %s.", attn_implementation, family.sdpa_reason)
    return "eager"


def build_model(
    cfg: ModelConfig,
    tokenizer,
    max_seq_length: int | None = None,
    attn_implementation: str | None = None,
    base_tokenizer=None,
):
    """``BertForMaskedLM`` or ``ModernBertForMaskedLM`` (``cfg.architecture``) from a size
    preset, or from ``cfg.init_from`` (continued pretraining; its own architecture).

    Attention runs through torch SDPA (``attn_implementation="sdpa"``), bidirectional, or
    flash-attn where ``attn_implementation`` (default: ``cfg.attn_implementation``, with
    ``auto`` read as ``sdpa``) says so. ``base_tokenizer``: the tokenizer of ``cfg.init_from``
    where ``tokenizer`` extends it (``tokenizer.extend_vocab``): the embeddings grow to match.
    """
    attn = resolve_attn_implementation(attn_implementation or cfg.attn_implementation)
    if cfg.init_from:
        model = load_pretrained(cfg.init_from, attn)
        if base_tokenizer is not None:
            extend_embeddings(model, tokenizer, base_tokenizer, cfg.pad_vocab_multiple)
        emb = model.get_input_embeddings().num_embeddings
        vocab = max(tokenizer.get_vocab().values()) + 1
        if vocab > emb:
            raise ConfigError(
                f"The tokenizer has {vocab} ids but model.init_from={cfg.init_from!r} has only "
                f"{emb} embeddings; use the tokenizer of that model (tokenizer.name_or_path=null)."
            )
        # Dropout is a recipe choice of this run, not of the checkpoint.
        parts_of(model).set_dropout(
            model, cfg.hidden_dropout_prob, cfg.attention_probs_dropout_prob
        )
        if cfg.extend_positions_to:
            extend_positions(model, cfg.extend_positions_to)
    else:
        masked_lm = transformers_class(architecture(cfg.architecture).masked_lm)
        model = masked_lm(bert_config(cfg, tokenizer))
        model.set_attn_implementation(attn)
        silence_padded_vocab(model, padded_vocab_size(tokenizer))
        architecture(cfg.architecture).init_positions(model, cfg.position_init)
        architecture(cfg.architecture).init_attention(model, cfg.attention_init)
    limit = parts_of(model).positions(model.config)  # RoBERTa's 514 rows hold 512 tokens
    if max_seq_length is not None and max_seq_length > limit:
        grow = (
            " or set model.extend_positions_to"
            if cfg.init_from
            else " or raise model.max_position_embeddings"
        )
        raise ConfigError(
            f"data.max_seq_length ({max_seq_length}, the longest of the run and its phases) is "
            f"larger than the {limit} positions of the model; lower "
            f"data.max_seq_length{grow}."
        )
    return model


@torch.no_grad()
def extend_positions(model, rows: int) -> int:
    """Give a loaded model positions up to ``rows`` (``model.extend_positions_to``). A BERT's
    learned table grows: row ``i`` past the old length ``n`` starts as a copy of row ``i - n``
    (Beltagy et al. (2020), 'Longformer', section 5: copying the learned table kept the
    masked-LM loss of RoBERTa from the first step at 4,096 tokens, where a random init did
    not). A ModernBERT's rotary positions need no rows: its config records the length.
    Returns the rows added."""
    config = model.config
    old = config.max_position_embeddings
    if rows < old:
        raise ConfigError(
            f"model.extend_positions_to ({rows}) is below the {old} positions of "
            "model.init_from; set it above them, or to null."
        )
    if rows == old:
        return 0
    if config.model_type == "bert":
        embeddings = model.bert.embeddings
        table = embeddings.position_embeddings
        grown = torch.nn.Embedding(
            rows, table.embedding_dim, device=table.weight.device, dtype=table.weight.dtype
        )
        for start in range(0, rows, old):
            n = min(old, rows - start)
            grown.weight[start : start + n] = table.weight[:n]
        embeddings.position_embeddings = grown
        embeddings.position_ids = torch.arange(rows, device=table.weight.device).expand((1, -1))
        embeddings.token_type_ids = torch.zeros(
            (1, rows), dtype=torch.long, device=table.weight.device
        )
    config.max_position_embeddings = rows
    return rows - old


@torch.no_grad()
def init_output_bias(model, counts: torch.Tensor) -> None:
    """``model.output_bias_init=unigram``: the output bias starts as the log of each token's
    frequency in ``counts`` (add-half smoothed), so the new model predicts the corpus's
    unigram distribution from its first step instead of spending its first hundred or so
    steps learning it, and the gradients go to using the context at once (Karpathy, 2019, 'A
    Recipe for Training Neural Networks': initialise the final layer's bias to the prior).
    The padding ids beyond the tokenizer keep their silencing bias."""
    bias = parts_of(model).output_bias(model)
    n = min(counts.numel(), bias.numel())
    freq = counts[:n].double() + 0.5
    bias[:n] = torch.log(freq / freq.sum()).to(bias.dtype)


@torch.no_grad()
def extend_embeddings(
    model, tokenizer, base_tokenizer, multiple: int = 1, unspelt: str = "average"
) -> int:
    """Grow the embeddings of a model made for ``base_tokenizer`` (and its tied output layer
    and bias) to the ids ``tokenizer`` adds after the base's last. Each new row, and its output
    bias, starts as the mean of those of the base pieces its word splits into, its [UNK] pieces
    left out. A word the base cannot spell at all (every piece [UNK]: a script its vocabulary
    lacks) starts as the average word (``unspelt="average"``): the mean of the base's rows of the
    word's script where it has at least ``SCRIPT_ROWS`` of them, else of all its rows but the
    special tokens'. [UNK]'s own row would make every such word the model's "unknown" at the
    start, with [UNK]'s output bias; the average keeps the new rows' share of the predictions
    near an ordinary word's (Hewitt, 2021, "Initializing New Word Embeddings for Pretrained
    Language Models"). ``unspelt="unk"``: the earlier start, [UNK]'s row (a benchmark's
    comparison). Rows beyond the tokenizer (padding to ``multiple``) are silenced. Returns the
    ids added."""
    old = max(base_tokenizer.get_vocab().values()) + 1
    new = max(tokenizer.get_vocab().values()) + 1
    if new <= old:
        return 0
    if (
        model.get_output_embeddings().weight.data_ptr()
        != model.get_input_embeddings().weight.data_ptr()
    ):
        raise ConfigError(
            "tokenizer.extend_vocab grows a model whose output layer shares its input embeddings "
            "(as BERT's and ModernBERT's do); this one's are untied: set tokenizer.extend_vocab=0."
        )
    rows = padded_vocab_size(tokenizer, multiple)
    if rows > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(rows, mean_resizing=False)
    weight = model.get_input_embeddings().weight
    bias = parts_of(model).output_bias(model)
    word = {i: w for w, i in tokenizer.get_vocab().items() if i >= old}
    pieces = base_tokenizer([word[i] for i in range(old, new)], add_special_tokens=False)[
        "input_ids"
    ]
    unk = base_tokenizer.unk_token_id
    average = _average_rows(base_tokenizer, old)
    for i, ids in zip(range(old, new), pieces):
        known = [j for j in ids if j != unk] if unspelt == "average" else ids
        if not known:
            known = average(word[i])
        weight[i] = weight[known].mean(dim=0)
        bias[i] = bias[known].mean()
    silence_padded_vocab(model, new)
    return new - old


SCRIPT_ROWS = 20  # base rows of a script, at least, for their mean to stand for its words


def _script(text: str) -> str:
    """Return the script of most of ``text``'s letters: the first word of their Unicode names."""
    import unicodedata
    from collections import Counter

    names = Counter(unicodedata.name(c, "?").split(" ", 1)[0] for c in text if c.isalpha())
    return names.most_common(1)[0][0] if names else "?"


def _average_rows(base_tokenizer, old: int):
    """``word -> base ids`` whose mean row stands for the average word of ``word``'s script (all
    the base's ordinary tokens where it has few of that script)."""
    special = set(base_tokenizer.all_special_ids)
    ordinary = {
        i: t.removeprefix("##")
        for t, i in base_tokenizer.get_vocab().items()
        if i < old and i not in special
    }
    by_script: dict[str, list[int]] = {}
    for i, text in ordinary.items():
        by_script.setdefault(_script(text), []).append(i)
    everything = sorted(ordinary)

    def rows(word: str) -> list[int]:
        script = _script(word)
        same = by_script.get(script, []) if script != "?" else []
        return sorted(same) if len(same) >= SCRIPT_ROWS else everything

    return rows


PADDED_VOCAB_BIAS = -1e4  # the output bias of the padding ids: exp(-1e4) is 0 in any dtype


@torch.no_grad()
def silence_padded_vocab(model, n_real: int) -> None:
    """Give the padding ids beyond the tokenizer's ``n_real`` a large negative output bias.

    Their probability is then 0 in every dtype, so the loss, the gradients and the
    predictions are those of the unpadded model (no gradient reaches those rows either),
    and a fill-mask pipeline on the exported model never proposes them.
    """
    bias = parts_of(model).output_bias(model)
    if bias.numel() > n_real:
        bias[n_real:] = PADDED_VOCAB_BIAS


def load_pretrained_config(name_or_path: str, setting: str = "model.init_from"):
    """Load the config of the encoder at ``name_or_path`` (a local dir, checked for safetensors and
    custom code before transformers opens it, or a Hub name) of a family mlmkit continues
    (``mlmkit.config.families``), with one clear error on failure; ``setting`` names where the
    path came from."""
    from transformers import AutoConfig

    from mlmkit.model.safety import refuse_custom_code, require_safetensors

    local = Path(name_or_path).expanduser()
    source = str(local) if local.exists() else name_or_path
    if local.exists() and not (local / "config.json").is_file():
        raise ConfigError(
            f"{setting}={name_or_path!r} has no config.json; point {setting} at a "
            "model dir with config.json and model.safetensors."
        )
    check_continued(name_or_path, setting)  # custom code, a decoder, an unknown family
    if local.exists():  # checked before transformers opens anything in it
        refuse_custom_code(local, setting)
        require_safetensors(local, setting)
    try:
        config = AutoConfig.from_pretrained(source, trust_remote_code=False)
    except Exception as exc:
        where = (
            "its config.json could not be read"
            if local.exists()
            else "not a local model dir, and the Hugging Face Hub could not provide it"
        )
        raise ConfigError(
            f"Could not load {setting}={name_or_path!r} ({where}: {first_line(exc)}); point "
            f"{setting} at a local dir with config.json and model.safetensors."
        ) from None
    return config


def load_pretrained(
    name_or_path: str, attn_implementation: str = "sdpa", setting: str = "model.init_from"
):
    """Load a ``BertForMaskedLM`` or ``ModernBertForMaskedLM`` (safetensors only, no custom
    code) with one clear error on failure; ``setting`` names where the path came from. The
    weights load in fp32 whatever dtype they were saved in (a bf16 ``final/`` of a DeepSpeed
    run, a Hub model stored in bf16): training keeps fp32 master weights, and mixed precision
    is the run's autocast, not the checkpoint's dtype."""
    config = load_pretrained_config(name_or_path, setting)
    local = Path(name_or_path).expanduser()
    source = str(local) if local.exists() else name_or_path
    family = architecture(config.model_type)
    masked_lm = transformers_class(family.masked_lm)
    try:
        return masked_lm.from_pretrained(
            source,
            attn_implementation=family_attention(family, attn_implementation),
            use_safetensors=True,
            trust_remote_code=False,
            dtype=torch.float32,
        )
    except Exception as exc:
        raise ConfigError(
            f"Could not load weights from {setting}={name_or_path!r}: "
            f"{first_line(exc)} (mlmkit loads model.safetensors only)."
        ) from None


def model_from_checkpoint(
    ckpt: Path, spec: Path, attn_implementation: str = "sdpa", setting: str = "checkpoint"
):
    """Load the masked-LM model of a training checkpoint folder ``ckpt`` (its ``model.safetensors``)
    on the architecture of ``spec``, the config.json its run wrote, with one clear error on
    failure; ``spec`` is refused if it asks for custom code."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from mlmkit.model.safety import refuse_custom_code

    refuse_custom_code(spec, setting)
    weights = ckpt / "model.safetensors"
    if not weights.is_file():
        raise CheckpointError(
            f"The checkpoint {str(ckpt)!r} has no model.safetensors (a sharded FSDP/DeepSpeed "
            "checkpoint); evaluate the run's final/ dir instead."
        )
    try:
        config = AutoConfig.from_pretrained(str(spec), trust_remote_code=False)
        tensors = load_file(str(weights))
    except Exception as exc:  # a cut or garbled file fails in json or in the safetensors header
        raise CheckpointError(
            f"{setting}: could not read the checkpoint {str(ckpt)!r} ({first_line(exc)}); it is "
            f"damaged, so point {setting} at another checkpoint or at the run's final/ dir."
        ) from None
    arch = architecture(config.model_type)  # bert or modernbert, else one sentence
    config._attn_implementation = attn_implementation
    model = transformers_class(arch.masked_lm)(config)
    # the training objective wraps the model as .model (replaced-token detection's generator and
    # discriminator head beside it are not the model's); tied weights are stored once
    state = {
        k.removeprefix("model."): v for k, v in tensors.items() if not k.startswith(OBJECTIVE_PARTS)
    }
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # tensors of other shapes than the run's config says
        raise CheckpointError(
            f"The checkpoint {str(ckpt)!r} does not match the run's model config ("
            f"{(str(exc).strip().splitlines() or ['size mismatch'])[-1].strip()[:160]}); "
            f"point {setting} at the run's final/ dir."
        ) from None
    missing = [k for k in missing if k not in arch.tied_keys]  # = the embeddings (and bias)
    if missing or unexpected:
        raise CheckpointError(
            f"The checkpoint {str(ckpt)!r} does not match the run's model config "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})."
        )
    model.tie_weights()
    return model


class MaskedLM(Objective):
    """The training objective around a plain ``BertForMaskedLM`` or ``ModernBertForMaskedLM``
    (masked-LM's loss: ``model.objective.Objective``'s defaults).

    ``forward`` returns the *sum* of the cross-entropy over the chosen positions and
    their count (and, in eval mode, the logits and targets of the chosen positions), so the
    loop can normalise by the number of chosen tokens in the whole optimizer step (all
    micro-batches, all ranks). With ``sparse_prediction`` the vocabulary projection runs only
    on the chosen positions; the loss and gradients are those of the full head. The wrapped
    model is saved as it is.
    """

    def __init__(
        self, model, sparse_prediction: bool = True, document_sep_id: int | None = None
    ) -> None:
        super().__init__()
        self.model = model
        self.sparse_prediction = sparse_prediction
        # data.packing=documents: attention within each document of a block (model.documents)
        self.document_sep_id = document_sep_id
        self.parts = parts_of(model)  # where the encoder and the head are
        # FSDP (conf/accelerate/fsdp.yaml) shards one unit per encoder layer of this class
        self._no_split_modules = [self.parts.layer_class]

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        targets: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        **varlen,
    ) -> dict[str, torch.Tensor]:
        """``positions``/``targets``: ``prediction_positions(labels)``, computed ahead (in the
        dataloader, on the CPU) so the step needs no host-device synchronisation; without
        them they are computed here (``nonzero`` waits for the device). Without ``labels``:
        only the encoder's last states, ``{"last_hidden_state": ...}`` (a probe's sentence
        vectors), through this forward so that every engine's hooks (FSDP, ZeRO-3) run.
        ``varlen``: a batch the loader flattened into one row of its sequences
        (``position_ids``, ``cu_seq_lens_q/k``, ``max_length_q/k``: ``model.documents``)."""
        inputs = encoder_inputs(self.model, input_ids, attention_mask, self.document_sep_id, varlen)
        if labels is None:
            if token_type_ids is not None and self.parts.takes_token_type_ids:
                inputs["token_type_ids"] = token_type_ids
            return {"last_hidden_state": self.parts.encoder(self.model)(**inputs).last_hidden_state}
        if self.sparse_prediction:
            encoder = self.parts.encoder(self.model)
            hidden = encoder(**inputs).last_hidden_state
            if positions is None or targets is None:
                positions, targets = prediction_positions(labels)
            hidden = hidden.reshape(-1, hidden.size(-1)).index_select(0, positions)
            logits = self.parts.head(self.model, hidden)
        else:
            logits = self.model(**inputs).logits
            logits = logits.reshape(-1, logits.size(-1))
            targets = labels.reshape(-1)
        loss_sum = cross_entropy_sum(logits, targets)
        n_tokens = (targets != IGNORE_INDEX).sum()
        out = {"loss_sum": loss_sum, "n_tokens": n_tokens}
        if not self.training:  # the evaluation's top-k; a training step returns no logits, which
            # would stay alive through the backward (and mixed precision's fp32 output copy)
            out.update(logits=logits, targets=targets)
        return out


def encoder_inputs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    document_sep_id: int | None,
    varlen: dict,
) -> dict:
    """Return the encoder's keyword arguments for a batch: a flattened one's (``varlen``), a packed
    one's, a padded one's (its masks built here, with no host wait), or with documents isolated
    (``document_sep_id``) the masks and positions of ``model.documents``."""
    if varlen:
        inputs = varlen_inputs(model, input_ids, **varlen)
    elif document_sep_id is None and (attention_mask is None or attention_mask.dim() != 2):
        return {"input_ids": input_ids, "attention_mask": attention_mask}
    elif document_sep_id is None:
        return padding_inputs(model, input_ids, attention_mask)
    else:
        inputs = document_inputs(model, input_ids, document_sep_id, attention_mask)
    offset = parts_of(model).position_offset_of(model.config)
    if offset and "position_ids" in inputs:  # RoBERTa counts positions from padding_idx + 1
        inputs["position_ids"] = inputs["position_ids"] + offset
    return inputs


def prediction_positions(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat indices of the chosen positions of ``labels`` and their targets.

    The row count is rounded up to a multiple of POSITION_BUCKET with ignored rows (index
    0, target IGNORE_INDEX), so the head sees a handful of shapes instead of a new one every
    step (kernel caches stay bounded; CPU memory otherwise grows with every new shape).
    """
    flat_labels = labels.reshape(-1)
    positions = torch.nonzero(flat_labels != IGNORE_INDEX).squeeze(1)
    targets = flat_labels.index_select(0, positions)
    extra = -positions.numel() % POSITION_BUCKET
    if extra:
        positions = torch.cat([positions, positions.new_zeros(extra)])
        targets = torch.cat([targets, targets.new_full((extra,), IGNORE_INDEX)])
    return positions, targets


def count_parameters(model: nn.Module, embeddings: bool = True) -> int:
    n = sum(p.numel() for p in model.parameters())
    if not embeddings:
        n -= sum(p.numel() for p in parts_of(model).embeddings(model).parameters())
    return n
