"""Do the presets' defaults learn? Each preset trains with its defaults alone for ``--budget``
seconds (5 minutes by default) on the built-in corpus, with about ``--evals`` evaluations on
its validation split along the way (they count towards the budget), and the table says:

* when it left the unigram plateau (in seconds of training, the evaluations' own time left
  out): the first evaluation whose held-out loss is at least
  ``--margin`` nats (0.3) below the plateau. The plateau is the loss of the best predictor
  that ignores the context (what a model learns first, and where a recipe that does not
  learn stays): at a [MASK] the token's frequency in the training blocks (the unigram loss
  U); at a chosen position that shows a token, that token with the share of unchanged among
  the shown ones, k, and else the frequencies. With the evaluation's 80-10-10 masking:
  0.8 U + 0.1 (-log k) + 0.1 (-log(1 - k) + U), k = 0.5. The goal is within the first
  quarter of the budget;
* its final held-out loss and accuracy;
* against the next smaller preset, the held-out loss of both at the larger one's final token
  count (the smaller one's curve interpolated there): a larger preset must not be worse at
  equal tokens.

    python benchmarks/presets.py [--budget 300] [--preset bert-tiny bert-mini bert-small]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from quality import ROOT, Curve, calibrate_mlmkit, compose, train_mlmkit  # noqa: E402


def unigram_loss(packed, tokenizer) -> float:
    """Mean -log p(token) over the held-out blocks' non-special tokens, p the training blocks'
    token frequencies (add-half smoothing)."""
    import numpy as np

    def ids(split):
        return np.concatenate([np.asarray(r, dtype=np.int64) for r in packed[split]["input_ids"]])

    train, held = ids("train"), ids("validation")
    size = int(max(train.max(), held.max())) + 1
    special = np.asarray(sorted(set(tokenizer.all_special_ids)))
    counts = np.bincount(train[~np.isin(train, special)], minlength=size).astype(np.float64) + 0.5
    counts[special] = 0.0
    p = counts / counts.sum()
    return float(-np.log(p[held[~np.isin(held, special)]]).mean())


def plateau_loss(unigram: float, mask_replace: float, random_replace: float) -> float:
    """The held-out loss of the best context-free predictor (the module docstring)."""
    keep = 1.0 - mask_replace - random_replace
    shown = keep + random_replace
    if shown <= 0:
        return unigram
    k = keep / shown
    kept = -math.log(k) if keep > 0 else 0.0
    replaced = -math.log(1.0 - k) + unigram if random_replace > 0 else 0.0
    return mask_replace * unigram + keep * kept + random_replace * replaced


def curve(events: list[dict]) -> list[dict]:
    """At each evaluation: its step, the seconds of training before it (``training_s``; the
    run's clock without the evaluations, which a run that evaluates rarely does not spend) and
    of the run (``wall_s``), tokens seen, held-out loss and accuracy."""
    clock = Curve.read(events)
    return [
        {
            "step": step,
            "training_s": clock.at(step, clock.training),
            "wall_s": clock.at(step, clock.wall),
            "tokens": clock.at(step, clock.tokens),
            "loss": loss,
            "accuracy": e["eval_accuracy"],
        }
        for (step, loss), e in zip(clock.evals, (e for e in events if e["event"] == "eval"))
    ]


def loss_at_tokens(points: list[dict], tokens: float) -> float:
    """The curve's held-out loss at ``tokens`` seen, linear between evaluations."""
    for a, b in zip(points, points[1:]):
        if a["tokens"] <= tokens <= b["tokens"]:
            w = (tokens - a["tokens"]) / max(b["tokens"] - a["tokens"], 1)
            return a["loss"] + w * (b["loss"] - a["loss"])
    return math.nan


def run_preset(preset: str, args, out: Path, cache: Path) -> dict:
    from harness import tokenizer_and_data

    base = [
        f"model={preset}",
        "data=builtin",
        "logger=none",
        "train.progress=false",
        f"paths.cache_dir={cache}",
    ]
    cfg = compose(base)
    tokenizer, packed = tokenizer_and_data(cfg)
    unigram = unigram_loss(packed, tokenizer)
    # the evaluation masks with BERT's 80-10-10 (MaskingConfig's mask and random shares)
    plateau = plateau_loss(unigram, cfg.masking.mask_replace_prob, cfg.masking.random_replace_prob)
    if args.report:  # the runs are there already
        from mlmkit.training.metrics_log import read_metrics

        events = read_metrics(out / preset / "run")
    else:
        calibration = calibrate_mlmkit(base, out / preset / "calibrate", 10)
        steps = args.budget / calibration.seconds_per_step
        eval_every = max(10, round(steps / args.evals / 10) * 10)
        print(
            f"== {preset}: {calibration.seconds_per_step:.3f} s/step, "
            f"train.eval_every={eval_every}",
            flush=True,
        )
        events = train_mlmkit(
            [
                *base,
                f"train.max_time={args.budget:g}s",
                "train.max_steps=1000000000",
                f"train.eval_every={eval_every}",
                "train.save_every=0",
                "train.export=false",
            ],
            out / preset / "run",
            f"the {preset} run",
        )
    points = curve(events)
    left = next((p for p in points if p["loss"] <= plateau - args.margin), None)
    return {
        "preset": preset,
        "lr": cfg.optim.lr,
        "mlm_probability": cfg.masking.mlm_probability,
        "batch": cfg.train.batch_size,
        "unigram_loss": unigram,
        "plateau_loss": plateau,
        "curve": points,
        "left_plateau_s": left["training_s"] if left else None,
        "left_plateau_step": left["step"] if left else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--budget", type=float, default=300.0, help="training seconds per preset (default 300)"
    )
    p.add_argument("--preset", nargs="+", default=["bert-tiny", "bert-mini", "bert-small"])
    p.add_argument("--evals", type=int, default=12, help="evaluations in the budget, about")
    p.add_argument(
        "--margin", type=float, default=0.3, help="nats below the plateau that count as off it"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default outputs/bench-presets/<time>)",
    )
    p.add_argument(
        "--report",
        action="store_true",
        help="the table of the runs already in --out, without training",
    )
    args = p.parse_args()
    if args.report and args.out is None:
        p.error("--report reads the runs of --out; name it")
    if args.budget <= 0 or args.evals < 1:
        p.error("--budget and --evals must be positive")

    from harness import machine, quiet_logging

    from mlmkit.training.runtime import describe_cpu

    quiet_logging()
    import datasets

    datasets.disable_progress_bars()
    out = (
        args.out or ROOT / "outputs" / "bench-presets" / time.strftime("%Y-%m-%d_%H-%M-%S")
    ).resolve()
    out.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine()}\ncpu: {describe_cpu()}\noutput: {out}")
    t0 = time.perf_counter()
    rows = [run_preset(preset, args, out, out / "cache") for preset in args.preset]

    quarter = args.budget / 4
    print(
        f"\n{args.budget:g} s per preset on the built-in corpus; unigram loss "
        f"{rows[0]['unigram_loss']:.3f}, plateau (context-free) loss "
        f"{rows[0]['plateau_loss']:.3f}; off the plateau: held-out loss {args.margin:g} nats "
        "below it\n"
    )
    print(
        "| preset | lr | masking | batch | off the plateau at | final held-out loss | "
        "final accuracy | tokens | smaller preset at equal tokens |"
    )
    print("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |")
    for i, r in enumerate(rows):
        last = r["curve"][-1]
        if r["left_plateau_s"] is None:
            off = "not within the budget"
        else:
            mark = "yes" if r["left_plateau_s"] <= quarter else "no"
            off = (
                f"{r['left_plateau_s']:.0f} s of training, step {r['left_plateau_step']:,} "
                f"(first quarter: {mark})"
            )
        versus = ""
        if i:
            smaller = rows[i - 1]
            theirs = loss_at_tokens(
                [{"tokens": 0, "loss": math.nan}, *smaller["curve"]], last["tokens"]
            )
            r["smaller_at_equal_tokens"] = theirs
            verdict = (
                ("not worse" if last["loss"] <= theirs else "worse")
                if math.isfinite(theirs)
                else "n/a"
            )
            versus = f"{smaller['preset']} {theirs:.3f} ({verdict})"
        print(
            f"| {r['preset']} | {r['lr']:g} | {r['mlm_probability']:.0%} | {r['batch']} | {off} | "
            f"{last['loss']:.3f} | {last['accuracy']:.1%} | {last['tokens'] / 1e6:.2f} M | "
            f"{versus} |"
        )
    (out / "summary.json").write_text(
        json.dumps(
            {"machine": machine(), "cpu": describe_cpu(), "budget_s": args.budget, "presets": rows},
            indent=2,
        )
        + "\n"
    )
    print(f"\ntotal wall time {time.perf_counter() - t0:.0f} s; figures in {out}/summary.json")


if __name__ == "__main__":
    main()
