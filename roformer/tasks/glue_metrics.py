"""The official GLUE metrics, computed offline (the `evaluate` library fetches its metric scripts from the hub).

Definitions as in the GLUE paper (Wang et al. 2019) and its evaluation code: CoLA Matthews correlation; STS-B
Pearson and Spearman correlation; MRPC and QQP F1 of the positive class and accuracy; the rest accuracy. Tested
against scikit-learn and scipy.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np


def accuracy(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Fraction of exact matches."""
    p, y = _arrays(predictions, labels)
    return float((p == y).mean())


def f1(predictions: Sequence[int], labels: Sequence[int], positive: int = 1) -> float:
    """F1 of the positive class: 2 TP / (2 TP + FP + FN); 0 when there are no positives at all."""
    p, y = _arrays(predictions, labels)
    tp = np.sum((p == positive) & (y == positive))
    fp = np.sum((p == positive) & (y != positive))
    fn = np.sum((p != positive) & (y == positive))
    denominator = 2 * tp + fp + fn
    return float(2 * tp / denominator) if denominator else 0.0


def matthews_corrcoef(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Matthews correlation (multi-class form of Gorodkin 2004, = the binary phi coefficient); 0 when undefined."""
    p, y = _arrays(predictions, labels)
    classes = np.union1d(p, y)
    confusion = np.zeros((len(classes), len(classes)), dtype=np.float64)
    np.add.at(confusion, (np.searchsorted(classes, y), np.searchsorted(classes, p)), 1)
    t, q = confusion.sum(axis=1), confusion.sum(axis=0)  # true and predicted counts per class
    c, s = np.trace(confusion), confusion.sum()
    denominator = np.sqrt((s**2 - q @ q) * (s**2 - t @ t))
    return float((c * s - t @ q) / denominator) if denominator else 0.0


def pearson(predictions: Sequence[float], labels: Sequence[float]) -> float:
    """Pearson correlation coefficient."""
    p, y = _arrays(predictions, labels, float)
    p, y = p - p.mean(), y - y.mean()
    denominator = np.sqrt((p @ p) * (y @ y))
    return float(p @ y / denominator) if denominator else 0.0


def spearman(predictions: Sequence[float], labels: Sequence[float]) -> float:
    """Spearman rank correlation: Pearson of the ranks, ties given their average rank."""
    p, y = _arrays(predictions, labels, float)
    return pearson(_average_ranks(p), _average_ranks(y))


def _average_ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.arange(1, len(values) + 1)
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    sums = np.zeros(len(counts))
    np.add.at(sums, inverse, ranks)
    return (sums / counts)[inverse]


def _arrays(predictions: Sequence, labels: Sequence, dtype: type = int) -> tuple[np.ndarray, np.ndarray]:
    p, y = np.asarray(predictions, dtype=dtype), np.asarray(labels, dtype=dtype)
    if p.shape != y.shape or p.ndim != 1:
        raise ValueError(f"predictions {p.shape} and labels {y.shape} must be 1-D of the same length")
    if len(p) == 0:
        raise ValueError("no predictions to score")
    return p, y


METRICS = {
    "accuracy": accuracy,
    "f1": f1,
    "matthews_corrcoef": matthews_corrcoef,
    "pearson": pearson,
    "spearman": spearman,
}


def compute(names: Sequence[str], predictions: Sequence, labels: Sequence) -> dict[str, float]:
    """The named metrics, plus `score`: their mean (how the GLUE leaderboard combines F1/accuracy, Pearson/Spearman)."""
    values = {name: METRICS[name](predictions, labels) for name in names}
    values["score"] = float(np.mean(list(values.values())))
    return values


def seed_summary(values: list[float]) -> dict[str, Any]:
    """mean, std (sample; 0 for one value), median and max of a metric over seeds, and the values themselves.

    Non-finite values (a NaN correlation of constant predictions) are left out of the statistics and counted in
    `non_finite`; with no finite value the statistics are NaN. (`statistics.stdev` raises on a NaN.)
    """
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        stats = dict.fromkeys(("mean", "std", "median", "max"), math.nan)
    else:
        stats = {
            "mean": statistics.fmean(finite),
            "std": statistics.stdev(finite) if len(finite) > 1 else 0.0,
            "median": statistics.median(finite),
            "max": max(finite),
        }
    missing = {"non_finite": len(values) - len(finite)} if len(finite) < len(values) else {}
    return {**stats, "values": list(values), **missing}


def ranked(score: float) -> float:
    """`score` for comparisons (best checkpoint, learning rate, seed): NaN ranks below every number.

    `nan > x` is false for every x, so a NaN best score would otherwise never be replaced, and `max` over NaNs
    depends on their order.
    """
    return -math.inf if math.isnan(score) else score
