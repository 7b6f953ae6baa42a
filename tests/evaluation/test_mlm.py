"""Evaluation masks, the baseline, and metrics.jsonl bookkeeping."""

from __future__ import annotations

import json

import datasets
import torch

from mlmkit.config import MaskingConfig
from mlmkit.evaluation.mlm import fixed_eval_batches, majority_baseline
from mlmkit.training.metrics_log import MetricsLog


def _dataset(tokenizer, n=300, length=32):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, len(tokenizer), (n, length), generator=g)
    ids[:, 0], ids[:, -1] = tokenizer.cls_token_id, tokenizer.sep_token_id
    return datasets.Dataset.from_dict({"input_ids": ids.tolist()}).with_format("torch")


def test_eval_masks_fixed_by_seed_not_by_batch_size(tokenizer):
    ds = _dataset(tokenizer)
    masking = MaskingConfig()
    a = fixed_eval_batches(ds, tokenizer, masking, batch_size=8)
    b = fixed_eval_batches(ds, tokenizer, masking, batch_size=32)
    assert len(a) == 38 and len(b) == 10  # 300 rows: 37 x 8 + 4, 9 x 32 + 12
    for key in ("input_ids", "labels"):
        assert torch.equal(torch.cat([x[key] for x in a]), torch.cat([x[key] for x in b]))
    other = fixed_eval_batches(ds, tokenizer, MaskingConfig(eval_seed=99), batch_size=8)
    assert not torch.equal(torch.cat([x["labels"] for x in a]), torch.cat([x["labels"] for x in other]))


def test_majority_baseline_counts_the_most_frequent_real_token(tokenizer):
    rows = [[tokenizer.cls_token_id] + [50] * 6 + [60] * 2 + [tokenizer.sep_token_id]] * 4
    train = datasets.Dataset.from_dict({"input_ids": rows}).with_format("torch")
    labels = torch.full((2, 10), -100)
    labels[0, 1], labels[0, 2], labels[1, 7], labels[1, 8] = 50, 60, 60, 70
    result = majority_baseline(train, [{"labels": labels}], tokenizer)
    assert result["baseline_token"] == tokenizer.convert_ids_to_tokens(50)
    assert result["baseline_accuracy"] == 0.25


def test_metrics_log_truncates_only_later_events(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for step in (0, 5, 10, 15):
        log.write({"event": "train", "step": step})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"event": "train", "st')  # a line cut by a kill
    log.truncate_after(10)
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 5, 10]


def test_eval_masks_do_not_depend_on_the_training_strategy(tokenizer):
    ds = _dataset(tokenizer)
    base = fixed_eval_batches(ds, tokenizer, MaskingConfig(), batch_size=16)
    for masking in (MaskingConfig(strategy="span", mlm_probability=0.4),
                    MaskingConfig(strategy="whole_word", mask_replace_prob=1.0, random_replace_prob=0.0),
                    MaskingConfig(strategy="fixed", mlm_probability_end=0.3)):
        other = fixed_eval_batches(ds, tokenizer, masking, batch_size=16)
        assert all(torch.equal(x["labels"], y["labels"]) and torch.equal(x["input_ids"], y["input_ids"])
                   for x, y in zip(base, other))


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
        return {"loss_sum": logits[:, 0].sum() + targets.numel(), "n_tokens": chosen.sum(),
                "logits": logits, "targets": targets % 11}


def test_every_rank_runs_the_same_number_of_eval_forwards_and_counts_each_batch_once(tokenizer):
    """Under FSDP or ZeRO-3 each forward is a collective: a rank short of a batch still runs it."""
    from mlmkit.evaluation.mlm import evaluate

    batches = fixed_eval_batches(_dataset(tokenizer, n=40), tokenizer, MaskingConfig(), batch_size=8)
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
