"""Masked language modeling figures over the chosen (masked) tokens.

For each chosen token: its cross-entropy loss (nats), the model's top-k token ids (best
first) and the original token id. Returns the mean loss, the perplexity exp(mean loss),
the top-1 accuracy and the top-k accuracy (k = the number of ids given per token).
"""

import math

import datasets
import evaluate
import numpy as np

_KWARGS = """
Args:
    losses (list of float): cross-entropy of each chosen token, in nats.
    predictions (list of list of int): the top-k predicted token ids of each chosen token, best first.
    references (list of int): the original token id of each chosen token.
Returns:
    loss, perplexity, accuracy, top{k}_accuracy (floats) and tokens (int).
"""


class MaskedLM(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="",
            inputs_description=_KWARGS,
            features=datasets.Features({
                "losses": datasets.Value("float64"),
                "predictions": datasets.Sequence(datasets.Value("int64")),
                "references": datasets.Value("int64"),
            }),
        )

    def _compute(self, losses, predictions, references):
        n = len(references)
        if n == 0:
            return {"loss": float("nan"), "perplexity": float("nan"), "accuracy": 0.0, "tokens": 0}
        losses = np.asarray(losses, dtype=np.float64)
        top = np.asarray(predictions)
        references = np.asarray(references)[:, None]
        loss = float(losses.mean())
        return {
            "loss": loss,
            "perplexity": math.exp(min(loss, 50.0)),
            "accuracy": float((top[:, :1] == references).any(axis=1).mean()),
            f"top{top.shape[1]}_accuracy": float((top == references).any(axis=1).mean()),
            "tokens": n,
        }
