"""MLMCollator: BERT's 80-10-10 masking, checked statistically over many tokens."""

from __future__ import annotations

import pytest
import torch

from mlmkit.errors import ConfigError
from mlmkit.masking.collator import IGNORE_INDEX, MLMCollator


def _examples(tokenizer, n=400, length=128, seed=0):
    """Packed-style rows: [CLS] real ids ... [SEP] with a [SEP] inside, from the real vocab."""
    g = torch.Generator().manual_seed(seed)
    special = set(tokenizer.all_special_ids)
    real = torch.tensor([i for i in range(len(tokenizer)) if i not in special])
    rows = []
    for _ in range(n):
        ids = real[torch.randint(len(real), (length - 2,), generator=g)]
        ids[length // 2] = tokenizer.sep_token_id  # a document boundary inside the block
        rows.append({"input_ids": [tokenizer.cls_token_id, *ids.tolist(), tokenizer.sep_token_id]})
    return rows


def test_share_chosen_and_80_10_10_split(tokenizer):
    collator = MLMCollator(tokenizer, seed=0)
    examples = _examples(tokenizer)
    batch = collator(examples)
    original = torch.tensor([e["input_ids"] for e in examples])
    chosen = batch["labels"] != IGNORE_INDEX
    real = ~torch.isin(original, torch.tensor(tokenizer.all_special_ids))
    n_real, n_chosen = int(real.sum()), int(chosen.sum())
    assert n_real >= 50_000
    # 15% of real tokens; binomial std is ~0.0016 here, so 0.01 is > 6 sigma
    assert abs(n_chosen / n_real - 0.15) < 0.01
    masked = chosen & (batch["input_ids"] == tokenizer.mask_token_id)
    unchanged = chosen & (batch["input_ids"] == original)
    random = chosen & ~masked & ~unchanged
    assert abs(masked.sum() / n_chosen - 0.8) < 0.015
    # a random draw can hit the original token (1/vocab), so "unchanged" is ~10% + a hair
    assert abs(unchanged.sum() / n_chosen - 0.1) < 0.012
    assert abs(random.sum() / n_chosen - 0.1) < 0.012
    # labels carry the original id where chosen, -100 elsewhere
    assert torch.equal(batch["labels"][chosen], original[chosen])
    assert (batch["labels"][~chosen] == IGNORE_INDEX).all()
    # outside the chosen positions the input is untouched
    assert torch.equal(batch["input_ids"][~chosen], original[~chosen])


def test_specials_never_chosen_and_random_tokens_not_special(tokenizer):
    collator = MLMCollator(
        tokenizer, mlm_probability=0.9, mask_replace_prob=0.0, random_replace_prob=1.0, seed=1
    )
    examples = _examples(tokenizer, n=200)
    batch = collator(examples)
    original = torch.tensor([e["input_ids"] for e in examples])
    specials = torch.tensor(tokenizer.all_special_ids)
    chosen = batch["labels"] != IGNORE_INDEX
    assert not chosen[torch.isin(original, specials)].any()
    assert not torch.isin(batch["input_ids"][chosen], specials).any()
    assert chosen.float().mean() > 0.8  # high rate really chose most real tokens


def test_padding_never_chosen_and_attention_mask(tokenizer):
    collator = MLMCollator(tokenizer, mlm_probability=0.5, seed=2, pad_to_multiple_of=8)
    examples = [
        {"input_ids": [tokenizer.cls_token_id] + [100 + i] * n + [tokenizer.sep_token_id]}
        for i, n in enumerate([3, 10, 29])
    ]
    batch = collator(examples)
    assert batch["input_ids"].shape == (3, 32)  # 31 rounded up to a multiple of 8
    lengths = torch.tensor([5, 12, 31])
    expected_mask = (torch.arange(32)[None] < lengths[:, None]).long()
    assert torch.equal(batch["attention_mask"], expected_mask)
    pad = expected_mask == 0
    assert (batch["input_ids"][pad] == tokenizer.pad_token_id).all()
    assert (batch["labels"][pad] == IGNORE_INDEX).all()


def test_reproducible_from_seed_and_seeds_differ(tokenizer):
    examples = _examples(tokenizer, n=32)
    a = MLMCollator(tokenizer, seed=7)(examples)
    b = MLMCollator(tokenizer, seed=7)(examples)
    c = MLMCollator(tokenizer, seed=8)(examples)
    assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
    assert not torch.equal(a["labels"], c["labels"])


def test_a_reseeded_collator_draws_as_one_built_with_that_seed(tokenizer):
    """The fixed evaluation masks draw again with the next seeds from one collator (its vocabulary
    tables built once): the same masks as a collator built with each seed."""
    examples = _examples(tokenizer, n=32)
    collator = MLMCollator(tokenizer, seed=7, draws=True)
    collator(examples)
    collator.reseed(8)
    again, fresh = collator(examples), MLMCollator(tokenizer, seed=8, draws=True)(examples)
    assert again.keys() == fresh.keys()
    assert all(torch.equal(again[k], fresh[k]) for k in fresh)


def test_generator_state_round_trip(tokenizer):
    examples = _examples(tokenizer, n=16)
    collator = MLMCollator(tokenizer, seed=3)
    collator(examples)
    state = collator.state_dict()
    expected = collator(examples)
    other = MLMCollator(tokenizer, seed=99)
    other.load_state_dict(state)
    assert torch.equal(other(examples)["labels"], expected["labels"])


def test_dataloader_workers_draw_different_masks(tokenizer):
    rows = _examples(tokenizer, n=1, seed=5) * 8  # the same row everywhere
    collator = MLMCollator(tokenizer, seed=11)

    def run():
        torch.manual_seed(0)
        loader = torch.utils.data.DataLoader(rows, batch_size=2, num_workers=2, collate_fn=collator)
        return [b["labels"] for b in loader]

    first, second = run(), run()
    # workers 0 and 1 each produced batches; their masks differ from each other
    assert not torch.equal(first[0], first[1])
    # and the whole sequence is reproducible from the seeds
    assert all(torch.equal(x, y) for x, y in zip(first, second))


def test_input_not_modified(tokenizer):
    ids = torch.tensor([[tokenizer.cls_token_id, 50, 60, 70, tokenizer.sep_token_id]] * 4)
    before = ids.clone()
    MLMCollator(tokenizer, mlm_probability=0.9, seed=0).mask(ids)
    assert torch.equal(ids, before)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mlm_probability": 0.0},
        {"mlm_probability": 1.0},
        {"mlm_probability": -0.1},
        {"mask_replace_prob": 0.8, "random_replace_prob": 0.3},
        {"mask_replace_prob": 1.2, "random_replace_prob": 0.0},
        {"pad_to_multiple_of": 0},
    ],
)
def test_invalid_settings_refused(tokenizer, kwargs):
    with pytest.raises(ConfigError):
        MLMCollator(tokenizer, **kwargs)


def test_batches_are_the_same_with_or_without_workers(tokenizer):
    """Each batch is masked from its own seed: worker count and resume position don't matter."""
    import datasets

    from mlmkit.data.loader import EpochBatchSampler, KeyedRows

    rows = [e["input_ids"] for e in _examples(tokenizer, n=64, length=32)]
    ds = KeyedRows(datasets.Dataset.from_dict({"input_ids": rows}))

    def batches(workers, skip=0):
        sampler = EpochBatchSampler(len(rows), 8, rank=0, world=1, seed=3)
        sampler.epoch, sampler.skip = 1, skip
        loader = torch.utils.data.DataLoader(
            ds,
            batch_sampler=sampler,
            num_workers=workers,
            collate_fn=MLMCollator(tokenizer, seed=0),
        )
        return [b["input_ids"] for b in loader]

    plain, with_workers, resumed = batches(0), batches(2), batches(0, skip=3)
    assert len(plain) == 8
    assert all(torch.equal(a, b) for a, b in zip(plain, with_workers))
    assert all(torch.equal(a, b) for a, b in zip(plain[3:], resumed))
    assert not torch.equal(plain[0], plain[1])


def test_what_dataloader_workers_receive_pickles_by_value(tokenizer):
    """Workers started by spawn or forkserver unpickle the collator: no tensor of it, nor its
    generator's state, may travel through torch's shared memory (a generator's state is a
    temporary tensor, freed before the worker maps it: "unable to resize file")."""
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers torch's shared-memory reducers)

    examples = _examples(tokenizer, n=8)
    collator = MLMCollator(tokenizer, seed=3, strategy="whole_word")
    collator(examples)  # a generator that has drawn
    data = bytes(ForkingPickler.dumps(collator))
    assert b"rebuild_storage" not in data and b"rebuild_tensor" not in data
    received = pickle.loads(data)
    assert torch.equal(received(examples)["labels"], collator(examples)["labels"])
    assert torch.equal(received.random_ids, collator.random_ids)
