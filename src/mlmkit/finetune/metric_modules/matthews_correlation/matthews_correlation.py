"""Matthews correlation coefficient, the official metric of CoLA (GLUE).

For K classes with confusion matrix C (rows: true class, columns: predicted), t_k the
true count and p_k the predicted count of class k, c = trace(C) and s = sum(C):

    MCC = (c * s - sum_k p_k t_k) / sqrt((s^2 - sum_k p_k^2) * (s^2 - sum_k t_k^2))

(Gorodkin, 2004), which for two classes is (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)).
It is 0 when either factor under the root is 0 (a constant prediction or reference).
"""

import datasets
import evaluate
import numpy as np

_CITATION = """\
@article{matthews1975,
  title={Comparison of the predicted and observed secondary structure of T4 phage lysozyme},
  author={Matthews, Brian W.}, journal={Biochimica et Biophysica Acta}, year={1975}}
@article{gorodkin2004,
  title={Comparing two K-category assignments by a K-category correlation coefficient},
  author={Gorodkin, Jan}, journal={Computational Biology and Chemistry}, year={2004}}
"""
_KWARGS = """
Args:
    predictions (list of int): predicted labels.
    references (list of int): true labels.
Returns:
    matthews_correlation (float): in [-1, 1]; 0 is chance level.
"""


class MatthewsCorrelation(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation=_CITATION,
            inputs_description=_KWARGS,
            features=datasets.Features(
                {"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}
            ),
        )

    def _compute(self, predictions, references):
        predictions, references = np.asarray(predictions), np.asarray(references)
        classes = np.union1d(predictions, references)
        index = {c: i for i, c in enumerate(classes.tolist())}
        k = len(classes)
        confusion = np.zeros((k, k), dtype=np.float64)
        for t, p in zip(references.tolist(), predictions.tolist()):
            confusion[index[t], index[p]] += 1
        true_counts, pred_counts = confusion.sum(axis=1), confusion.sum(axis=0)
        correct, total = np.trace(confusion), confusion.sum()
        cov = correct * total - pred_counts @ true_counts
        denom = (total**2 - pred_counts @ pred_counts) * (total**2 - true_counts @ true_counts)
        return {"matthews_correlation": float(cov / np.sqrt(denom)) if denom > 0 else 0.0}
