"""The training loader: batches laid out on the host (the meter's blocks; for flash-attn one row of
real tokens), and workers that persist across epochs with an exact resume."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from mlmkit.data.loader import BatchLayout, TrainingCollate
from mlmkit.masking.collator import IGNORE_INDEX, MLMCollator


def _rows(tokenizer, lengths, seed=0):
    """``[CLS] words [SEP]`` rows of the given lengths (special tokens included)."""
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "input_ids": [
                tokenizer.cls_token_id,
                *torch.randint(10, len(tokenizer), (n - 2,), generator=g).tolist(),
                tokenizer.sep_token_id,
            ],
            "mask_seed": seed * 100 + i,
        }
        for i, n in enumerate(lengths)
    ]


def test_a_padded_batch_is_flattened_for_flash_attn_on_the_host(tokenizer):
    """Rows of 5, 3 and 7 tokens padded to 8: one row of the 15 real tokens, positions restarting
    at each row, cumulative lengths 0, 5, 8, 15, the longest (7) a Python int; the labels and the
    chosen positions follow the flattening."""
    examples = _rows(tokenizer, (5, 3, 7))
    collator = MLMCollator(tokenizer, mlm_probability=0.4, seed=0, pad_to_multiple_of=8)
    padded = TrainingCollate(collator)(examples)  # SDPA: the padded batch as before
    assert padded["input_ids"].shape == (3, 8) and padded["layout"] == BatchLayout(24, (5, 3, 7))
    assert not ({"flat_index", "cu_seq_lens_q", "position_ids"} & set(padded))

    flat = TrainingCollate(collator, varlen=True)(examples)
    real = padded["attention_mask"].bool()
    assert flat["layout"] == BatchLayout(24, (5, 3, 7))
    assert "attention_mask" not in flat and "flat_index" not in flat
    assert torch.equal(flat["input_ids"], padded["input_ids"][real][None])
    assert torch.equal(flat["labels"], padded["labels"][real][None])
    assert flat["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3, 4, 5, 6]]
    assert flat["cu_seq_lens_q"].tolist() == flat["cu_seq_lens_k"].tolist() == [0, 5, 8, 15]
    assert flat["cu_seq_lens_q"].dtype == torch.int32
    assert flat["max_length_q"] == flat["max_length_k"] == 7 and type(flat["max_length_q"]) is int
    chosen = int((flat["labels"] != IGNORE_INDEX).sum())
    assert chosen > 0 and torch.equal(
        flat["labels"][0, flat["positions"][:chosen]], flat["targets"][:chosen]
    )
    assert (flat["targets"][chosen:] == IGNORE_INDEX).all()


def test_isolated_documents_are_one_sequence_each(tokenizer):
    """A block [CLS] a b [SEP] c d [SEP] e f g (the last document cut by the block's end) beside
    one of [CLS] a [SEP] b c d e f g [SEP]: documents of 4, 3, 3 and 3, 7 tokens."""
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    examples = [
        {"input_ids": [cls, 11, 12, sep, 13, 14, sep, 15, 16, 17], "mask_seed": 1},
        {"input_ids": [cls, 11, sep, 12, 13, 14, 15, 16, 17, sep], "mask_seed": 2},
    ]
    collator = MLMCollator(tokenizer, mlm_probability=0.3, seed=0)
    sdpa = TrainingCollate(collator, sep_id=sep)(examples)
    assert sdpa["input_ids"].shape == (2, 10) and sdpa["layout"] == BatchLayout(20, (4, 3, 3, 3, 7))
    flat = TrainingCollate(collator, sep_id=sep, varlen=True)(examples)
    assert torch.equal(flat["input_ids"], sdpa["input_ids"].reshape(1, -1))
    assert flat["cu_seq_lens_q"].tolist() == [0, 4, 7, 10, 13, 20] and flat["max_length_q"] == 7
    assert flat["position_ids"].tolist() == [
        [0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 4, 5, 6]
    ]


def test_masked_on_the_device_the_batch_is_flattened_in_the_step(tokenizer):
    """With masking.on_device the worker pads and lays out; the step masks the padded rows (a row's
    strategy sees its own row) and then flattens them by the host's index."""
    from mlmkit.training.step import next_micro_batches

    examples = _rows(tokenizer, (5, 3, 7))
    collator = MLMCollator(
        tokenizer, mlm_probability=0.4, seed=0, apply_mask=False, pad_to_multiple_of=8
    )
    batch = TrainingCollate(collator, varlen=True)(examples)
    assert batch["input_ids"].shape == (3, 8) and "flat_index" in batch and "labels" not in batch
    real = batch["attention_mask"].bool()
    micro, _, layouts = next_micro_batches(iter([batch]), collator, 1, on_device=True)
    (flat,) = micro
    assert layouts == [BatchLayout(24, (5, 3, 7))] and "layout" not in flat
    assert flat["input_ids"].shape == flat["labels"].shape == (1, 15)
    assert "attention_mask" not in flat and "flat_index" not in flat
    assert (flat["labels"] != IGNORE_INDEX).any()
    unmasked = torch.where(flat["labels"] != IGNORE_INDEX, flat["labels"], flat["input_ids"])
    padded_ids = torch.full((3, 8), tokenizer.pad_token_id)
    for i, e in enumerate(examples):
        padded_ids[i, : len(e["input_ids"])] = torch.tensor(e["input_ids"])
    assert torch.equal(unmasked, padded_ids[real][None])


# -- workers that persist across epochs ------------------------------------------------------------


class _Recorded:
    """A packed split (a ``datasets.Dataset`` of rows of ids) that writes the id of the process
    that reads each batch to ``log``."""

    def __init__(self, rows, log, dataset=None) -> None:
        import datasets

        self.log = log
        self.dataset = dataset or datasets.Dataset.from_dict({"input_ids": rows})

    def __len__(self) -> int:
        return len(self.dataset)

    def with_format(self, kind):
        return _Recorded(None, self.log, self.dataset.with_format(kind))

    def __getitem__(self, indices):
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return self.dataset[indices]


def _stream(tokenizer, rows, log, workers=1, rank=0, world=1, batch_size=4):
    from mlmkit.data.loader import training_stream

    cfg = SimpleNamespace(
        train=SimpleNamespace(batch_size=batch_size, seed=5),
        data=SimpleNamespace(streaming=False),
        workers=lambda device_type: workers,
    )
    accelerator = SimpleNamespace(
        device=torch.device("cpu"), process_index=rank, num_processes=world
    )
    collator = MLMCollator(tokenizer, mlm_probability=0.3, seed=0)
    return training_stream(cfg, collator, _Recorded(rows, log), accelerator)


def _same(a, b) -> bool:
    return all(
        torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["labels"], y["labels"])
        for x, y in zip(a, b, strict=True)
    )


def test_workers_persist_across_epochs_and_a_resume_is_exact(tokenizer, tmp_path):
    """Epochs of 6 batches read by one dataloader worker: the same process serves every epoch (no
    fork from the training process at each); a new stream resumed from a mid-epoch position, and
    the running stream sent back to it (its worker's prefetched batches dropped), give the batches
    of the uninterrupted run."""
    rows = [
        [tokenizer.cls_token_id, *range(10 + i, 20 + i), tokenizer.sep_token_id] for i in range(24)
    ]
    log = tmp_path / "pids"
    stream = _stream(tokenizer, rows, log)
    head = [next(stream) for _ in range(8)]  # an epoch and 2 batches
    state = stream.state_dict()
    assert state["epoch"] == 1 and state["offset"] == 2 and stream.loader.persistent_workers
    tail = [next(stream) for _ in range(9)]  # through the third epoch's first
    pids = set(log.read_text().split())
    assert len(pids) == 1 and str(os.getpid()) not in pids  # one worker for all three epochs
    assert not _same(head[:6], head[6:] + tail[:4])  # each epoch its own order

    resumed = _stream(tokenizer, rows, tmp_path / "other")
    resumed.load_state_dict(state, world=1, saved_world=1)
    assert _same([next(resumed) for _ in range(9)], tail)
    stream.load_state_dict(state, world=1, saved_world=1)  # back, mid-epoch, with batches in flight
    assert _same([next(stream) for _ in range(9)], tail)
    assert set(log.read_text().split()) == pids


def _masked_rows(batches) -> list[tuple]:
    """Each row of ``batches`` with its masks: (ids before masking, positions chosen)."""
    out = []
    for b in batches:
        original = b["labels"].where(b["labels"] != IGNORE_INDEX, b["input_ids"])
        chosen = b["labels"] != IGNORE_INDEX
        out += [
            (tuple(original[i].tolist()), tuple(chosen[i].tolist())) for i in range(chosen.size(0))
        ]
    return out


@pytest.mark.parametrize(("world", "batch_size"), [(1, 4), (3, 4), (2, 6), (3, 3)])
def test_a_resume_on_another_split_goes_on_at_the_next_sample(
    tokenizer, tmp_path, world, batch_size
):
    """An epoch of 60 rows read by 2 processes x 4, cut after 3 micro-batches each (24 rows),
    then read on by ``world`` processes x ``batch_size``: the rows of the epoch are each read
    once, with the masks an uninterrupted run gives them, and the next epoch starts over."""
    rows = [
        [tokenizer.cls_token_id, *range(10 + i, 20 + i), tokenizer.sep_token_id] for i in range(60)
    ]
    whole = _masked_rows(
        next(_stream(tokenizer, rows, tmp_path / "log", workers=0, batch_size=60)) for _ in range(1)
    )
    head, states = [], []
    for rank in range(2):
        stream = _stream(tokenizer, rows, tmp_path / "log", workers=0, rank=rank, world=2)
        head += _masked_rows(next(stream) for _ in range(3))
        states.append(stream.state_dict())
    assert states[0] == {"epoch": 0, "start": 0, "offset": 3, "batch_size": 4}
    tail, tails = [], []
    for rank in range(world):
        stream = _stream(
            tokenizer,
            rows,
            tmp_path / "log",
            workers=0,
            rank=rank,
            world=world,
            batch_size=batch_size,
        )
        stream.load_state_dict(states[rank % 2], world=world, saved_world=2)
        tail += _masked_rows(next(stream) for _ in range(36 // (world * batch_size)))
        tails.append(stream)
    assert sorted(head + tail) == sorted(whole)  # every row once, masked alike
    nxt = _masked_rows([next(tails[0])])  # the next epoch: from its start, by this split
    assert nxt and tails[0].epoch == 1 and tails[0].start == 0


def test_without_workers_the_loader_reads_in_the_training_process(tokenizer, tmp_path):
    log = tmp_path / "pids"
    stream = _stream(
        tokenizer,
        [[tokenizer.cls_token_id, 10 + i, tokenizer.sep_token_id] for i in range(8)],
        log,
        workers=0,
    )
    assert not stream.loader.persistent_workers
    [next(stream) for _ in range(3)]
    assert set(log.read_text().split()) == {str(os.getpid())}


@pytest.mark.parametrize("varlen", [False, True])
def test_the_stream_moves_tensors_and_keeps_host_values(tokenizer, tmp_path, varlen):
    from mlmkit.data.loader import to_device

    batch = TrainingCollate(MLMCollator(tokenizer, seed=0), varlen=varlen)(_rows(tokenizer, (5, 3)))
    moved = to_device(batch, torch.device("cpu"))
    assert isinstance(moved["layout"], BatchLayout)
    assert ("max_length_q" in moved) == varlen and all(
        isinstance(moved[k], int) for k in moved if k.startswith("max")
    )


# -- workers started by spawn and forkserver -------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_training_with_two_workers_started_by_spawn_or_forkserver(tmp_path, cache_dir, method):
    """Python 3.14 starts dataloader workers by forkserver on Linux, and a process started by
    spawn starts its own workers by spawn: a run with 2 such workers trains, and its losses are
    those of a run that reads in the training process (each row's masks come from its seed)."""
    import multiprocessing

    from runs import events, run_train

    args = ["train.max_steps=4", "train.log_every=1", "train.eval_every=0", "train.precision=no"]
    run_train(tmp_path / "inline", cache_dir, *args, "train.num_workers=0")
    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method(method, force=True)
    try:
        run_train(tmp_path / method, cache_dir, *args, "train.num_workers=2")
    finally:
        multiprocessing.set_start_method(before, force=True)
    inline, spawned = (events(tmp_path / r, "train") for r in ("inline", method))
    assert [e["step"] for e in spawned] == [1, 2, 3, 4] == [e["step"] for e in inline]
    assert [e["loss"] for e in spawned] == pytest.approx([e["loss"] for e in inline], rel=1e-6)
