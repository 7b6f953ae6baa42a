"""Does a discriminator learn, and does its encoder keep its tokens apart? Replaced-token
detection's objective driven directly on Gutenberg blocks of 128 tokens (ELECTRA's masking: 15%
chosen, 85% [MASK]), printing every window: the discriminator's accuracy beside its prior (1 - the
replaced share), its loss beside the entropy of that share (what the share alone scores), the
generator's loss, and the mean cosine between the last states of a sequence's tokens (1.0: every
token the same vector, the encoder collapsed). A new model's generator starts from an output bias of
0 here (a run's starts at the unigram distribution) and reaches the unigram plateau within about
50 steps. AdamW, gradient clipping at 1.0, no warmup or decay.

  --start prior|zero   where the discriminator's logit starts (mlmkit's: the masking rate's
                       log-odds; ELECTRA's: 0)
  --replace generator|shuffled
                       the generator's samples, or the step's chosen tokens shuffled among
                       themselves (exactly the corpus's unigram distribution, no generator)
  --init-from DIR      the discriminator from a model dir (an MLM run's final/) and its tokenizer

    python benchmarks/rtd_plateau.py --tokenizer RUN/model [--model bert-tiny] [--steps 600]
        [--lr 3e-3] [--start prior] [--replace generator] [--init-from DIR] [--bf16]
"""

from __future__ import annotations

import argparse
import glob
import random
from pathlib import Path

import torch

from mlmkit.config import ObjectiveConfig, compose
from mlmkit.masking.collator import IGNORE_INDEX, MLMCollator
from mlmkit.model.bert import build_model
from mlmkit.model.rtd import ReplacedTokenDetection, build_generator, share_entropy

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "corpora" / "gutenberg"


class Shuffled(ReplacedTokenDetection):
    """The chosen tokens of the step, shuffled among the chosen positions, as the replacements."""

    def _discriminate(self, inputs, positions, targets, sampled, real):
        chosen = torch.nonzero(targets != IGNORE_INDEX).squeeze(1)
        sampled = sampled.clone()
        sampled[chosen] = targets[chosen[torch.randperm(chosen.numel())]]
        return super()._discriminate(inputs, positions, targets, sampled, real)


def blocks(tokenizer, data: Path, chars: int) -> list[list[int]]:
    text = ""
    for name in sorted(glob.glob(f"{data}/*.txt")):  # in order, until there are enough
        text += Path(name).read_text(encoding="utf-8", errors="replace") + " "
        if len(text) >= chars:
            break
    ids = tokenizer(text[:chars], add_special_tokens=False)["input_ids"]
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    return [[cls, *ids[i : i + 126], sep] for i in range(0, len(ids) - 126, 126)]


def last_state_cosine(objective, batch: torch.Tensor) -> float:
    """The mean cosine between the last states of each sequence's tokens (eval mode)."""
    objective.eval()
    with torch.no_grad():
        hidden = objective(input_ids=batch)["last_hidden_state"].float()
        unit = torch.nn.functional.normalize(hidden, dim=-1)
        cosine = (unit @ unit.transpose(1, 2)).mean().item()
    objective.train()
    return cosine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", help="a tokenizer dir (a run's model/); default: --init-from")
    p.add_argument("--model", default="bert-tiny", help="the preset, when not --init-from")
    p.add_argument("--init-from", help="the discriminator from this model dir")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--every", type=int, default=50, help="steps a printed window")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--start", choices=("prior", "zero"), default="prior")
    p.add_argument("--replace", choices=("generator", "shuffled"), default="generator")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast")
    p.add_argument("--data", default=str(DATA), help="a folder of .txt files")
    p.add_argument("--chars", type=int, default=3_000_000, help="of the text, from its start")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    from transformers import AutoTokenizer, BertForMaskedLM

    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.init_from)
    if args.init_from:
        model = BertForMaskedLM.from_pretrained(args.init_from, attn_implementation="sdpa")
    else:
        model = build_model(compose([f"model={args.model}"]).model, tokenizer)
    generator = build_generator(model, ObjectiveConfig(name="rtd"), "sdpa")
    kind = Shuffled if args.replace == "shuffled" else ReplacedTokenDetection
    objective = kind(model, generator, 50.0, replaced_share=0.15)
    if args.start == "zero":
        torch.nn.init.zeros_(objective.discriminator_head.prediction.bias)
    rows = blocks(tokenizer, Path(args.data), args.chars)
    collate = MLMCollator(
        tokenizer, 0.15, mask_replace_prob=0.85, random_replace_prob=0.0, seed=args.seed, draws=True
    )
    watched = torch.tensor([rng.choice(rows) for _ in range(4)])
    params = [q for q in objective.parameters() if q.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    cosine = last_state_cosine(objective, watched)
    print(
        f"{args.init_from or args.model}, lr {args.lr:g}, logit start {args.start}, replacements "
        f"{args.replace}; last-state cosine at the start {cosine:.3f}"
    )
    print("step | rtd accuracy | prior | rtd loss | share's entropy | generator loss | cosine")
    sums = torch.zeros(4)
    for step in range(1, args.steps + 1):
        batch = collate([{"input_ids": rng.choice(rows)} for _ in range(args.batch)])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            out = objective(**batch)
        chosen, real = objective.counts(batch).tolist()
        (out["loss_sum"] / chosen + 50.0 * out["rtd_loss_sum"] / real).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        hits, replaced, counted = out["rtd_sums"].tolist()
        sums += torch.tensor([hits, replaced, counted, out["rtd_loss_sum"].item()])
        if step % args.every == 0:
            share = sums[1].item() / sums[2].item()
            cosine = last_state_cosine(objective, watched)
            entropy = share_entropy(share)
            print(
                f"{step} | {sums[0].item() / sums[2].item():.4f} | {1 - share:.4f} | "
                f"{sums[3].item() / sums[2].item():.4f} | {entropy:.4f} | "
                f"{out['loss_sum'].item() / chosen:.3f} | {cosine:.3f}",
                flush=True,
            )
            sums.zero_()


if __name__ == "__main__":
    main()
