"""Continued pretraining: transformers' run_mlm recipe (Trainer) against ``mlmkit train
model.init_from=...``, at equal wall-clock, per encoder family.

For each family, a released model folder (``examples/released_model.py``: the family's layout,
a real released tokenizer from ../shared/data/tokenizers, a seeded random init) is first given
``--warm-start`` seconds of general pretraining by mlmkit, so that what both sides continue is a
model that knows something; its final/ is then continued on the same text, for the same
``--budget`` seconds of training each, one side after the other (the order alternating between
families), by:

  run_mlm  transformers' ``Trainer`` + ``DataCollatorForLanguageModeling(mlm_probability=0.15)``
           as the run_mlm example sets them up: each line tokenized with its special tokens,
           ``group_texts`` concatenating them into blocks of ``--seq`` tokens, the model loaded
           with ``AutoModelForMaskedLM.from_pretrained`` as saved (dropout 0.1, the vocabulary
           projection at every position), AdamW, a linear schedule, no weight decay, ``bf16=True``
           where the CPU has bf16 hardware (else fp32). Its ``max_steps`` is the budget over the
           seconds per step of a short calibration, so its schedule decays over the budget; a
           callback stops it when the budget is spent. Empty lines are left out (run_mlm keeps
           them as a ``<s></s>`` pair each, which would cost it block space).
  mlmkit   ``python -m mlmkit train model.init_from=<folder> train.max_time=<budget>``: its
           continued-pretraining recipe (the peak rate, 6% warmup, 15% masking), its defaults
           otherwise (precision auto, dropout 0, the head only at the chosen positions, weight
           decay 0.01).

Both sides take the same batch (``--batch`` sequences of ``--seq`` tokens), the same peak rate
(the recipe's, ``mlmkit.config.recipes.continued_lr``) and the same 6% warmup. Every model (the
start, and each side's final model) is scored by ``mlmkit eval`` on the same held-out text (the
last tenth of the text's lines, which neither side trains on) with the same fixed masks.
tokens/s counts the tokens of the blocks trained on over the training seconds.

    python benchmarks/continue_vs_run_mlm.py [--budget 60] [--warm-start 60]
        [--families roberta xlm-roberta deberta-v2 distilbert] [--batch 16] [--seq 128]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
CORPORA = SHARED / "corpora"
sys.path.insert(0, os.path.dirname(__file__))
from quality import Clock, quiet, run_logged  # noqa: E402


@dataclass
class Setup:
    tokenizer: str  # a folder of ../shared/data/tokenizers
    size: tuple[int, int, int, int]  # width, layers, heads, FFN
    general: list[str]  # the warm start's text (globs)
    text: str  # the text both sides continue on; its last tenth held out


WIKITEXT = "wikitext-2/valid.txt"
# each family with a released tokenizer of its kind: DeBERTa (v1, and DeBERTa-v2's layout here)
# shares RoBERTa's byte-level BPE; DistilBERT's multilingual model uses multilingual BERT's
# WordPiece; XLM-R's 250,002 SentencePiece pieces ask for a narrow model
SETUPS = {
    "roberta": Setup("roberta-base", (128, 4, 4, 512), ["gutenberg/*.txt"], WIKITEXT),
    "xlm-roberta": Setup(
        "xlm-roberta",
        (64, 4, 2, 256),
        ["gutenberg/austen-*.txt", "hindi/kabir.txt"],
        "hindi/sevasadan.txt",
    ),
    "deberta-v2": Setup("roberta-base", (128, 4, 4, 512), ["gutenberg/*.txt"], WIKITEXT),
    "distilbert": Setup(
        "bert-base-multilingual-cased", (128, 4, 4, 512), ["gutenberg/*.txt"], WIKITEXT
    ),
}


# ---- the starting folder and the text ------------------------------------------------------


def build_folder(family: str, setup: Setup, out: Path) -> None:
    """``examples/released_model.py``'s folder of ``family`` (seed 0), in this process."""
    spec = importlib.util.spec_from_file_location(
        "released_model", ROOT / "examples" / "released_model.py"
    )
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(SHARED / "tokenizers" / setup.tokenizer))
    config = helper.family_config(family, tokenizer, *setup.size)
    torch.manual_seed(0)
    AutoModelForMaskedLM.from_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)


def split_text(text: Path, out: Path) -> tuple[Path, Path]:
    """The first nine tenths of ``text``'s lines to train on, the rest held out."""
    lines = text.read_text(encoding="utf-8").splitlines(keepends=True)
    keep = len(lines) * 9 // 10
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.txt").write_text("".join(lines[:keep]), encoding="utf-8")
    (out / "held-out.txt").write_text("".join(lines[keep:]), encoding="utf-8")
    return out / "train.txt", out / "held-out.txt"


def mlmkit_train(init: Path, files: list[str], run: Path, settings: list[str], cache: Path):
    """``mlmkit train model.init_from=<init>`` on ``files``; returns its metrics events."""
    from mlmkit.training.metrics_log import read_metrics

    if run.exists():
        shutil.rmtree(run)
    run.mkdir(parents=True)
    argv = [sys.executable, "-m", "mlmkit", "train", f"model.init_from={init}", "data=files"]
    argv += [f"data.train_files=[{','.join(files)}]", "train.eval_every=0", "train.save_every=0"]
    argv += ["train.progress=false", "logger=none", f"paths.cache_dir={cache}"]
    run_logged([*argv, *settings, f"hydra.run.dir={run}"], run / "stdout.log", f"mlmkit {run}")
    return read_metrics(run)


def mlmkit_eval(model: Path, held_out: Path, blocks: int, cache: Path, output: Path) -> dict:
    run_logged(
        [sys.executable, "-m", "mlmkit", "eval", f"checkpoint={model}", f"files=[{held_out}]"]
        + [f"data.max_eval_samples={blocks}", f"paths.cache_dir={cache}", f"output={output}"],
        output.with_suffix(".log"),
        f"mlmkit eval of {model}",
    )
    return json.loads(output.read_text())


# ---- run_mlm: Trainer + DataCollatorForLanguageModeling -------------------------------------


def run_mlm_blocks(tokenizer, train: Path, seq: int):
    """run_mlm's data: each line tokenized with its special tokens (and their mask), then
    ``group_texts``: all concatenated and cut into blocks of ``seq`` tokens, the rest dropped."""
    from itertools import chain

    from datasets import load_dataset

    raw = load_dataset("text", data_files={"train": str(train)})["train"]
    raw = raw.filter(lambda row: row["text"].strip() != "")

    def tokenize(batch):
        return tokenizer(batch["text"], return_special_tokens_mask=True)

    def group_texts(examples):
        joined = {k: list(chain(*examples[k])) for k in examples}
        total = len(joined["input_ids"]) // seq * seq
        return {k: [t[i : i + seq] for i in range(0, total, seq)] for k, t in joined.items()}

    tokenized = raw.map(tokenize, batched=True, remove_columns=["text"])
    return tokenized.map(group_texts, batched=True)


def trainer_args(out: Path, batch: int, lr: float, max_steps: int, bf16: bool):
    """run_mlm's TrainingArguments: AdamW, linear schedule, no weight decay; the shared batch,
    peak rate and 6% warmup."""
    import dataclasses

    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    warmup = {"warmup_ratio": 0.06} if "warmup_ratio" in names else {"warmup_steps": 0.06}
    return TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=batch,
        max_steps=max_steps,
        learning_rate=lr,
        lr_scheduler_type="linear",
        **warmup,
        bf16=bf16,
        use_cpu=True,
        eval_strategy="no",
        save_strategy="no",
        logging_strategy="no",
        report_to=[],
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
    )


def run_trainer(start: Path, blocks, args, lr: float, bf16: bool, out: Path) -> dict:
    """Calibrate, then train for ``args.budget`` seconds; save the model to ``out/final``."""
    from transformers import (
        AutoModelForMaskedLM,
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        Trainer,
    )

    tokenizer = AutoTokenizer.from_pretrained(str(start))
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)

    def trainer(steps: int, clock: Clock, folder: Path):
        model = AutoModelForMaskedLM.from_pretrained(str(start))
        return quiet(
            Trainer(
                model=model,
                args=trainer_args(folder, args.batch, lr, steps, bf16),
                train_dataset=blocks,
                data_collator=collator,
                callbacks=[clock.callback],
            )
        )

    warm, timed = 2, args.calibration_steps
    clock = Clock()
    trainer(warm + timed, clock, out / "calibrate").train()
    per_step = (clock.ends[-1] - clock.ends[warm - 1]) / timed
    shutil.rmtree(out / "calibrate", ignore_errors=True)
    planned = max(1, int(args.budget / per_step))
    clock = Clock(args.budget)
    run = trainer(planned, clock, out)
    run.train()
    run.model.save_pretrained(out / "final")
    tokenizer.save_pretrained(out / "final")
    seconds = clock.ends[-1] - clock.start
    tokens = clock.steps * args.batch * args.seq
    return {
        "steps": clock.steps,
        "planned_steps": planned,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "calibrated_s_per_step": per_step,
    }


def mlmkit_side(events: list[dict]) -> dict:
    """Steps, training seconds (the train events' windows) and tokens/s of an mlmkit run."""
    train = [e for e in events if e["event"] == "train"]
    seconds, seen = 0.0, 0
    for e in train:
        seconds += (e["tokens_seen"] - seen) / max(e["tokens_per_s"], 1e-9)
        seen = e["tokens_seen"]
    return {
        "steps": train[-1]["step"],
        "seconds": seconds,
        "tokens_per_s": seen / seconds,
        "wall_s": train[-1]["elapsed_s"],
    }


# ---- one family: both sides ----------------------------------------------------------------


def start_folder(family: str, setup: Setup, args, here: Path, held_out: Path, cache: Path):
    """The folder both sides continue: the released layout, warm-started by mlmkit."""
    folder = here / "released-random"
    if not (folder / "config.json").is_file():
        build_folder(family, setup, folder)
    if args.warm_start <= 0:
        return folder, None
    events = mlmkit_train(
        folder,
        [str(CORPORA / g) for g in setup.general],
        here / "warm-start",
        [
            f"train.max_time={args.warm_start:g}s",
            "optim.lr=2e-3",  # a from-scratch rate, not the continued-pretraining recipe's
            "optim.warmup_fraction=0.06",
            *shared_settings(args, held_out),
        ],
        cache,
    )
    return here / "warm-start" / "final", mlmkit_side(events)


def shared_settings(args, held_out: Path) -> list[str]:
    """mlmkit's settings of every run here: the batch, the block, a short final evaluation."""
    return [
        f"data.validation_files=[{held_out}]",
        f"data.max_seq_length={args.seq}",
        f"train.batch_size={args.batch}",
        "data.max_eval_samples=16",
    ]


def run_family(family: str, mlmkit_first: bool, args, out: Path) -> dict:
    import torch
    from transformers import AutoTokenizer

    from mlmkit.config.recipes import continued_lr
    from mlmkit.training.runtime import cpu_has_bf16

    setup, here, cache = SETUPS[family], out / family, out / "cache"
    train, held_out = split_text(CORPORA / setup.text, here / "text")
    print(f"\n== {family}: the start folder, then {args.budget:g} s per side", flush=True)
    start, warm = start_folder(family, setup, args, here, held_out, cache)
    lr = float(f"{continued_lr(setup.size[0], args.batch):.3g}")  # what mlmkit's recipe takes
    bf16 = cpu_has_bf16() and not torch.cuda.is_available()

    def mlmkit_run() -> dict:
        print("   mlmkit train model.init_from=...", flush=True)
        settings = [f"train.max_time={args.budget:g}s", *shared_settings(args, held_out)]
        return mlmkit_side(mlmkit_train(start, [str(train)], here / "mlmkit", settings, cache))

    def trainer_run() -> dict:
        print("   Trainer (run_mlm): calibrating, then training", flush=True)
        blocks = run_mlm_blocks(AutoTokenizer.from_pretrained(str(start)), train, args.seq)
        if (here / "run_mlm").exists():
            shutil.rmtree(here / "run_mlm")
        return run_trainer(start, blocks, args, lr, bf16, here / "run_mlm")

    if mlmkit_first:
        sides = {"mlmkit": mlmkit_run(), "run_mlm": trainer_run()}
    else:
        sides = {"run_mlm": trainer_run(), "mlmkit": mlmkit_run()}
    taken = (here / "mlmkit" / ".hydra" / "config.yaml").read_text()
    if f"lr: {lr}" not in taken:
        print(f"   warning: mlmkit's recipe rate is not {lr} (its config: {here / 'mlmkit'})")
    print("   scoring the start and both final models with mlmkit eval", flush=True)
    models = {
        "start": start,
        "mlmkit": here / "mlmkit" / "final",
        "run_mlm": here / "run_mlm" / "final",
    }
    scores = {
        name: mlmkit_eval(model, held_out, args.eval_blocks, cache, here / f"eval-{name}.json")
        for name, model in models.items()
    }
    summary = {
        "family": family,
        "tokenizer": setup.tokenizer,
        "vocab": json.loads((start / "config.json").read_text())["vocab_size"],
        "size": dict(zip(("width", "layers", "heads", "ffn"), setup.size, strict=True)),
        "text": setup.text,
        "peak_lr": lr,
        "run_mlm_bf16": bf16,
        "order": "mlmkit first" if mlmkit_first else "run_mlm first",
        "warm_start": warm,
        "sides": {name: {**side, **scores[name]} for name, side in sides.items()},
        "start": scores["start"],
    }
    (here / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


# ---- the table -------------------------------------------------------------------------------


def print_table(summaries: list[dict], args) -> None:
    print(
        f"\n{args.budget:g} s of training per side, batch {args.batch} x {args.seq} tokens, "
        f"after {args.warm_start:g} s of mlmkit's general pretraining; held-out masked-LM loss by "
        "mlmkit eval (the same blocks and fixed masks for every model)\n"
    )
    print(
        "| family | tokenizer (vocab), width x layers | text | start loss | side | steps (s) | "
        "tokens/s | held-out loss | accuracy | mlmkit / run_mlm tokens/s |"
    )
    print("| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for s in summaries:
        m, t = s["sides"]["mlmkit"], s["sides"]["run_mlm"]
        ratio = m["tokens_per_s"] / t["tokens_per_s"]
        size = f"{s['tokenizer']} ({s['vocab']:,}), {s['size']['width']} x {s['size']['layers']}"
        text = Path(s["text"]).parent.name
        head = f"| {s['family']} | {size} | {text} | {s['start']['loss']:.3f} |"
        trainer_kind = "bf16" if s["run_mlm_bf16"] else "fp32"
        for name, side, tail in (
            ("mlmkit", m, f" **{ratio:.2f}x** |"),
            (f"run_mlm ({trainer_kind})", t, " |"),
        ):
            print(
                f"{head} {name} | {side['steps']:,} ({side['seconds']:.0f} s) | "
                f"{side['tokens_per_s']:,.0f} | "
                f"{side['loss']:.3f} | {100 * side['accuracy']:.1f}% |{tail}"
            )
            head = "| | | | |"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=60.0, help="training seconds per side")
    p.add_argument("--warm-start", type=float, default=60.0, help="mlmkit's general pretraining")
    p.add_argument("--families", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--eval-blocks", type=int, default=200, help="held-out blocks scored")
    p.add_argument("--calibration-steps", type=int, default=4, help="the Trainer's, timed")
    p.add_argument("--out", type=Path, default=None, help="default outputs/bench-continue/<time>")
    p.add_argument("--table", type=Path, default=None, help="print a finished run's table again")
    args = p.parse_args()
    if args.table:
        done = json.loads(args.table.read_text())
        print_table(done["families"], argparse.Namespace(**done["args"]))
        return
    if args.budget <= 0 or args.batch < 1 or args.seq < 8 or args.calibration_steps < 1:
        p.error("--budget, --batch, --seq and --calibration-steps must be positive")
    if not (SHARED / "tokenizers").is_dir() or not CORPORA.is_dir():
        raise SystemExit(f"{SHARED} (the released tokenizers and the corpora) is absent.")

    from harness import machine, quiet_logging, write_summary

    from mlmkit.training.runtime import describe_cpu

    quiet_logging()
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    out = (args.out or ROOT / "outputs" / "bench-continue" / stamp).resolve()
    out.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine()}\ncpu: {describe_cpu()}\noutput: {out}")
    t0 = time.perf_counter()
    summaries = [run_family(f, i % 2 == 0, args, out) for i, f in enumerate(args.families)]
    print_table(summaries, args)
    total = time.perf_counter() - t0
    write_summary(out, args=vars(args) | {"out": str(out)}, total_s=total, families=summaries)
    print(f"\ntotal wall time {total:.0f} s; figures in {out}/summary.json")


if __name__ == "__main__":
    main()
