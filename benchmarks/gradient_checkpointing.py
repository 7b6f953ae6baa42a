"""Gradient checkpointing on and off, side by side in one run: memory and tokens/s.

Each setting trains a preset (its width and depth as ``model=<preset>``, a 30,522-token
vocabulary) at a long context in a fresh child process, as ``mlmkit train`` builds it on this
machine: the attention ``model.attn_implementation=auto`` picks, the precision
``train.precision=auto`` picks (bf16 on a CPU with AVX512-BF16 or AMX), the sparse head, malloc
keeping freed memory (``train.reuse_cpu_memory``), and with ``train.gradient_checkpointing=true``
the layers checkpointed by ``runtime.checkpoint_activations``, the function the loop calls.
Per setting it prints:

- peak memory: on a CPU the child's peak RSS (``VmHWM``), and its growth over the RSS of the
  built model (the step's gradients, AdamW's moments and activations); on CUDA
  ``torch.cuda.max_memory_allocated`` and its growth over the built model's;
- the activations the encoder's forward keeps for the backward (bytes, torch's saved-tensor
  hooks, one step; with checkpointing a layer's input is held by the checkpoint, outside them);
- tokens/s over the timed steps (after one warm-up step; AdamW's step included);
- the first step's loss (the same weights and batches: it must match).

    python benchmarks/gradient_checkpointing.py [--runs bert-small:1024:4 bert-base:512:4]
        [--steps 4] [--rounds 1]

A run is ``preset:tokens:batch``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _batches(vocab, batch: int, seq: int, n: int = 4) -> list[dict]:
    import torch

    from mlmkit.masking.collator import MLMCollator
    from mlmkit.model.bert import prediction_positions

    collator = MLMCollator(vocab, seed=0)
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(1000, vocab.size, (batch, seq), generator=g)
        ids[:, 0], ids[:, -1] = vocab.cls_token_id, vocab.sep_token_id
        b = collator([{"input_ids": r} for r in ids])
        positions, targets = prediction_positions(b["labels"])
        out.append(
            {
                "input_ids": b["input_ids"],
                "labels": b["labels"],
                "positions": positions,
                "targets": targets,
            }
        )
    return out


def _kept_bytes(step, encoder) -> tuple[float, int]:
    """Run ``step`` (a forward and backward) counting the bytes the forward of ``encoder`` keeps
    for the backward (the head's, the same either way, left out); returns its loss and the
    count."""
    import torch

    kept, counting = [0], [False]

    def pack(tensor):
        kept[0] += tensor.numel() * tensor.element_size() if counting[0] else 0
        return tensor

    hooks = [
        encoder.register_forward_pre_hook(lambda *_: counting.__setitem__(0, True)),
        encoder.register_forward_hook(lambda *_: counting.__setitem__(0, False)),
    ]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = step(0)
    for hook in hooks:
        hook.remove()
    return loss, kept[0]


def child(preset: str, seq: int, batch: int, steps: int, checkpointing: bool) -> dict:
    """One setting, in this (fresh) process: the figures as a dict."""
    import torch

    sys.path.insert(0, str(HERE))
    from sparse_head import _Vocab

    from mlmkit.config.compose import compose
    from mlmkit.model.architectures import parts_of
    from mlmkit.model.bert import MaskedLM, build_model, resolve_attn_implementation
    from mlmkit.training.runtime import (
        autocast_dtype,
        checkpoint_activations,
        resolve_precision,
        reuse_freed_memory,
    )

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if not cuda:
        reuse_freed_memory()
    precision = resolve_precision("auto", use_cpu=not cuda)
    cfg = compose(
        [
            f"model={preset}",
            f"model.max_position_embeddings={max(512, seq)}",
            f"data.max_seq_length={seq}",
        ]
    )
    vocab = _Vocab()
    batches = [{k: v.to(device) for k, v in b.items()} for b in _batches(vocab, batch, seq)]
    attn = resolve_attn_implementation(cfg.model.attn_implementation, device.type, precision)
    torch.manual_seed(0)
    model = build_model(cfg.model, vocab, attn_implementation=attn).to(device)
    if checkpointing:
        checkpoint_activations(model)
    objective = MaskedLM(model).train()
    opt = torch.optim.AdamW(objective.parameters(), lr=1e-4, fused=True)
    dtype = autocast_dtype(precision)
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        base = _status_kb("VmRSS") * 1024
        with open("/proc/self/clear_refs", "w") as f:  # the peak from here on (Linux 4.0+)
            f.write("5")

    def step(i: int) -> float:
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            out = objective(**batches[i % len(batches)])
        loss = out["loss_sum"] / out["n_tokens"]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    torch.manual_seed(1)
    first_loss, kept = _kept_bytes(step, parts_of(model).encoder(model))  # the warm-up step
    first_loss = float(first_loss)
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(1, steps + 1):
        loss = step(i)
    float(loss)  # waits for the device
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if cuda else _status_kb("VmHWM") * 1024
    return {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "precision": precision,
        "attention": attn,
        "threads": torch.get_num_threads(),
        "peak": peak,
        "growth": peak - base,
        "kept": kept,
        "tokens_per_s": steps * batch * seq / seconds,
        "first_loss": first_loss,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", nargs="+", default=["bert-small:1024:4", "bert-base:512:4"])
    p.add_argument("--steps", type=int, default=4, help="timed steps per setting")
    p.add_argument(
        "--rounds", type=int, default=1, help="off, on, off, ...: each setting's fastest is shown"
    )
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        preset, seq, batch, steps, on = args.child
        print(json.dumps(child(preset, int(seq), int(batch), int(steps), on == "on")))
        return

    import torch

    from mlmkit.training.runtime import describe_cpu

    rows, gib = [], 2**30
    for run in args.runs:
        preset, seq, batch = run.split(":")
        figures: dict[str, dict] = {}
        for _ in range(args.rounds):
            for setting in ("off", "on"):
                argv = [sys.executable, __file__, "--child", preset, seq, batch, str(args.steps)]
                out = subprocess.run([*argv, setting], capture_output=True, text=True, check=False)
                if out.returncode:
                    sys.exit(f"{run} ({setting}) failed:\n{out.stderr[-3000:]}")
                got = json.loads(out.stdout.strip().splitlines()[-1])
                best = figures.get(setting)
                if best is None or got["tokens_per_s"] > best["tokens_per_s"]:
                    figures[setting] = got
        off, on = figures["off"], figures["on"]
        rows.append((preset, seq, batch, off, on))
    first = rows[0][3]
    where = first["device"] if first["device"] != "cpu" else describe_cpu()
    print(
        f"{where}; torch {torch.__version__}, precision {first['precision']}, attention "
        f"{first['attention']}, {first['threads']} threads; {args.steps} timed steps per "
        f"setting after one, AdamW's step included; each setting in a fresh process, the "
        f"fastest of {args.rounds} round(s)\n"
    )
    memory = "peak RSS" if first["device"] == "cpu" else "peak allocated"
    print(
        f"| model | batch x tokens | checkpointing | {memory} | growth over the built model "
        "| encoder activations kept | tokens/s | first loss |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for preset, seq, batch, off, on in rows:
        for name, f in (("off", off), ("on", on)):
            print(
                f"| {preset} | {batch} x {seq} | {name} | {f['peak'] / gib:.2f} GiB | "
                f"{f['growth'] / gib:.2f} GiB | {f['kept'] / gib:.2f} GiB | "
                f"{f['tokens_per_s']:,.0f} | {f['first_loss']:.4f} |"
            )
    print()
    for preset, seq, batch, off, on in rows:
        ratio = {key: on[key] / off[key] for key in ("peak", "growth", "kept", "tokens_per_s")}
        print(
            f"{preset} {batch} x {seq}, checkpointing on against off: peak {ratio['peak']:.2f}x, "
            f"growth {ratio['growth']:.2f}x, activations kept {ratio['kept']:.3f}x, tokens/s "
            f"{ratio['tokens_per_s']:.2f}x"
        )


if __name__ == "__main__":
    main()
