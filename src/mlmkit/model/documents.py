"""Attention within each document of a packed block (``data.packing=documents``).

Packed blocks are ``[CLS] doc1 [SEP] doc2 [SEP] ... [SEP]``: every document ends with a
[SEP] (the masking never chooses special tokens, so they survive it). With document
isolation a token attends only to the tokens of its own document, and positions restart at
0 at the first token of each document, so a document reads as if it were alone, wherever
the packing put it. The layout is derived from the ids on the device (no extra data; on
SDPA no host synchronisation either, while flash-attn's cumulative lengths take one
``nonzero``), unless the loader laid the batch out already (``varlen_layout``, below):

* SDPA (CPU, and CUDA without flash-attn): a block-diagonal boolean mask of shape
  (batch, 1, seq, seq); for ModernBERT also its sliding-window variant for the local layers
  (eager attention: the same masks as additive -inf biases);
* flash-attn (``attn_implementation=flash_attention_2``): the batch is flattened into one row
  and each document is one sequence of flash-attn's variable-length kernel (cumulative
  sequence lengths), so no attention is computed across documents at all.

Where the model runs flash-attn, the training loader lays every batch that needs it out on the
host, in its worker (``varlen_layout``): a padded batch (``data.packing=line_by_line``) or a
documents batch becomes one row of its real tokens (``flatten_rows``), positions restarting at
each row or document, with the cumulative lengths and the longest length as Python ints
(transformers' ``FlashAttentionKwargs``: ``cu_seq_lens_q/k``, ``max_length_q/k``, which BERT and
ModernBERT hand to every layer's ``flash_attn_varlen_func``). No layer then waits for the host
(transformers' own unpadding asks ``mask.all()``, ``nonzero`` and ``max().item()`` in each), and
no FLOP goes to padding. The same flattened batch runs on SDPA and eager attention too
(``varlen_inputs``: the block-diagonal mask of its sequences), as the tests check it.
"""

from __future__ import annotations

import torch

from mlmkit.model.architectures import architecture


def isolation_sep_id(packing: str, tokenizer) -> int | None:
    """Return the id that ends a document where ``data.packing`` isolates documents, else None."""
    return tokenizer.sep_token_id if packing == "documents" else None


def document_layout(input_ids: torch.Tensor, sep_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(document number of each token, its position within its document), both (batch, seq).

    A [SEP] belongs to the document it closes; the next token starts a new document.
    """
    batch, seq = input_ids.shape
    is_sep = input_ids == sep_id
    closes = is_sep.long()
    document = closes.cumsum(1) - closes
    index = torch.arange(seq, device=input_ids.device).expand(batch, seq)
    starts = torch.zeros_like(is_sep)
    starts[:, 0] = True
    starts[:, 1:] = is_sep[:, :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(1).values
    return document, index - first


def block_diagonal_mask(
    document: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """(batch, 1, seq, seq) booleans, True where query and key are in the same document
    (and the key is not padding). Every token keeps itself, so no row is empty."""
    same = document[:, :, None] == document[:, None, :]
    if attention_mask is not None:
        same &= attention_mask[:, None, :].bool()
    same |= torch.eye(document.size(1), dtype=torch.bool, device=document.device)
    return same[:, None]


def document_inputs(
    model, input_ids: torch.Tensor, sep_id: int, attention_mask: torch.Tensor | None = None
) -> dict:
    """Return the keyword arguments of the encoder (or the whole masked-LM) of ``model`` that keep
    attention within each document and restart positions at each one. With flash-attn the
    ids come back flattened to one row: the caller's hidden states are then (1, batch x seq,
    hidden), to be read back as (batch, seq, hidden)."""
    document, positions = document_layout(input_ids, sep_id)
    config = model.config
    if config._attn_implementation == "flash_attention_2":
        flat_positions = positions.reshape(1, -1)
        starts = torch.nonzero(flat_positions[0] == 0).squeeze(1)
        total = torch.tensor([flat_positions.size(1)], device=starts.device)
        cu = torch.cat([starts, total]).to(torch.int32)
        return {
            "input_ids": input_ids.reshape(1, -1),
            "position_ids": flat_positions,
            "cu_seq_lens_q": cu,
            "cu_seq_lens_k": cu,
            "max_length_q": input_ids.size(1),
            "max_length_k": input_ids.size(1),
        }
    return _masked_inputs(
        config, input_ids, positions, block_diagonal_mask(document, attention_mask)
    )


def _masked_inputs(
    config, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor
) -> dict:
    """SDPA's or eager attention's inputs with a (batch, 1, seq, seq) boolean ``mask``; for
    ModernBERT also its sliding-window variant for the local layers."""
    if config.model_type == "modernbert":
        seq = input_ids.size(1)
        index = torch.arange(seq, device=input_ids.device)
        window = (index[:, None] - index[None, :]).abs() <= config.sliding_window
        masks = {"full_attention": mask, "sliding_attention": mask & window}
        return {
            "input_ids": input_ids,
            "position_ids": positions,
            "attention_mask": {k: _for(config, m) for k, m in masks.items()},
        }
    return {"input_ids": input_ids, "position_ids": positions, "attention_mask": _for(config, mask)}


def sequence_lengths(
    input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, sep_id: int | None = None
) -> torch.Tensor:
    """Return the lengths of the sequences attention runs over in a collated batch (on the CPU), in
    order: each row's real tokens, or with ``sep_id`` (documents isolated) each document of a
    row (a [SEP] closes one; a row's tail is one too)."""
    batch, seq = input_ids.shape
    if sep_id is None:
        lengths = attention_mask.sum(1) if attention_mask is not None else torch.full((batch,), seq)
        return lengths[lengths > 0]
    document, _ = document_layout(input_ids, sep_id)
    sequence = (document + torch.arange(batch)[:, None] * seq).reshape(-1)
    if attention_mask is not None:
        sequence = sequence[attention_mask.reshape(-1).bool()]
    return torch.unique_consecutive(sequence, return_counts=True)[1]


def varlen_layout(attention_mask: torch.Tensor | None, lengths: torch.Tensor) -> dict:
    """Return the flat layout of a collated batch (on the CPU) whose sequences have ``lengths``
    (``sequence_lengths``), computed on the host: ``flat_index`` (the flat positions of the real
    tokens, in order), ``position_ids`` (1, tokens), restarting at 0 at each sequence,
    ``cu_seq_lens_q/k`` (int32, the cumulative lengths from 0) and ``max_length_q/k`` (the
    longest sequence, a Python int)."""
    tokens = int(lengths.sum())
    flat_index = (
        torch.nonzero(attention_mask.reshape(-1)).squeeze(1)
        if attention_mask is not None
        else torch.arange(tokens)
    )
    cu = torch.zeros(lengths.numel() + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    position_ids = (torch.arange(tokens) - cu[:-1].long().repeat_interleave(lengths))[None]
    longest = int(lengths.max()) if lengths.numel() else 0
    return {
        "flat_index": flat_index,
        "position_ids": position_ids,
        "cu_seq_lens_q": cu,
        "cu_seq_lens_k": cu.clone(),
        "max_length_q": longest,
        "max_length_k": longest,
    }


def flatten_rows(batch: dict) -> dict:
    """Flatten ``batch`` (laid out by ``varlen_layout``) in place: ``input_ids``, ``labels`` (and
    replaced-token detection's ``draws``) become (1, tokens) rows of the real tokens
    (``flat_index`` taken out, no ``attention_mask`` left). On the host in the loader, or on the
    device after masking there (an index already on the device: no wait)."""
    index = batch.pop("flat_index")
    batch.pop("attention_mask", None)
    for key in ("input_ids", "labels", "draws"):
        if key in batch:
            batch[key] = batch[key].reshape(-1).index_select(0, index)[None]
    return batch


def varlen_inputs(
    model,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    cu_seq_lens_q: torch.Tensor,
    cu_seq_lens_k: torch.Tensor,
    max_length_q: int,
    max_length_k: int,
) -> dict:
    """Return the encoder's keyword arguments for a flattened batch (``flatten_rows``): flash-attn's
    variable-length kernel gets the cumulative lengths as they are (attention mask None, so
    transformers builds none); SDPA and eager attention get the block-diagonal mask of the
    sequences (and ModernBERT's window), the same masks as ``document_inputs``."""
    if model.config._attn_implementation == "flash_attention_2":
        return {
            "input_ids": input_ids,
            "position_ids": position_ids,
            "cu_seq_lens_q": cu_seq_lens_q,
            "cu_seq_lens_k": cu_seq_lens_k,
            "max_length_q": max_length_q,
            "max_length_k": max_length_k,
        }
    index = torch.arange(input_ids.size(1), device=input_ids.device)
    sequence = torch.searchsorted(cu_seq_lens_q[1:].to(index.device, torch.long), index, right=True)
    return _masked_inputs(
        model.config, input_ids, position_ids, block_diagonal_mask(sequence[None])
    )


def padding_inputs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict:
    """Return the encoder's keyword arguments for a padded batch, its masks built here:
    transformers, given the 2-D padding mask, first asks whether it hides anything (``mask.all()``,
    a wait for the device on every forward, twice for ModernBERT), which mlmkit's loader has already
    answered (it drops the mask of a batch without padding). SDPA and eager attention get the
    key-padding mask as (batch, 1, 1, seq), ModernBERT's local layers also their window;
    flash-attn takes the 2-D mask as it is."""
    config = model.config
    own = architecture(config.model_type).padding_mask_2d  # DeBERTa builds its own masks
    if config._attn_implementation not in ("sdpa", "eager") or own:
        return {"input_ids": input_ids, "attention_mask": attention_mask}
    keys = attention_mask[:, None, None, :].bool()
    if config.model_type == "modernbert":
        index = torch.arange(input_ids.size(1), device=input_ids.device)
        window = (index[:, None] - index[None, :]).abs() <= config.sliding_window
        masks = {"full_attention": keys, "sliding_attention": keys & window}
        return {
            "input_ids": input_ids,
            "attention_mask": {k: _for(config, m) for k, m in masks.items()},
        }
    return {"input_ids": input_ids, "attention_mask": _for(config, keys)}


def _for(config, mask: torch.Tensor) -> torch.Tensor:
    """SDPA takes the boolean mask; eager attention adds its mask to the scores."""
    if config._attn_implementation != "eager":
        return mask
    return torch.zeros(mask.shape, device=mask.device).masked_fill_(
        ~mask, torch.finfo(torch.float32).min
    )
