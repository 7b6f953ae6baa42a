"""Minimal-pair acceptability: does the masked LM prefer the acceptable sentence of each pair?

    mlmkit eval-pairs checkpoint=outputs/<run> 'files=[blimp/anaphor_gender_agreement.jsonl,...]'
    mlmkit eval-pairs checkpoint=outputs/<run> files=[pairs.tsv] init=random   # random weights

Each pair is an acceptable sentence and a minimally different unacceptable one, as in BLiMP
(Warstadt et al., 2020, "BLiMP: The Benchmark of Linguistic Minimal Pairs for English": 67
paradigm files in JSONL, with the fields ``sentence_good`` and ``sentence_bad``). A file is
JSONL, one object per line with the fields ``good_field`` and ``bad_field``, or TSV, a header
line naming those two columns and one pair per line.

The model scores a sentence by its pseudo-log-likelihood (Salazar et al., 2020, "Masked
Language Model Scoring"): each of its tokens (special tokens and padding aside) is masked in turn,
one copy of the sentence per token, and the log-probabilities of the true tokens at their masked
positions are summed. A pair counts as right when its acceptable sentence scores higher, and as
half right on a tie. The figures are the accuracy of each file, their mean (BLiMP's headline
figure, the mean over its paradigms) and the number of pairs; random weights score about 0.5.
Nothing is trained.
"""

from __future__ import annotations

import csv
import json
import logging
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from mlmkit.config import PairsEvalConfig
from mlmkit.data.sources import check_not_binary
from mlmkit.errors import ConfigError, DataError
from mlmkit.evaluation.sts import write_output
from mlmkit.model.architectures import parts_of
from mlmkit.model.bert import padded_vocab_size
from mlmkit.training.runtime import autocast_dtype, resolve_precision
from mlmkit.training.trained_model import load_model_and_tokenizer

log = logging.getLogger("mlmkit")

FIX = "set files=[...] to JSONL or TSV files of minimal pairs"


# ---- reading the pairs ------------------------------------------------------------------------


def read_pairs(
    path: str | Path, good_field: str = "sentence_good", bad_field: str = "sentence_bad"
) -> list[tuple[str, str]]:
    """Read the ``(acceptable, unacceptable)`` sentences of each line of a JSONL file (the fields
    ``good_field`` and ``bad_field``) or a TSV file (the columns of its header so named)."""
    file = Path(path).expanduser()
    if file.suffix not in (".jsonl", ".tsv"):
        raise ConfigError(f"files: {str(path)!r} is neither a .jsonl nor a .tsv file; {FIX}.")
    if not file.is_file():
        raise DataError(f"files: {str(path)!r} does not exist; {FIX}.")
    check_not_binary(str(file), "files")
    read = _read_jsonl if file.suffix == ".jsonl" else _read_tsv
    pairs = list(read(file, good_field, bad_field))
    if not pairs:
        raise DataError(
            f"files: {str(path)!r} holds no pairs; write one pair a line in it, or "
            "leave it out of files=[...]."
        )
    return pairs


def _read_jsonl(path: Path, good_field: str, bad_field: str) -> Iterable[tuple[str, str]]:
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        for line, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            where = f"{str(path)!r} line {line}"
            try:
                obj = json.loads(raw)
            except ValueError as exc:
                raise DataError(
                    f"{where} is not valid JSON ({exc}); write one JSON object per line, "
                    f"with {good_field!r} and {bad_field!r}."
                ) from None
            if not isinstance(obj, dict):
                raise DataError(
                    f"{where} is not a JSON object; write one object per line, with "
                    f"{good_field!r} and {bad_field!r}."
                )
            yield (
                _sentence(obj.get(good_field), where, good_field, "good_field"),
                _sentence(obj.get(bad_field), where, bad_field, "bad_field"),
            )


def _read_tsv(path: Path, good_field: str, bad_field: str) -> Iterable[tuple[str, str]]:
    with open(path, encoding="utf-8-sig", errors="replace", newline="") as f:
        rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(rows, None)
        if header is None:
            return
        columns = [c.strip() for c in header]
        index = {}
        for field, setting in ((good_field, "good_field"), (bad_field, "bad_field")):
            if field not in columns:
                raise DataError(
                    f"{str(path)!r} has no column {field!r} in its header line (it has "
                    f"{', '.join(map(repr, columns))}); set {setting} to the column of "
                    f"the {'acceptable' if setting == 'good_field' else 'unacceptable'} "
                    "sentences."
                )
            index[field] = columns.index(field)
        for fields in rows:
            if not any(v.strip() for v in fields):
                continue
            where = f"{str(path)!r} line {rows.line_num}"
            if len(fields) < len(columns):
                raise DataError(
                    f"{where} has {len(fields)} tab-separated fields and its header "
                    f"{len(columns)}; write every field of the header on each line."
                )
            yield (
                _sentence(fields[index[good_field]], where, good_field, "good_field"),
                _sentence(fields[index[bad_field]], where, bad_field, "bad_field"),
            )


def _sentence(value: Any, where: str, field: str, setting: str) -> str:
    """Check and return the sentence ``value`` of ``field`` on one line of a file."""
    if not isinstance(value, str):
        raise DataError(
            f"{where} has no {field!r} (a JSON string); set {setting} to the field of "
            f"the {'acceptable' if setting == 'good_field' else 'unacceptable'} sentences."
        )
    if not value.strip():
        raise DataError(
            f"{where} has an empty {field!r}; write a sentence there or remove the line."
        )
    return value.strip()


# ---- scoring ----------------------------------------------------------------------------------


@torch.no_grad()
def pseudo_log_likelihoods(
    model, tokenizer, sentences: Sequence[str], max_seq_length: int = 128, batch_size: int = 512
) -> list[float]:
    """Return the pseudo-log-likelihood of each sentence under the masked LM ``model``
    (``BertForMaskedLM``, ``RobertaForMaskedLM``, ...): the sum over its tokens (the special
    ones, [CLS] and [SEP] or <s> and </s>, aside) of the log-probability of the token where it
    alone is masked.

    Sentences are cut to ``max_seq_length`` tokens (at most the model's positions); a forward
    pass takes up to ``batch_size`` masked copies, of one sentence or of several, padded to the
    longest. The encoder runs on every copy, the MLM head at its masked position only, and the
    probabilities are those over the tokenizer's ids (a vocabulary padded beyond it is left
    out). A sentence repeated in ``sentences`` is scored once; the model runs in eval mode.
    """
    if tokenizer.mask_token_id is None:
        raise ConfigError(
            "The tokenizer has no mask token, so the model cannot score a sentence by "
            "masking its tokens; evaluate a masked language model."
        )
    unique = list(dict.fromkeys(sentences))
    if not unique:
        return []
    ids, special, lengths = _encode(
        tokenizer, unique, min(max_seq_length, parts_of(model).positions(model.config))
    )
    # longest first, so that the copies of a batch pad to similar lengths
    order = torch.argsort(lengths, descending=True, stable=True)
    real = (special[order] == 0) & (torch.arange(ids.shape[1]) < lengths[order][:, None])
    rows, positions = real.nonzero(as_tuple=True)  # one masked copy each, grouped by sentence
    copies = order[rows]
    totals = torch.zeros(len(unique), dtype=torch.float64)
    training = model.training
    model.eval()
    try:
        for start in range(0, len(copies), batch_size):
            chunk, at = copies[start : start + batch_size], positions[start : start + batch_size]
            totals.index_add_(
                0, chunk, _masked_log_probs(model, tokenizer, ids, lengths, chunk, at)
            )
    finally:
        model.train(training)
    row = {s: i for i, s in enumerate(unique)}
    return [float(totals[row[s]]) for s in sentences]


def _encode(tokenizer, sentences: list[str], max_length: int):
    """``(ids, special-token mask, lengths)``: the sentences' token ids and which are special,
    both ``(len(sentences), longest)`` and padded, and their lengths."""
    enc = tokenizer(
        sentences,
        truncation=True,
        max_length=max_length,
        padding=True,
        return_special_tokens_mask=True,
        return_attention_mask=True,
        return_tensors="pt",
    )
    return enc["input_ids"], enc["special_tokens_mask"], enc["attention_mask"].sum(1)


def _masked_log_probs(
    model,
    tokenizer,
    ids: torch.Tensor,
    lengths: torch.Tensor,
    sentences: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """Return the log-probability of the true token of each copy (row ``sentences[i]`` of ``ids``,
    ``positions[i]`` masked), in float64 on the CPU."""
    device = next(model.parameters()).device
    width = int(lengths[sentences].max())
    inputs = ids[sentences, :width].clone()
    rows = torch.arange(len(sentences))
    targets = inputs[rows, positions].clone()
    inputs[rows, positions] = tokenizer.mask_token_id
    attention = (torch.arange(width) < lengths[sentences][:, None]).long()
    parts = parts_of(model)
    hidden = parts.encoder(model)(
        input_ids=inputs.to(device), attention_mask=attention.to(device)
    ).last_hidden_state
    logits = parts.head(model, hidden[rows.to(device), positions.to(device)])
    logits = logits[:, : min(logits.shape[-1], padded_vocab_size(tokenizer))].float()
    log_probs = torch.log_softmax(logits, dim=-1).gather(1, targets.to(device)[:, None]).squeeze(1)
    return log_probs.double().cpu()


def pair_accuracy(good: Sequence[float], bad: Sequence[float]) -> float:
    """Return the share of pairs whose acceptable sentence scores higher (a tie counts half)."""
    if not good or len(good) != len(bad):
        raise ValueError(
            "pair_accuracy needs as many acceptable as unacceptable scores, at least one."
        )
    return sum(1.0 if g > b else 0.5 if g == b else 0.0 for g, b in zip(good, bad)) / len(good)


def score_pairs(
    model,
    tokenizer,
    pairs: Sequence[tuple[str, str]],
    max_seq_length: int = 128,
    batch_size: int = 512,
) -> dict[str, Any]:
    """``{"accuracy", "pairs"}`` of the masked LM ``model`` on ``(acceptable, unacceptable)``
    sentence pairs, by pseudo-log-likelihood (``pseudo_log_likelihoods``)."""
    scores = pseudo_log_likelihoods(
        model,
        tokenizer,
        [s for pair in pairs for s in pair],
        max_seq_length=max_seq_length,
        batch_size=batch_size,
    )
    return {"accuracy": pair_accuracy(scores[0::2], scores[1::2]), "pairs": len(pairs)}


# ---- the command ------------------------------------------------------------------------------


def load_masked_lm(cfg: PairsEvalConfig):
    """``(masked LM, tokenizer, resolved path)``: the checkpoint's model with its MLM head, or
    for ``init=random`` the same architecture with seeded random weights, in eval mode."""
    mlm, tokenizer, resolved = load_model_and_tokenizer(cfg.checkpoint)
    if cfg.init == "random":
        torch.manual_seed(cfg.seed)
        mlm = type(mlm)(mlm.config)
    return mlm.float().to(_device()).eval(), tokenizer, resolved


def _device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def evaluate_pairs(cfg: PairsEvalConfig) -> dict[str, Any]:
    """Return the accuracy of each file of ``cfg.files``, their mean and the number of pairs; also
    written to ``cfg.output`` when set. Every file is read before the model loads, and the
    sentences of all files are scored together."""
    data = {name: read_pairs(name, cfg.good_field, cfg.bad_field) for name in cfg.files}
    device = _device()
    precision = resolve_precision(cfg.precision, use_cpu=device.type == "cpu", setting="precision")
    model, tokenizer, resolved = load_masked_lm(cfg)
    t0 = time.perf_counter()
    sentences = list(dict.fromkeys(s for pairs in data.values() for pair in pairs for s in pair))
    # the encoder and head under autocast (the weights stay fp32); log-softmax in fp32
    mixed = autocast_dtype(precision)
    with torch.autocast(device.type, dtype=mixed, enabled=mixed is not None):
        scores = dict(
            zip(
                sentences,
                pseudo_log_likelihoods(
                    model, tokenizer, sentences, cfg.max_seq_length, cfg.batch_size
                ),
            )
        )
    files = {
        name: {
            "accuracy": pair_accuracy([scores[g] for g, _ in pairs], [scores[b] for _, b in pairs]),
            "pairs": len(pairs),
        }
        for name, pairs in data.items()
    }
    result = {
        "checkpoint": str(resolved),
        "init": cfg.init,
        "files": files,
        "accuracy": sum(f["accuracy"] for f in files.values()) / len(files),
        "pairs": sum(f["pairs"] for f in files.values()),
        "precision": precision,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    write_output(cfg.output, result)
    return result
