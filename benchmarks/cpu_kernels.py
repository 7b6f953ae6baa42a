"""The CPU kernels of ``mlmkit.model.kernels`` against the plain torch ops, side by side.

  * the loss over the head's logits: ``F.cross_entropy(logits.float(), ...)`` against
    ``cross_entropy_sum`` (forward + backward, bf16 logits of bert-mini's shape: about 15%
    of 32 x 128 positions x a 30,528-wide padded vocabulary);
  * attention: SDPA's fused bf16 forward + backward against ``mlmkit_cpu_sdpa`` (the same
    forward, the fp32 fused backward), bert-mini's shape (batch 32, 4 heads, seq 128, dim 64).

Rounds alternate between the two; the best round of each is kept.

    python benchmarks/cpu_kernels.py [--rounds 3] [--iters 10]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from mlmkit.model.kernels import IGNORE_INDEX, cpu_sdpa_attention_forward, cross_entropy_sum


def best_ms(fns: dict, rounds: int, iters: int) -> dict[str, float]:
    best = {name: float("inf") for name in fns}
    for r in range(rounds):
        for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            fns[name]()  # warm-up
            start = time.perf_counter()
            for _ in range(iters):
                fns[name]()
            best[name] = min(best[name], (time.perf_counter() - start) / iters * 1e3)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument(
        "--rows", type=int, default=640, help="chosen positions (15%% of 4,096, bucketed)"
    )
    p.add_argument("--vocab", type=int, default=30528)
    args = p.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")

    logits = (torch.randn(args.rows, args.vocab) * 3).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, args.vocab, (args.rows,))
    targets[-20:] = IGNORE_INDEX

    def torch_ce():
        F.cross_entropy(
            logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="sum"
        ).backward()
        logits.grad = None

    def ours_ce():
        cross_entropy_sum(logits, targets).backward()
        logits.grad = None

    ce = best_ms({"torch": torch_ce, "mlmkit": ours_ce}, args.rounds, args.iters)
    print(
        f"loss over {args.rows} x {args.vocab} bf16 logits, forward + backward: "
        f"F.cross_entropy {ce['torch']:.1f} ms, cross_entropy_sum {ce['mlmkit']:.1f} ms, "
        f"{ce['torch'] / ce['mlmkit']:.2f}x"
    )

    q, k, v = (torch.randn(32, 4, 128, 64).to(torch.bfloat16).requires_grad_() for _ in range(3))
    grad = torch.randn(32, 128, 4, 64).to(torch.bfloat16)
    module = torch.nn.Module()
    module.is_causal = False

    def torch_attn():
        F.scaled_dot_product_attention(q, k, v).transpose(1, 2).backward(grad)

    def ours_attn():
        cpu_sdpa_attention_forward(module, q, k, v, None)[0].backward(grad)

    attn = best_ms({"torch": torch_attn, "mlmkit": ours_attn}, args.rounds, args.iters)
    print(
        f"attention 32 x 4 heads x 128 x 64, bf16, forward + backward: SDPA {attn['torch']:.1f} "
        f"ms, mlmkit_cpu_sdpa {attn['mlmkit']:.1f} ms, {attn['torch'] / attn['mlmkit']:.2f}x"
    )


if __name__ == "__main__":
    main()
