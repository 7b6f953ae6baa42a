"""Pearson and Spearman correlation of two sequences of numbers, in numpy (no scipy).

Spearman's rho is Pearson's r of the ranks, ties given the mean of the ranks they span
(as STS benchmarks report it). Either is 0 when a sequence is constant (no variance),
and for fewer than two values.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson's r of ``x`` and ``y`` (equal lengths)."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(
            f"pearson: two sequences of the same length are needed, got {a.shape} and {b.shape}"
        )
    if a.size < 2:
        return 0.0
    a, b = a - a.mean(), b - b.mean()
    denom = np.sqrt((a @ a) * (b @ b))
    return float(np.clip((a @ b) / denom, -1.0, 1.0)) if denom > 0 else 0.0


def ranks(x: Sequence[float]) -> np.ndarray:
    """1-based ranks of ``x``; equal values share the mean of the ranks they occupy."""
    a = np.asarray(x, dtype=np.float64)
    order = np.argsort(a, kind="stable")
    sorted_values = a[order]
    # runs of equal values: [start, end) in sorted order
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], a.size]
    mean_rank = (starts + ends + 1) / 2.0  # mean of start+1 .. end
    out = np.empty(a.size, dtype=np.float64)
    out[order] = np.repeat(mean_rank, ends - starts)
    return out


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho of ``x`` and ``y``: Pearson's r of their (tie-averaged) ranks."""
    return pearson(ranks(x), ranks(y))
