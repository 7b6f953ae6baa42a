"""``evaluate`` metric modules shipped with mlmkit, so they load without a network.

``evaluate.load("accuracy")`` fetches a script from the Hugging Face Hub; these are local
scripts for the same API: ``load_metric("accuracy")`` or
``evaluate.load(str(metric_path("accuracy")))``.
"""

from __future__ import annotations

from pathlib import Path

from mlmkit.config.schema import METRICS  # task.metrics checks against the same names

HERE = Path(__file__).resolve().parent


def metric_path(name: str) -> Path:
    """Return the folder of the shipped metric ``name`` (the script inside has the same name)."""
    if name not in METRICS:
        raise ValueError(f"Unknown metric {name!r}; mlmkit ships {', '.join(METRICS)}.")
    return HERE / name


def load_metric(name: str, **kwargs):
    """``evaluate.load`` of a shipped metric (no network needed)."""
    import evaluate

    return evaluate.load(str(metric_path(name)), **kwargs)


def correlation_metric(key: str, fn, description: str):
    """Make the ``evaluate.Metric`` class of a correlation ``fn(predictions, references)`` (the
    shipped ``pearson`` and ``spearman`` scripts), reporting ``{key: value}``."""
    import datasets
    import evaluate

    inputs = (
        f"Args:\n    predictions (list of float): predicted scores.\n    references (list of "
        f"float): gold scores.\nReturns:\n    {key} (float): in [-1, 1].\n"
    )

    class Correlation(evaluate.Metric):
        def _info(self):
            return evaluate.MetricInfo(
                description=description,
                citation="",
                inputs_description=inputs,
                features=datasets.Features(
                    {
                        "predictions": datasets.Value("float64"),
                        "references": datasets.Value("float64"),
                    }
                ),
            )

        def _compute(self, predictions, references):
            return {key: fn(predictions, references)}

    Correlation.__name__ = Correlation.__qualname__ = key.capitalize()
    return Correlation
