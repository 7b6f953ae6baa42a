"""GLUE as papers report it: each task fine-tuned under one protocol, one row of scores and
their average.

    mlmkit glue checkpoint=outputs/<run> data_dir=path/to/glue_data
    mlmkit glue checkpoint=outputs/<run> data_dir=... protocol=modern seeds=[0,1,2]
    mlmkit glue checkpoint=outputs/<run> data_dir=... init=random      # the same table from scratch

Protocols (``protocol=``):

- ``bert`` (Devlin et al., 2019, section 4.1): 3 epochs at batch 32 for every task, the best
  dev score over the learning rates {5, 4, 3, 2}e-5, one seed.
- ``modern``: the way MosaicBERT (Portes et al., 2023) and ModernBERT (Warner et al., 2024)
  report GLUE: for each task every learning rate of a grid with several seeds, the median over
  the seeds at the learning rate whose median is best; RTE, MRPC and STS-B start from the
  weights fine-tuned on MNLI (its best run), as RoBERTa did (Liu et al., 2019). Its defaults
  here: learning rates {1, 2, 3, 5, 8}e-5, seeds 0, 1, 2, 3 epochs (10 for RTE, MRPC and
  STS-B, whose training sets are small).

``lrs``, ``seeds`` and ``epochs`` replace a protocol's values. A task's score is its metric, or
the mean of its two (MRPC and QQP: F1 and accuracy; STS-B: Pearson and Spearman; MNLI: the
matched and mismatched accuracy); the average is the unweighted mean of the task scores, WNLI
left out as usual (GLUE's WNLI dev set is adversarial to training-set statistics), and it is
labelled with the tasks it covers: a task whose data is missing is skipped with a note.
``parallel`` tasks run side by side, each in a process of its own pinned to a GPU (default:
one per visible GPU; one at a time on a CPU): ``mlmkit.evaluation.workers``.
Each fine-tuning is ``mlmkit finetune`` (``finetune.loop.finetune``) into
``<run dir>/<task>/lr<lr>-seed<seed>/``; the results are ``results.json``, ``results.md`` (the
table) and ``glue.png`` (a bar chart) in the run dir.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlmkit.config import FinetuneConfig, GlueConfig, TaskConfig
from mlmkit.errors import ConfigError, DataError

log = logging.getLogger("mlmkit")


@dataclass(frozen=True)
class GlueTask:
    name: str  # conf/task/<name>.yaml
    folder: str  # its folder in glue_data/
    column: str  # its column in the table
    metrics: tuple[str, ...]  # averaged into the task's score
    small: bool = (
        False  # a small training set: more epochs and, in the modern protocol, MNLI's start
    )


TASKS = {
    t.name: t
    for t in (
        GlueTask("cola", "CoLA", "CoLA", ("matthews_correlation",)),
        GlueTask("sst2", "SST-2", "SST-2", ("accuracy",)),
        GlueTask("mrpc", "MRPC", "MRPC", ("f1", "accuracy"), small=True),
        GlueTask("stsb", "STS-B", "STS-B", ("pearson", "spearman"), small=True),
        GlueTask("qqp", "QQP", "QQP", ("f1", "accuracy")),
        GlueTask("mnli", "MNLI", "MNLI-m/mm", ("accuracy",)),
        GlueTask("qnli", "QNLI", "QNLI", ("accuracy",)),
        GlueTask("rte", "RTE", "RTE", ("accuracy",), small=True),
        GlueTask("wnli", "WNLI", "WNLI", ("accuracy",)),
    )
}
AVERAGED = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte")  # GLUE's 8, WNLI aside


@dataclass
class Protocol:
    name: str
    lrs: list[float]
    seeds: list[int]
    epochs: float
    small_epochs: float  # RTE, MRPC, STS-B
    from_mnli: bool  # RTE, MRPC and STS-B start from the MNLI-fine-tuned weights
    summary: str = ""

    def describe(self) -> str:
        lrs = ", ".join(f"{lr:g}" for lr in self.lrs)
        seeds = ", ".join(map(str, self.seeds))
        epochs = f"{self.epochs:g} epochs" + (
            f" ({self.small_epochs:g} for RTE, MRPC, STS-B)"
            if self.small_epochs != self.epochs
            else ""
        )
        pick = (
            "the best dev score" if len(self.seeds) == 1 else "the median over seeds at the best lr"
        )
        start = "; RTE, MRPC and STS-B from the MNLI-fine-tuned weights" if self.from_mnli else ""
        return f"{self.name}: lr {{{lrs}}}, seeds {{{seeds}}}, {epochs}, {pick}{start}"


def protocol_of(cfg: GlueConfig) -> Protocol:
    """Return the protocol ``cfg`` names, with its ``lrs``, ``seeds`` and ``epochs`` if set."""
    if cfg.protocol == "bert":
        p = Protocol("bert", [5e-5, 4e-5, 3e-5, 2e-5], [0], 3.0, 3.0, False)
    else:
        p = Protocol("modern", [1e-5, 2e-5, 3e-5, 5e-5, 8e-5], [0, 1, 2], 3.0, 10.0, True)
    if cfg.lrs is not None:
        p.lrs = list(cfg.lrs)
    if cfg.seeds is not None:
        p.seeds = list(cfg.seeds)
    if cfg.epochs is not None:
        p.epochs = p.small_epochs = cfg.epochs
    return p


def task_config(name: str, data_dir: str | None) -> TaskConfig:
    """conf/task/<name>.yaml (shipped in the package), its files in ``data_dir/<GLUE folder>``."""
    from importlib.resources import files

    from omegaconf import OmegaConf

    from mlmkit.config import CONFIG_MODULE

    text = (files(CONFIG_MODULE) / "task" / f"{name}.yaml").read_text(encoding="utf-8")
    merged = OmegaConf.merge(OmegaConf.structured(TaskConfig), OmegaConf.create(text))
    task = OmegaConf.to_object(merged)
    if data_dir is not None:
        task.data_dir = str(Path(data_dir).expanduser() / TASKS[name.removesuffix("_mm")].folder)
    return task


def check_tasks(names: list[str]) -> None:
    unknown = [n for n in names if n not in TASKS]
    if unknown:
        raise ConfigError(
            f"tasks: {', '.join(map(repr, unknown))} is not a GLUE task; choose from "
            f"{', '.join(TASKS)}."
        )


def missing_data(task: TaskConfig) -> str | None:
    """Why a task's local files cannot be read (None: they are there, or the Hub is used)."""
    if task.data_dir is None:
        return None
    for split in ("train_file", "eval_file"):
        path = Path(task.data_dir) / getattr(task, split)
        if not path.is_file():
            return f"no {path}"
    return None


@dataclass
class TaskResult:
    """The runs of one task and the score chosen from them."""

    task: str
    runs: list[dict[str, Any]] = field(default_factory=list)  # lr, seed, metrics, model
    score: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # the chosen figures
    lr: float | None = None
    skipped: str | None = None
    ran_on: dict[str, Any] = field(default_factory=dict)  # device and process (workers.job_place)


def task_score(task: GlueTask, figures: dict[str, float]) -> float:
    return sum(figures[m] for m in task.metrics) / len(task.metrics)


def choose(task: GlueTask, runs: list[dict[str, Any]]) -> tuple[float, float, dict[str, float]]:
    """``(lr, score, figures)``: the learning rate whose median score over its seeds is best, that
    median and the figures of the run that scored it (of an even count of seeds, the lower of
    the middle two, so that the figures are one run's)."""
    by_lr: dict[float, list[dict[str, Any]]] = {}
    for run in runs:
        by_lr.setdefault(run["lr"], []).append(run)
    best = None
    for lr, group in by_lr.items():
        middle = sorted(group, key=lambda r: r["score"])[(len(group) - 1) // 2]
        if best is None or middle["score"] > best[1]:
            best = (lr, middle["score"], middle["metrics"])
    return best


def finetune_run(
    cfg: GlueConfig,
    task: TaskConfig,
    checkpoint: str,
    init: str,
    lr: float,
    seed: int,
    epochs: float,
    out: Path,
) -> dict[str, Any]:
    """One fine-tuning (``mlmkit finetune``) and its dev figures."""
    from mlmkit.finetune.loop import finetune

    ft = FinetuneConfig(
        checkpoint=checkpoint,
        init=init,
        task=task,
        max_seq_length=cfg.max_seq_length,
        batch_size=cfg.batch_size,
        epochs=epochs,
        max_train_samples=cfg.max_train_samples,
        lr=lr,
        pooling=cfg.pooling,
        precision=cfg.precision,
        seed=seed,
        save_model=True,
        keep_best=False,  # the protocols' figures are their last epoch's, at fixed epochs
        patience=None,
    )
    summary = finetune(ft, out)
    return {
        "lr": lr,
        "seed": seed,
        "model": summary["model"],
        "pooling": summary.get("pooling"),
        "metrics": {
            k.removeprefix("eval_"): v
            for k, v in summary.items()
            if k.startswith("eval_") and k != "eval_examples"
        },
    }


def mismatched_accuracy(model_dir: str, data_dir: str | None) -> float:
    """MNLI's mismatched dev accuracy of an MNLI-fine-tuned model."""
    from mlmkit.evaluation.predict import load_classifier, predict
    from mlmkit.finetune.reader import load_split

    task = task_config("mnli_mm", data_dir)
    examples = load_split(task, "eval")
    model, tokenizer, meta = load_classifier(model_dir)
    preds = predict(
        model, tokenizer, [e["text"] for e in examples], meta.get("max_seq_length", 128)
    )
    names = list(task.labels)
    return sum(names.index(p["label"]) == e["label"] for p, e in zip(preds, examples)) / max(
        len(examples), 1
    )


def run_task(
    cfg: GlueConfig, name: str, protocol: Protocol, run_dir: Path, mnli_model: str | None
) -> TaskResult:
    """Every (lr, seed) run of one task, and the score chosen from them."""
    from mlmkit.evaluation.workers import job_place

    meta, result = TASKS[name], TaskResult(name, ran_on=job_place())
    task = task_config(name, cfg.data_dir)
    if why := missing_data(task):
        result.skipped = why
        return result
    from_mnli = protocol.from_mnli and meta.small and mnli_model is not None
    checkpoint, init = (mnli_model, "pretrained") if from_mnli else (cfg.checkpoint, cfg.init)
    epochs = protocol.small_epochs if meta.small else protocol.epochs
    for lr in protocol.lrs:
        for seed in protocol.seeds:
            out = run_dir / name / f"lr{lr:g}-seed{seed}"
            try:
                run = finetune_run(cfg, task, checkpoint, init, lr, seed, epochs, out)
            except (
                DataError
            ) as exc:  # the Hub unreachable: the task is skipped; a local file's fault stops
                if task.data_dir is not None or result.runs:
                    raise
                result.skipped = str(exc)
                return result
            if name == "mnli":
                run["metrics"]["accuracy_mm"] = mismatched_accuracy(run["model"], cfg.data_dir)
            run["score"] = task_score(
                meta,
                {
                    **run["metrics"],
                    **(
                        {
                            "accuracy": (run["metrics"]["accuracy"] + run["metrics"]["accuracy_mm"])
                            / 2
                        }
                        if name == "mnli"
                        else {}
                    ),
                },
            )
            result.runs.append(run)
            log.info("GLUE %s lr %g seed %d: %.4f", name, lr, seed, run["score"])
    result.lr, result.score, result.metrics = choose(meta, result.runs)
    return result


def run_tasks(
    cfg: GlueConfig, order: list[str], protocol: Protocol, run_dir: Path
) -> dict[str, TaskResult]:
    """Each task's runs, ``cfg.parallel`` tasks at once (``workers.pool``: a process per task,
    pinned to a GPU); under a protocol that starts RTE, MRPC and STS-B from MNLI's model,
    those wait for MNLI. Returns the results in ``order``."""
    from concurrent.futures import FIRST_COMPLETED, wait

    from mlmkit.evaluation.workers import pool

    after_mnli = [n for n in order if protocol.from_mnli and TASKS[n].small and "mnli" in order]
    results: dict[str, TaskResult] = {}
    with pool(cfg.parallel) as executor:
        running = {
            executor.submit(run_task, cfg, n, protocol, run_dir, None): n
            for n in order
            if n not in after_mnli
        }
        try:
            while running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    name = running.pop(future)
                    results[name] = future.result()
                    if results[name].skipped:
                        log.warning("GLUE %s skipped: %s", name, results[name].skipped)
                    if name == "mnli":
                        runs = results[name].runs
                        mnli_model = max(runs, key=lambda r: r["score"])["model"] if runs else None
                        running.update(
                            {
                                executor.submit(run_task, cfg, n, protocol, run_dir, mnli_model): n
                                for n in after_mnli
                            }
                        )
        except BaseException:
            executor.shutdown(wait=True, cancel_futures=True)  # the running tasks end; none starts
            raise
    return {n: results[n] for n in order}


def average(results: dict[str, TaskResult]) -> tuple[float | None, list[str]]:
    """Return the unweighted mean of the scored tasks of GLUE's eight, and which they are."""
    covered = [n for n in AVERAGED if n in results and results[n].score is not None]
    return (sum(results[n].score for n in covered) / len(covered) if covered else None), covered


def cell(name: str, result: TaskResult | None) -> str:
    if result is None or result.score is None:
        return "-"
    m = result.metrics
    if name == "mnli":
        return f"{100 * m['accuracy']:.1f}/{100 * m['accuracy_mm']:.1f}"
    if name in ("mrpc", "qqp"):
        return f"{100 * m['f1']:.1f}/{100 * m['accuracy']:.1f}"
    if name == "stsb":
        return f"{100 * m['pearson']:.1f}/{100 * m['spearman']:.1f}"
    return f"{100 * result.score:.1f}"


def table(label: str, results: dict[str, TaskResult], names: list[str]) -> str:
    """One Markdown row per model: a column per task, the average last."""
    score, covered = average(results)
    head = f"GLUE ({len(covered)} of {len(AVERAGED)})"
    columns = [TASKS[n].column for n in names]
    lines = [
        "| model | " + " | ".join(columns) + f" | {head} |",
        "| --- |" + " ---: |" * (len(columns) + 1),
        f"| {label} | "
        + " | ".join(cell(n, results.get(n)) for n in names)
        + f" | {'-' if score is None else f'{100 * score:.1f}'} |",
    ]
    return "\n".join(lines)


def bar_chart(path: Path, label: str, results: dict[str, TaskResult], names: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    score, covered = average(results)
    bars = [
        (TASKS[n].column, 100 * results[n].score) for n in names if results[n].score is not None
    ]
    if score is not None:
        bars.append((f"GLUE ({len(covered)} of {len(AVERAGED)})", 100 * score))
    fig, ax = plt.subplots(figsize=(1.2 * max(len(bars), 4), 4), constrained_layout=True)
    ax.bar([b[0] for b in bars], [b[1] for b in bars], color=["C0"] * (len(bars) - 1) + ["C1"])
    for i, (_, value) in enumerate(bars):
        ax.text(i, value, f"{value:.1f}", ha="center", va="bottom", fontsize="small")
    ax.set_ylabel("dev score (x100)")
    ax.set_title(label)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def glue(
    cfg: GlueConfig, run_dir: str | Path, on_open: Callable[[Path], None] | None = None
) -> dict[str, Any]:
    """Run ``cfg``'s tasks (MNLI first when the protocol starts others from it), write
    results.json, results.md and glue.png to ``run_dir`` (a new or empty folder); returns what
    results.json holds. ``on_open(run_dir)`` is called once every check has passed, before
    anything is written there."""
    from mlmkit.finetune.loop import check_new_run_dir
    from mlmkit.training.trained_model import resolve_model_path

    run_dir, protocol = Path(run_dir), protocol_of(cfg)
    check_new_run_dir(run_dir, "GLUE evaluation")
    check_tasks(cfg.tasks)
    resolve_model_path(cfg.checkpoint)  # a wrong path is one sentence now, not one per task
    if cfg.data_dir is not None and not Path(cfg.data_dir).expanduser().is_dir():
        raise DataError(
            f"data_dir={cfg.data_dir!r} is not a folder; set it to GLUE's data folder (CoLA/, "
            "SST-2/, MRPC/, ... as GLUE's download writes them), or to null for the Hub."
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    if on_open is not None:
        on_open(run_dir)
    names = [n for n in TASKS if n in cfg.tasks]  # GLUE's order
    order = sorted(names, key=lambda n: n != "mnli") if protocol.from_mnli else names
    log.info("GLUE %s, protocol %s", ", ".join(names), protocol.describe())
    results = run_tasks(cfg, order, protocol, run_dir)
    if all(r.skipped for r in results.values()):
        first = results[names[0]]
        raise DataError(
            f"No GLUE task could be run ({first.task}: {first.skipped.rstrip('.')}); set "
            "data_dir to GLUE's data folder (CoLA/, SST-2/, ...) or tasks to those it holds."
        )
    label = f"{cfg.checkpoint}" + (" (random init)" if cfg.init == "random" else "")
    score, covered = average(results)
    out = {
        "checkpoint": cfg.checkpoint,
        "init": cfg.init,
        "protocol": protocol.describe(),
        "average": score,
        "average_tasks": covered,
        "table": table(label, results, names),
        "tasks": {n: vars(results[n]) for n in names},
    }
    (run_dir / "results.json").write_text(json.dumps(out, indent=2) + "\n")
    skipped = [f"{n}: {results[n].skipped}" for n in names if results[n].skipped]
    (run_dir / "results.md").write_text(
        f"{out['table']}\n\nProtocol {out['protocol']}.\n"
        + "".join(f"Skipped {s}\n" for s in skipped)
    )
    if any(results[n].score is not None for n in names):
        bar_chart(run_dir / "glue.png", label, results, names)
    return out
