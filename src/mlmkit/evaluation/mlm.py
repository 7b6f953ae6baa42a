"""Evaluation with fixed masks, and the run's metrics.jsonl."""

from __future__ import annotations

import math

import torch

from mlmkit.masking.collator import IGNORE_INDEX, MLMCollator

EVAL_MASK_CHUNK = 256  # rows masked together when fixing the validation masks


def fixed_eval_batches(dataset, tokenizer, masking, batch_size: int) -> list[dict[str, torch.Tensor]]:
    """Mask the validation set once with ``masking.eval_seed``.

    The same masks (BERT's 80-10-10 at ``masking.eval_mlm_probability``) are used at every
    evaluation and by every run with the same data and tokenizer, whatever the training
    seed, strategy or rate, so eval figures are comparable.
    """
    collator = MLMCollator(tokenizer, mlm_probability=masking.eval_mlm_probability,
                           seed=masking.eval_seed)  # BERT's 80-10-10, whatever the training strategy
    # Masks are drawn over fixed chunks of rows, so they do not depend on batch_size.
    chunks = []
    for start in range(0, len(dataset), EVAL_MASK_CHUNK):
        rows = dataset[start:start + EVAL_MASK_CHUNK]["input_ids"]
        chunks.append(collator([{"input_ids": r} for r in rows]))
    batches = []
    for chunk in chunks:
        n = chunk["input_ids"].size(0)
        for start in range(0, n, batch_size):
            batches.append({k: v[start:start + batch_size] for k, v in chunk.items()})
    return batches


def majority_baseline(train_set, eval_batches: list[dict[str, torch.Tensor]], tokenizer,
                      max_blocks: int = 20_000) -> dict[str, float | int | str]:
    """Accuracy of always predicting the training corpus's most frequent real token.

    The bar a model must clear to have learned anything from context.
    """
    ids = train_set[: min(len(train_set), max_blocks)]["input_ids"]
    if isinstance(ids, list):  # rows of different lengths (line_by_line packing)
        ids = torch.cat([torch.as_tensor(r).reshape(-1) for r in ids]) if ids else torch.zeros(0)
    ids = torch.as_tensor(ids).reshape(-1).long()
    counts = torch.bincount(ids, minlength=len(tokenizer))
    counts[torch.tensor(tokenizer.all_special_ids, dtype=torch.long)] = 0
    top = int(counts.argmax())
    hits = total = 0
    for batch in eval_batches:
        targets = batch["labels"][batch["labels"] != IGNORE_INDEX]
        hits += int((targets == top).sum())
        total += targets.numel()
    return {"baseline_token": tokenizer.convert_ids_to_tokens(top),
            "baseline_accuracy": hits / max(total, 1)}


def rank_share(batches: list, rank: int, world: int):
    """This rank's share of ``batches`` (every world-th one) as ``(batch, counted)`` pairs.

    Every rank gets the same number of pairs: a rank short of a batch repeats one with
    ``counted`` False, to run and not count. With FSDP or DeepSpeed ZeRO-3 each forward
    gathers the weights from all ranks, so a rank that stopped early would leave the others
    waiting forever.
    """
    for i in range(-(-len(batches) // world)):
        index = rank + i * world
        yield (batches[index], True) if index < len(batches) else (batches[rank % len(batches)], False)


@torch.no_grad()
def evaluate(accelerator, model, batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """MLM loss, perplexity and masked-token accuracy (top-1, top-5) over ``batches``.

    Each rank evaluates every world_size-th batch; sums are reduced across ranks, so the
    figures are exact averages over all chosen tokens; every rank runs the same number of
    forward passes (``rank_share``).
    """
    was_training = model.training
    model.eval()
    device = accelerator.device
    totals = torch.zeros(4, dtype=torch.float64, device=device)  # loss, n, top1, top5
    for batch, counted in rank_share(batches, accelerator.process_index, accelerator.num_processes):
        batch = {k: v.to(device) for k, v in batch.items()}
        if bool(batch["attention_mask"].all()):
            batch["attention_mask"] = None
        out = model(**batch)  # the prepared model runs under the run's autocast
        valid = out["targets"] != IGNORE_INDEX
        # top-1 is the first of the top-5 of the fp32 logits, so ties (frequent in bf16 early
        # in training) break as in ``mlmkit eval``
        top5 = out["logits"].float().topk(min(5, out["logits"].size(-1)), dim=-1).indices
        hit1 = (top5[:, 0] == out["targets"]) & valid
        hit5 = (top5 == out["targets"][:, None]).any(-1) & valid
        if counted:
            totals += torch.stack([
                out["loss_sum"].double(), out["n_tokens"].double(), hit1.sum().double(),
                hit5.sum().double(),
            ])
    totals = accelerator.reduce(totals, reduction="sum")
    loss_sum, n, top1, top5 = totals.tolist()
    if was_training:
        model.train()
    n = max(n, 1.0)
    loss = loss_sum / n
    return {
        "eval_loss": loss,
        "eval_perplexity": math.exp(min(loss, 50.0)),
        "eval_accuracy": top1 / n,
        "eval_top5_accuracy": top5 / n,
        "eval_tokens": int(n),
    }
