"""Masking for masked-language-model pretraining, as a collator.

Each strategy masks a whole batch in tensor operations. The training loader gives every
row its own mask seed (so a row's masks do not depend on its batch, worker or process),
and a generator draws from one seed at a time: those batches are masked a row at a time.

Which real tokens (never [CLS], [SEP], [PAD] or any other special token) are chosen for
prediction depends on the strategy:

- ``bernoulli`` (BERT, Devlin et al., 2019): each token with probability ``mlm_probability``;
- ``whole_word``: each *word* with that probability, and then all its sub-tokens, so the
  share of chosen tokens is still ``mlm_probability`` on average. Words come from the
  vocabulary: WordPiece ``##`` continuations, or the ``Ġ``/``▁`` word-start marks of
  byte-level BPE and SentencePiece. In scripts written without spaces (Thai, Lao, Khmer,
  Japanese kana) one such "word" can be a clause: a word is cut into pieces of at most
  ``max_word_tokens`` sub-tokens, each a word of its own, and a token of CJK ideographs
  starts a word (as WordPiece's pre-tokenizer makes each ideograph one);
- ``span`` (SpanBERT, Joshi et al., 2020): spans of whole words whose lengths follow a
  geometric distribution (p=0.2, clipped at 10 words), until round(p x real tokens) of
  each sequence are chosen (a row the whole spans cannot fill exactly takes one more span
  with the probability that keeps the share at p on average);
- ``fixed`` (cramming, Geiping & Goldstein, 2023): exactly round(p x (length - 2)) per
  sequence, the length counted without padding and the [CLS] ... [SEP] frame, so every
  packed batch predicts the same number of positions (static shapes).

Of the chosen, ``mask_replace_prob`` become [MASK], ``random_replace_prob`` a random
non-special token, and the rest stay as they are; the decision is made per token, per
word (whole_word) or per span (span). ``labels`` hold the original id at chosen positions
and ``IGNORE_INDEX`` (-100) elsewhere, so the loss is taken only where the model must predict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mlmkit.config.schema import check_masking
from mlmkit.errors import ConfigError

IGNORE_INDEX = -100


def _is_ideograph(ch: str) -> bool:
    import unicodedata

    return unicodedata.name(ch, "").startswith(
        ("CJK UNIFIED IDEOGRAPH", "CJK COMPATIBILITY IDEOGRAPH")
    )


def _bincount(index: torch.Tensor, size: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.bincount(index, weights, minlength=size)`` for indices below ``size``, without
    its host wait on a GPU (bincount reads the largest index to size its output)."""
    if weights is None:
        return torch.zeros(size, dtype=torch.int64, device=index.device).index_add_(
            0, index, torch.ones_like(index)
        )
    return torch.zeros(size, dtype=weights.dtype, device=index.device).index_add_(0, index, weights)


def _unsort(values: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """``out[order] = values`` for the permutation ``order`` (boolean indexing would wait for the
    device to count the chosen positions)."""
    return torch.zeros_like(values).scatter_(0, order, values)


def continuation_lookup(tokenizer, size: int) -> torch.Tensor:
    """Vocab id -> True where the token continues the previous word: WordPiece's ``##`` pieces
    (the tokenizer's model says it is WordPiece: RoBERTa's byte-level BPE has tokens such as
    ``##`` too, which start words), else every piece without the word-start mark of a byte-level
    BPE (``Ġ``) or of SentencePiece (``▁``)."""
    vocab = tokenizer.get_vocab()
    cont = torch.zeros(size, dtype=torch.bool)
    tokens = list(vocab)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    kind = type(backend.model).__name__ if backend is not None else ""
    if kind == "WordPiece" or (not kind and any(t.startswith("##") for t in tokens)):
        prefix = getattr(backend.model, "continuing_subword_prefix", "##") if kind else "##"
        ids = [i for t, i in vocab.items() if t.startswith(prefix)]
    else:
        # the mark most tokens carry (a 250k-token SentencePiece vocabulary holds a few "Ġ..."
        # tokens of text too, as a byte-level BPE's may hold "▁...")
        count = {m: sum(t.startswith(m) for t in tokens) for m in ("Ġ", "▁")}
        mark = max(count, key=count.get)
        if not count[mark]:  # no sub-word marks: every token is a word
            return cont
        special = set(tokenizer.all_special_ids)
        ids = [i for t, i in vocab.items() if not t.startswith(mark) and i not in special]
        # a token of CJK ideographs starts a word, though no space came before it
        text = (lambda t: t) if mark == "▁" else (lambda t: tokenizer.convert_tokens_to_string([t]))
        starts = {
            i
            for t, i in vocab.items()
            if not t.isascii() and (s := text(t).strip()) and _is_ideograph(s[0])
        }
        ids = [i for i in ids if i not in starts]
    cont[[i for i in ids if i < size]] = True
    return cont


class MLMCollator:
    """Pads a list of examples and masks them (argument names as transformers' collator).

    Args:
        tokenizer: a tokenizer with ``mask_token_id``, ``pad_token_id`` and special tokens.
        mlm_probability: share of real tokens chosen for prediction.
        mask_replace_prob: share of the chosen replaced by [MASK].
        random_replace_prob: share of the chosen replaced by a random non-special token.
        pad_to_multiple_of: pad the batch length up to a multiple of this when the batch
            needs padding at all (rows of equal length stay as they are, without a mask).
        seed: seed of the collator's own generator (None: drawn from torch's global RNG).
            In dataloader workers each worker derives its own stream from the seed and the
            worker's seed, so workers never repeat each other's masks.
        strategy: bernoulli | whole_word | span | fixed (see the module docstring).
        span_p, span_max_words: the geometric distribution of span lengths, in words.
        max_word_tokens: a longer word is cut into words of at most this many sub-tokens
            (whole_word and span).
        apply_mask: False to only pad (the masking then runs in the training step, on the
            device, through ``mask``).
        draws: also give each position a uniform draw in [0, 1) (``draws``, the shape of
            ``input_ids``), from the same stream as its row's masks, after them: replaced-token
            detection samples the generator's token at a chosen position with it, so the samples,
            like the masks, are the same in any worker, process split or resume.
    """

    def __init__(
        self,
        tokenizer,
        mlm_probability: float = 0.15,
        mask_replace_prob: float = 0.8,
        random_replace_prob: float = 0.1,
        pad_to_multiple_of: int | None = None,
        seed: int | None = None,
        strategy: str = "bernoulli",
        span_p: float = 0.2,
        span_max_words: int = 10,
        apply_mask: bool = True,
        max_word_tokens: int = 8,
        draws: bool = False,
    ) -> None:
        check_masking(
            mlm_probability,
            mask_replace_prob,
            random_replace_prob,
            strategy,
            span_p,
            span_max_words,
        )
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ConfigError("pad_to_multiple_of must be a positive integer.")
        if tokenizer.mask_token_id is None or tokenizer.pad_token_id is None:
            raise ConfigError(
                "The tokenizer needs a [MASK] and a [PAD] token for masked-LM training."
            )

        self.tokenizer = tokenizer
        self.mlm_probability = float(mlm_probability)
        self.mask_replace_prob = float(mask_replace_prob)
        self.random_replace_prob = float(random_replace_prob)
        self.pad_to_multiple_of = pad_to_multiple_of
        self.seed = seed
        self.strategy = strategy
        self.span_p = float(span_p)
        self.span_max_words = int(span_max_words)
        if max_word_tokens < 1:
            raise ConfigError(f"masking.max_word_tokens must be at least 1, got {max_word_tokens}.")
        self.max_word_tokens = int(max_word_tokens)
        self.apply_mask = apply_mask
        self.draws = draws
        self.mask_id = int(tokenizer.mask_token_id)
        self.pad_id = int(tokenizer.pad_token_id)

        vocab_size = max(len(tokenizer), max(tokenizer.get_vocab().values()) + 1)
        special = torch.zeros(vocab_size, dtype=torch.bool)
        special_ids = set(tokenizer.all_special_ids)
        special_ids.update(getattr(tokenizer, "added_tokens_decoder", {}).keys())
        special[[i for i in special_ids if 0 <= i < vocab_size]] = True
        self.special_lookup = special  # vocab id -> is special
        self.continuation = continuation_lookup(tokenizer, vocab_size) & ~special
        self.random_ids = torch.nonzero(~special).squeeze(1)  # candidates for random replacement
        if self.random_ids.numel() == 0:
            raise ConfigError(
                "The tokenizer has no non-special tokens to sample replacements from."
            )

        self.generator = torch.Generator()
        self.generator.manual_seed(
            seed if seed is not None else int(torch.randint(2**62, ()).item())
        )
        self._worker_key: tuple[int, int] | None = None
        self._device_tables: dict[torch.device, tuple] = {}
        # masking inside the training step (masking.on_device) draws from a generator of its own,
        # on the device; its state is part of a checkpoint (step_generator_state)
        self._step_generator: torch.Generator | None = None
        self._step_state: torch.Tensor | None = None

    def set_mlm_probability(self, p: float) -> None:
        """Change the rate between batches (a mask-rate schedule)."""
        check_masking(p, self.mask_replace_prob, self.random_replace_prob)
        self.mlm_probability = float(p)

    # -- reproducibility --------------------------------------------------------------
    def reseed(self, seed: int) -> None:
        """Draw from ``seed`` on, as a collator built with it would: the vocabulary's tables are
        kept (building them reads the whole vocabulary, most of a second for XLM-R's 250,002
        tokens)."""
        self.seed = seed
        self.generator.manual_seed(seed)
        self._worker_key = None

    def _sync_worker_generator(self) -> None:
        info = torch.utils.data.get_worker_info()
        if info is None:
            return
        key = (info.id, info.seed)
        if key != self._worker_key:
            base = self.seed if self.seed is not None else 0
            self.generator.manual_seed((base * 1_000_003 + info.seed) % (2**63))
            self._worker_key = key

    # -- pickling: what dataloader workers receive -----------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """Return the collator with its tensors and generator states as numpy arrays, which
        pickle by value. Dataloader workers started by spawn or forkserver (Python 3.14's
        default) receive it so: torch would pass a tensor through shared memory, and a
        generator's state, a temporary tensor, is freed before the worker maps it."""
        state = self.__dict__.copy()
        for name in ("special_lookup", "continuation", "random_ids"):
            state[name] = state[name].numpy()
        state["generator"] = self.generator.get_state().numpy()
        step_state = self.step_generator_state()
        state["_step_state"] = None if step_state is None else step_state.cpu().numpy()
        state["_step_generator"], state["_device_tables"] = None, {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        for name in ("special_lookup", "continuation", "random_ids"):
            state[name] = torch.from_numpy(state[name])
        generator = torch.Generator()
        generator.set_state(torch.from_numpy(state["generator"]))
        state["generator"] = generator
        if state["_step_state"] is not None:
            state["_step_state"] = torch.from_numpy(state["_step_state"])
        self.__dict__.update(state)

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])

    def step_generator_state(self) -> torch.Tensor | None:
        """Return the state of the generator that masks inside the training step (None before its
        first draw in a fresh run)."""
        return (
            self._step_generator.get_state()
            if self._step_generator is not None
            else self._step_state
        )

    def load_step_generator_state(self, state: torch.Tensor | None) -> None:
        """Restore ``step_generator_state()``; applied on the device at the next draw."""
        self._step_state, self._step_generator = state, None

    def _step_generator_on(self, device: torch.device) -> torch.Generator:
        g = self._step_generator
        if g is None or g.device != device:
            state = g.get_state() if g is not None else self._step_state
            g = torch.Generator(device=device)
            if state is None:  # a fresh run: seeded from the collator's own generator
                g.manual_seed(int(torch.randint(2**62, (), generator=self.generator)))
            else:
                g.set_state(state)
            self._step_generator, self._step_state = g, None
        return g

    def _tables(self, device: torch.device):
        """Return the special-token, continuation and replacement lookups on ``device``."""
        if device.type == "cpu":
            return self.special_lookup, self.continuation, self.random_ids
        if device not in self._device_tables:
            self._device_tables[device] = (
                self.special_lookup.to(device),
                self.continuation.to(device),
                self.random_ids.to(device),
            )
        return self._device_tables[device]

    # -- collation --------------------------------------------------------------------
    def pad(self, examples: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Stack examples into ``input_ids`` and ``attention_mask``, padding on the right."""
        seqs = [
            torch.as_tensor(e["input_ids"] if isinstance(e, dict) else e, dtype=torch.long)
            for e in examples
        ]
        lengths = torch.tensor([len(s) for s in seqs])
        max_len = int(lengths.max())
        if self.pad_to_multiple_of and int(lengths.min()) < max_len:  # only batches that pad
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

    def mask_in_step(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``mask`` inside the training step (``masking.on_device``): on ``input_ids``'s device,
        from the step's own generator there, whose state a checkpoint keeps. No host wait."""
        return self.mask(input_ids, attention_mask, self._step_generator_on(input_ids.device))

    def draw_in_step(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Return the ``draws`` of a batch ``mask_in_step`` masked, from the same generator."""
        g = self._step_generator_on(input_ids.device)
        return torch.rand(input_ids.shape, generator=g, device=input_ids.device)

    def mask(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (masked input_ids, labels); runs on ``input_ids``'s device, leaves it as is.
        ``generator``: where the draws come from (the collator's own, on the CPU, by default)."""
        special, cont, random_ids = self._tables(input_ids.device)
        g = generator if generator is not None else self.generator
        ids = input_ids.clamp(0, special.numel() - 1)
        candidates = ~special[ids] & (input_ids != self.pad_id)
        if attention_mask is not None:
            candidates &= attention_mask.bool()

        chosen, group = self._choose(ids, candidates, cont, special, g)
        labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))

        # One uniform draw per group (token, word or span) decides [MASK] / random / unchanged.
        u = torch.rand(input_ids.numel(), generator=g, device=input_ids.device)[group]
        to_mask = chosen & (u < self.mask_replace_prob)
        to_random = (
            chosen
            & (u >= self.mask_replace_prob)
            & (u < self.mask_replace_prob + self.random_replace_prob)
        )

        out = torch.where(to_mask, self.mask_id, input_ids)
        picks = torch.randint(
            random_ids.numel(), input_ids.shape, generator=g, device=input_ids.device
        )
        out = torch.where(to_random, random_ids[picks], out)
        return out, labels

    def _word_ids(
        self, ids: torch.Tensor, cont: torch.Tensor, special: torch.Tensor
    ) -> torch.Tensor:
        """Batch-unique word index of every position (a word = a start token + continuations).

        A continuation right after a special token (a word cut by packing) starts a word, and
        so does every ``max_word_tokens``-th sub-token of a word.
        """
        starts = ~cont[ids]
        starts[:, 0] = True
        starts[:, 1:] |= special[ids[:, :-1]]
        pos = torch.arange(ids.size(1), device=ids.device).expand_as(ids)
        in_word = (
            pos - torch.where(starts, pos, 0).cummax(dim=1).values
        )  # sub-tokens since the start
        starts |= in_word % self.max_word_tokens == 0
        word = starts.long().cumsum(dim=1) - 1
        return word + torch.arange(ids.size(0), device=ids.device)[:, None] * ids.size(1)

    def _choose(self, ids, candidates, cont, special, g) -> tuple[torch.Tensor, torch.Tensor]:
        """(chosen positions, group id of each position for the 80/10/10 decision)."""
        p = self.mlm_probability
        positions = torch.arange(ids.numel(), device=ids.device).view_as(ids)
        if self.strategy == "bernoulli":
            return (
                torch.rand(ids.shape, generator=g, device=ids.device) < p
            ) & candidates, positions
        if self.strategy == "whole_word":
            word = self._word_ids(ids, cont, special)
            chosen_word = torch.rand(ids.numel(), generator=g, device=ids.device) < p
            return chosen_word[word] & candidates, word
        if self.strategy == "fixed":
            # the row's length without padding and without its [CLS] ... [SEP] frame, so
            # every packed row (whatever [SEP]s it holds inside) predicts the same count
            frame = (ids != self.pad_id).sum(dim=1) - 2
            k = torch.minimum(torch.round(frame.clamp(min=0) * p), candidates.sum(dim=1)).long()
            scores = torch.rand(ids.shape, generator=g, device=ids.device).masked_fill(
                ~candidates, 2.0
            )
            rank = torch.empty_like(positions)
            rank.scatter_(
                1,
                scores.argsort(dim=1),
                torch.arange(ids.size(1), device=ids.device).expand_as(ids),
            )
            return (rank < k[:, None]) & candidates, positions
        return self._choose_spans(ids, candidates, cont, special, g)

    def _choose_spans(self, ids, candidates, cont, special, g) -> tuple[torch.Tensor, torch.Tensor]:
        """SpanBERT-style spans of whole words, vectorised over the batch.

        Each row's words are cut into consecutive segments: after every word a segment ends
        with probability ``span_p``, and at the latest after ``span_max_words`` words, so
        segment lengths follow the geometric distribution clipped at span_max_words (the
        geometric is memoryless, so restarting after a clip draws a fresh length). Segments
        are taken in random order while they fit in the row's budget of round(p x real
        tokens); a second pass lets smaller segments fill what a large one left over, and a row
        still short takes one more segment with probability (tokens short) / (its size).
        """
        n_rows, length = ids.shape
        dev = ids.device
        n = ids.numel()
        word = self._word_ids(ids, cont, special).reshape(-1)  # batch-unique word slots < n
        tokens_per_word = _bincount(word, n)
        cand_per_word = _bincount(word, n, candidates.reshape(-1).float())
        ok = (tokens_per_word > 0) & (cand_per_word == tokens_per_word)  # only candidate tokens

        slot = torch.arange(n, device=dev)
        row_of_slot = slot // length
        brk = torch.rand(n, generator=g, device=dev) < self.span_p  # a segment ends after this word
        start = ~ok | (slot % length == 0)
        start[1:] |= brk[:-1] | ~ok[:-1]
        first = torch.cummax(torch.where(start, slot, 0), 0).values  # where each segment began
        start |= (slot - first) % self.span_max_words == 0
        seg = torch.cumsum(start, 0) - 1  # segment of each word slot (< n)

        # segments never mix ok and other words, and never cross rows
        seg_tokens = _bincount(seg, n, tokens_per_word.float())
        seg_ok = torch.zeros(n, dtype=torch.bool, device=dev).scatter_(0, seg, ok)
        seg_row = torch.zeros(n, dtype=torch.long, device=dev).scatter_(0, seg, row_of_slot)
        valid = seg_ok & (seg_tokens > 0)

        budget = torch.round(candidates.sum(dim=1) * self.mlm_probability)
        order = torch.argsort(seg_row * 2 + torch.rand(n, generator=g, device=dev) + (~valid) * 1.5)
        rows_sorted = seg_row[order]
        sizes_sorted = seg_tokens[order]
        selected = torch.zeros(n, dtype=torch.bool, device=dev)
        remaining = budget.clone()
        for _ in range(2):
            avail = (valid & ~selected)[order] & (sizes_sorted <= remaining[rows_sorted])
            s = sizes_sorted * avail
            per_row = _bincount(rows_sorted, n_rows, s)
            within = torch.cumsum(s, 0) - (torch.cumsum(per_row, 0) - per_row)[rows_sorted]
            take = avail & (within <= remaining[rows_sorted])
            selected |= _unsort(take, order)
            remaining = remaining - _bincount(rows_sorted, n_rows, s * take)
        # A row left short of its budget by segments too large to fit (words of many sub-tokens)
        # takes its next segment with probability remaining / size: the share averages p.
        avail = (valid & ~selected)[order] & (remaining[rows_sorted] > 0)
        count = _bincount(rows_sorted, n_rows, avail.float())
        nth = torch.cumsum(avail.float(), 0) - (torch.cumsum(count, 0) - count)[rows_sorted]
        chance = remaining[rows_sorted] / sizes_sorted.clamp(min=1)
        take = avail & (nth == 1) & (torch.rand(n, generator=g, device=dev) < chance)
        selected |= _unsort(take, order)

        chosen = selected[seg][word].view_as(ids) & candidates
        return chosen, seg[word].view_as(ids)

    def __call__(self, examples: Sequence[Any]) -> dict[str, torch.Tensor]:
        """Pad and mask. Examples may carry ``mask_seed``: each row is then masked from its
        own seed alone, so its masks are the same in any worker, after a resume, and however
        the rows are split into batches and processes."""
        first = examples[0] if len(examples) else None
        row_seeds = isinstance(first, dict) and "mask_seed" in first
        if not row_seeds:
            self._sync_worker_generator()
        input_ids, attention_mask = self.pad(examples)
        if not self.apply_mask:
            return {"input_ids": input_ids, "attention_mask": attention_mask}
        if row_seeds:
            rows = []
            for i, example in enumerate(examples):
                self.generator.manual_seed(int(example["mask_seed"]))
                rows.append(self._mask_and_draw(input_ids[i : i + 1], attention_mask[i : i + 1]))
            parts = [torch.cat(column) for column in zip(*rows)]
        else:
            parts = self._mask_and_draw(input_ids, attention_mask)
        batch = {"input_ids": parts[0], "attention_mask": attention_mask, "labels": parts[1]}
        if self.draws:
            batch["draws"] = parts[2]
        return batch

    def _mask_and_draw(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple:
        """``mask``'s (masked ids, labels), then with ``draws`` a uniform draw per position."""
        masked, labels = self.mask(input_ids, attention_mask)
        if not self.draws:
            return masked, labels
        return masked, labels, torch.rand(input_ids.shape, generator=self.generator)
