"""Seed-to-seed statistics for comparisons: the mean difference between an arm and the baseline with a 95% interval.

With runs of both arms for the same seeds (which in `roformer experiment` share the data order, masks and the
initial weights of every common parameter) the difference is taken seed by seed and its mean gets a paired
Student-t interval; otherwise Welch's unequal-variance t interval compares the two means. A difference whose
interval contains zero is marked not significant. Plain Python (no SciPy at run time): the t quantile comes from
the regularised incomplete beta function (a continued fraction, Numerical Recipes sec. 6.4) and is tested
against `scipy.stats.t.ppf`.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from roformer.study.runs import Arm, GlueRun, PretrainRun, first_reaching, glue_seed_scores

CONFIDENCE = 0.95


def pretraining_differences(arms: list[Arm], base: Arm, targets: list[float]) -> dict[str, dict[str, Any]]:
    """For every arm but `base`: final eval loss and steps to each target, arm - baseline, with intervals.

    Steps to a target are per run (each seed's own eval curve); a target that some run never reached has no
    difference (None), and `unreached` names the seeds of each side that did not reach it. Runs are paired by their
    `train.seed`.
    """
    out = {}
    for arm in arms:
        if arm is base:
            continue
        steps = []
        for target in targets:
            mine, theirs = _steps_to(arm, target), _steps_to(base, target)
            unreached = {"arm": _unreached(mine), "baseline": _unreached(theirs)}
            if mine and theirs and not any(unreached.values()):
                steps.append({"target": target, **difference(mine, theirs)})
            else:  # say whose seeds never got there: the baseline's missing a target is not this arm's
                steps.append({"target": target, "mean": None, "unreached": unreached})
        finals = {_key(r): _final(r)["eval_loss"] for r in arm.runs}
        base_finals = {_key(r): _final(r)["eval_loss"] for r in base.runs}
        out[arm.label] = {"final_eval_loss": difference(finals, base_finals), "steps_to_target": steps}
    return out


def length_differences(arms: list[Arm], base: Arm) -> dict[str, dict[int, dict[str, Any]]]:
    """{label: {length: arm - baseline eval loss}} at every length both arms were evaluated at (eval-mlm)."""

    def losses(arm: Arm) -> dict[int, dict[int | str, float]]:
        table: dict[int, dict[int | str, float]] = {}
        for run in arm.runs:
            for row in run.lengths:
                if "eval_loss" in row:
                    table.setdefault(row["seq_len"], {})[_key(run)] = row["eval_loss"]
        return table

    theirs = losses(base)
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for arm in arms:
        if arm is base:
            continue
        mine = losses(arm)
        common = sorted(set(mine) & set(theirs))
        if common:
            out[arm.label] = {n: difference(mine[n], theirs[n]) for n in common}
    return out


def glue_differences(glue: list[GlueRun], baseline: str) -> dict[str, dict[str, Any]]:
    """{label: {column: arm - baseline dev score}} for every GLUE column both arms have.

    With one fine-tuning run per arm and task the replicates are its fine-tuning seeds (paired by seed: the same
    head initialisation and batch order); with several (one per pretraining seed, as `roformer experiment` makes
    them) each run's mean over its fine-tuning seeds is one replicate, paired by pretraining seed.
    """
    runs: dict[tuple[str, str], list[tuple[GlueRun, dict[int, float]]]] = {}
    for run in glue:
        for column, scores in glue_seed_scores(run).items():
            runs.setdefault((run.label, column), []).append((run, scores))
    out: dict[str, dict[str, Any]] = {}
    for (label, column), mine in runs.items():
        theirs = runs.get((baseline, column))
        if label == baseline or theirs is None:
            continue
        if len(mine) == 1 and len(theirs) == 1:
            values, base_values = mine[0][1], theirs[0][1]
        else:
            values, base_values = _per_pretraining_seed(mine), _per_pretraining_seed(theirs)
        out.setdefault(label, {})[column] = difference(values, base_values)
    return out


def _per_pretraining_seed(runs: list[tuple[GlueRun, dict[int, float]]]) -> dict[int | str, float]:
    return {
        (run.pretraining_seed if run.pretraining_seed is not None else str(run.path)): statistics.fmean(scores.values())
        for run, scores in runs
    }


def _key(run: PretrainRun) -> int | str:
    return run.seed if run.seed is not None else str(run.path)  # no seed recorded: never paired


def _final(run: PretrainRun) -> dict[str, Any]:
    return max(run.eval, key=lambda e: e["step"])


def _unreached(steps: dict[int | str, float | None]) -> list[int | str]:
    """The seeds (run keys) whose eval curve never reached the target."""
    return [key for key, step in steps.items() if step is None]


def _steps_to(arm: Arm, target: float) -> dict[int | str, float | None]:
    """{run key: the first step whose eval loss reached `target`, None if none did}."""
    hits = {_key(r): first_reaching(r.eval, target) for r in arm.runs}
    return {key: None if hit is None else float(hit["step"]) for key, hit in hits.items()}


def difference(values: dict[int, float], baseline: dict[int, float], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """Mean of arm - baseline with its confidence interval, paired by seed when both arms ran the same seeds.

    Non-finite values (a diverged run, a NaN correlation of constant predictions) are left out, paired seeds from
    both arms, and named in `note`. Differences without spread (equal paired differences, or both arms constant)
    have no interval: a zero-width one would be marked significant whatever the number of runs.

    Args:
        values: {seed: value} of the arm.
        baseline: {seed: value} of the baseline arm.
        confidence: Two-sided confidence level of the interval.

    Returns:
        {"mean": difference of the means (None when an arm has no finite value), "low", "high": the interval
        (None with fewer than 2 runs per arm or no spread), "test": "paired t" | "Welch t" | None, "n": runs per
        arm used, "significant": interval excludes 0 (None: no interval), "note": why values or the interval are
        missing (absent when nothing is)}.
    """
    paired = set(values) == set(baseline)
    bad = sorted({seed for seed, v in (*values.items(), *baseline.items()) if not math.isfinite(v)}, key=str)
    if paired:
        values = {seed: v for seed, v in values.items() if seed not in bad}
        baseline = {seed: v for seed, v in baseline.items() if seed not in bad}
    else:
        values = {seed: v for seed, v in values.items() if math.isfinite(v)}
        baseline = {seed: v for seed, v in baseline.items() if math.isfinite(v)}
    notes = [f"non-finite value left out (seed {', '.join(map(str, bad))})"] if bad else []
    out: dict[str, Any] = {"mean": None, "low": None, "high": None, "test": None, "significant": None}
    out["n"] = [len(values), len(baseline)]
    if not values or not baseline:
        return _with_notes(out, notes)
    out["mean"] = statistics.fmean(values.values()) - statistics.fmean(baseline.values())
    if paired and len(values) >= 2:
        diffs = [values[seed] - baseline[seed] for seed in sorted(values)]
        spread = statistics.stdev(diffs) / math.sqrt(len(diffs))
        dof, out["test"] = len(diffs) - 1, "paired t"
    elif not paired and len(values) >= 2 and len(baseline) >= 2:
        va = statistics.variance(values.values()) / len(values)  # squared standard errors of the two means
        vb = statistics.variance(baseline.values()) / len(baseline)
        spread, out["test"] = math.sqrt(va + vb), "Welch t"
        dof = (va + vb) ** 2 / (va**2 / (len(values) - 1) + vb**2 / (len(baseline) - 1)) if va + vb else 0.0
    else:
        return _with_notes(out, notes)
    scale = max(1.0, *(abs(v) for v in (*values.values(), *baseline.values())))
    if spread <= 1e-12 * scale:  # equal up to rounding (0.40 - 0.485 vs 0.45 - 0.535): no spread to speak of
        return _with_notes(out, notes + ["no interval: zero variance"])
    half = t_quantile((1 + confidence) / 2, dof) * spread
    out["low"], out["high"] = out["mean"] - half, out["mean"] + half
    out["significant"] = not out["low"] <= 0.0 <= out["high"]
    return _with_notes(out, notes)


def mean_interval(values: list[float], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """`mean` of seeds' values with its Student-t `interval` (None for fewer than two values; mean None for none)."""
    if not values:
        return {"mean": None, "interval": None}
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"mean": mean, "interval": None}
    half = t_quantile(0.5 + confidence / 2, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return {"mean": mean, "interval": [mean - half, mean + half]}


def _with_notes(result: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    return {**result, "note": "; ".join(notes)} if notes else result


def t_quantile(p: float, dof: float) -> float:
    """The p-quantile of Student's t distribution with `dof` degrees of freedom (dof may be fractional: Welch)."""
    if not 0.0 < p < 1.0 or dof <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and dof > 0, got p={p}, dof={dof}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, dof)
    low, high = 0.0, 1.0
    while t_cdf(high, dof) < p:  # bracket, then bisect: the CDF is monotone
        high *= 2.0
    for _ in range(200):
        mid = (low + high) / 2
        if t_cdf(mid, dof) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


def t_cdf(t: float, dof: float) -> float:
    """P(T <= t) for Student's t with `dof` degrees of freedom: 1 - I_x(dof/2, 1/2) / 2, x = dof / (dof + t^2)."""
    tail = 0.5 * regularized_beta(dof / (dof + t * t), dof / 2.0, 0.5)
    return 1.0 - tail if t >= 0 else tail


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), the regularised incomplete beta function (Lentz's continued fraction)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):  # the fraction converges fast here; else use the symmetry
        return math.exp(log_front) * _beta_fraction(x, a, b) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(1.0 - x, b, a) / b


def _beta_fraction(x: float, a: float, b: float) -> float:
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def wilson_interval(correct: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a proportion `correct / n` (well-behaved at 0 and 1, unlike the normal one)."""
    if n == 0:
        return 0.0, 1.0
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)
