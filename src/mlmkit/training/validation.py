"""The loop's validation: ``evaluate`` over the same fixed masks (``fixed_eval_batches``) at
every eval event, and ``mlmkit eval`` of a saved model (``evaluation.mlm``) runs it too: loss,
perplexity, masked-token accuracy and top-5 accuracy over the chosen tokens; the majority
baseline a model must beat (``majority_baseline``)."""

from __future__ import annotations

import math

import torch

from mlmkit.data.packing import id_rows
from mlmkit.masking.collator import IGNORE_INDEX, MLMCollator

EVAL_MASK_CHUNK = 256  # rows masked together when fixing the validation masks
EVAL_MAX_DRAWS = 8  # mask draws over a small validation set, at most


def fixed_eval_batches(
    dataset, tokenizer, masking, batch_size: int, draws: bool = False
) -> list[dict[str, torch.Tensor]]:
    """Mask the validation set with ``masking.eval_seed``; again with the next seeds (up to
    ``EVAL_MAX_DRAWS`` draws in all) while fewer than ``masking.eval_min_masked_tokens``
    tokens are chosen.

    The same masks (BERT's 80-10-10 at ``masking.eval_mlm_probability``) are used at every
    evaluation and by every run with the same data and tokenizer, whatever the training
    seed, strategy or rate, so eval figures are comparable. ``draws``: each position also gets a
    fixed uniform draw (replaced-token detection samples its generator's tokens with them).
    """
    chunks, chosen = [], 0
    collator = MLMCollator(
        tokenizer,
        mlm_probability=masking.eval_mlm_probability,
        seed=masking.eval_seed,
        draws=draws,
    )  # BERT's 80-10-10, whatever the training strategy
    for draw in range(EVAL_MAX_DRAWS):
        if draw and chosen >= masking.eval_min_masked_tokens:
            break
        collator.reseed(masking.eval_seed + draw)
        # Masks are drawn over fixed chunks of rows, so they do not depend on batch_size.
        for start in range(0, len(dataset), EVAL_MASK_CHUNK):
            rows = id_rows(dataset, slice(start, start + EVAL_MASK_CHUNK))
            chunks.append(collator([{"input_ids": r} for r in rows]))
            chosen += int((chunks[-1]["labels"] != IGNORE_INDEX).sum())
    batches = []
    for chunk in chunks:
        n = chunk["input_ids"].size(0)
        for start in range(0, n, batch_size):
            batches.append({k: v[start : start + batch_size] for k, v in chunk.items()})
    return batches


def majority_baseline(
    counts: torch.Tensor, eval_batches: list[dict[str, torch.Tensor]], tokenizer
) -> dict[str, float | int | str]:
    """Accuracy of always predicting the training corpus's most frequent real token
    (``counts``: ``data.packing.token_counts``).

    The bar a model must clear to have learned anything from context.
    """
    top = int(counts.argmax())
    hits = total = 0
    for batch in eval_batches:
        targets = batch["labels"][batch["labels"] != IGNORE_INDEX]
        hits += int((targets == top).sum())
        total += targets.numel()
    return {
        "baseline_token": tokenizer.convert_ids_to_tokens(top),
        "baseline_accuracy": hits / max(total, 1),
    }


def rank_share(batches: list, rank: int, world: int):
    """Yield this rank's share of ``batches`` (every world-th one) as ``(batch, counted)`` pairs.

    Every rank gets the same number of pairs: a rank short of a batch repeats one with
    ``counted`` False, to run and not count. With FSDP or DeepSpeed ZeRO-3 each forward
    gathers the weights from all ranks, so a rank that stopped early would leave the others
    waiting forever.
    """
    for i in range(-(-len(batches) // world)):
        index = rank + i * world
        yield (
            (batches[index], True)
            if index < len(batches)
            else (batches[rank % len(batches)], False)
        )


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
    # loss, n, top1, top5; replaced-token detection's discriminator: loss, hits, replaced, real
    totals = torch.zeros(8, dtype=torch.float64, device=device)
    for batch, counted in rank_share(batches, accelerator.process_index, accelerator.num_processes):
        batch = {k: v.to(device) for k, v in batch.items()}
        if bool(batch["attention_mask"].all()):
            batch["attention_mask"] = None
        out = model(**batch)  # the prepared model runs under the run's autocast
        valid = out["targets"] != IGNORE_INDEX
        # top-1 is the first of the top-5 of the fp32 logits, so ties (frequent in bf16 early
        # in training) break the same way in every evaluation
        top5 = out["logits"].float().topk(min(5, out["logits"].size(-1)), dim=-1).indices
        hit1 = (top5[:, 0] == out["targets"]) & valid
        hit5 = (top5 == out["targets"][:, None]).any(-1) & valid
        if counted:
            totals[:4] += torch.stack(
                [
                    out["loss_sum"].double(),
                    out["n_tokens"].double(),
                    hit1.sum().double(),
                    hit5.sum().double(),
                ]
            )
            if "rtd_sums" in out:
                totals[4:] += torch.cat([out["rtd_loss_sum"].reshape(1), out["rtd_sums"]])
    totals = accelerator.reduce(totals, reduction="sum").tolist()
    loss_sum, n, top1, top5 = totals[:4]
    if was_training:
        model.train()
    n = max(n, 1.0)
    loss = loss_sum / n
    figures = discriminator_figures(totals[4:])
    return {
        "eval_loss": loss,
        "eval_perplexity": math.exp(min(loss, 50.0)),
        "eval_accuracy": top1 / n,
        # the binomial standard error over the chosen tokens (tokens of a block, or of the
        # same block in several mask draws, are not quite independent: a slight underestimate)
        "eval_accuracy_stderr": math.sqrt(top1 / n * (1.0 - top1 / n) / n),
        "eval_top5_accuracy": top5 / n,
        "eval_tokens": int(n),
        **figures,
    }


def discriminator_figures(sums: list[float]) -> dict[str, float]:
    """Return the evaluation's figures of replaced-token detection's discriminator from its summed
    loss, hits, replaced and real tokens (none for a masked-LM objective)."""
    loss, hits, replaced, real = sums
    if not real:
        return {}
    return {
        "eval_rtd_loss": loss / real,
        "eval_rtd_accuracy": hits / real,
        "eval_replaced_share": replaced / real,
    }
