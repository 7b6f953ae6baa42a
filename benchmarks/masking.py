"""Masking speed: each mlmkit strategy against transformers' DataCollatorForLanguageModeling.

The same examples (built-in corpus documents tokenized to 128 tokens, truncated or padded) are
collated by every collator, in alternating rounds so machine noise hits all alike; prints
batches/s and the ratio of each mlmkit strategy to the transformers collator it corresponds to
(whole_word to transformers' whole_word_mask=True, the others to its plain masking). Then the
share of a bert-mini training step (seq 128, batch 32, bf16 where the CPU has it, sparse head,
AdamW) that masking a packed batch takes.

    python benchmarks/masking.py [--batches 30] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mlmkit.config import ModelConfig, TokenizerConfig
from mlmkit.data.packing import pack_ids
from mlmkit.data.sources import builtin_documents
from mlmkit.data.tokenizer import train_tokenizer
from mlmkit.masking.collator import MLMCollator
from mlmkit.model.bert import MaskedLM, build_model
from mlmkit.training.runtime import cpu_has_bf16


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=30, help="batches per collator and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()

    from transformers import DataCollatorForLanguageModeling

    docs = builtin_documents()
    tokenizer = train_tokenizer(TokenizerConfig(vocab_size=8192, max_train_chars=2_000_000), docs)
    # padded to 128 at tokenization: transformers' whole-word masking needs offsets of
    # equal length, and every collator then gets the very same input_ids
    enc = tokenizer(
        docs[:2000],
        truncation=True,
        max_length=128,
        padding="max_length",
        return_offsets_mapping=True,
    )
    examples = [
        {"input_ids": i, "offset_mapping": o}
        for i, o in zip(enc["input_ids"], enc["offset_mapping"])
    ]
    plain_examples = [{"input_ids": e["input_ids"]} for e in examples]
    bs = args.batch_size
    batches = [examples[i : i + bs] for i in range(0, args.batches * bs, bs)]
    plain_batches = [plain_examples[i : i + bs] for i in range(0, args.batches * bs, bs)]

    collators = {
        "transformers plain": (DataCollatorForLanguageModeling(tokenizer, seed=0), plain_batches),
        "transformers whole_word_mask": (
            DataCollatorForLanguageModeling(tokenizer, whole_word_mask=True, seed=0),
            batches,
        ),
    }
    for strategy in ("bernoulli", "whole_word", "span", "fixed"):
        collators[f"mlmkit {strategy}"] = (
            MLMCollator(tokenizer, seed=0, strategy=strategy),
            plain_batches,
        )

    def rate(collator, data) -> float:
        start = time.perf_counter()
        for b in data:
            collator(b)
        return len(data) / (time.perf_counter() - start)

    for collator, data in collators.values():  # warm-up
        rate(collator, data[:3])
    rates = {name: [] for name in collators}
    for _ in range(args.rounds):
        for name, (collator, data) in collators.items():
            rates[name].append(rate(collator, data))
    med = {name: statistics.median(r) for name, r in rates.items()}

    print(
        f"batch {bs} x 128 (documents truncated or padded), vocab {len(tokenizer)}, "
        f"{torch.get_num_threads()} threads, median of {args.rounds} rounds"
    )
    reference = {
        "bernoulli": "transformers plain",
        "whole_word": "transformers whole_word_mask",
        "span": "transformers plain",
        "fixed": "transformers plain",
    }
    for name, r in med.items():
        line = f"  {name:<30} {r:>9,.1f} batches/s"
        if name.startswith("mlmkit"):
            ref = reference[name.split()[1]]
            line += f"   {r / med[ref]:5.1f}x {ref}"
        print(line)

    # Share of a training step: bert-mini, packed 32 x 128, sparse head, AdamW.
    packed = pack_ids(
        tokenizer(docs[:3000], add_special_tokens=False)["input_ids"],
        tokenizer.cls_token_id,
        tokenizer.sep_token_id,
        128,
    )
    rows = [{"input_ids": r} for r in packed[:bs]]
    model = MaskedLM(
        build_model(
            ModelConfig(
                num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024
            ),
            tokenizer,
        )
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    use_bf16 = cpu_has_bf16()
    batch = MLMCollator(tokenizer, seed=0)(rows)
    del batch["attention_mask"]

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            out = model(**batch)
        (out["loss_sum"] / out["n_tokens"]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    n = 10
    start = time.perf_counter()
    for _ in range(n):
        step()
    step_s = (time.perf_counter() - start) / n
    print(
        f"bert-mini training step (packed {bs} x 128, {'bf16' if use_bf16 else 'fp32'}): "
        f"{step_s * 1000:.0f} ms"
    )
    for strategy in ("bernoulli", "whole_word", "span", "fixed"):
        c = MLMCollator(tokenizer, seed=0, strategy=strategy)
        start = time.perf_counter()
        for _ in range(20):
            c(rows)
        mask_s = (time.perf_counter() - start) / 20
        print(
            f"  masking with {strategy:<10} {mask_s * 1000:6.2f} ms = "
            f"{100 * mask_s / step_s:4.1f}% of a step"
        )


if __name__ == "__main__":
    main()
