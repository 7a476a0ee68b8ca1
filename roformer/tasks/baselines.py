"""Trivial baselines: what a model that learned nothing of the input scores on a split, from the training labels.

A fine-tuned score means something only above the level a constant answer reaches: RTE's majority class is 52.7%
of its dev set, and a model that predicts one class everywhere scores exactly that (or less, if the class it learned
is the dev set's minority). Every scored split of a task with labels gets one (results.json's `baseline`):

    majority_class          the commonest training class for every row (classification, GLUE)
    training_mean           the mean training score for every row (regression, similarity: its correlations
                            are 0, since a constant has none)
    commonest_label_set     the commonest training set of labels (multi-label classification)
    commonest_answer        the commonest right position among the K candidates (multiple choice)
    all_outside             `O` for every word (entity tagging: no entity found)
    commonest_tag           the commonest training tag for every word (plain tags)

The guess is scored by the task's own `evaluate`, so it is read on the metrics the runs are read on.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Guess:
    """A constant answer: its kind (the module docstring's names) and the predictions it makes for a split."""

    kind: str
    predict: Callable[[Any], list[Any]]


def commonest(values: Sequence[Any]) -> Any:
    """The commonest value (the first seen of those tied: deterministic for a given file)."""
    counts = Counter(_hashable(v) for v in values)
    top = max(counts.values())
    return next(v for v in values if counts[_hashable(v)] == top)


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def label_guess(labels: Sequence[Any]) -> Guess | None:
    """The constant guess of a split of one label per row: the commonest class or label set, or the mean score."""
    known = [label for label in labels if label is not None]
    if not known:
        return None
    if isinstance(known[0], float):
        mean = sum(known) / len(known)
        return Guess("training_mean", lambda split: [mean] * len(split.labels))
    top = commonest(known)
    kind = "commonest_label_set" if isinstance(top, list) else "majority_class"
    return Guess(kind, lambda split: [top] * len(split.labels))


def scored(guess: Guess, split: Any, evaluate: Callable[[Any, list[Any]], dict[str, float]]) -> dict[str, Any]:
    """`{"kind": ..., <metric>: ...}`: the guess scored on `split` by the task's `evaluate`.

    A correlation of a constant is undefined (NaN, with a warning of scipy's): it is 0 here, the level of no
    information, so that the baseline stays a number in JSON and in comparisons.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metrics = evaluate(split, guess.predict(split))
    return {"kind": guess.kind, **{k: 0.0 if isinstance(v, float) and math.isnan(v) else v for k, v in metrics.items()}}


def constant_predictions(predictions: Sequence[Any]) -> bool:
    """Whether every prediction of a split of several rows is the same (a model that learned one answer)."""
    return len(predictions) > 1 and len({repr(p) for p in predictions}) == 1
