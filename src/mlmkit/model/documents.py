"""Attention within each document of a packed block (``data.packing=documents``).

Packed blocks are ``[CLS] doc1 [SEP] doc2 [SEP] ... [SEP]``: every document ends with a
[SEP] (the masking never chooses special tokens, so they survive it). With document
isolation a token attends only to the tokens of its own document, and positions restart at
0 at the first token of each document, so a document reads as if it were alone, wherever
the packing put it. The layout is derived from the ids on the device (no extra data; on
SDPA no host synchronisation either, while flash-attn's cumulative lengths take one
``nonzero``):

* SDPA (CPU, and CUDA without flash-attn): a block-diagonal boolean mask of shape
  (batch, 1, seq, seq); for ModernBERT also its sliding-window variant for the local layers
  (eager attention: the same masks as additive -inf biases);
* flash-attn (``attn_implementation=flash_attention_2``): the batch is flattened into one row
  and each document is one sequence of flash-attn's variable-length kernel (cumulative
  sequence lengths), so no attention is computed across documents at all.
"""

from __future__ import annotations

import torch


def isolation_sep_id(packing: str, tokenizer) -> int | None:
    """The id that ends a document where ``data.packing`` isolates documents, else None."""
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


def block_diagonal_mask(document: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """(batch, 1, seq, seq) booleans, True where query and key are in the same document
    (and the key is not padding). Every token keeps itself, so no row is empty."""
    same = document[:, :, None] == document[:, None, :]
    if attention_mask is not None:
        same &= attention_mask[:, None, :].bool()
    same |= torch.eye(document.size(1), dtype=torch.bool, device=document.device)
    return same[:, None]


def document_inputs(model, input_ids: torch.Tensor, sep_id: int,
                    attention_mask: torch.Tensor | None = None) -> dict:
    """The keyword arguments of the encoder (or the whole masked-LM) of ``model`` that keep
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
        return {"input_ids": input_ids.reshape(1, -1), "position_ids": flat_positions,
                "cu_seq_lens_q": cu, "cu_seq_lens_k": cu,
                "max_length_q": input_ids.size(1), "max_length_k": input_ids.size(1)}
    mask = block_diagonal_mask(document, attention_mask)
    if config.model_type == "modernbert":
        seq = input_ids.size(1)
        index = torch.arange(seq, device=input_ids.device)
        window = (index[:, None] - index[None, :]).abs() <= config.sliding_window
        masks = {"full_attention": mask, "sliding_attention": mask & window}
        return {"input_ids": input_ids, "position_ids": positions,
                "attention_mask": {k: _for(config, m) for k, m in masks.items()}}
    return {"input_ids": input_ids, "position_ids": positions, "attention_mask": _for(config, mask)}


def padding_inputs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> dict:
    """The encoder's keyword arguments for a padded batch, its masks built here: transformers,
    given the 2-D padding mask, first asks whether it hides anything (``mask.all()``, a wait
    for the device on every forward, twice for ModernBERT), which mlmkit's loader has already
    answered (it drops the mask of a batch without padding). SDPA and eager attention get the
    key-padding mask as (batch, 1, 1, seq), ModernBERT's local layers also their window;
    flash-attn takes the 2-D mask as it is."""
    config = model.config
    if config._attn_implementation not in ("sdpa", "eager"):
        return {"input_ids": input_ids, "attention_mask": attention_mask}
    keys = attention_mask[:, None, None, :].bool()
    if config.model_type == "modernbert":
        index = torch.arange(input_ids.size(1), device=input_ids.device)
        window = (index[:, None] - index[None, :]).abs() <= config.sliding_window
        masks = {"full_attention": keys, "sliding_attention": keys & window}
        return {"input_ids": input_ids, "attention_mask": {k: _for(config, m) for k, m in masks.items()}}
    return {"input_ids": input_ids, "attention_mask": _for(config, keys)}


def _for(config, mask: torch.Tensor) -> torch.Tensor:
    """SDPA takes the boolean mask; eager attention adds its mask to the scores."""
    if config._attn_implementation != "eager":
        return mask
    return torch.zeros(mask.shape, device=mask.device).masked_fill_(~mask, torch.finfo(torch.float32).min)
