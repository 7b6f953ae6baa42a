"""Binary F1 of class 1, which GLUE reports with accuracy for MRPC and QQP (Wang et al., 2019).

With class 1 the positive class (every other class counts as negative), TP the examples
predicted 1 whose reference is 1, FP those predicted 1 with another reference and FN those
with reference 1 predicted otherwise:

    precision = TP / (TP + FP),  recall = TP / (TP + FN),
    F1 = 2 * precision * recall / (precision + recall) = 2 TP / (2 TP + FP + FN)

It is 0 when there is no true positive, including when nothing is predicted 1.
"""

import datasets
import evaluate
import numpy as np

_CITATION = """\
@inproceedings{wang2019glue,
  title={{GLUE}: A Multi-Task Benchmark and Analysis Platform for Natural Language Understanding},
  author={Wang, Alex and Singh, Amanpreet and Michael, Julian and Hill, Felix and Levy, Omer and
          Bowman, Samuel R.}, booktitle={ICLR}, year={2019}}
"""
_KWARGS = """
Args:
    predictions (list of int): predicted labels.
    references (list of int): true labels.
Returns:
    f1 (float): in [0, 1], the F1 of class 1.
"""


class F1(evaluate.Metric):
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
        predicted, true = np.asarray(predictions) == 1, np.asarray(references) == 1
        tp = int((predicted & true).sum())
        fp, fn = int((predicted & ~true).sum()), int((~predicted & true).sum())
        return {"f1": 2 * tp / (2 * tp + fp + fn) if tp else 0.0}
