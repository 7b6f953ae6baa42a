"""Evaluation masks, the baseline, and metrics.jsonl bookkeeping."""

from __future__ import annotations

import json

import datasets
import pytest
import torch

from mlmkit.config import MaskingConfig
from mlmkit.data.packing import token_counts
from mlmkit.training.metrics_log import MetricsLog
from mlmkit.training.validation import fixed_eval_batches, majority_baseline


def _dataset(tokenizer, n=300, length=32):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, len(tokenizer), (n, length), generator=g)
    ids[:, 0], ids[:, -1] = tokenizer.cls_token_id, tokenizer.sep_token_id
    return datasets.Dataset.from_dict({"input_ids": ids.tolist()})


def test_eval_masks_fixed_by_seed_not_by_batch_size(tokenizer):
    ds = _dataset(tokenizer)
    masking = MaskingConfig(eval_min_masked_tokens=0)  # one draw
    a = fixed_eval_batches(ds, tokenizer, masking, batch_size=8)
    b = fixed_eval_batches(ds, tokenizer, masking, batch_size=32)
    assert len(a) == 38 and len(b) == 10  # 300 rows: 37 x 8 + 4, 9 x 32 + 12
    for key in ("input_ids", "labels"):
        assert torch.equal(torch.cat([x[key] for x in a]), torch.cat([x[key] for x in b]))
    other = fixed_eval_batches(
        ds, tokenizer, MaskingConfig(eval_seed=99, eval_min_masked_tokens=0), batch_size=8
    )
    assert not torch.equal(
        torch.cat([x["labels"] for x in a]), torch.cat([x["labels"] for x in other])
    )


def _chosen(batches) -> int:
    return sum(int((b["labels"] != -100).sum()) for b in batches)


def test_a_small_validation_set_is_masked_again_until_10k_tokens_are_chosen(tokenizer):
    ds = _dataset(tokenizer)  # about 1,350 chosen tokens per draw
    one = fixed_eval_batches(ds, tokenizer, MaskingConfig(eval_min_masked_tokens=0), batch_size=32)
    many = fixed_eval_batches(ds, tokenizer, MaskingConfig(), batch_size=32)
    draws = len(many) // len(one)
    assert len(many) == draws * len(one) and draws == -(-10_000 // _chosen(one))
    assert _chosen(many) >= 10_000
    # the first draw is the single-draw masks; each further one is another seed's
    assert torch.equal(
        torch.cat([b["labels"] for b in many[: len(one)]]), torch.cat([b["labels"] for b in one])
    )
    second = torch.cat([b["labels"] for b in many[len(one) : 2 * len(one)]])
    assert not torch.equal(second, torch.cat([b["labels"] for b in one]))
    capped = fixed_eval_batches(
        _dataset(tokenizer, n=10), tokenizer, MaskingConfig(), batch_size=32
    )
    assert len(capped) == 8  # at most 8 draws of a tiny set


def test_accuracy_comes_with_its_standard_error():
    from accelerate import Accelerator

    from mlmkit.training.validation import evaluate

    class Guess(torch.nn.Module):  # predicts token 1 everywhere: right where the target is 1
        def forward(self, input_ids, labels, attention_mask=None, **_):
            targets = labels.reshape(-1)
            logits = torch.zeros(targets.numel(), 5)
            logits[:, 1] = 1.0
            valid = targets != -100
            return {
                "targets": targets,
                "logits": logits,
                "loss_sum": torch.tensor(0.0),
                "n_tokens": valid.sum(),
            }

    labels = torch.full((4, 10), -100)
    labels[:, :5] = torch.tensor([1, 1, 2, 3, 4])  # 20 chosen, 8 right
    batch = {
        "input_ids": torch.zeros(4, 10, dtype=torch.long),
        "labels": labels,
        "attention_mask": torch.ones(4, 10),
    }
    figures = evaluate(Accelerator(cpu=True), Guess(), [batch])
    assert figures["eval_accuracy"] == 0.4 and figures["eval_tokens"] == 20
    assert figures["eval_accuracy_stderr"] == pytest.approx((0.4 * 0.6 / 20) ** 0.5)


def test_majority_baseline_counts_the_most_frequent_real_token(tokenizer):
    rows = [[tokenizer.cls_token_id] + [50] * 6 + [60] * 2 + [tokenizer.sep_token_id]] * 4
    train = datasets.Dataset.from_dict({"input_ids": rows})
    labels = torch.full((2, 10), -100)
    labels[0, 1], labels[0, 2], labels[1, 7], labels[1, 8] = 50, 60, 60, 70
    counts = token_counts(train, tokenizer)
    assert counts.numel() == len(tokenizer)
    assert counts[50] == 24 and counts[60] == 8 and counts.sum() == 32  # [CLS], [SEP] not counted
    result = majority_baseline(counts, [{"labels": labels}], tokenizer)
    assert result["baseline_token"] == tokenizer.convert_ids_to_tokens(50)
    assert result["baseline_accuracy"] == 0.25


def test_metrics_log_truncates_only_later_events(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for step in (0, 5, 10, 15):
        log.write({"event": "train", "step": step})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"event": "train", "st')  # a line cut by a kill
    log.truncate_after(10)
    steps = [
        json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()
    ]
    assert steps == [0, 5, 10]


def test_eval_masks_do_not_depend_on_the_training_strategy(tokenizer):
    ds = _dataset(tokenizer)
    base = fixed_eval_batches(ds, tokenizer, MaskingConfig(), batch_size=16)
    for masking in (
        MaskingConfig(strategy="span", mlm_probability=0.4),
        MaskingConfig(strategy="whole_word", mask_replace_prob=1.0, random_replace_prob=0.0),
        MaskingConfig(strategy="fixed", mlm_probability_end=0.3),
    ):
        other = fixed_eval_batches(ds, tokenizer, masking, batch_size=16)
        assert all(
            torch.equal(x["labels"], y["labels"]) and torch.equal(x["input_ids"], y["input_ids"])
            for x, y in zip(base, other)
        )


class _Ranks:
    """The parts of an Accelerator that ``evaluate`` uses, for one rank of ``world``."""

    def __init__(self, rank: int, world: int) -> None:
        self.process_index, self.num_processes, self.device = rank, world, torch.device("cpu")
        self.reduced = None

    def reduce(self, tensor, reduction):
        self.reduced = tensor.clone()
        return tensor


class _CountingModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, input_ids, labels, attention_mask=None):
        self.calls += 1
        chosen = labels != -100
        targets = labels[chosen]
        logits = torch.nn.functional.one_hot(input_ids[chosen] % 11, 11).float()
        return {
            "loss_sum": logits[:, 0].sum() + targets.numel(),
            "n_tokens": chosen.sum(),
            "logits": logits,
            "targets": targets % 11,
        }


def test_every_rank_runs_the_same_number_of_eval_forwards_and_counts_each_batch_once(tokenizer):
    """Under FSDP or ZeRO-3 each forward is a collective: a rank short of a batch still runs it."""
    from mlmkit.training.validation import evaluate

    batches = fixed_eval_batches(
        _dataset(tokenizer, n=40), tokenizer, MaskingConfig(eval_min_masked_tokens=0), batch_size=8
    )
    assert len(batches) == 5
    single, model = _Ranks(0, 1), _CountingModel()
    evaluate(single, model, batches)
    ranks, calls = [], []
    for r in range(2):
        ranks.append(_Ranks(r, 2))
        model = _CountingModel()
        evaluate(ranks[r], model, batches)
        calls.append(model.calls)
    assert calls == [3, 3]
    assert torch.equal(ranks[0].reduced + ranks[1].reduced, single.reduced)
