"""Training: the loop (``trainer``), budgets and the schedule against them (``budget``),
checkpoints (``checkpoint``), the optimizer (``optim``), speed settings (``runtime``),
throughput and MFU (``perf``), trackers (``tracking``) and metrics.jsonl (``metrics_log``)."""
