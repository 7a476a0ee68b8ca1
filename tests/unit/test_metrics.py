"""GLUE metrics against scikit-learn and scipy on random predictions (the `evaluate` scripts need the hub)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as sk

from roformer.tasks.glue_metrics import accuracy, compute, f1, matthews_corrcoef, pearson, spearman


@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_match_sklearn(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 400))
    y, p = rng.integers(0, 2, n), rng.integers(0, 2, n)
    assert accuracy(p, y) == pytest.approx(sk.accuracy_score(y, p))
    assert f1(p, y) == pytest.approx(sk.f1_score(y, p))
    assert matthews_corrcoef(p, y) == pytest.approx(sk.matthews_corrcoef(y, p))
    y3, p3 = rng.integers(0, 3, n), rng.integers(0, 3, n)  # MNLI-style three classes
    assert matthews_corrcoef(p3, y3) == pytest.approx(sk.matthews_corrcoef(y3, p3))
    assert accuracy(p3, y3) == pytest.approx(sk.accuracy_score(y3, p3))


@pytest.mark.parametrize("seed", range(5))
def test_correlations_match_scipy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 26, 300) / 5.0  # STS-B-like scores in [0, 5] with many ties
    p = y + rng.normal(0, 1.0, 300)
    assert pearson(p, y) == pytest.approx(stats.pearsonr(p, y)[0])
    assert spearman(p, y) == pytest.approx(stats.spearmanr(p, y)[0])
    rounded = np.round(p)  # ties on both sides
    assert spearman(rounded, y) == pytest.approx(stats.spearmanr(rounded, y)[0])


def test_degenerate_cases() -> None:
    assert matthews_corrcoef([1, 1, 1], [0, 1, 1]) == 0.0 == sk.matthews_corrcoef([0, 1, 1], [1, 1, 1])
    assert f1([0, 0], [0, 0]) == 0.0
    with pytest.raises(ValueError):
        accuracy([1, 0], [1])
    values = compute(["f1", "accuracy"], [1, 0, 1, 1], [1, 0, 0, 1])
    assert values["score"] == pytest.approx((values["f1"] + values["accuracy"]) / 2)
