"""Pearson correlation coefficient, one of STS-B's (GLUE) two metrics.

    r = sum((p - mean p)(t - mean t)) / sqrt(sum((p - mean p)^2) * sum((t - mean t)^2))

for predictions p and references t; 0 when either is constant.
"""

from mlmkit.finetune.correlation import pearson
from mlmkit.finetune.metric_modules import correlation_metric

Pearson = correlation_metric("pearson", pearson, __doc__)
