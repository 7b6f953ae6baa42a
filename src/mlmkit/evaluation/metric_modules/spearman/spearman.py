"""Spearman rank correlation, the headline metric of STS-B (GLUE) and of STS benchmarks.

Pearson's r of the ranks of predictions and references, equal values sharing the mean of
their ranks; 0 when either is constant.
"""

import datasets
import evaluate

from mlmkit.evaluation.correlation import spearman

_KWARGS = """
Args:
    predictions (list of float): predicted scores.
    references (list of float): gold scores.
Returns:
    spearman (float): in [-1, 1].
"""


class Spearman(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="",
            inputs_description=_KWARGS,
            features=datasets.Features({"predictions": datasets.Value("float64"),
                                        "references": datasets.Value("float64")}),
        )

    def _compute(self, predictions, references):
        return {"spearman": spearman(predictions, references)}
