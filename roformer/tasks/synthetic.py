"""`type: synthetic`: tasks where position is the whole difficulty, generated from a seed and trained from scratch.

A model trained on real text for a few hundred CPU steps cannot find a planted fact at its own length, so a probe of it
says nothing about positions (docs/long-context.md). The studies that separate position encodings at small scale train
the task itself (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length Generalization of Transformers";
Deletang et al. 2023; Kazemnejad et al. 2023): a tiny encoder learns it at the trained lengths in minutes, and what it
keeps at longer test lengths is the position encoding's doing. Every task here is encoder-native: the answers are read
by the MLM head at [MASK] positions, rows are `[CLS] content [SEP]`, and `data.synthetic` (`SyntheticConfig`) says
which task, its alphabet, lengths and seed:

    shift              uniform symbols, `mask_rate` of them masked; the answer at a masked position i is the symbol
                       at i - offset (`direction: left`) or i + offset (`right`), which is never masked itself: pure
                       relative addressing. Chance: 1 / symbols.
    missing-duplicate  a bit string written twice, one bit masked (Deletang et al.; Ruoss et al. Table 1): its copy is
                       n / 2 tokens away, an offset that grows with the length. Chance: 1 / 2.
    passkey-binding    filler symbols with key tokens scattered in them as distractors; one key follows the [KEY]
                       marker, and an [ASK] [MASK] later (at any distance) asks for it. Without distractors a model
                       copies the only key-like token and positions do not matter. Chance: 1 / keys.
    mqar               multi-query associative recall (Arora et al. 2023, Zoology): `pairs` key-value pairs first,
                       then filler with each key asked again, its [MASK] right after it. Chance: 1 / values.
                       Zoology's regime: `values` of their own count (its 8,192 tokens are 4,096 keys and 4,096
                       values), `distinct_values` (its values are drawn without replacement) and `filler: constant`
                       (its filler is one token, [FILL]) beside the power-law query places (`query_gap_power`).

Chance is not the level to read a model against: a model that ignores positions sees the row's bag of tokens, and
the bag alone does better than a uniform guess. `position_blind_floor` is the best accuracy such a model can reach
(the Bayes-optimal guess given the bag, derived per task in `row_floor`), for every split; results.json carries it
per split (`baseline.<split>`) and the study tables and draws it.

Training lengths (content tokens) are drawn from `train_lengths` [shortest, longest]; the dev split (which selects
checkpoints) is drawn alike from another seed; the test splits `test_<m>x` hold rows of exactly m times the longest
trained length, for every m of `test_multiples`. The dev rows, and those of a test split at a trained length
(`test_1x`), are never training rows: a generated row equal to one is drawn again (`DisjointRows`).
`randomized_positions: L` gives every row a sorted sample of positions from [0, L) in place of 0..T-1 (Ruoss et al.
2023, sec. 3), in training and evaluation alike, so that test lengths reuse positions seen in training; it applies
to every encoding that reads positions. The positions come from a random stream of their own (`positions_seed`), so
an arm with them sees the very rows of an arm without.

The model is built from the config's `model:` section (`init:` empty) with this task's vocabulary: the specials, the
symbols and the task's markers, as a word-level tokenizer written with the model.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections import Counter
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch

from roformer.config import check_types
from roformer.errors import ConfigError, UserError
from roformer.files import atomic_write_text
from roformer.labels import IGNORE_INDEX
from roformer.tasks.base import HeadOutputs, TaskSpec, TokenRows, with_score
from roformer.tasks.extensions import EvalVariant, parse_extensions

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer
    from roformer.model.config import ModelConfig
    from roformer.tasks.config import FinetuneDataConfig

SYNTHETIC_TASKS = ("shift", "missing-duplicate", "passkey-binding", "mqar")
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MARKERS = ("[KEY]", "[ASK]")  # passkey-binding's tag of the true key and its question
FILLER = "[FILL]"  # mqar's constant filler (`filler: constant`, Zoology's)
DEV_SEED_OFFSET = 1_000_003  # the dev and test splits are drawn from seeds of their own, far from the training one


@dataclass
class SyntheticConfig:
    """`data.synthetic`: which task, its alphabet, lengths, sizes and seed.

    Attributes:
        task: `shift`, `missing-duplicate`, `passkey-binding` or `mqar` (see the module's docstring).
        seed: The data's seed: every split is a function of it (the run's `train.seed` orders batches and inits).
        symbols: The alphabet: shift's symbols, passkey-binding's filler, mqar's keys (and as many values).
        keys: passkey-binding: the key alphabet (the answer is one of them).
        pairs: mqar: key-value pairs per row.
        query_gap_power: mqar: a > 0 draws the queries' places after the pairs with probability proportional to
            (g + 1)^(a - 1) for the g-th free place (Zoology's `power_a`, 0.01 there: biased toward the places
            right after the pairs); null: uniform.
        values: mqar: the value alphabet (`v0`...), apart from the keys (null: as many as `symbols`).
        distinct_values: mqar: a row's values are drawn without replacement (Zoology), not independently.
        filler: mqar: the tokens between the pairs and the queries: `random` keys, or one `constant` token
            ([FILL], Zoology's), so that only the pairs and the queries carry keys.
        offset: shift: the distance k to the answer's source.
        direction: shift: `left` (the symbol at i - k) or `right` (at i + k).
        mask_rate: shift: the fraction of positions masked (at least one per row).
        distractors: passkey-binding: untagged keys per 16 content tokens (at least one).
        train_lengths: [shortest, longest] content tokens of training rows (and of the dev split).
        test_multiples: Test splits at these multiples of the longest trained length (`test_2x`, ...).
        train_examples: Rows of the training split.
        eval_examples: Rows of the dev split and of every test split.
        randomized_positions: L: positions are a sorted sample from [0, L) (Ruoss et al. 2023); null: 0..T-1.
        randomized_kind: `integer`: a sorted sample of distinct integers (Ruoss et al.); `float`: sorted uniform
            reals from [0, L) (random float sampling, Shimizu et al. 2026), for the encodings that compute from
            real positions (rotary, p_rope, sinusoidal, ALiBi, FIRE; not a learned table, Shaw's or T5's buckets).
        extensions: Test-time context extension methods evaluated on every test split after training, each as
            `method` or `method:factor` (roformer.tasks.extensions: linear, ntk, yarn, self_extend, log_scale).
        masked_logits_only: Training computes the vocabulary projection at the asked positions alone (MaskedLM's
            `masked_only`: the same loss up to float rounding): with Zoology's 8,192 tokens and 4 answers in 66
            positions, a step costs a fraction of the full projection's. Off by default: the shipped studies'
            numbers were made without it.
    """

    task: Literal["shift", "missing-duplicate", "passkey-binding", "mqar"] = "shift"
    seed: int = 0
    symbols: int = 16
    keys: int = 10
    pairs: int = 4
    query_gap_power: float | None = None
    values: int | None = None
    distinct_values: bool = False
    filler: Literal["random", "constant"] = "random"
    offset: int = 2
    direction: Literal["left", "right"] = "left"
    mask_rate: float = 0.15
    distractors: int = 2
    train_lengths: list[int] = field(default_factory=lambda: [8, 32])
    test_multiples: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    train_examples: int = 20000
    eval_examples: int = 500
    randomized_positions: int | None = None
    randomized_kind: Literal["integer", "float"] = "integer"
    extensions: list[str] = field(default_factory=list)
    masked_logits_only: bool = False

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("symbols", "keys", "pairs", "offset", "distractors", "train_examples", "eval_examples"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.symbols < 2:
            raise ConfigError(f"symbols must be >= 2, got {self.symbols}")
        if len(self.train_lengths) != 2 or not 1 <= self.train_lengths[0] <= self.train_lengths[1]:
            raise ConfigError(f"train_lengths must be [shortest, longest] >= 1, got {self.train_lengths}")
        if (
            not self.test_multiples
            or min(self.test_multiples) < 1
            or len(set(self.test_multiples)) != len(self.test_multiples)
        ):
            raise ConfigError(f"test_multiples must be distinct integers >= 1, got {self.test_multiples}")
        if self.query_gap_power is not None and self.query_gap_power <= 0:
            raise ConfigError(f"query_gap_power must be > 0 (or null: uniform), got {self.query_gap_power}")
        if self.query_gap_power is not None and self.task != "mqar":
            raise ConfigError(f"query_gap_power places mqar's queries; {self.task} has none")
        if self.task == "mqar" and self.pairs > self.symbols:
            raise ConfigError(
                f"pairs ({self.pairs}) must be <= symbols ({self.symbols}): mqar's keys are distinct symbols"
            )
        self._check_mqar_values()
        if not 0.0 < self.mask_rate < 1.0:
            raise ConfigError(f"mask_rate must be in (0, 1), got {self.mask_rate}")
        shortest = self.train_lengths[0]
        if shortest < self.shortest_row:
            raise ConfigError(
                f"train_lengths: {self.task} needs rows of at least {self.shortest_row} tokens, got {shortest}"
            )
        if self.randomized_positions is not None and self.randomized_positions < self.longest_row + 2:
            raise ConfigError(
                f"randomized_positions ({self.randomized_positions}) must hold the longest test row "
                f"({self.longest_row} tokens + [CLS] and [SEP])"
            )
        if self.randomized_kind != "integer" and self.randomized_positions is None:
            raise ConfigError(f"randomized_kind: {self.randomized_kind} draws randomized_positions, which is null")
        parse_extensions(self.extensions)

    def _check_mqar_values(self) -> None:
        """The value alphabet and filler are mqar's own; a count of at least one (all the pairs' when distinct)."""
        zoology = (("values", None), ("distinct_values", False), ("filler", "random"))  # (field, its default)
        given = [name for name, default in zoology if getattr(self, name) != default]
        if given and self.task != "mqar":
            raise ConfigError(f"{given[0]} shapes mqar's rows; {self.task} has no values")
        if self.values is not None and self.values < 1:
            raise ConfigError(f"values must be >= 1 (or null: as many as symbols), got {self.values}")
        if self.distinct_values and self.value_symbols < self.pairs:
            raise ConfigError(f"distinct_values needs at least pairs ({self.pairs}) values, got {self.value_symbols}")

    @property
    def value_symbols(self) -> int:
        """The value alphabet of mqar: `values`, else as many as the keys."""
        return self.values if self.values is not None else self.symbols

    @property
    def shortest_row(self) -> int:
        """The fewest content tokens a row of this task can have."""
        return {
            "shift": self.offset + 1,
            "missing-duplicate": 2,
            "passkey-binding": 4 + self.distractors,
            "mqar": 4 * self.pairs,
        }[self.task]

    @property
    def longest_row(self) -> int:
        """Content tokens of the longest test row."""
        return self.train_lengths[1] * max(self.test_multiples)

    @property
    def chance(self) -> float:
        """The accuracy of a uniform guess among the possible answers."""
        answers = {"shift": self.symbols, "missing-duplicate": 2, "passkey-binding": self.keys}
        answers["mqar"] = self.value_symbols
        return 1.0 / answers[self.task]


# ----------------------------------------------------------------------------------------------------------------
# The vocabulary


def vocabulary(settings: SyntheticConfig) -> list[str]:
    """The task's tokens in id order: the specials, the markers, the symbols (`s0`...), keys (`k0`...), values."""
    symbols = [f"s{i}" for i in range(settings.symbols)]
    keys = [f"k{i}" for i in range(settings.keys)] if settings.task == "passkey-binding" else []
    values = [f"v{i}" for i in range(settings.value_symbols)] if settings.task == "mqar" else []
    bits = ["0", "1"] if settings.task == "missing-duplicate" else []
    filler = [FILLER] if settings.filler == "constant" else []  # last: every other token keeps its id
    return [*SPECIALS, *MARKERS, *(bits or symbols), *keys, *values, *filler]


def word_level_tokenizer(tokens: list[str]) -> Tokenizer:
    """A fast tokenizer of exactly `tokens` (one id each, split on spaces), with BERT's specials and template."""
    from tokenizers import Tokenizer as Pipeline
    from tokenizers import models, pre_tokenizers

    from roformer.data.tokenizer import wrap_tokenizer

    pipeline = Pipeline(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="[UNK]"))
    pipeline.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return wrap_tokenizer(pipeline, lowercase=False)


# ----------------------------------------------------------------------------------------------------------------
# The generators: (content token names, {position: answer}) of one row of `length` content tokens


Row = tuple[list[str], dict[int, str]]


def shift_row(settings: SyntheticConfig, length: int, rng: random.Random) -> Row:
    """Uniform symbols; masked positions answer the symbol `offset` away, whose own position is never masked."""
    content = [f"s{rng.randrange(settings.symbols)}" for _ in range(length)]
    step = -settings.offset if settings.direction == "left" else settings.offset
    askable = [i for i in range(length) if 0 <= i + step < length]
    wanted = shift_masks_wanted(settings, length)
    answers: dict[int, str] = {}
    for i in rng.sample(askable, len(askable)):
        if len(answers) == wanted:
            break
        if i + step not in answers and i - step not in answers:  # neither a source nor asking for a masked one
            answers[i] = content[i + step]
    return content, answers


def missing_duplicate_row(settings: SyntheticConfig, length: int, rng: random.Random) -> Row:
    """A bit string of length // 2 written twice (a last bit of an odd length is padding `0`), one bit masked."""
    half = length // 2
    bits = [str(rng.randrange(2)) for _ in range(half)]
    content = bits + bits + ["0"] * (length - 2 * half)
    at = rng.randrange(2 * half)
    return content, {at: content[at]}


def passkey_binding_row(settings: SyntheticConfig, length: int, rng: random.Random) -> Row:
    """Filler symbols, untagged keys as distractors, `[KEY] k` once and a later `[ASK] [MASK]` asking for k."""
    content = [f"s{rng.randrange(settings.symbols)}" for _ in range(length)]
    tag = rng.randrange(length - 3)  # [KEY] k at tag, tag + 1; [ASK] [MASK] at some a, a + 1 after it
    ask = rng.randrange(tag + 2, length - 1)
    key = f"k{rng.randrange(settings.keys)}"
    content[tag : tag + 2] = ["[KEY]", key]
    content[ask : ask + 2] = ["[ASK]", key]
    free = [i for i in range(length) if i not in (tag, tag + 1, ask, ask + 1)]
    count = distractor_count(settings, length)
    for i in rng.sample(free, count):  # uniform keys, the answer's among them: the commonest key is the bag's guess
        content[i] = f"k{rng.randrange(settings.keys)}"
    return content, {ask + 1: key}


def mqar_row(settings: SyntheticConfig, length: int, rng: random.Random) -> Row:
    """`pairs` key-value pairs, then filler in which every key is asked once more, its value masked after it."""
    keys = rng.sample(range(settings.symbols), settings.pairs)  # pairs <= symbols (checked)
    if settings.distinct_values:
        values = rng.sample(range(settings.value_symbols), settings.pairs)
    else:
        values = [rng.randrange(settings.value_symbols) for _ in keys]
    if settings.filler == "constant":
        content = [FILLER] * length
    else:
        content = [f"s{rng.randrange(settings.symbols)}" for _ in range(length)]
    for i, (k, v) in enumerate(zip(keys, values, strict=True)):
        content[2 * i : 2 * i + 2] = [f"s{k}", f"v{v}"]
    start = 2 * len(keys)
    slots = query_slots((length - start) // 2, len(keys), settings.query_gap_power, rng)
    answers: dict[int, str] = {}
    for k, v, slot in zip(keys, values, slots, strict=True):
        at = start + 2 * slot
        content[at] = f"s{k}"
        answers[at + 1] = f"v{v}"
    # the filler must not hold a key's own value token elsewhere: values appear only in the pairs
    return content, answers


def query_slots(places: int, count: int, power: float | None, rng: random.Random) -> list[int]:
    """`count` distinct places of `places`, each a (key, [MASK]) pair of tokens after the row's pairs.

    Uniform (`power` None), or the g-th with weight (g + 1)^(power - 1), drawn one at a time without replacement
    (Zoology's power-law query gaps).
    """
    if power is None:
        return rng.sample(range(places), count)
    free = list(range(places))
    log_weights = [(power - 1) * math.log(g + 1) for g in free]  # logs: a large power neither overflows nor underflows
    chosen = []
    for _ in range(count):
        top = max(log_weights)
        i = rng.choices(range(len(free)), weights=[math.exp(w - top) for w in log_weights])[0]
        chosen.append(free.pop(i))
        log_weights.pop(i)
    return chosen


def shift_masks_wanted(settings: SyntheticConfig, length: int) -> int:
    """The masks shift asks for in a row of `length` content tokens (it places fewer only when none is left)."""
    return max(1, round(settings.mask_rate * length))


def distractor_count(settings: SyntheticConfig, length: int) -> int:
    """The untagged keys of a passkey-binding row of `length` content tokens."""
    return min(length - 4, max(1, settings.distractors * length // 16))


GENERATORS: dict[str, Callable[[SyntheticConfig, int, random.Random], Row]] = {
    "shift": shift_row,
    "missing-duplicate": missing_duplicate_row,
    "passkey-binding": passkey_binding_row,
    "mqar": mqar_row,
}


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


# ----------------------------------------------------------------------------------------------------------------
# Splits


@dataclass
class SyntheticSplit(TokenRows):
    """A generated split: ids with [MASK] at the asked positions, the answers' ids there, positions when randomized.

    Attributes:
        ids: `[CLS] content [SEP]` token ids of every row.
        labels: Per row, IGNORE_INDEX except at the asked positions (the answer's id).
        positions: Per row, the position of every token (randomized positions), or None: 0..T-1.
        length: The content length of every row of a test split; None for rows of the training range.
    """

    ids: list[list[int]]
    labels: list[list[int]]
    positions: list[list[int]] | list[list[float]] | None
    length: int | None = None
    labelled: bool = True


RowKey = tuple[tuple[str, ...], tuple[tuple[int, str], ...]]
MAX_DRAWS_PER_ROW = 100  # a split kept apart from the training rows gives up after this many draws per row


def row_key(row: Row) -> RowKey:
    """A row's identity: its tokens and what is asked where (the positions it is shown at are no part of it)."""
    content, answers = row
    return tuple(content), tuple(sorted(answers.items()))


def generate_rows(
    settings: SyntheticConfig,
    rows: int,
    lengths: tuple[int, int],
    seed: int,
    exclude: AbstractSet[RowKey] = frozenset(),
) -> list[Row]:
    """`rows` rows of content lengths drawn uniformly from `lengths` (inclusive), from `seed` alone, none in `exclude`.

    A row of `exclude` is drawn again from the same stream, so the split stays a function of its seed: the
    generator's rows with those of `exclude` left out (a split without `exclude` is unchanged by it).

    Raises:
        ConfigError: naming data.synthetic.train_lengths, when `MAX_DRAWS_PER_ROW` draws per row do not find
            `rows` rows outside `exclude` (a task with too few distinct rows at these lengths).
    """
    rng = random.Random(seed)
    generate = GENERATORS[settings.task]
    kept: list[Row] = []
    draws = 0
    while len(kept) < rows and draws < MAX_DRAWS_PER_ROW * rows:
        draws += 1
        row = generate(settings, rng.randint(*lengths), rng)
        if not exclude or row_key(row) not in exclude:
            kept.append(row)
    if len(kept) < rows:
        raise ConfigError(
            f"data.synthetic.train_lengths: {settings.task} has too few distinct rows of {lengths[0]}-{lengths[1]} "
            f"tokens for {rows} evaluation rows apart from the training rows ({len(kept)} found in {draws} "
            "draws): lengthen the rows or lower data.synthetic.train_examples"
        )
    return kept


def positions_seed(seed: int) -> str:
    """The seed of a split's randomized positions: a stream of their own, so that they change no row."""
    return f"{seed} positions"


def random_positions(settings: SyntheticConfig, lengths: list[int], seed: int) -> list[list[float]] | None:
    """Per row of `lengths` tokens, its sorted positions from [0, randomized_positions); or None (0..T-1).

    `randomized_kind: integer` samples distinct integers (Ruoss et al. 2023); `float` draws uniform reals and sorts
    them (random float sampling): no position repeats a trained one exactly, nor falls on the integer grid.
    """
    if settings.randomized_positions is None:
        return None
    rng, span = random.Random(positions_seed(seed)), settings.randomized_positions
    if settings.randomized_kind == "float":
        return [sorted(rng.random() * span for _ in range(length)) for length in lengths]
    return [sorted(rng.sample(range(span), length)) for length in lengths]


def encode_rows(rows: list[Row], ids: dict[str, int]) -> tuple[list[list[int]], list[list[int]]]:
    """`[CLS] content [SEP]` ids with [MASK] at the asked positions, and the labels (the answers' ids there)."""
    all_ids, all_labels = [], []
    for content, answers in rows:
        row = [ids["[CLS]"]] + [ids["[MASK]"] if i in answers else ids[t] for i, t in enumerate(content)]
        row.append(ids["[SEP]"])
        labels = [IGNORE_INDEX] * len(row)
        for i, answer in answers.items():
            labels[1 + i] = ids[answer]
        all_ids.append(row)
        all_labels.append(labels)
    return all_ids, all_labels


def generate_split(
    settings: SyntheticConfig,
    ids: dict[str, int],
    rows: int,
    lengths: tuple[int, int],
    seed: int,
    exclude: AbstractSet[RowKey] = frozenset(),
) -> SyntheticSplit:
    """`rows` rows of content lengths drawn uniformly from `lengths` (inclusive), from `seed` alone, none in `exclude`.

    The randomized positions (if any) come from a stream of their own: the rows are those of the same split without.
    """
    return encode_split(settings, ids, generate_rows(settings, rows, lengths, seed, exclude), lengths, seed)


def encode_split(
    settings: SyntheticConfig, ids: dict[str, int], rows: list[Row], lengths: tuple[int, int], seed: int
) -> SyntheticSplit:
    """Generated rows as a split in the token ids `ids`, with the positions of `seed`'s stream when randomized."""
    all_ids, all_labels = encode_rows(rows, ids)
    positions = random_positions(settings, [len(row) for row in all_ids], seed)
    fixed = lengths[0] if lengths[0] == lengths[1] else None
    return SyntheticSplit(all_ids, all_labels, positions, fixed)


def split_lengths(settings: SyntheticConfig, name: str) -> tuple[int, int]:
    """The content lengths of a split: the training range (`train`, `dev`), m x the longest (`test_<m>x`)."""
    shortest, longest = settings.train_lengths
    if name in ("train", "dev"):
        return shortest, longest
    m = int(name.removeprefix("test_").removesuffix("x"))
    return longest * m, longest * m


def split_seed(settings: SyntheticConfig, name: str) -> int:
    """Each split's seed of its own, far apart: `seed` (train), + DEV_SEED_OFFSET (dev), + (m + 1) x it (test_<m>x)."""
    if name == "train":
        return settings.seed
    if name == "dev":
        return settings.seed + DEV_SEED_OFFSET
    m = int(name.removeprefix("test_").removesuffix("x"))
    return settings.seed + (m + 1) * DEV_SEED_OFFSET


def test_split_name(multiple: int) -> str:
    """The name of the test split at `multiple` times the longest trained length."""
    return f"test_{multiple}x"


# ----------------------------------------------------------------------------------------------------------------
# The task


class SyntheticTask(HeadOutputs):
    """A generated task trained from scratch by the MLM head: `type: synthetic`.

    Args:
        data: The data: section (its `synthetic:` settings).
    """

    architecture = "masked_lm"
    num_labels = 2  # unused by the MLM head
    micro_batch_loss = "the MLM loss is a mean over a micro-batch's masked tokens"

    def __init__(self, data: FinetuneDataConfig) -> None:
        super().__init__(data)
        self.settings: SyntheticConfig = data.synthetic or SyntheticConfig()
        self.tokens = vocabulary(self.settings)
        self.test_splits = [test_split_name(m) for m in self.settings.test_multiples]
        self._training_rows: list[Row] | None = None
        self._floors: dict[str, list[Floor]] | None = None

    @classmethod
    def from_config(cls, data: FinetuneDataConfig) -> SyntheticTask:
        """The task of a data: section (its splits are generated when encoded)."""
        return cls(data)

    def tokenizer(self) -> Tokenizer:
        """The task's own vocabulary, written with the model it trains."""
        return word_level_tokenizer(self.tokens)

    def check_model(self, config: ModelConfig) -> None:
        """What the model must take: the longest test row (or randomized range), its positions and extensions.

        A learned position table must hold the longest test row (or the randomized range); real positions and every
        test-time extension must be defined for the encoding.

        Raises:
            UserError: naming the field: model.max_position_embeddings and what it needs, randomized_kind: float
                for an encoding of integer positions, or an extension the encoding has no meaning for.
        """
        settings = self.settings
        needed = settings.randomized_positions or settings.longest_row + 2
        if not config.holds_positions(needed):
            raise UserError(
                f"model.max_position_embeddings ({config.max_position_embeddings}) must hold {needed} positions: the "
                "longest test row, or synthetic.randomized_positions"
            )
        spec = config.encoding
        if settings.randomized_kind == "float" and spec.acts != "nothing" and not spec.real_positions:
            raise UserError(
                f"data.synthetic.randomized_kind: float draws real positions; {spec.name} reads them as table rows or "
                "buckets (use randomized_kind: integer)"
            )
        for extension in parse_extensions(settings.extensions):
            reason = extension.refusal(config)
            if reason is not None:
                raise UserError(f"data.synthetic.extensions: {extension.label}: {reason}")
            for split in self.test_splits:
                try:
                    extension.variant(config, *self.extension_lengths(split))  # ModelConfig's own checks
                except ConfigError as e:
                    raise UserError(f"data.synthetic.extensions: {extension.label} at {split}: {e}") from None

    def extension_lengths(self, split: str) -> tuple[int, int]:
        """(trained, split) lengths in tokens that extensions scale between: the longest rows with [CLS] and [SEP]."""
        return split_lengths(self.settings, "train")[1] + 2, split_lengths(self.settings, split)[1] + 2

    def test_variants(self, config: ModelConfig, split: str) -> dict[str, EvalVariant]:
        """{label: how the model is evaluated under it} for every `extensions` method at the test split `split`."""
        if split not in self.test_splits:
            return {}
        lengths = self.extension_lengths(split)
        return {e.label: e.variant(config, *lengths) for e in parse_extensions(self.settings.extensions)}

    def encode(self, tokenizer: Tokenizer, max_length: int) -> dict[str, SyntheticSplit]:
        """Every split generated in the tokenizer's ids (the task's own vocabulary).

        Raises:
            UserError: a test row longer than `max_length` (data.max_length), which would be cut.
        """
        self.check_length(max_length)
        ids = tokenizer.get_vocab()
        return {name: self.split(name, ids) for name in ["train", *self.evaluated_splits]}

    def check_length(self, max_length: int) -> None:
        """The longest test row must fit `max_length` (data.max_length, capped at a learned table) uncut.

        Raises:
            UserError: it does not, naming data.max_length.
        """
        if self.settings.longest_row + 2 > max_length:
            raise UserError(
                f"data.max_length ({max_length}) is shorter than the longest test row ({self.settings.longest_row} "
                f"tokens + [CLS] and [SEP]): raise it"
            )

    def split(self, name: str, ids: dict[str, int]) -> SyntheticSplit:
        """One split (`train`, `dev` or `test_<m>x`) in the token ids `ids`: each split from a seed of its own."""
        lengths = split_lengths(self.settings, name)
        return encode_split(self.settings, ids, self.rows(name), lengths, split_seed(self.settings, name))

    def rows(self, name: str) -> list[Row]:
        """A split's generated rows; dev's and those of a test split at a trained length exclude the training rows.

        Raises:
            ConfigError: too few distinct rows to keep them apart (`generate_rows`).
        """
        settings = self.settings
        lengths, seed = split_lengths(settings, name), split_seed(settings, name)
        if name == "train":
            if self._training_rows is None:  # kept: every split apart from it asks for it
                self._training_rows = generate_rows(settings, settings.train_examples, lengths, seed)
            return self._training_rows
        shortest, longest = settings.train_lengths
        trained = lengths[0] <= longest and lengths[1] >= shortest  # it could draw a training row
        exclude = {row_key(row) for row in self.rows("train")} if trained else frozenset()
        return generate_rows(settings, settings.eval_examples, lengths, seed, exclude)

    def floors(self) -> dict[str, list[Floor]]:
        """Per dev and test split, its position-blind floor and the simpler guesses worth reading against."""
        if self._floors is None:  # computed once: every run of the job asks for them
            self._floors = {
                name: floors(self.settings, split_lengths(self.settings, name)) for name in self.evaluated_splits
            }
        return self._floors

    @property
    def evaluated_splits(self) -> list[str]:
        """The dev split, then the test splits."""
        return [*self.dev_splits, *self.test_splits]

    def baseline(self, splits: dict[str, Any], split: str) -> dict[str, Any]:
        """results.json's `baseline` of a dev or test split: its position-blind floor, simpler guesses beside it.

        `{"kind": "position_blind", "accuracy", "sequence_accuracy", "score", "guess", "method", "references": [...]}`,
        of the generator's distribution at the split's lengths (not of its few hundred rows, whose answers the floor
        does not look at); `references` holds the simpler guesses worth reading against (missing-duplicate's frequent
        bit), scored alike.
        """
        floor, *references = self.floors()[split]
        metrics = {"accuracy": floor.accuracy, "sequence_accuracy": floor.sequence_accuracy}
        return {
            **floor.to_dict(),
            "score": with_score(metrics, self.metrics)["score"],
            "references": [level.to_dict() for level in references],
        }

    def collate(self, split: SyntheticSplit, rows: list[int], pad_id: int, cap: int) -> dict[str, torch.Tensor]:
        """Padded ids, mask and labels of `rows`, and `position_ids` when the positions are randomized."""
        length = self.padded_length(max(len(split.ids[r]) for r in rows), cap)
        ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        labels = torch.full((len(rows), length), IGNORE_INDEX, dtype=torch.long)
        kind = torch.float32 if self.settings.randomized_kind == "float" else torch.long
        positions = torch.zeros((len(rows), length), dtype=kind) if split.positions is not None else None
        for i, r in enumerate(rows):
            n = len(split.ids[r])
            ids[i, :n], labels[i, :n], mask[i, :n] = torch.tensor(split.ids[r]), torch.tensor(split.labels[r]), 1
            if positions is not None:
                positions[i, :n] = torch.tensor(split.positions[r])
        batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
        if positions is not None:
            batch["position_ids"] = positions
        return batch

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The masked-token loss; with `masked_logits_only`, the vocabulary projection at the asked positions alone."""
        return model(**batch, masked_only=self.settings.masked_logits_only).loss

    def outputs(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The MLM logits (B, T, V), the randomized positions given; or (N, V) at the asked positions alone.

        With `masked_logits_only` the asked positions alone, row by row: Zoology's 8,192 tokens over 500 rows of
        514 would be 8 GB of logits.
        """
        if self.settings.masked_logits_only:
            return model(**batch, masked_only=True).logits  # (N, V); the labels say where, and are not read
        return model(**{k: v for k, v in batch.items() if k != "labels"}).logits

    def predictions(self, logits: torch.Tensor, split: SyntheticSplit, rows: list[int]) -> list[list[int]]:
        """Per row, the predicted id at every asked position, in order (from (B, T, V) or the asked (N, V))."""
        if logits.dim() == 2:  # the asked positions' logits, row by row
            counts = [sum(label != IGNORE_INDEX for label in split.labels[r]) for r in rows]
            return [chunk.tolist() for chunk in logits.argmax(-1).cpu().split(counts)]
        best = logits.argmax(-1).cpu()  # (B, T)
        return [
            [int(best[i, p]) for p, label in enumerate(split.labels[r]) if label != IGNORE_INDEX]
            for i, r in enumerate(rows)
        ]

    def evaluate(self, split: SyntheticSplit, predictions: list[list[int]]) -> dict[str, float]:
        """`accuracy` over the asked positions, `sequence_accuracy` over rows (all of a row's answers right)."""
        right = rows_right = total = 0
        for labels, predicted in zip(split.labels, predictions, strict=True):
            gold = [label for label in labels if label != IGNORE_INDEX]
            hits = sum(p == g for p, g in zip(predicted, gold, strict=True))
            right, total, rows_right = right + hits, total + len(gold), rows_right + (hits == len(gold))
        scores = {"accuracy": right / total, "sequence_accuracy": rows_right / len(split.labels)}
        return with_score(scores, self.metrics)

    def write_predictions(
        self, folder: Path, encoded: dict[str, SyntheticSplit], predictions: dict[str, list[list[int]]]
    ) -> None:
        """`<split>.jsonl` per dev and test split: every row's ids, answers and predictions (token names)."""
        names = self.tokens
        for split in self.evaluated_splits:
            data = encoded[split]
            lines = []
            for ids, labels, predicted in zip(data.ids, data.labels, predictions[split], strict=True):
                gold = [names[label] for label in labels if label != IGNORE_INDEX]
                row = {
                    "input": " ".join(names[i] for i in ids),
                    "answers": gold,
                    "predicted": [names[p] for p in predicted],
                }
                lines.append(json.dumps(row))
            atomic_write_text(folder / f"{split}.jsonl", "".join(line + "\n" for line in lines))

    def write_submission(self, run_folder: Path, submission: Path) -> None:
        """Nothing: a synthetic task has no benchmark server."""


SPECS = (
    TaskSpec(
        name="synthetic",
        summary="generated length-generalization tasks (shift, missing-duplicate, passkey-binding, mqar), from scratch",
        builder=SyntheticTask.from_config,
        architecture="masked_lm",
        metrics=("accuracy", "sequence_accuracy"),
        default_metrics=("accuracy",),
        predictions="dev.jsonl",
        docs="length-generalization.md",
        section="synthetic",
        settings=SyntheticConfig,
        needs_validation_file=lambda data: False,
        own_vocabulary=True,
    ),
)
