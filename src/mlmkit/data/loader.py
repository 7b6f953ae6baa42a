"""The training stream of one rank: endless micro-batches on the device, and the position
in the data as ``state_dict()`` / ``load_state_dict()`` for an exact resume.

Map mode (``BatchStream``, over a packed dataset) and streaming
(``mlmkit.data.streaming.StreamingBatches``) both give ``next()``, ``epoch`` and
``state_dict()``; a resume restores map mode's position with ``load_state_dict(state, world,
saved_world)`` and streaming's with ``load_ranks`` (the positions of all the checkpoint's ranks,
dealt out again on another number of processes); ``training_stream`` builds the one the config
asks for.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from mlmkit.data.packing import id_rows
from mlmkit.data.streaming import StreamingBatches
from mlmkit.errors import ConfigError
from mlmkit.masking.collator import MLMCollator
from mlmkit.model.bert import prediction_positions
from mlmkit.model.documents import flatten_rows, sequence_lengths, varlen_layout

log = logging.getLogger("mlmkit")


class DropFullAttentionMask:
    """Collate, drop ``attention_mask`` when the batch has no padding, and find the chosen
    positions for the sparse head.

    Runs in the dataloader (on the CPU, no device synchronisation); without a mask,
    SDPA can use its fused kernels. Packed blocks never need one.
    """

    def __init__(self, collator: MLMCollator) -> None:
        self.collator = collator

    def __call__(self, examples):
        batch = self.collator(examples)
        if bool(batch["attention_mask"].all()):
            del batch["attention_mask"]
        if "labels" in batch:
            batch["positions"], batch["targets"] = prediction_positions(batch["labels"])
        return batch


@dataclass
class BatchLayout:
    """What the loader found of a batch, on the host: ``positions``, its rows x width as
    collated (padding included: the budget's count, ``TrainState.tokens_seen``); ``lengths``,
    the lengths of the blocks attention runs over (each row's real tokens, or each document
    where documents are isolated: the throughput meter's count)."""

    positions: int
    lengths: tuple[int, ...]


class TrainingCollate(DropFullAttentionMask):
    """The training loader's collation: ``DropFullAttentionMask``, the batch's ``BatchLayout``
    (under ``"layout"``) and, with ``varlen`` (the model runs flash-attn), a padded batch or
    any batch of isolated documents (``sep_id``) laid out as one row of its real tokens for
    flash-attn's variable-length kernel (``model.documents.varlen_layout``), all on the host in
    the dataloader worker. Masked here, the batch is flattened here; with ``masking.on_device``
    it is flattened in the step, once masked (``flat_index`` rides along)."""

    def __init__(
        self, collator: MLMCollator, sep_id: int | None = None, varlen: bool = False
    ) -> None:
        super().__init__(collator)
        self.sep_id, self.varlen = sep_id, varlen

    def __call__(self, examples):
        batch = super().__call__(examples)
        ids, mask = batch["input_ids"], batch.get("attention_mask")
        lengths = sequence_lengths(ids, mask, self.sep_id)
        if self.varlen and (mask is not None or self.sep_id is not None):
            batch.update(varlen_layout(mask, lengths))
            if "labels" in batch:  # masked here: flattened here, the chosen positions with it
                flatten_rows(batch)
                batch["positions"], batch["targets"] = prediction_positions(batch["labels"])
        batch["layout"] = BatchLayout(ids.numel(), tuple(lengths.tolist()))
        return batch


class EpochBatchSampler(Sampler[list[tuple[int, int]]]):
    """Batches of (index, mask seed) for one rank: a seeded permutation per epoch, by rank.

    Rank r of w takes batches r, r + w, r + 2w, ... of the epoch's permutation, so ranks
    never overlap; ``skip`` batches at the start of the epoch are passed over (resume), after
    ``start`` samples taken by a run of another split (a resume on another number of
    processes or batch size goes on at the very next sample).
    Each row carries its own mask seed, a function of (seed, epoch, position in the
    epoch's order), so its masks are the same whichever dataloader worker collates it,
    after a resume, and for any split of a global batch: 2 processes x batch b draw the
    masks of 1 process x batch 2b.
    """

    def __init__(self, n: int, batch_size: int, rank: int, world: int, seed: int) -> None:
        self.n, self.batch_size, self.rank, self.world, self.seed = n, batch_size, rank, world, seed
        self.epoch = 0
        self.skip = 0
        self.start = 0  # samples of the epoch taken before these batches (by another split)

    def __len__(self) -> int:
        return (self.n - self.start) // (self.batch_size * self.world)

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        perm = torch.randperm(self.n, generator=g)
        base = (self.seed * 1_000_003 + self.epoch) * 1_000_003
        for b in range(self.skip, len(self)):
            start = self.start + (b * self.world + self.rank) * self.batch_size
            rows = perm[start : start + self.batch_size].tolist()
            yield [(i, (base + start + j) % 2**63) for j, i in enumerate(rows)]


class KeyedRows(torch.utils.data.Dataset):
    """Rows of a packed dataset fetched by (index, mask seed) as numpy arrays read from Arrow
    (``packing.id_rows``); the seed rides along."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> dict[str, Any]:
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: list[tuple[int, int]]) -> list[dict[str, Any]]:
        rows = id_rows(self.dataset, [k[0] for k in keys])  # one fetch for the batch
        return [{"input_ids": r, "mask_seed": k[1]} for r, k in zip(rows, keys)]


class BatchStream:
    """Endless micro-batches over epochs of a packed dataset, moved to the device."""

    def __init__(self, loader: DataLoader, device: torch.device) -> None:
        self.loader = loader
        self.sampler: EpochBatchSampler = loader.batch_sampler
        self.device = device
        self.epoch = 0
        self.start = 0  # samples of this epoch taken before this split of the batch
        self.offset = 0  # micro-batches of this rank taken since
        self._it = None

    def _start_epoch(self) -> None:
        self.sampler.epoch, self.sampler.start = self.epoch, self.start
        self.sampler.skip = self.offset
        # the loader's generator only seeds workers; reseeding it per epoch keeps worker
        # seeds reproducible without touching torch's global RNG (which dropout uses)
        self.loader.generator.manual_seed(self.sampler.seed * 100_003 + self.epoch)
        self._it = iter(self.loader)

    def __next__(self) -> dict[str, torch.Tensor]:
        if self._it is None:
            self._start_epoch()
        try:
            batch = next(self._it)
        except StopIteration:
            self.epoch, self.start, self.offset = self.epoch + 1, 0, 0
            self._start_epoch()
            batch = next(self._it)
        self.offset += 1
        return to_device(batch, self.device)

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "start": self.start,
            "offset": self.offset,
            "batch_size": self.sampler.batch_size,
        }

    def load_state_dict(self, state: dict[str, Any], world: int, saved_world: int) -> None:
        """Continue where ``state`` stood; with another number of processes or another
        batch size, at the epoch's next sample: none skipped, none repeated."""
        if state.get("streaming"):
            raise ConfigError(
                "The checkpoint was written with data.streaming=true; resume with the same setting."
            )
        batch_size = self.sampler.batch_size
        saved_batch = state.get("batch_size", batch_size)
        self.epoch, self.start, self.offset = state["epoch"], state.get("start", 0), state["offset"]
        if (saved_world, saved_batch) != (world, batch_size):
            self.start += self.offset * saved_world * saved_batch
            self.offset = 0
            log.info(
                "Resuming with %d process(es) x %d sequences per micro-batch from a checkpoint "
                "written with %d x %d: the epoch goes on at its sample %d, in batches split "
                "another way.",
                world,
                batch_size,
                saved_world,
                saved_batch,
                self.start,
            )
        self._it = None


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Return the batch's tensors on ``device`` (without waiting); its other values (the layout, the
    longest sequence) stay on the host."""
    return {
        k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
        for k, v in batch.items()
    }


def training_stream(
    cfg,
    collator: MLMCollator,
    train_set,
    accelerator,
    sep_id: int | None = None,
    varlen: bool = False,
):
    """Return the stream of micro-batches of this rank: ``BatchStream`` in map mode,
    ``StreamingBatches`` when ``data.streaming``; ``sep_id``: the id that ends a document where
    documents are isolated; ``varlen``: the model runs flash-attn (``TrainingCollate``).

    Our own sampler (not accelerate's prepared loader, which collates a batch ahead)
    shards by rank and gives every row its own mask seed, so a resumed run sees the same
    batches with the same masks, with or without dataloader workers. The workers persist from
    one epoch to the next: a new epoch (or a resume) sets the sampler's place and iterates the
    same workers again, instead of forking new ones from the (CUDA) training process.
    """
    tc, device = cfg.train, accelerator.device
    workers = cfg.workers(device.type)
    collate = TrainingCollate(collator, sep_id, varlen)
    if cfg.data.streaming:
        return StreamingBatches(train_set, collate, workers, device, device.type == "cuda")
    loader = DataLoader(
        KeyedRows(train_set),
        batch_sampler=EpochBatchSampler(
            len(train_set),
            tc.batch_size,
            accelerator.process_index,
            accelerator.num_processes,
            tc.seed,
        ),
        collate_fn=collate,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        persistent_workers=workers > 0,
        prefetch_factor=4 if workers > 0 else None,
        generator=torch.Generator(),
    )
    return BatchStream(loader, device)
