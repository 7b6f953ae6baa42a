"""Spearman rank correlation, the headline metric of STS-B (GLUE) and of STS benchmarks.

Pearson's r of the ranks of predictions and references, equal values sharing the mean of
their ranks; 0 when either is constant.
"""

from mlmkit.finetune.correlation import spearman
from mlmkit.finetune.metric_modules import correlation_metric

Spearman = correlation_metric("spearman", spearman, __doc__)
