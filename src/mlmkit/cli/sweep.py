"""One table of the final figures of every run of a sweep.

    python train.py -m optim.lr=1e-3,3e-3,1e-2 train.max_steps=500    # a Hydra multirun
    mlmkit sweep multirun/<date>/<time>                        # its table
    mlmkit sweep outputs/run-a outputs/run-b --csv             # any runs

Each row is one run: the overrides that set it apart from the others (from
.hydra/overrides.yaml; all of them for a single run), its last
step, tokens seen and its last evaluation. Rows are sorted by validation accuracy, best
first.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mlmkit.cli.errors import ArgumentParser
from mlmkit.errors import DataError
from mlmkit.training.metrics_log import read_metrics

COLUMNS = [
    "run",
    "overrides",
    "step",
    "tokens_seen",
    "eval_loss",
    "eval_perplexity",
    "eval_accuracy",
    "eval_top5_accuracy",
]


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run dirs (with metrics.jsonl) among ``paths`` and their subfolders, e.g. a sweep dir."""
    runs: list[Path] = []
    for p in map(Path, paths):
        if (p / "metrics.jsonl").is_file():
            runs.append(p)
        elif p.is_dir():
            runs += sorted((m.parent for m in p.rglob("metrics.jsonl")), key=_natural)
    return runs


def _natural(path: Path) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in path.parts]


def _overrides(run: Path) -> list[str]:
    path = run / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return []
    from omegaconf import ListConfig, OmegaConf

    try:
        overrides = OmegaConf.load(path)
    except Exception as exc:  # not YAML
        raise DataError(
            f"{str(path)!r} is not a YAML list of overrides "
            f"({(str(exc).splitlines() or [type(exc).__name__])[0].rstrip('.')}); "
            "restore it or delete it."
        ) from None
    if not isinstance(overrides, ListConfig):
        raise DataError(f"{str(path)!r} is not a YAML list of overrides; restore it or delete it.")
    skip = ("hydra.", "paths.")
    return [str(o) for o in overrides if not str(o).startswith(skip)]


def summarize(run: Path, root: Path | None = None) -> dict[str, Any]:
    """Return the table row of one run: its overrides, last step and last evaluation."""
    events = read_metrics(run)
    train = [e for e in events if e["event"] == "train"]
    evals = [e for e in events if e["event"] == "eval"]
    row: dict[str, Any] = {
        "run": str(run.relative_to(root))
        if root and run != root and run.is_relative_to(root)
        else str(run),
        "overrides": " ".join(_overrides(run)),
        "step": train[-1].get("step", 0) if train else 0,
        "tokens_seen": train[-1].get("tokens_seen", 0) if train else 0,
    }
    for key in COLUMNS[4:]:
        value = evals[-1].get(key) if evals else None
        row[key] = (
            value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        )
    return row


def sweep_table(paths: list[str | Path]) -> list[dict[str, Any]]:
    """Rows for every run under ``paths``, best validation accuracy first."""
    runs = find_runs(paths)
    if not runs:
        raise FileNotFoundError(
            f"No run (a folder with metrics.jsonl) under {', '.join(map(str, paths))}."
        )
    root = Path(paths[0]) if len(paths) == 1 else None
    rows = [summarize(r, root) for r in runs]
    if len(runs) > 1:  # show what differs between the runs (the swept settings)
        common = set.intersection(*(set(_overrides(r)) for r in runs))
        for row, run in zip(rows, runs):
            row["overrides"] = " ".join(o for o in _overrides(run) if o not in common)
    return sorted(
        rows, key=lambda r: -(r["eval_accuracy"] if r["eval_accuracy"] is not None else -1)
    )


def format_table(rows: list[dict[str, Any]]) -> str:
    def cell(v: Any) -> str:
        if v is None:
            return "-"
        return f"{v:.4f}" if isinstance(v, float) else str(v)

    cells = [COLUMNS] + [[cell(r[c]) for c in COLUMNS] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="mlmkit sweep", description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", help="a sweep dir (multirun/<date>/<time>) or run dirs")
    parser.add_argument("--csv", action="store_true", help="print CSV instead of a table")
    args = parser.parse_args(argv)
    try:
        rows = sweep_table(args.paths)
    except FileNotFoundError as exc:
        raise DataError(str(exc)) from None
    if args.csv:
        import csv

        writer = csv.DictWriter(sys.stdout, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    else:
        print(format_table(rows))
    return 0
