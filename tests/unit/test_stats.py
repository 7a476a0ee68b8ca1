"""Comparison statistics against SciPy: t quantiles, paired and Welch intervals."""

from __future__ import annotations

import pytest
from scipy import stats

from roformer.study.stats import difference, t_cdf, t_quantile


@pytest.mark.parametrize("dof", [1, 2, 3, 4.5, 9, 30, 200])
@pytest.mark.parametrize("p", [0.6, 0.9, 0.975, 0.995, 0.025])
def test_t_distribution_equals_scipy(dof: float, p: float) -> None:
    assert t_quantile(p, dof) == pytest.approx(stats.t.ppf(p, dof), rel=1e-8, abs=1e-10)
    for t in (-3.0, -0.5, 0.0, 1.0, 2.5, 12.0):
        assert t_cdf(t, dof) == pytest.approx(stats.t.cdf(t, dof), rel=1e-9, abs=1e-12)


def test_paired_interval_equals_scipy() -> None:
    arm = {0: 3.71, 1: 3.79, 2: 3.74}
    base = {0: 4.70, 1: 4.69, 2: 4.71}
    d = [arm[s] - base[s] for s in (0, 1, 2)]
    result = difference(arm, base)
    expected = stats.ttest_rel(list(arm.values()), list(base.values())).confidence_interval(0.95)
    assert result["test"] == "paired t" and result["n"] == [3, 3]
    assert result["mean"] == pytest.approx(sum(d) / 3)
    assert (result["low"], result["high"]) == pytest.approx((expected.low, expected.high))
    assert result["significant"] is True


def test_welch_interval_equals_scipy_and_zero_inside_is_not_significant() -> None:
    arm, base = {0: 0.52, 1: 0.55, 2: 0.49, 3: 0.60}, {5: 0.50, 6: 0.58, 7: 0.47}
    result = difference(arm, base)
    expected = stats.ttest_ind(list(arm.values()), list(base.values()), equal_var=False).confidence_interval(0.95)
    assert result["test"] == "Welch t"
    assert (result["low"], result["high"]) == pytest.approx((expected.low, expected.high))
    assert result["low"] < 0 < result["high"] and result["significant"] is False


def test_one_seed_has_no_interval() -> None:
    result = difference({0: 1.0}, {0: 2.0})
    assert result["mean"] == -1.0 and result["low"] is None and result["significant"] is None


def test_non_finite_values_are_left_out_and_named() -> None:
    nan = float("nan")
    paired = difference({0: 1.0, 1: nan, 2: 1.4, 3: 1.1}, {0: 2.0, 1: 2.1, 2: 2.2, 3: 1.9})
    assert paired["n"] == [3, 3] and paired["test"] == "paired t" and "seed 1" in paired["note"]
    assert paired["mean"] == pytest.approx((1.0 + 1.4 + 1.1) / 3 - (2.0 + 2.2 + 1.9) / 3)
    welch = difference({0: nan, 1: 0.5, 2: 0.6}, {5: 0.4, 6: 0.45, 7: float("inf")})
    assert welch["n"] == [2, 2] and welch["test"] == "Welch t" and welch["significant"] is not None
    assert "non-finite" in welch["note"]
    nothing = difference({0: nan}, {0: 1.0})
    assert nothing["mean"] is None and nothing["significant"] is None


def test_differences_without_spread_have_no_interval() -> None:
    """Seen on real GLUE files: each arm predicting one class, two seeds, reported as -8.5 [-8.5, -8.5] significant."""
    from roformer.study.markdown import _difference_cell

    paired = difference({0: 0.40, 1: 0.45}, {0: 0.485, 1: 0.535})  # equal paired differences
    assert paired["low"] is None and paired["significant"] is None and paired["note"] == "no interval: zero variance"
    assert _difference_cell(paired, 1).startswith("-0.1 (no interval: zero variance")
    welch = difference({0: 0.4, 1: 0.4}, {5: 0.5, 6: 0.5})  # both arms constant
    assert welch["low"] is None and welch["significant"] is None and "zero variance" in welch["note"]
