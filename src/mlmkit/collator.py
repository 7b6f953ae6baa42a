"""BERT's 80-10-10 masking as a vectorised collator.

Of the real tokens of each sequence (never [CLS], [SEP], [PAD] or any other special
token), each is chosen for prediction with probability ``mlm_probability``. Of the chosen,
``mask_replace_prob`` become [MASK], ``random_replace_prob`` become a random non-special
token, and the rest stay as they are. ``labels`` hold the original id at chosen positions
and -100 elsewhere, so the loss is taken only where the model must predict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mlmkit.errors import ConfigError

IGNORE_INDEX = -100


class MLMCollator:
    """Pads a list of examples and masks them (argument names as transformers' collator).

    Args:
        tokenizer: a tokenizer with ``mask_token_id``, ``pad_token_id`` and special tokens.
        mlm_probability: share of real tokens chosen for prediction.
        mask_replace_prob: share of the chosen replaced by [MASK].
        random_replace_prob: share of the chosen replaced by a random non-special token.
        pad_to_multiple_of: pad the batch length up to a multiple of this.
        seed: seed of the collator's own generator (None: drawn from torch's global RNG).
            In dataloader workers each worker derives its own stream from the seed and the
            worker's seed, so workers never repeat each other's masks.
    """

    def __init__(
        self,
        tokenizer,
        mlm_probability: float = 0.15,
        mask_replace_prob: float = 0.8,
        random_replace_prob: float = 0.1,
        pad_to_multiple_of: int | None = None,
        seed: int | None = None,
    ) -> None:
        if not 0.0 < mlm_probability < 1.0:
            raise ConfigError(f"mlm_probability must be in (0, 1), got {mlm_probability}.")
        if not (0.0 <= mask_replace_prob <= 1.0 and 0.0 <= random_replace_prob <= 1.0):
            raise ConfigError("mask_replace_prob and random_replace_prob must be in [0, 1].")
        if mask_replace_prob + random_replace_prob > 1.0 + 1e-9:
            raise ConfigError(
                "mask_replace_prob + random_replace_prob must not exceed 1 "
                f"(got {mask_replace_prob} + {random_replace_prob})."
            )
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ConfigError("pad_to_multiple_of must be a positive integer.")
        if tokenizer.mask_token_id is None or tokenizer.pad_token_id is None:
            raise ConfigError("The tokenizer needs a [MASK] and a [PAD] token for masked-LM training.")

        self.tokenizer = tokenizer
        self.mlm_probability = float(mlm_probability)
        self.mask_replace_prob = float(mask_replace_prob)
        self.random_replace_prob = float(random_replace_prob)
        self.pad_to_multiple_of = pad_to_multiple_of
        self.seed = seed
        self.mask_id = int(tokenizer.mask_token_id)
        self.pad_id = int(tokenizer.pad_token_id)

        vocab_size = max(len(tokenizer), max(tokenizer.get_vocab().values()) + 1)
        special = torch.zeros(vocab_size, dtype=torch.bool)
        special_ids = set(tokenizer.all_special_ids)
        special_ids.update(getattr(tokenizer, "added_tokens_decoder", {}).keys())
        special[[i for i in special_ids if 0 <= i < vocab_size]] = True
        self.special_lookup = special  # vocab id -> is special
        self.random_ids = torch.nonzero(~special).squeeze(1)  # candidates for random replacement
        if self.random_ids.numel() == 0:
            raise ConfigError("The tokenizer has no non-special tokens to sample replacements from.")

        self.generator = torch.Generator()
        self.generator.manual_seed(seed if seed is not None else int(torch.randint(2**62, ()).item()))
        self._worker_key: tuple[int, int] | None = None

    # -- reproducibility --------------------------------------------------------------
    def _sync_worker_generator(self) -> None:
        info = torch.utils.data.get_worker_info()
        if info is None:
            return
        key = (info.id, info.seed)
        if key != self._worker_key:
            base = self.seed if self.seed is not None else 0
            self.generator.manual_seed((base * 1_000_003 + info.seed) % (2**63))
            self._worker_key = key

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])

    # -- collation --------------------------------------------------------------------
    def pad(self, examples: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Stack examples into ``input_ids`` and ``attention_mask``, padding on the right."""
        seqs = [torch.as_tensor(e["input_ids"] if isinstance(e, dict) else e, dtype=torch.long)
                for e in examples]
        lengths = torch.tensor([len(s) for s in seqs])
        max_len = int(lengths.max())
        if self.pad_to_multiple_of:
            m = self.pad_to_multiple_of
            max_len = (max_len + m - 1) // m * m
        if all(len(s) == max_len for s in seqs):
            input_ids = torch.stack(seqs)
        else:
            input_ids = torch.full((len(seqs), max_len), self.pad_id, dtype=torch.long)
            for i, s in enumerate(seqs):
                input_ids[i, : len(s)] = s
        attention_mask = (torch.arange(max_len)[None, :] < lengths[:, None]).long()
        return input_ids, attention_mask

    def mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (masked input_ids, labels) for a batch of ids; ``input_ids`` is not modified."""
        g = self.generator
        lookup = self.special_lookup
        ids = input_ids.clamp(0, lookup.numel() - 1)
        candidates = ~lookup[ids]
        if attention_mask is not None:
            candidates &= attention_mask.bool()
        candidates &= input_ids != self.pad_id

        chosen = (torch.rand(input_ids.shape, generator=g) < self.mlm_probability) & candidates
        labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))

        # One uniform draw per position decides [MASK] / random / unchanged.
        u = torch.rand(input_ids.shape, generator=g)
        to_mask = chosen & (u < self.mask_replace_prob)
        to_random = chosen & (u >= self.mask_replace_prob) & (u < self.mask_replace_prob + self.random_replace_prob)

        out = input_ids.clone()
        out[to_mask] = self.mask_id
        n_random = int(to_random.sum())
        if n_random:
            picks = torch.randint(self.random_ids.numel(), (n_random,), generator=g)
            out[to_random] = self.random_ids[picks]
        return out, labels

    def __call__(self, examples: Sequence[Any]) -> dict[str, torch.Tensor]:
        self._sync_worker_generator()
        input_ids, attention_mask = self.pad(examples)
        masked, labels = self.mask(input_ids, attention_mask)
        return {"input_ids": masked, "attention_mask": attention_mask, "labels": labels}
