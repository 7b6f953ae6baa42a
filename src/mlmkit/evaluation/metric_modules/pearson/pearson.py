"""Pearson correlation coefficient, one of STS-B's (GLUE) two metrics.

    r = sum((p - mean p)(t - mean t)) / sqrt(sum((p - mean p)^2) * sum((t - mean t)^2))

for predictions p and references t; 0 when either is constant.
"""

import datasets
import evaluate

from mlmkit.evaluation.correlation import pearson

_KWARGS = """
Args:
    predictions (list of float): predicted scores.
    references (list of float): gold scores.
Returns:
    pearson (float): in [-1, 1].
"""


class Pearson(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="",
            inputs_description=_KWARGS,
            features=datasets.Features({"predictions": datasets.Value("float64"),
                                        "references": datasets.Value("float64")}),
        )

    def _compute(self, predictions, references):
        return {"pearson": pearson(predictions, references)}
