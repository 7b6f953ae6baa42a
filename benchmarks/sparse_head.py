"""Sparse prediction vs the full MLM head, measured side by side in one run.

Trains the same BertForMaskedLM (bert-mini by default: 4 layers, hidden 256, vocab 30522,
seq 128, batch 32, AdamW step included) with the vocabulary projection over every
position (transformers' own forward) and only at the chosen positions (mlmkit's
MaskedLM), alternating the two so machine noise hits both alike, and prints tokens/s
and the ratio.

    python benchmarks/sparse_head.py [--steps 20] [--precision bf16|no] [--preset bert-mini]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mlmkit.config import ModelConfig
from mlmkit.masking.collator import MLMCollator
from mlmkit.model.bert import MaskedLM, build_model

PRESETS = {"bert-tiny": (2, 128, 2), "bert-mini": (4, 256, 4), "bert-small": (4, 512, 8)}


class _Vocab:
    """A stand-in tokenizer with BERT's special ids and a 30,522-token vocabulary."""

    def __init__(self, size: int = 30522) -> None:
        self.size = size
        self.pad_token_id, self.cls_token_id, self.sep_token_id, self.mask_token_id = (
            0,
            101,
            102,
            103,
        )
        self.all_special_ids = [0, 100, 101, 102, 103]

    def __len__(self) -> int:
        return self.size

    def get_vocab(self) -> dict[str, int]:
        return {str(i): i for i in range(self.size)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="bert-mini", choices=sorted(PRESETS))
    p.add_argument("--steps", type=int, default=20, help="timed steps per variant and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--precision", default="bf16", choices=["bf16", "no"])
    args = p.parse_args()

    layers, hidden, heads = PRESETS[args.preset]
    cfg = ModelConfig(
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        intermediate_size=4 * hidden,
    )
    vocab = _Vocab()
    collator = MLMCollator(vocab, seed=0)
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(8):
        ids = torch.randint(1000, vocab.size, (args.batch, args.seq), generator=g)
        ids[:, 0], ids[:, -1] = vocab.cls_token_id, vocab.sep_token_id
        b = collator([{"input_ids": r} for r in ids])
        batches.append({"input_ids": b["input_ids"], "labels": b["labels"]})

    variants = {}
    for name, sparse in (("full head", False), ("sparse head", True)):
        torch.manual_seed(0)
        objective = MaskedLM(build_model(cfg, vocab), sparse_prediction=sparse)
        opt = torch.optim.AdamW(objective.parameters(), lr=1e-4)
        variants[name] = (objective, opt)

    def run(objective, opt, steps):
        start = time.perf_counter()
        for i in range(steps):
            batch = batches[i % len(batches)]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
                out = objective(**batch)
            (out["loss_sum"] / out["n_tokens"]).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return steps * args.batch * args.seq / (time.perf_counter() - start)

    for objective, opt in variants.values():  # warm-up
        run(objective, opt, 3)
    rates = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, (objective, opt) in variants.items():
            rates[name].append(run(objective, opt, args.steps))

    print(
        f"{args.preset}, vocab {vocab.size}, batch {args.batch} x seq {args.seq}, "
        f"precision {args.precision}, {torch.get_num_threads()} threads, AdamW step included"
    )
    for name, r in rates.items():
        print(
            f"  {name:<12} {statistics.median(r):>10,.0f} tokens/s  (rounds: "
            f"{', '.join(f'{x:,.0f}' for x in r)})"
        )
    ratio = statistics.median(rates["sparse head"]) / statistics.median(rates["full head"])
    print(f"  sparse / full: {ratio:.2f}x")


if __name__ == "__main__":
    main()
