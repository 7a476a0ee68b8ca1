"""The position-blind floor of a synthetic task: the best accuracy a model that ignores positions can reach.

A model that ignores positions sees each row's bag of tokens; the bag alone does better than a uniform guess.
`position_blind_floor` is the Bayes-optimal guess given the bag, derived per task in `row_floor` (exactly where the
sum is tractable, else by a seeded Monte Carlo), for every split; `floors` gives it with the simpler guesses worth
reading against (missing-duplicate's frequent visible bit). results.json carries it per split (`baseline.<split>`,
roformer.tasks.synthetic) and the study tables draw it (roformer.study.task_study).
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from roformer.tasks.synthetic_rows import SyntheticConfig, distractor_count, shift_masks_wanted, shift_row

if TYPE_CHECKING:
    pass
# ----------------------------------------------------------------------------------------------------------------
# The position-blind floor: the best a model that ignores positions can do


MONTE_CARLO_ROWS = 20_000  # rows per length where a floor needs a Monte Carlo (shift's mask counts, rarely)
MONTE_CARLO_SEED = "position-blind floor"  # its stream: a string seeds random.Random the same on every platform


@dataclass(frozen=True)
class Floor:
    """A level to read a split's scores against: what a guess of the row's bag of tokens scores.

    Attributes:
        kind: `position_blind` (the best guess given the bag: the floor) or the name of a simpler guess.
        accuracy: Its expected accuracy over the split's answers (expected right answers over expected answers).
        sequence_accuracy: Its expected share of rows with every answer right.
        guess: What it answers, in words.
        method: `exact` (computed in float64 from the generator's definition) or the Monte Carlo behind it.
    """

    kind: str
    accuracy: float
    sequence_accuracy: float
    guess: str
    method: str = "exact"

    def to_dict(self) -> dict[str, str | float]:
        """As results.json and the study's summary.json hold it."""
        return {
            "kind": self.kind,
            "accuracy": self.accuracy,
            "sequence_accuracy": self.sequence_accuracy,
            "guess": self.guess,
            "method": self.method,
        }


@dataclass(frozen=True)
class RowFloor:
    """The position-blind guess on a row of one length: expected right answers, answers, P(every answer right)."""

    right: float
    answers: float
    whole: float
    method: str = "exact"


def commonest_counts(draws: int, alphabet: int) -> list[float]:
    """P(the largest count among `draws` uniform draws from `alphabet` symbols = t), t = 0..draws, in float64.

    With Y_1..Y_A independent Poisson(draws / A), the counts are the Y conditioned on their sum being `draws`, so
    P(max <= t) = P(sum Y = draws, every Y <= t) / P(sum Y = draws): the coefficient of x^draws in
    (sum_{j<=t} P(Y = j) x^j)^A over P(Poisson(draws) = draws). Computed until it is 1 to float64's resolution.
    """
    if draws < 1 or alphabet < 1:
        raise ValueError(f"commonest_counts needs draws and alphabet >= 1, got {draws} and {alphabet}")
    rate = draws / alphabet
    pmf = np.exp([j * math.log(rate) - rate - math.lgamma(j + 1) for j in range(draws + 1)])
    total = math.exp(draws * math.log(draws) - draws - math.lgamma(draws + 1))
    at_most = [0.0] * (draws + 1)
    for t in range(draws + 1):
        at_most[t] = 1.0 if t == draws else min(1.0, _power_coefficient(pmf[: t + 1], alphabet, draws) / total)
        if t > rate and 1.0 - at_most[t] < 1e-17:
            at_most[t:] = [1.0] * (draws + 1 - t)
            break
    return [at_most[0], *(max(0.0, at_most[t] - at_most[t - 1]) for t in range(1, draws + 1))]


def commonest_share(draws: int, alphabet: int) -> float:
    """E[the largest count among `draws` uniform draws from `alphabet` symbols] / draws: the commonest's share."""
    return sum(t * p for t, p in enumerate(commonest_counts(draws, alphabet))) / draws


def _power_coefficient(poly: np.ndarray, power: int, degree: int) -> float:
    """The coefficient of x^degree in poly(x)^power, by squaring (every product cut at `degree`)."""
    result, base = np.ones(1), poly
    while power:
        if power & 1:
            result = np.convolve(result, base)[: degree + 1]
        power >>= 1
        if power:
            base = np.convolve(base, base)[: degree + 1]
    return float(result[degree]) if len(result) > degree else 0.0


def shift_masks_always_wanted(settings: SyntheticConfig, length: int) -> bool:
    """Whether every shift row of `length` gets exactly `shift_masks_wanted` masks.

    The masks are placed greedily in a random order, none `offset` away from another: a maximal independent set of
    the askable positions joined at distance `offset`, which fall into `offset` chains (one per residue). Every
    maximal independent set of a chain of L positions has at least ceil(L / 3) of them, so when those bounds add up
    to the masks wanted, the greedy placement always reaches them.
    """
    k = settings.offset
    chains = [len(range(k + r, length, k)) for r in range(k)]  # the askable positions of each residue
    return sum(math.ceil(size / 3) for size in chains) >= shift_masks_wanted(settings, length)


def shift_mask_counts(settings: SyntheticConfig, length: int) -> tuple[dict[int, float], str]:
    """P(masks = m) of a shift row of `length`: exact when the placement always reaches its target, else Monte Carlo."""
    if shift_masks_always_wanted(settings, length):
        return {shift_masks_wanted(settings, length): 1.0}, "exact"
    rng, counts = random.Random(f"{MONTE_CARLO_SEED} {length}"), Counter[int]()
    for _ in range(MONTE_CARLO_ROWS):
        counts[len(shift_row(settings, length, rng)[1])] += 1
    method = f"exact given the mask counts, a Monte Carlo of {MONTE_CARLO_ROWS} rows per length (seeded)"
    return {m: c / MONTE_CARLO_ROWS for m, c in counts.items()}, method


def row_floor(settings: SyntheticConfig, length: int) -> RowFloor:
    """The position-blind floor on a row of `length` content tokens (the expectations of `RowFloor`).

    A model that ignores positions sees the row's bag of tokens (the multiset, its size included) and answers every
    [MASK] alike: identical tokens without positions get identical outputs. Its best guess is the answer most
    probable under the generator given the bag. Per task, from the generators above:

    - shift: the m masks (their number depends on the length alone) hide symbols nobody asks for, and the m answers
      are the symbols at m of the N = n - m visible positions. The symbols are independent of which positions are
      masked, so given the bag the answers are m draws without replacement from the visible symbols: a guess of s
      gets m c_s / N right on average (and all m with probability C(c_s, m) / C(N, m)), best for the commonest
      visible symbol. The visible symbols are N uniform draws: E[right] = m commonest_share(N, symbols).
    - missing-duplicate: every bit of the string stands twice, so the count of 1s is even before the mask; the
      masked bit is the one whose visible count is odd. The bag answers it always: the floor is 1. (The guess of the
      more frequent visible bit, which a model that does not count exactly falls back on, is `frequent_bit_level`.)
    - passkey-binding: the visible keys are the tagged answer and d distractors, each uniform over the keys: the
      bag's key counts c are the answer's one plus a multinomial, so P(answer = j | bag) is proportional to c_j
      (the multinomial's probability of c minus one j). The best guess is the commonest key, right max_j c_j /
      (d + 1) of the time; the d + 1 visible keys are uniform draws (the answer being uniform too):
      E[right] = commonest_share(d + 1, keys).
    - mqar: each key is asked once, so the answers are exactly the row's `pairs` values, visible in the pairs; one
      guess for every mask gets the count of that value right, best the commonest value:
      E[right] = pairs commonest_share(pairs, values) at every length; every answer right iff the values are one.
      With distinct values each appears once: E[right] = 1 (a share of 1 / pairs), and never all (pairs > 1).
    """
    if settings.task == "shift":
        masks, method = shift_mask_counts(settings, length)
        right = whole = 0.0
        for m, p in masks.items():
            visible = length - m
            counts = commonest_counts(visible, settings.symbols)
            right += p * m * sum(t * q for t, q in enumerate(counts)) / visible
            whole += p * sum(math.comb(t, m) * q for t, q in enumerate(counts)) / math.comb(visible, m)
        return RowFloor(right, sum(p * m for m, p in masks.items()), whole, method)
    if settings.task == "missing-duplicate":
        return RowFloor(1.0, 1.0, 1.0)
    if settings.task == "passkey-binding":
        share = commonest_share(distractor_count(settings, length) + 1, settings.keys)
        return RowFloor(share, 1.0, share)
    pairs, values = settings.pairs, settings.value_symbols
    if settings.distinct_values:  # each value once: one answer right, all of them only for a single pair
        return RowFloor(1.0, pairs, 1.0 if pairs == 1 else 0.0)
    return RowFloor(pairs * commonest_share(pairs, values), pairs, values ** (1 - pairs))


def frequent_bit_level(half: int, padding: int) -> float:
    """missing-duplicate: the accuracy of guessing the more frequent visible bit (a tie: either, half the time).

    With k ones among the `half` bits, the masked bit is 1 with probability k / half; then the visible bits are
    2k - 1 ones and 2 (half - k) + padding zeros, else 2k ones and 2 (half - k) - 1 + padding zeros. Exact, summed
    over k ~ Binomial(half, 1/2).
    """

    def right(ones: int, zeros: int, answer_is_one: bool) -> float:
        if ones == zeros:
            return 0.5
        return float((ones > zeros) == answer_is_one)

    level = 0.0
    for k in range(half + 1):
        weight = math.comb(half, k) / 2**half
        level += weight * k / half * right(2 * k - 1, 2 * (half - k) + padding, True)
        level += weight * (half - k) / half * right(2 * k, 2 * (half - k) - 1 + padding, False)
    return level


POSITION_BLIND_GUESS = {
    "shift": "the commonest visible symbol",
    "missing-duplicate": "the bit whose visible count is odd (every bit stands twice)",
    "passkey-binding": "the commonest visible key",
    "mqar": "the commonest value of the row's pairs",
}


def position_blind_floor(settings: SyntheticConfig, lengths: tuple[int, int]) -> Floor:
    """The best scores a model that ignores positions reaches on rows of `lengths` (inclusive, drawn uniformly).

    Accuracy is expected right answers over expected answers, over the lengths (a large split's accuracy); sequence
    accuracy the mean probability of a row's answers all right (`row_floor`).
    """
    rows = [row_floor(settings, n) for n in range(lengths[0], lengths[1] + 1)]
    method = next((row.method for row in rows if row.method != "exact"), "exact")
    accuracy = sum(row.right for row in rows) / sum(row.answers for row in rows)
    whole = statistics.fmean(row.whole for row in rows)
    return Floor("position_blind", accuracy, whole, POSITION_BLIND_GUESS[settings.task], method)


def floors(settings: SyntheticConfig, lengths: tuple[int, int]) -> list[Floor]:
    """The level a split is read against (its `baseline`), then the other levels worth knowing (if any).

    The level is the position-blind floor, but for missing-duplicate: there the bag determines the answer (its
    parity: 100%), a bound that needs exact counting and that no model without positions came near (56-66% here), so
    its reading level is the guess a model without positions falls back on, the more frequent visible bit, and the
    parity bound stands beside it.
    """
    floor = position_blind_floor(settings, lengths)
    if settings.task != "missing-duplicate":
        return [floor]
    level = statistics.fmean(frequent_bit_level(n // 2, n % 2) for n in range(lengths[0], lengths[1] + 1))
    return [Floor("frequent_bit", level, level, "the more frequent visible bit"), floor]
