"""Time to quality: transformers' Trainer against mlmkit, side by side in one run.

For each preset, both sides train the same model size on the same text, with the same
tokenizer, the same packed blocks of 128 tokens and the same batch, for the same wall-clock
budget, and are then scored on the same held-out text with the same fixed masks:

  mlmkit   ``python train.py`` with its defaults for the preset (precision auto, dropout 0,
           the head only at the chosen positions, its schedule over the time budget), with
           about ``--evals`` evaluations on the held-out text during the budget: its curve;
  Trainer  transformers' ``Trainer`` + ``DataCollatorForLanguageModeling(mlm_probability=0.15)``
           as transformers' run_mlm example sets them up by default: fp32, BertConfig's
           dropout 0.1, the full vocabulary head (plain ``BertForMaskedLM``), AdamW, a linear
           schedule with 6% warmup, at mlmkit's peak learning rate for the preset. Its
           ``max_steps`` comes from a short calibration (budget / seconds per step), so its
           schedule decays over the budget; a callback stops it when the budget is spent.

Training text: the 13 Gutenberg books of ../shared/data; held out: WikiText-2 valid from
there. Without ../shared/data (or with ``--builtin``): the built-in corpus, and its
validation split (5% of its documents, which neither side trains on).

Both final models are scored by ``mlmkit eval``. The table gives held-out accuracy (with its
standard error) and loss, training tokens/s and steps, and the time mlmkit needed to reach the
Trainer's final held-out loss: the first evaluation of its curve at or below it, mapped to
seconds of its run through the ``elapsed_s`` of its train events (the run's wall clock, its
earlier evaluations included, as its budget counts them), and also without the time of those
evaluations.

    python benchmarks/quality.py [--budget 300] [--preset bert-tiny bert-mini] [--builtin]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "corpora"
GUTENBERG = SHARED / "gutenberg"
WIKITEXT_VALID = SHARED / "wikitext-2" / "valid.txt"
# the BERT presets: the Trainer side trains a plain BertForMaskedLM of the same sizes
PRESETS = sorted(p.stem for p in (ROOT / "conf" / "model").glob("bert-*.yaml"))

sys.path.insert(0, os.path.dirname(__file__))


# ---- the data both sides train and are scored on -------------------------------------------


@dataclass
class Data:
    overrides: list[str]  # mlmkit's data settings
    eval_overrides: list[str]  # mlmkit eval's choice of held-out text
    training: str  # in words, for the output
    held_out: str


def choose_data(builtin: bool) -> Data:
    if not builtin and (GUTENBERG.is_dir() and WIKITEXT_VALID.is_file()):
        books = sorted(GUTENBERG.glob("*.txt"))
        size = sum(p.stat().st_size for p in books) / 1e6
        return Data(
            overrides=[
                "data=files",
                f"data.train_files=[{GUTENBERG / '*.txt'}]",
                f"data.validation_files=[{WIKITEXT_VALID}]",
            ],
            eval_overrides=[f"files=[{WIKITEXT_VALID}]"],
            training=f"{len(books)} Gutenberg books ({GUTENBERG}, {size:.1f} MB)",
            held_out=f"WikiText-2 valid ({WIKITEXT_VALID})",
        )
    if not builtin:
        print(
            f"{SHARED} is absent: training on the built-in corpus, scoring on its validation split"
        )
    return Data(
        overrides=["data=builtin"],
        eval_overrides=["data=builtin"],
        training=(
            "the built-in corpus (pydoc topics and standard-library docstrings), 95% of its "
            "documents"
        ),
        held_out=(
            "the built-in corpus's validation split (the other 5% of its documents; neither "
            "side trains on it)"
        ),
    )


def compose(overrides: list[str]):
    """The ``Config`` train.py composes from ``overrides`` (no hydra.* settings)."""
    from mlmkit.config import compose_command, to_config

    return to_config(compose_command("config", overrides))


# ---- running mlmkit ------------------------------------------------------------------------


def run_logged(argv: list[str], log: Path, what: str) -> None:
    """Run ``argv`` from the checkout's root with its output in ``log``; stop with its tail on
    failure."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    with open(log, "w") as f:
        proc = subprocess.run(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-30:])
        raise SystemExit(f"{what} failed (exit code {proc.returncode}); the end of {log}:\n{tail}")


def train_mlmkit(overrides: list[str], run_dir: Path, what: str) -> list[dict]:
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a fresh run, never a resume
    run_dir.mkdir(parents=True)
    run_logged(
        [sys.executable, str(ROOT / "train.py"), *overrides, f"hydra.run.dir={run_dir}"],
        run_dir / "stdout.log",
        what,
    )
    from mlmkit.training.metrics_log import read_metrics

    return read_metrics(run_dir)


@dataclass
class Calibration:
    seconds_per_step: float  # training alone
    seconds_per_eval: float


def calibrate_mlmkit(base: list[str], run_dir: Path, k: int) -> Calibration:
    """2k steps, a log event and an evaluation every k: the second window gives the time per
    step after warm-up, and the evaluation at step k the time of one evaluation."""
    events = train_mlmkit(
        [
            *base,
            f"train.max_steps={2 * k}",
            f"train.log_every={k}",
            f"train.eval_every={k}",
            "train.save_every=0",
            "train.export=false",
        ],
        run_dir,
        "the mlmkit calibration run",
    )
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # the end-of-run checkpoint, unused
    first, second = [e for e in events if e["event"] == "train"][:2]
    training = (second["tokens_seen"] - first["tokens_seen"]) / second["tokens_per_s"]
    pause = second["elapsed_s"] - first["elapsed_s"] - training
    return Calibration(training / (second["step"] - first["step"]), max(pause, 0.0))


@dataclass
class Curve:
    """An mlmkit run from its metrics.jsonl: steps to seconds, and its evaluations."""

    steps: list[int] = field(default_factory=list)
    wall: list[float] = field(
        default_factory=list
    )  # elapsed_s: the run's clock, evaluations included
    training: list[float] = field(default_factory=list)  # training alone (tokens / tokens_per_s)
    tokens: list[int] = field(default_factory=list)
    evals: list[tuple[int, float]] = field(default_factory=list)  # (step, eval_loss)

    @classmethod
    def read(cls, events: list[dict]) -> Curve:
        c = cls(steps=[0], wall=[0.0], training=[0.0], tokens=[0])
        for e in events:
            if e["event"] == "train":
                window = (e["tokens_seen"] - c.tokens[-1]) / max(e["tokens_per_s"], 1e-9)
                c.steps.append(e["step"])
                c.wall.append(e["elapsed_s"])
                c.training.append(c.training[-1] + window)
                c.tokens.append(e["tokens_seen"])
            elif e["event"] == "eval":
                c.evals.append((e["step"], e["eval_loss"]))
        return c

    def at(self, step: int, clock: list[float]) -> float:
        """``clock`` (wall or training seconds) at ``step``, linear between log events."""
        for i in range(1, len(self.steps)):
            if step <= self.steps[i]:
                s0, s1 = self.steps[i - 1], self.steps[i]
                return clock[i - 1] + (clock[i] - clock[i - 1]) * (step - s0) / max(s1 - s0, 1)
        return clock[-1]

    def first_at_or_below(self, loss: float) -> int | None:
        return next((step for step, value in self.evals if value <= loss), None)


# ---- running the Trainer -------------------------------------------------------------------


def trainer_args(out: Path, cfg, max_steps: int):
    """run_mlm's defaults, with mlmkit's batch and peak learning rate; fp32; nothing but
    training."""
    import dataclasses

    import torch
    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    # 6% linear warmup: warmup_ratio where it exists; newer releases take the share as warmup_steps
    warmup = {"warmup_ratio": 0.06} if "warmup_ratio" in names else {"warmup_steps": 0.06}
    return TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=cfg.train.batch_size,
        max_steps=max_steps,
        learning_rate=cfg.optim.lr,
        lr_scheduler_type="linear",
        **warmup,
        eval_strategy="no",
        save_strategy="no",
        logging_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
    )


def fresh_model(cfg, tokenizer, seed: int):
    """A plain ``BertForMaskedLM`` of the preset's sizes, BertConfig's defaults otherwise."""
    from transformers import BertConfig, BertForMaskedLM, set_seed

    m = cfg.model
    set_seed(seed)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=m.hidden_size,
        num_hidden_layers=m.num_hidden_layers,
        num_attention_heads=m.num_attention_heads,
        intermediate_size=m.intermediate_size,
        max_position_embeddings=m.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
    )
    return BertForMaskedLM(config)


class Clock:
    """Step-end times of a Trainer run (synchronised on CUDA); stops it once ``budget`` is spent."""

    def __init__(self, budget: float | None = None) -> None:
        from transformers import TrainerCallback

        clock = self

        class Callback(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                clock.start = clock.now()

            def on_step_end(self, args, state, control, **kwargs):
                clock.ends.append(clock.now())
                clock.steps = state.global_step
                if budget is not None and clock.ends[-1] - clock.start >= budget:
                    control.should_training_stop = True

        self.callback = Callback()
        self.start, self.ends, self.steps = 0.0, [], 0

    @staticmethod
    def now() -> float:
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return time.perf_counter()


def quiet(trainer):
    """``trainer`` without the printout of its end-of-training figures (the table has them)."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    return trainer


@dataclass
class TrainerRun:
    steps: int
    planned_steps: int
    seconds: float
    tokens: int
    seconds_per_step: float  # calibrated


def run_trainer(
    cfg, tokenizer, train_set, budget: float, out: Path, calibration_steps: int, seed: int = 42
) -> TrainerRun:
    from transformers import DataCollatorForLanguageModeling, Trainer

    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    warm = 2
    clock = Clock()
    trainer = quiet(
        Trainer(
            model=fresh_model(cfg, tokenizer, seed),
            args=trainer_args(out / "calibrate", cfg, warm + calibration_steps),
            train_dataset=train_set,
            data_collator=collator,
            callbacks=[clock.callback],
        )
    )
    trainer.train()
    per_step = (clock.ends[-1] - clock.ends[warm - 1]) / calibration_steps
    del trainer
    shutil.rmtree(out / "calibrate", ignore_errors=True)

    planned = max(1, int(budget / per_step))
    clock = Clock(budget)
    trainer = quiet(
        Trainer(
            model=fresh_model(cfg, tokenizer, seed),
            args=trainer_args(out, cfg, planned),
            train_dataset=train_set,
            data_collator=collator,
            callbacks=[clock.callback],
        )
    )
    trainer.train()
    seconds = clock.ends[-1] - clock.start
    final = out / "final"
    trainer.model.save_pretrained(final)
    tokenizer.save_pretrained(final)
    # sequences seen: full epochs of the (shuffled) set, the last batch of each one short
    batch, n = cfg.train.batch_size, len(train_set)
    epochs, rest = divmod(clock.steps, math.ceil(n / batch))
    tokens = (epochs * n + rest * batch) * cfg.data.max_seq_length
    del trainer
    return TrainerRun(clock.steps, planned, seconds, tokens, per_step)


# ---- scoring ---------------------------------------------------------------------------------


def mlmkit_eval(checkpoint: Path, data: Data, cache_dir: Path, output: Path) -> dict:
    run_logged(
        [
            sys.executable,
            "-m",
            "mlmkit",
            "eval",
            f"checkpoint={checkpoint}",
            *data.eval_overrides,
            f"paths.cache_dir={cache_dir}",
            f"output={output}",
        ],
        output.with_suffix(".log"),
        f"mlmkit eval of {checkpoint}",
    )
    return json.loads(output.read_text())


def accuracy(result: dict) -> str:
    se = result.get("accuracy_stderr")
    return f"{result['accuracy']:.4f}" + (f" ± {se:.4f}" if se is not None else "")


# ---- one preset: both sides ------------------------------------------------------------------


def run_preset(preset: str, mlmkit_first: bool, args, data: Data, out: Path) -> dict:
    import torch
    from harness import tokenizer_and_data

    from mlmkit.data.tokenizer import load_tokenizer, tokenizer_fingerprint
    from mlmkit.training.runtime import resolve_precision

    here = out / preset
    here.mkdir(parents=True, exist_ok=True)
    cache = out / "cache"
    base = [
        f"model={preset}",
        *data.overrides,
        "logger=none",
        "train.progress=false",
        f"paths.cache_dir={cache}",
    ]
    cfg = compose(base)
    print(
        f"\n== {preset}: preparing the tokenizer and the packed text (cached in {cache})",
        flush=True,
    )
    tokenizer, packed = tokenizer_and_data(cfg)  # what train.py uses, from the same cache
    precision = resolve_precision(cfg.train.precision, use_cpu=not torch.cuda.is_available())

    if args.eval_every:
        eval_every, calibration = args.eval_every, None
    else:
        calibration = calibrate_mlmkit(base, here / "calibrate", args.calibration_steps)
        # mlmkit's budget counts its evaluations: at most half of it goes to them
        evals = max(
            1, min(args.evals, int(args.budget / 2 / max(calibration.seconds_per_eval, 1e-9)))
        )
        if evals < args.evals:
            print(
                f"   note: {calibration.seconds_per_eval:.1f} s per evaluation: {evals} "
                f"evaluation(s) instead of {args.evals}, so that they take at most half of the "
                "budget"
            )
        spent = min(evals * calibration.seconds_per_eval, args.budget / 2)
        steps = max(1.0, (args.budget - spent) / calibration.seconds_per_step)
        # on log steps (a multiple of train.log_every): the times of evaluations are measured there
        log_every = cfg.train.log_every
        eval_every = max(1, round(steps / evals / log_every)) * log_every
        print(
            f"   mlmkit calibration: {calibration.seconds_per_step:.3f} s/step, "
            f"{calibration.seconds_per_eval:.1f} s per evaluation -> train.eval_every={eval_every}",
            flush=True,
        )

    def mlmkit_side() -> list[dict]:
        print(f"   mlmkit: training for {args.budget:g} s", flush=True)
        return train_mlmkit(
            [
                *base,
                f"train.max_time={args.budget:g}s",
                "train.max_steps=1000000000",
                f"train.eval_every={eval_every}",
            ],
            here / "mlmkit",
            "the mlmkit run",
        )

    def trainer_side() -> TrainerRun:
        print(f"   Trainer: calibrating, then training for {args.budget:g} s", flush=True)
        trainer_dir = here / "trainer"
        if trainer_dir.exists():
            shutil.rmtree(trainer_dir)
        return run_trainer(
            cfg, tokenizer, packed["train"], args.budget, trainer_dir, args.calibration_steps
        )

    if mlmkit_first:
        events = mlmkit_side()
        trainer = trainer_side()
    else:
        trainer = trainer_side()
        events = mlmkit_side()
    run_tokenizer = load_tokenizer(
        str(here / "mlmkit" / "model"), setting="the mlmkit run's tokenizer"
    )
    if tokenizer_fingerprint(run_tokenizer) != tokenizer_fingerprint(tokenizer):
        raise SystemExit(
            "The mlmkit run trained with another tokenizer than the Trainer's; remove "
            f"{cache} and run again."
        )

    print("   scoring both final models with mlmkit eval", flush=True)
    scores = {
        "mlmkit": mlmkit_eval(here / "mlmkit" / "final", data, cache, here / "eval-mlmkit.json"),
        "trainer": mlmkit_eval(here / "trainer" / "final", data, cache, here / "eval-trainer.json"),
    }

    curve = Curve.read(events)
    if curve.evals and not math.isclose(curve.evals[-1][1], scores["mlmkit"]["loss"], rel_tol=1e-3):
        print(
            f"   warning: mlmkit's last evaluation in training ({curve.evals[-1][1]:.4f}) and "
            f"mlmkit eval of its final model ({scores['mlmkit']['loss']:.4f}) differ: not the same "
            "blocks or masks?"
        )
    target = scores["trainer"]["loss"]
    reached = curve.first_at_or_below(target)
    last = events_last_train(events)
    mlmkit_training = curve.training[-1]
    summary = {
        "preset": preset,
        "budget_s": args.budget,
        "order": "mlmkit first" if mlmkit_first else "Trainer first",
        "vocab": len(tokenizer),
        "batch_size": cfg.train.batch_size,
        "seq": cfg.data.max_seq_length,
        "peak_lr": cfg.optim.lr,
        "mlmkit_precision": precision,
        "eval_every": eval_every,
        "mlmkit": {
            **scores["mlmkit"],
            "steps": last["step"],
            "wall_s": last["elapsed_s"],
            "training_s": mlmkit_training,
            "tokens_per_s": last["tokens_seen"] / mlmkit_training,
            "curve": [
                {
                    "step": s,
                    "wall_s": curve.at(s, curve.wall),
                    "training_s": curve.at(s, curve.training),
                    "eval_loss": loss,
                }
                for s, loss in curve.evals
            ],
        },
        "trainer": {
            **scores["trainer"],
            "steps": trainer.steps,
            "planned_steps": trainer.planned_steps,
            "training_s": trainer.seconds,
            "tokens_per_s": trainer.tokens / trainer.seconds,
            "calibrated_s_per_step": trainer.seconds_per_step,
        },
        "reached_step": reached,
        "reached_wall_s": curve.at(reached, curve.wall) if reached is not None else None,
        "reached_training_s": curve.at(reached, curve.training) if reached is not None else None,
    }
    if calibration is not None:
        summary["mlmkit_calibration"] = {
            "s_per_step": calibration.seconds_per_step,
            "s_per_eval": calibration.seconds_per_eval,
        }
    (here / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print_table(summary, data)
    return summary


def events_last_train(events: list[dict]) -> dict:
    return [e for e in events if e["event"] == "train"][-1]


def print_table(s: dict, data: Data) -> None:
    m, t = s["mlmkit"], s["trainer"]
    precision = "fp32" if s["mlmkit_precision"] == "no" else s["mlmkit_precision"]
    print(
        f"\n{s['preset']}, budget {s['budget_s']:g} s per side ({s['order']}); vocab "
        f"{s['vocab']:,}, batch {s['batch_size']} x {s['seq']}, peak lr {s['peak_lr']:g}"
    )
    print(f"training text: {data.training}")
    print(
        f"held-out text: {data.held_out}; {m['blocks']} blocks, {m['tokens']:,} masked tokens "
        "(fixed masks)"
    )
    rows = [
        (f"mlmkit (defaults, {precision})", m, m["steps"], m["training_s"]),
        ("Trainer (run_mlm defaults, fp32)", t, t["steps"], t["training_s"]),
    ]
    print(
        f"{'':<34}{'held-out accuracy':>20}{'held-out loss':>15}"
        f"{'tokens/s':>11}{'steps':>8}{'train s':>9}"
    )
    for name, r, steps, seconds in rows:
        print(
            f"{name:<34}{accuracy(r):>20}{r['loss']:>15.4f}{r['tokens_per_s']:>11,.0f}{steps:>8,}{seconds:>9.1f}"
        )
    during = sum(1 for p in m["curve"] if p["step"] < m["steps"])
    print(
        f"(mlmkit: {m['wall_s']:.1f} s of run time to its last step, {m['training_s']:.1f} s "
        f"training and {m['wall_s'] - m['training_s']:.1f} s for {during} evaluation(s) every "
        f"{s['eval_every']} steps and checkpoints; Trainer: {t['steps']} of {t['planned_steps']} "
        f"planned steps, calibrated at {t['calibrated_s_per_step']:.3f} s/step)"
    )
    print(
        "mlmkit's curve (s of run time: held-out loss): "
        + ", ".join(f"{p['wall_s']:.0f}: {p['eval_loss']:.3f}" for p in m["curve"])
    )
    budget, target = s["budget_s"], t["loss"]
    if s["reached_step"] is None:
        best = min((p["eval_loss"] for p in m["curve"]), default=float("nan"))
        print(
            f"time to reach the Trainer's final held-out loss ({target:.4f}): not reached within "
            f"the budget (mlmkit's best evaluation {best:.4f})"
        )
    else:
        print(
            f"time to reach the Trainer's final held-out loss ({target:.4f}): "
            f"{s['reached_wall_s']:.1f} s ({s['reached_wall_s'] / budget:.0%} of the budget), at "
            f"step {s['reached_step']:,}, its first evaluation at or below it; "
            f"{s['reached_training_s']:.1f} s ({s['reached_training_s'] / budget:.0%}) without the "
            "time of its evaluations"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--budget", type=float, default=300.0, help="training seconds per side (default 300)"
    )
    p.add_argument(
        "--preset",
        nargs="+",
        default=["bert-mini"],
        choices=PRESETS,
        help="one pair of runs per preset, in turn",
    )
    p.add_argument(
        "--builtin",
        action="store_true",
        help="the built-in corpus and its validation split, even where ../shared/data is present",
    )
    p.add_argument(
        "--evals", type=int, default=15, help="evaluations of mlmkit's curve in the budget, about"
    )
    p.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="mlmkit's train.eval_every, instead of one calibrated for --evals",
    )
    p.add_argument(
        "--calibration-steps", type=int, default=8, help="timed steps of each side's calibration"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder (default outputs/bench-quality/<date>_<time>)",
    )
    args = p.parse_args()
    if args.budget <= 0 or args.evals < 1 or args.calibration_steps < 1 or args.eval_every < 0:
        p.error(
            "--budget, --evals and --calibration-steps must be positive, --eval-every not negative"
        )

    from harness import machine, quiet_logging, write_summary

    from mlmkit.training.runtime import describe_cpu

    quiet_logging()
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    out = (
        args.out or ROOT / "outputs" / "bench-quality" / time.strftime("%Y-%m-%d_%H-%M-%S")
    ).resolve()
    out.mkdir(parents=True, exist_ok=True)
    data = choose_data(args.builtin)
    print(f"machine: {machine()}")
    print(f"cpu: {describe_cpu()}")
    print(f"output: {out}")
    t0 = time.perf_counter()
    summaries = [
        run_preset(preset, i % 2 == 0, args, data, out) for i, preset in enumerate(args.preset)
    ]
    write_summary(out, training_text=data.training, held_out=data.held_out, presets=summaries)
    print(f"\ntotal wall time {time.perf_counter() - t0:.0f} s; figures in {out}/summary.json")


if __name__ == "__main__":
    main()
