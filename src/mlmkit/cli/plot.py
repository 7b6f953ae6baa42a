"""Curves of one or several runs from their metrics.jsonl, as one PNG.

    mlmkit plot outputs/<run>                      # writes outputs/<run>/curves.png
    mlmkit plot multirun/<date>/<time>/* --out lr-sweep.png

Four panels against the optimizer step: training loss, validation accuracy (masked
tokens; the dashed line is the majority-token baseline), learning rate and tokens/s; the
probe's dev accuracy on its labelled task, when a run probed (``probe.every``). A replaced-token
detection run (``objective=rtd``) shows both its losses: the generator's masked-LM loss in the
first panel (where a masked-LM run's loss is drawn beside it) and the discriminator's in
the second. A phased run's phases begin at its dotted vertical lines, named in the learning-rate
panel.
"""

from __future__ import annotations

from pathlib import Path

from mlmkit.cli.errors import ArgumentParser
from mlmkit.errors import ConfigError, DataError
from mlmkit.training.metrics_log import read_metrics

PANELS = [  # (event, key, title)
    ("train", "loss", "training loss (masked tokens)"),
    ("eval", "eval_accuracy", "validation accuracy (masked tokens)"),
    ("train", "lr", "learning rate"),
    ("train", "tokens_per_s", "tokens/s"),
]
PROBE_PANEL = ("probe", "probe_accuracy", "linear probe, dev accuracy (frozen encoder)")
# replaced-token detection (objective=rtd): the generator's and the discriminator's losses
RTD_PANEL = ("train", "rtd_loss", "discriminator loss (replaced or not, every token)")
RTD_LOSS_TITLE = "generator loss (masked tokens)"


def run_label(run: Path, runs: list[Path]) -> str:
    """Return the shortest trailing part of the path that tells the runs apart."""
    parts = run.resolve().parts
    for n in range(1, len(parts) + 1):
        labels = {"/".join(r.resolve().parts[-n:]) for r in runs}
        if len(labels) == len(runs):
            return "/".join(parts[-n:])
    return str(run)


def plot_runs(runs: list[str | Path], out: str | Path) -> Path:
    """Draw the curves of ``runs`` into the PNG file ``out``; returns its path."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    runs = [Path(r) for r in runs]
    loaded = []
    for run in runs:
        if not (run / "metrics.jsonl").is_file():
            raise FileNotFoundError(
                f"{str(run)!r} has no metrics.jsonl; pass run dirs (outputs/<run>)."
            )
        loaded.append((run_label(run, runs), read_metrics(run)))
    probed = any(e["event"] == "probe" for _, events in loaded for e in events)
    rtd = any("rtd_loss" in e for _, events in loaded for e in events)
    panels = list(PANELS)
    if rtd:  # both losses: a masked-LM run's loss is drawn in the generator's panel
        panels[0] = ("train", "mlm_loss", RTD_LOSS_TITLE)
        panels.insert(1, RTD_PANEL)
    panels += [PROBE_PANEL] if probed else []
    columns = 2 if len(panels) <= 4 else 3
    fig, axes = plt.subplots(
        2, columns, figsize=(6 * columns, 8), constrained_layout=True, squeeze=False
    )
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (kind, key, title) in zip(axes.flat, panels):
        for i, (label, events) in enumerate(loaded):
            read = "loss" if key == "mlm_loss" and not any("mlm_loss" in e for e in events) else key
            points = [
                (e["step"], e[read])
                for e in events
                if e["event"] == kind and _number(e.get("step")) and _number(e.get(read))
            ]
            if points:
                steps, values = zip(*points)
                ax.plot(
                    steps,
                    values,
                    label=label,
                    color=f"C{i}",
                    marker="." if len(points) < 30 else None,
                )
            _mark_phases(ax, events, f"C{i}", named=key == "lr")
            if key == "eval_accuracy":
                base = [
                    e["baseline_accuracy"]
                    for e in events
                    if e["event"] == "baseline" and _number(e.get("baseline_accuracy"))
                ]
                if base:
                    ax.axhline(base[0], color=f"C{i}", linestyle="--", linewidth=0.8)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if key == "lr":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    axes.flat[0].legend(fontsize="small")
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100)
    except (OSError, ValueError) as exc:  # a folder or a file in the way, a format matplotlib lacks
        reason = (
            getattr(exc, "strerror", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
        )
        reason = reason.split(" (supported formats")[0]
        raise ConfigError(
            f"Cannot write the plot to --out {str(out)!r} ({reason.rstrip('.')}); "
            "pass a writable .png file path."
        ) from None
    finally:
        plt.close(fig)
    return out


def _mark_phases(ax, events: list[dict], colour: str, named: bool) -> None:
    """Mark a phased run: a dotted line where each later phase begins (``named``: with its name)."""
    for e in events:
        if e["event"] == "phase" and _number(e.get("step")) and e["step"] > 0:
            ax.axvline(e["step"], color=colour, linestyle=":", linewidth=0.8)
            if named:
                ax.annotate(
                    str(e.get("phase", "")),
                    (e["step"], 1.0),
                    xycoords=("data", "axes fraction"),
                    fontsize="small",
                    rotation=90,
                    va="top",
                    ha="right",
                )


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="mlmkit plot", description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="run dirs (each with metrics.jsonl)")
    parser.add_argument(
        "--out", help="PNG file (default: <run>/curves.png for one run, comparison.png for several)"
    )
    args = parser.parse_args(argv)
    out = args.out or (
        Path(args.runs[0]) / "curves.png" if len(args.runs) == 1 else "comparison.png"
    )
    try:
        path = plot_runs(args.runs, out)
    except FileNotFoundError as exc:
        raise DataError(str(exc)) from None
    print(path)
    return 0
