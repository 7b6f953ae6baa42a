"""``mlmkit scorecard``: did pretraining pay? One table that scores model dirs on a fixed,
versioned suite of local tasks, each figure with its 95% interval, the same architecture from a
random init as a row of its own, and which differences are larger than their intervals.

    mlmkit scorecard models=[outputs/run_a,outputs/run_b] data_dir=../shared/data
    mlmkit scorecard models=[outputs/run_a] suite=full seeds=5

Each cell is a task's dev figure, the mean over fine-tuning seeds; its interval is a
bootstrap over both sources of noise (Efron & Tibshirani, 1993; the seeds' share follows
Dodge et al., 2020, who find fine-tuning seeds alone move BERT's GLUE figures by several
points): each of ``bootstrap`` replicates draws the dev examples with replacement (the same
draw for every model, so differences are paired) and the seeds with replacement, and scores
the task's own metric (word accuracy, entity F1, Spearman) on the drawn examples. A difference
between two rows is called larger than its interval when the interval of the paired replicates'
differences leaves out zero.

Every (model, task, seed) is cached under ``<cache_dir>/scorecard/`` by the model's weights and
config, the task's settings and ``SCORECARD_VERSION``: a row scored before (the random init's,
a model scored in an earlier scorecard) is read back, not trained again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from mlmkit.config import FinetuneConfig
from mlmkit.errors import ConfigError

log = logging.getLogger("mlmkit")

# The suite's tasks or settings changed: cached cells of another version are not read.
SCORECARD_VERSION = 2


@dataclass(frozen=True)
class SuiteTask:
    """One column of the scorecard: a fine-tuned task (``task``: conf/task/<task>.yaml with
    ``overrides``; ``settings``: FinetuneConfig's) or the held-out masked-LM accuracy
    (``task="mlm"``; ``overrides["file"]``: the text)."""

    column: str
    task: str
    metric: str
    overrides: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    def key(self) -> dict[str, Any]:
        return asdict(self)


# Paths are relative to the scorecard's data_dir (laid out as ../shared/data is). The fine-tuning
# is mlmkit finetune's with its defaults (epochs from the data's size, lr by the encoder's width,
# the best epoch kept: docs/benchmarks.md, "Fine-tuning defaults"); SST-2 alone is held to 3
# epochs of 4,000 phrases, where its dev accuracy has stopped rising, to keep suite=fast near 10
# minutes for bert-tiny.
MLM_TASK = SuiteTask(
    "masked LM acc. (WikiText-2)",
    "mlm",
    "accuracy",
    {"file": "corpora/wikitext-2/valid.txt", "max_seq_length": 128, "blocks": 64},
)
UPOS = SuiteTask(
    "UPOS (UD-EWT)",
    "pos",
    "accuracy",
    {
        "data_dir": "tokens/ud-ewt",
        "train_file": "en_ewt-ud-dev.conllu",
        "eval_file": None,
        "eval_share": 0.2,
    },
)
SST2 = SuiteTask(
    "SST-2",
    "sst2",
    "accuracy",
    {"data_dir": "glue/SST-2"},
    {"epochs": 3, "max_train_samples": 4000},
)
NER = SuiteTask(
    "WNUT-17 entity F1",
    "ner",
    "f1",
    {"data_dir": "tokens/wnut17", "train_file": "train.conll", "eval_file": "dev.conll"},
)
STSB = SuiteTask("STS-B", "stsb", "spearman", {"data_dir": "glue/STS-B"})
SUITES: dict[str, list[SuiteTask]] = {
    "fast": [MLM_TASK, UPOS, SST2],
    "full": [MLM_TASK, UPOS, SST2, NER, STSB],
}


# ---- the statistics ---------------------------------------------------------------------------


def example_draws(name: str, n: int, replicates: int) -> np.ndarray:
    """``(replicates, n)`` indices of the dev examples drawn with replacement: the same for
    every model and seed of a task (seeded by the task's name and size), so that differences
    are paired."""
    seed = int.from_bytes(hashlib.sha256(f"{name}/{n}".encode()).digest()[:8], "little")
    return np.random.default_rng(seed).integers(0, n, size=(replicates, n))


def seed_draws(seeds: int, replicates: int) -> np.ndarray:
    """``(replicates, seeds)`` positions of the seeds drawn with replacement (fixed)."""
    return np.random.default_rng(seeds).integers(0, seeds, size=(replicates, seeds))


@dataclass
class Cell:
    """A model's figure on one task: one score per seed, each with its replicates."""

    scores: list[float]
    replicates: list[list[float]]  # per seed: the figure on each draw of the examples

    @property
    def mean(self) -> float:
        return float(np.mean(self.scores))

    def combined(self) -> np.ndarray:
        """Return each bootstrap replicate's figure: the mean, over seeds drawn with replacement,
        of each seed's figure on that replicate's draw of the examples."""
        reps = np.asarray(self.replicates, dtype=np.float64)  # (seeds, replicates)
        chosen = seed_draws(reps.shape[0], reps.shape[1])  # (replicates, seeds)
        return reps[chosen, np.arange(reps.shape[1])[:, None]].mean(axis=1)

    def interval(self, confidence: float) -> tuple[float, float]:
        return percentile_interval(self.combined(), confidence)


def percentile_interval(values: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(values, [tail, 100 - tail])
    return float(low), float(high)


def difference(a: Cell, b: Cell, confidence: float) -> dict[str, Any]:
    """Return ``a - b``: the difference of the means, its paired interval and whether the
    interval leaves out zero."""
    diffs = a.combined() - b.combined()
    low, high = percentile_interval(diffs, confidence)
    return {
        "difference": a.mean - b.mean,
        "low": low,
        "high": high,
        "separated": bool(low > 0 or high < 0),
    }


def replicate_scores(score, predictions: list, examples: list, draws: np.ndarray) -> list[float]:
    """``score(predictions, examples)`` (a number) on each draw of the examples."""
    return [
        float(score([predictions[i] for i in row], [examples[i] for i in row])) for row in draws
    ]


# ---- the cache --------------------------------------------------------------------------------


def model_fingerprint(model_dir: Path, init: str) -> str:
    """Return a hash of what a cell depends on of the model: its config and tokenizer, and its
    weights unless from a random init."""
    h = hashlib.sha256(init.encode())
    names = ["config.json", "vocab.txt", "vocab.json", "merges.txt"]
    names += sorted(p.name for p in model_dir.iterdir() if p.name.startswith(("tokenizer", "spm")))
    names += sorted(p.name for p in model_dir.iterdir() if p.name.endswith(".model"))
    if init == "pretrained":
        names += sorted(p.name for p in model_dir.iterdir() if p.suffix in (".safetensors", ".bin"))
    for name in dict.fromkeys(names):
        path = model_dir / name
        if path.is_file():
            h.update(name.encode())
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()


def data_stamp(task: SuiteTask, data_dir: Path) -> list[list[Any]]:
    """Return the path, size and modification time of each file a task reads: another copy or
    an edited file of the data is scored anew."""
    folder = task.overrides.get("data_dir")
    base = data_dir / folder if folder else data_dir
    paths = sorted(p for p in base.iterdir() if p.is_file()) if folder and base.is_dir() else []
    for key in ("file", "train_file", "eval_file"):
        value = task.overrides.get(key)
        if isinstance(value, str):
            paths += [p for p in (base / value, Path(value)) if p.is_file()]
    return [
        [str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in dict.fromkeys(paths)
    ]


def cell_key(fingerprint: str, task: SuiteTask, seed: int, cfg, data: list) -> str:
    """Return the cache's name of one cell: everything its figure and replicates depend on."""
    spec = {
        "version": SCORECARD_VERSION,
        "model": fingerprint,
        "task": task.key(),
        "data": data,
        "seed": seed,
        "replicates": cfg.bootstrap,
        "max_seq_length": cfg.max_seq_length,
        "batch_size": cfg.batch_size,
        "precision": cfg.precision,
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:32]


# ---- one cell's runs --------------------------------------------------------------------------


def data_path(data_dir: Path, relative: str | None, setting: str) -> str | None:
    if relative is None:
        return None
    path = data_dir / relative
    if not path.exists():
        raise ConfigError(
            f"The scorecard's {setting} {relative!r} is not in data_dir={str(data_dir)!r} "
            f"({path} is absent); point data_dir at a folder laid out as ../shared/data."
        )
    return str(path)


def finetuned_seed(
    model: str, init: str, task: SuiteTask, data_dir: Path, seed: int, replicates: int, cfg
) -> tuple[float, list[float], dict[str, Any]]:
    """Fine-tune ``model`` on ``task`` with ``seed``: the dev figure, its replicates and the
    task's baseline."""
    from omegaconf import OmegaConf

    from mlmkit.evaluation.glue import task_config
    from mlmkit.finetune.loop import finetune_scored

    tc = task_config(task.task, None)
    overrides = dict(task.overrides)
    overrides["data_dir"] = data_path(data_dir, overrides.get("data_dir"), "task folder")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(tc), overrides)
    except Exception as exc:  # omegaconf's errors: a key the task lacks, a value of a wrong type
        raise ConfigError(
            f"The scorecard's task {task.column!r} takes no such setting ({exc.__class__.__name__}:"
            f" {str(exc).splitlines()[0]}); fix its overrides (conf/task/{task.task}.yaml)."
        ) from None
    ft = FinetuneConfig(
        checkpoint=model,
        init=init,
        task=OmegaConf.to_object(merged),
        max_seq_length=cfg.max_seq_length,
        batch_size=cfg.batch_size,
        precision=cfg.precision,
        seed=seed,
        save_model=False,
        **task.settings,
    )
    with tempfile.TemporaryDirectory(prefix="mlmkit-scorecard-") as run_dir:
        summary, scored, predictions = finetune_scored(ft, run_dir)
    draws = example_draws(task.column, len(scored.eval), replicates)

    def score(p, e):
        return scored.score(p, e)[task.metric]

    if f"eval_{task.metric}" not in summary:
        figures = sorted(k.removeprefix("eval_") for k in summary if k.startswith("eval_"))
        raise ConfigError(
            f"The scorecard's task {task.column!r} has no figure {task.metric!r}; choose its "
            f"metric from {', '.join(figures)}."
        )
    return (
        float(summary[f"eval_{task.metric}"]),
        replicate_scores(score, predictions, scored.eval, draws),
        scored.baseline(),
    )


def masked_lm(
    model: str, init: str, task: SuiteTask, data_dir: Path, replicates: int, cfg
) -> tuple[float, list[float]]:
    """Masked-token accuracy on held-out text under the evaluation's fixed masks, each packed
    block an example of the bootstrap."""
    import torch

    from mlmkit.config import EvalConfig
    from mlmkit.evaluation.mlm import eval_dataset
    from mlmkit.model.bert import MaskedLM
    from mlmkit.training.trained_model import load_model_and_tokenizer
    from mlmkit.training.validation import IGNORE_INDEX, fixed_eval_batches

    loaded, tokenizer, _ = load_model_and_tokenizer(model)
    if init == "random":  # the same architecture, seeded random weights (as eval-sts's)
        torch.manual_seed(0)
        loaded = type(loaded)(loaded.config)
    length = min(task.overrides["max_seq_length"], cfg.max_seq_length)
    text = data_path(data_dir, task.overrides["file"], "text")
    ec = EvalConfig(checkpoint=model, files=[text])
    ec.data.max_seq_length = length
    ec.data.max_eval_samples = task.overrides["blocks"]
    ec.paths.cache_dir = cfg.cache_dir
    blocks = eval_dataset(ec, tokenizer)
    batches = fixed_eval_batches(blocks, tokenizer, ec.masking, batch_size=1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    objective = MaskedLM(loaded).to(device).eval()
    hits: list[tuple[int, int]] = []  # per block: right, chosen
    with torch.no_grad():
        for batch in batches:
            out = objective(**{k: v.to(device) for k, v in batch.items()})
            valid = out["targets"] != IGNORE_INDEX
            right = (out["logits"].float().argmax(-1) == out["targets"]) & valid
            hits.append((int(right.sum()), int(valid.sum())))

    def accuracy(rows, _examples):
        return sum(r for r, _ in rows) / max(sum(n for _, n in rows), 1)

    draws = example_draws(task.column, len(hits), replicates)
    return accuracy(hits, None), replicate_scores(accuracy, hits, hits, draws)


OWN_KEYS = {"name", "task", "metric", "overrides", "settings"}
# fine-tuning settings the scorecard sets itself, for every task alike
FIXED_SETTINGS = {"checkpoint", "init", "task", "max_seq_length", "batch_size", "precision", "seed"}
FIXED_SETTINGS |= {"save_model"}


def own_task(spec: dict[str, Any]) -> SuiteTask:
    """Return a user's labelled files as a column (``own_tasks``): ``name``, ``task``
    (conf/task/: files, tokens, ner, pos, ...), ``overrides`` (the task's settings: its files;
    a ``data_dir`` there is relative to the scorecard's data_dir), ``settings`` (fine-tuning's:
    epochs, lr, ...), ``metric`` (default: the task's headline)."""
    from mlmkit.evaluation.glue import task_config

    example = (
        "e.g. own_tasks=[{name: mine, task: files, overrides: {train_file: a.csv, eval_file: "
        "b.csv}}]"
    )
    if not isinstance(spec, Mapping) or not all(
        isinstance(spec.get(key) or {}, Mapping) for key in ("overrides", "settings")
    ):
        raise ConfigError(
            f"own_tasks: each entry is a mapping whose overrides and settings are mappings, got "
            f"{spec!r}; {example}."
        )
    spec = dict(spec)
    unknown = sorted(set(spec) - OWN_KEYS)
    if unknown or "name" not in spec or "task" not in spec:
        raise ConfigError(
            f"own_tasks: each entry takes {', '.join(sorted(OWN_KEYS))} (name and task "
            f"required), got {', '.join(map(str, spec))}; {example}."
        )
    try:
        defaults = task_config(str(spec["task"]), None)
    except FileNotFoundError:
        raise ConfigError(
            f"own_tasks: {spec['task']!r} is not a task of conf/task/; choose files, tokens, "
            "ner, pos, qa or a GLUE task."
        ) from None
    metric = spec.get("metric") or (defaults.metrics or ["accuracy"])[0]
    settings = dict(spec.get("settings") or {})
    allowed = {f.name for f in fields(FinetuneConfig)} - FIXED_SETTINGS
    wrong = sorted(set(settings) - allowed)
    if wrong:
        raise ConfigError(
            f"own_tasks: {spec['name']}'s settings {', '.join(wrong)} are not fine-tuning "
            f"settings the scorecard takes; choose from {', '.join(sorted(allowed))}."
        )
    try:  # the values' types and ranges, as mlmkit finetune checks them
        FinetuneConfig(checkpoint="-", **settings)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"own_tasks: {spec['name']}'s settings {settings} do not make a fine-tuning ({exc}); "
            "give numbers where numbers are asked, e.g. settings: {epochs: 3, lr: 5e-4}."
        ) from None
    return SuiteTask(
        str(spec["name"]),
        str(spec["task"]),
        str(metric),
        dict(spec.get("overrides") or {}),
        settings,
    )


# ---- the table --------------------------------------------------------------------------------


@dataclass
class Row:
    label: str
    model: str
    init: str
    cells: dict[str, Cell] = field(default_factory=dict)
    cached: int = 0  # cells read from the cache
    scored: int = 0  # cells computed now


def check_length(model_dir: Path, length: int) -> None:
    """Refuse a ``max_seq_length`` longer than the model's positions, before any work."""
    from transformers import AutoConfig

    from mlmkit.model.architectures import architecture

    config = AutoConfig.from_pretrained(str(model_dir))
    positions = architecture(config.model_type).positions(config)
    if length > positions:
        raise ConfigError(
            f"max_seq_length ({length}) is longer than the {positions} positions of {model_dir}; "
            "lower max_seq_length."
        )


def score_row(row: Row, tasks: list[SuiteTask], data_dir: Path, cfg, cache: Path) -> dict:
    """Fill ``row.cells`` (from the cache where it holds them); returns each task's baseline."""
    from mlmkit.training.trained_model import resolve_model_path

    resolved = resolve_model_path(row.model, "models")
    if not (resolved / "config.json").is_file():
        raise ConfigError(
            f"models: {row.model!r} resolves to a checkpoint ({resolved}); score a model dir "
            "or a finished run (its final/), or export the checkpoint first (mlmkit export)."
        )
    check_length(resolved, cfg.max_seq_length)
    fingerprint = model_fingerprint(resolved, row.init)
    baselines: dict[str, Any] = {}
    for task in tasks:
        seeds = [0] if task.task == "mlm" else list(range(cfg.seeds))
        scores, reps = [], []
        stamp = data_stamp(task, data_dir)
        for seed in seeds:
            path = cache / f"{cell_key(fingerprint, task, seed, cfg, stamp)}.json"
            if path.is_file():
                found = json.loads(path.read_text())
                row.cached += 1
            else:
                log.info("Scoring %s on %s (seed %d)", row.label, task.column, seed)
                if task.task == "mlm":
                    figure, replicates = masked_lm(
                        str(resolved), row.init, task, data_dir, cfg.bootstrap, cfg
                    )
                    baseline: dict[str, Any] = {}
                else:
                    figure, replicates, baseline = finetuned_seed(
                        str(resolved), row.init, task, data_dir, seed, cfg.bootstrap, cfg
                    )
                found = {"score": figure, "replicates": replicates, "baseline": baseline}
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(found))
                row.scored += 1
            scores.append(found["score"])
            reps.append(found["replicates"])
            if found.get("baseline"):
                baselines[task.column] = found["baseline"]
        row.cells[task.column] = Cell(scores, reps)
    return baselines


def cell_text(cell: Cell | None, confidence: float) -> str:
    if cell is None:
        return "-"
    low, high = cell.interval(confidence)
    return f"{100 * cell.mean:.1f} [{100 * low:.1f}, {100 * high:.1f}]"


def markdown(rows: list[Row], tasks: list[SuiteTask], baselines: dict, report: dict) -> str:
    confidence = report["confidence"]
    head = "| model | " + " | ".join(t.column for t in tasks) + " |"
    lines = [head, "| --- |" + " ---: |" * len(tasks)]
    for row in rows:
        cells = " | ".join(cell_text(row.cells.get(t.column), confidence) for t in tasks)
        lines.append(f"| {row.label} | {cells} |")
    if baselines:
        shown = []
        for t in tasks:
            b = baselines.get(t.column)
            shown.append(f"{100 * b[t.metric]:.1f} ({b['baseline']})" if b else "-")
        lines.append("| lookup baseline | " + " | ".join(shown) + " |")
    lines += ["", f"Differences ({100 * confidence:.0f}% paired intervals, x100):", ""]
    for d in report["differences"]:
        mark = "larger than its interval" if d["separated"] else "within its interval"
        lines.append(
            f"- {d['a']} - {d['b']}, {d['task']}: {100 * d['difference']:+.1f} "
            f"[{100 * d['low']:+.1f}, {100 * d['high']:+.1f}], {mark}"
        )
    return "\n".join(lines) + "\n"


def bar_chart(path: Path, rows: list[Row], tasks: list[SuiteTask], confidence: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = 0.8 / len(rows)
    fig, ax = plt.subplots(figsize=(1.6 * len(tasks) + 2, 4), constrained_layout=True)
    for i, row in enumerate(rows):
        xs, means, errors = [], [], [[], []]
        for j, task in enumerate(tasks):
            cell = row.cells[task.column]
            low, high = cell.interval(confidence)
            xs.append(j + (i - (len(rows) - 1) / 2) * width)
            means.append(100 * cell.mean)
            errors[0].append(100 * max(cell.mean - low, 0.0))
            errors[1].append(100 * max(high - cell.mean, 0.0))
        ax.bar(xs, means, width, yerr=errors, capsize=3, label=row.label)
    ax.set_xticks(range(len(tasks)), [t.column for t in tasks], fontsize="small")
    ax.set_ylabel(f"dev figure (x100), {100 * confidence:.0f}% interval")
    ax.legend(fontsize="small")
    fig.savefig(path, dpi=100)
    plt.close(fig)


def scorecard(cfg, out: Path) -> dict[str, Any]:
    """Score ``cfg.models`` (and the first one's architecture from a random init) on the suite;
    writes scorecard.md, scorecard.json and scorecard.png into ``out``; returns the report."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ConfigError(
            "mlmkit scorecard runs in one process (its fine-tunings are small); run it without "
            "accelerate launch or mlmkit launch."
        )
    if cfg.suite not in SUITES:
        raise ConfigError(f"suite must be one of {', '.join(SUITES)}, got {cfg.suite!r}.")
    if not cfg.models:
        raise ConfigError("models is empty; list model dirs, e.g. models=[outputs/<run>].")
    if cfg.data_dir is None:
        raise ConfigError(
            "data_dir is not set; point it at the suite's data (a folder laid out as "
            "../shared/data: glue/, tokens/, corpora/)."
        )
    from mlmkit.finetune.loop import check_new_run_dir

    check_new_run_dir(out, "scorecard")  # an earlier scorecard there stays as it is
    data_dir = Path(cfg.data_dir).expanduser()
    tasks = SUITES[cfg.suite]
    if cfg.tasks:
        known = {t.task for t in tasks}
        unknown = [t for t in cfg.tasks if t not in known]
        if unknown:
            raise ConfigError(
                f"tasks: {', '.join(unknown)} is not in suite {cfg.suite} "
                f"({', '.join(sorted(known))}); choose from those."
            )
        tasks = [t for t in tasks if t.task in cfg.tasks]
    tasks = [*tasks, *(own_task(spec) for spec in cfg.own_tasks)]
    rows = [Row(m, m, "pretrained") for m in cfg.models]  # labelled as the user named them
    if cfg.random_init:
        rows.insert(0, Row("random init", cfg.models[0], "random"))
    cache = Path(cfg.cache_dir).expanduser() / "scorecard"
    baselines: dict[str, Any] = {}
    for row in rows:
        baselines.update(score_row(row, tasks, data_dir, cfg, cache))
    confidence = cfg.confidence
    differences = []
    for i, a in enumerate(rows):
        for b in rows[:i]:
            for task in tasks:
                d = difference(a.cells[task.column], b.cells[task.column], confidence)
                differences.append({"a": a.label, "b": b.label, "task": task.column, **d})
    report = {
        "suite": cfg.suite,
        "version": SCORECARD_VERSION,
        "seeds": cfg.seeds,
        "bootstrap": cfg.bootstrap,
        "confidence": confidence,
        "tasks": [t.key() for t in tasks],
        "rows": [
            {
                "label": r.label,
                "model": r.model,
                "init": r.init,
                "cached_cells": r.cached,
                "scored_cells": r.scored,
                "cells": {
                    t.column: {
                        "mean": r.cells[t.column].mean,
                        "interval": list(r.cells[t.column].interval(confidence)),
                        "seeds": r.cells[t.column].scores,
                    }
                    for t in tasks
                },
            }
            for r in rows
        ],
        "baselines": baselines,
        "differences": differences,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "scorecard.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "scorecard.md").write_text(markdown(rows, tasks, baselines, report))
    bar_chart(out / "scorecard.png", rows, tasks, confidence)
    return report
