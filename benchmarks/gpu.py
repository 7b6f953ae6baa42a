"""The GPU path: bert-base at seq 128 in bf16, mlmkit against transformers' Trainer (bf16).

Both train the same BertConfig sizes on the same tokenizer and packed data for the same
steps (sized for about two minutes each on an H100-class GPU), with the same batch and
dataloader workers; the Trainer keeps its other defaults (DataCollatorForLanguageModeling,
BertConfig's dropout 0.1, the full vocabulary projection), mlmkit its own (dropout 0, head
at the chosen positions, fused AdamW, TF32, flash-attn where installed). Prints tokens/s,
the ratio, and MFU against the chip's dense bf16 peak (datasheet; on an unknown chip or a
CPU, against the bf16 matmul rate measured in this run).

    python benchmarks/gpu.py                 # on a CUDA machine
    python benchmarks/gpu.py --tiny          # bert-tiny, a few steps: checks the script on a CPU
    python benchmarks/gpu.py --compile       # mlmkit with train.compile=true as well
    python benchmarks/gpu.py --preset modernbert-base   # ModernBERT (conf/model/): mlmkit only,
                                             # attention auto (flash-attn where installed) and sdpa
    python benchmarks/gpu.py --tiny --preset modernbert-tiny   # the ModernBERT path on a CPU
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from harness import (  # noqa: E402
    PRESETS,
    flops_per_token,
    machine,
    mlmkit_config,
    quiet_logging,
    run_mlmkit,
    run_trainer,
    tokenizer_and_data,
)

from mlmkit.config import DataConfig, ModelConfig  # noqa: E402
from mlmkit.model.bert import flash_attn_available  # noqa: E402
from mlmkit.training.perf import chip_bf16_peak, measure_matmul_rate, train_flops_per_token  # noqa: E402

MODERNBERT = ("modernbert-tiny", "modernbert-mini", "modernbert-base", "modernbert-large")


def modernbert_model(preset: str, seq: int) -> ModelConfig:
    """The ModernBERT preset of conf/model/ as a ModelConfig."""
    from omegaconf import OmegaConf

    path = os.path.join(os.path.dirname(__file__), "..", "conf", "model", f"{preset}.yaml")
    merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(path)["model"])
    model = OmegaConf.to_object(merged)
    model.max_position_embeddings = max(model.max_position_embeddings, seq)
    return model


def model_flops(cfg, vocab: int, predicted_share: float) -> float:
    """Training FLOPs per token (mlmkit.training.perf), ModernBERT's GeGLU and windows included."""
    m = cfg.model
    if m.architecture != "modernbert":
        return flops_per_token(cfg, vocab, predicted_share)
    local = sum(1 for i in range(m.num_hidden_layers) if i % m.global_attn_every_n_layers)
    return train_flops_per_token(
        m.num_hidden_layers,
        m.hidden_size,
        m.intermediate_size,
        vocab,
        cfg.data.max_seq_length,
        predicted_share,
        ffn_matrices=3,
        local_layers=local,
        local_window=m.local_attention,
    )


def modernbert_runs(cfg, warmup: int, cuda: bool):
    """mlmkit on ModernBERT, labelled by the kernel each run takes: attention auto (flash-attn's
    kernel where installed, else SDPA, where the local layers' window is a dense mask), the same
    with document isolation (flash-attn's variable-length kernel, else SDPA with a block-diagonal
    mask), and, on a GPU with flash-attn, SDPA as well; no Trainer run (its comparison is
    BERT's)."""
    import copy

    flash = flash_attn_available()
    label = "mlmkit, flash-attn" if flash else "mlmkit, SDPA (window: dense mask)"
    runs = [(label, lambda: run_mlmkit(label, cfg, warmup))]
    documents = copy.deepcopy(cfg)
    documents.data.packing = "documents"
    doc_label = (
        "mlmkit, documents, flash-attn varlen"
        if flash
        else "mlmkit, documents, SDPA block-diagonal mask"
    )
    runs.append((doc_label, lambda: run_mlmkit(doc_label, documents, warmup)))
    if cuda and flash:  # without flash-attn, auto is SDPA: the first run
        sdpa = copy.deepcopy(cfg)
        sdpa.model.attn_implementation = "sdpa"
        runs.append(("mlmkit, SDPA", lambda: run_mlmkit("mlmkit, SDPA", sdpa, warmup)))
    return runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--tiny", action="store_true", help="bert-tiny, 6 steps, batch 16: runs on a CPU"
    )
    p.add_argument(
        "--preset",
        default=None,
        choices=sorted(PRESETS) + list(MODERNBERT),
        help="default bert-base; a modernbert-* preset runs mlmkit only",
    )
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 1000; --tiny 6)")
    p.add_argument(
        "--warmup", type=int, default=None, help="untimed steps first (default 50; --tiny 2)"
    )
    p.add_argument("--batch", type=int, default=None, help="per device (default 128; --tiny 16)")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument(
        "--workers", type=int, default=None, help="dataloader workers, both (default 4; --tiny 0)"
    )
    p.add_argument("--compile", action="store_true", help="also run mlmkit with train.compile=true")
    p.add_argument("--out", default=None, help="also write the figures to this JSON file")
    p.add_argument(
        "--corpus",
        choices=("shared", "builtin"),
        default="shared",
        help="shared: ../shared/data's books where present (a 30,522-token vocabulary); builtin: "
        "the built-in corpus (quicker to tokenize)",
    )
    args = p.parse_args()
    tiny = args.tiny
    preset = args.preset or ("bert-tiny" if tiny else "bert-base")
    steps = args.steps or (6 if tiny else 1000)
    warmup = args.warmup if args.warmup is not None else (2 if tiny else 50)
    batch = args.batch or (16 if tiny else 128)
    workers = args.workers if args.workers is not None else (0 if tiny else 4)
    log_every = 1 if tiny else 50
    if warmup % log_every or steps % log_every:
        p.error(f"--warmup and --steps must be multiples of {log_every} (mlmkit's log interval)")
    quiet_logging()
    cuda = torch.cuda.is_available()
    if not cuda and not tiny:
        print("No CUDA GPU here; run with --tiny to check the script on a CPU.")
        sys.exit(2)

    precision = "bf16"
    bert_sizes = (
        preset if preset in PRESETS else "bert-base"
    )  # a ModernBERT preset replaces the model
    cfg = mlmkit_config(
        bert_sizes, args.seq, batch, steps, warmup, 30522, log_every=log_every, precision=precision
    )
    cfg.train.num_workers = workers
    if args.corpus == "builtin":
        cfg.data = DataConfig(max_seq_length=args.seq, max_eval_samples=32)
    if preset in MODERNBERT:
        cfg.model = modernbert_model(preset, args.seq)
    tokenizer, packed = tokenizer_and_data(cfg)
    vocab = len(tokenizer)
    known = chip_bf16_peak() if cuda else None
    if known:
        peak, against = (
            known[0],
            f"{known[1]} dense bf16 peak {known[0] / 1e12:.0f} TFLOP/s (datasheet)",
        )
    else:
        # --tiny on a CPU checks the script: a small product is enough, and an emulated bf16
        # one of 2,048 squared (a CPU without bf16 hardware) takes most of a minute
        peak = measure_matmul_rate(
            torch.bfloat16, "cuda" if cuda else "cpu", n=512 if tiny and not cuda else None
        )
        against = f"bf16 matmul rate measured here, {peak / 1e12:.2f} TFLOP/s"
    print(
        f"machine: {machine()}; flash-attn "
        f"{'installed' if flash_attn_available() else 'not installed'}"
    )
    print(
        f"model: {preset}, vocab {vocab:,}, batch {batch} x seq {args.seq}, bf16, {workers} "
        f"workers, {steps} timed steps after {warmup}"
    )

    runs = [
        (
            "Trainer, bf16=True",
            lambda: run_trainer(
                "Trainer, bf16=True",
                cfg,
                tokenizer,
                packed["train"],
                warmup,
                bf16=True,
                workers=workers,
            ),
        ),
        ("mlmkit", lambda: run_mlmkit("mlmkit", cfg, warmup)),
    ]
    if preset in MODERNBERT:
        runs = modernbert_runs(cfg, warmup, cuda)
    if args.compile:
        cfg_c = mlmkit_config(
            bert_sizes,
            args.seq,
            batch,
            steps,
            warmup,
            30522,
            log_every=log_every,
            precision=precision,
            compile=True,
            strategy="fixed",
        )
        cfg_c.train.num_workers = workers
        cfg_c.model, cfg_c.data = cfg.model, cfg.data
        runs.append(
            ("mlmkit, compile, fixed masking", lambda: run_mlmkit("mlmkit, compile", cfg_c, warmup))
        )
    figures = {
        "machine": machine(),
        "preset": preset,
        "batch": batch,
        "seq": args.seq,
        "steps": steps,
        "workers": workers,
        "peak": against,
        "runs": {},
    }
    results = {}
    for (
        name,
        fn,
    ) in runs:  # the figures file is rewritten as each run ends: a timeout keeps the rest
        results[name] = r = fn()
        flops = model_flops(cfg, vocab, r.predicted_share) * r.tokens_per_s
        figures["runs"][name] = {
            "tokens_per_s": r.tokens_per_s,
            "mfu": flops / peak,
            "seconds": r.seconds,
        }
        if r.workers is not None:  # mlmkit's: the dataloader workers its run started, and how
            figures["runs"][name]["workers"] = r.workers
        add_ratios(figures, results)
        if args.out:
            write_json(args.out, figures)

    print(f"MFU against: {against}")
    print(f"{'':<46}{'tokens/s':>12}{'model TFLOP/s':>15}{'MFU':>8}{'seconds':>9}")
    for name, r in results.items():
        run = figures["runs"][name]
        print(
            f"{name:<46}{r.tokens_per_s:>12,.0f}{run['mfu'] * peak / 1e12:>15.2f}{run['mfu']:>8.1%}"
            f"{r.seconds:>9.1f}"
        )
    for name, run in figures["runs"].items():
        if "ratio_to_trainer" in run:
            print(f"ratio {name} / Trainer bf16: {run['ratio_to_trainer']:.2f}x")


def add_ratios(figures: dict, results: dict) -> None:
    """Set each mlmkit run's tokens/s ratio to the Trainer's, once the Trainer has run."""
    if "Trainer, bf16=True" not in results:
        return
    base = results["Trainer, bf16=True"].tokens_per_s
    for name, r in results.items():
        if name.startswith("mlmkit"):
            figures["runs"][name]["ratio_to_trainer"] = r.tokens_per_s / base


def write_json(path: str, figures: dict) -> None:
    """Write ``figures`` to ``path`` whole (a reader never sees half a file)."""
    import json

    partial = f"{path}.partial"
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(figures, f, indent=1)
    os.replace(partial, path)


if __name__ == "__main__":
    main()
