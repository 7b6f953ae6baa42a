"""Training: the loop (``trainer``), its evaluation on fixed masks (``validation``), budgets
and the schedule against them (``budget``), checkpoints (``checkpoint``), a trained model
from a model dir, run dir or checkpoint (``loading``), the optimizer (``optim``), speed
settings (``runtime``), throughput and MFU (``perf``), trackers (``tracking``) and
metrics.jsonl (``metrics_log``)."""
