"""The synthetic tasks' rows: their settings, vocabulary, generators and splits, each a function of a seed.

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
                       (its filler is one token, [FILL]) beside the power-law query places (`query_gap_power`),
                       and `ask: key` (the value predicted at the query key itself, Zoology's framing).

Chance is not the level to read a model against: a model that ignores positions sees the row's bag of tokens, and
the bag alone does better than a uniform guess: roformer.tasks.synthetic_floors derives the best accuracy such a
model can reach, per task and split.

Training lengths (content tokens) are drawn from `train_lengths` [shortest, longest]; the dev split (which selects
checkpoints) is drawn alike from another seed; the test splits `test_<m>x` hold rows of exactly m times the longest
trained length, for every m of `test_multiples`. The dev rows, and those of a test split at a trained length
(`test_1x`), are never training rows: a generated row equal to one is drawn again (`DisjointRows`).
`randomized_positions: L` gives every row a sorted sample of positions from [0, L) in place of 0..T-1 (Ruoss et al.
2023, sec. 3), in training and evaluation alike, so that test lengths reuse positions seen in training; it applies
to every encoding that reads positions. The positions come from a random stream of their own (`positions_seed`), so
an arm with them sees the very rows of an arm without. `randomized_kind: float` draws them as sorted uniform reals
(random float sampling) for the encodings that compute from real positions.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from roformer.config import check_types
from roformer.errors import ConfigError
from roformer.labels import IGNORE_INDEX
from roformer.tasks.base import TokenRows
from roformer.tasks.extensions import parse_extensions

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer

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
        ask: mqar: where a query's value is predicted. `mask`: at a [MASK] right after the query key, which the
            model must first read the key from (one more hop of attention); `key`: at the query key's own position,
            left unmasked (Zoology's next-token framing: the model reads the key and answers there; nothing after
            it tells the value, so it suits bidirectional attention too).
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
    ask: Literal["mask", "key"] = "mask"
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
        zoology = (("values", None), ("distinct_values", False), ("filler", "random"), ("ask", "mask"))  # defaults
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
    asked_after = 0 if settings.ask == "key" else 1  # the answer at the key itself, or at the [MASK] after it
    for k, v, slot in zip(keys, values, slots, strict=True):
        at = start + 2 * slot
        content[at] = f"s{k}"
        answers[at + asked_after] = f"v{v}"
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


def encode_rows(rows: list[Row], ids: dict[str, int], masked: bool = True) -> tuple[list[list[int]], list[list[int]]]:
    """`[CLS] content [SEP]` ids with [MASK] at the asked positions, and the labels (the answers' ids there).

    With `masked` False the asked positions keep their content token (mqar's `ask: key`: the query key itself).
    """
    all_ids, all_labels = [], []
    for content, answers in rows:
        row = [ids["[CLS]"]] + [ids["[MASK]"] if masked and i in answers else ids[t] for i, t in enumerate(content)]
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
    return encode_synthetic_split(settings, ids, generate_rows(settings, rows, lengths, seed, exclude), lengths, seed)


def encode_synthetic_split(
    settings: SyntheticConfig, ids: dict[str, int], rows: list[Row], lengths: tuple[int, int], seed: int
) -> SyntheticSplit:
    """Generated rows as a split in the token ids `ids`, with the positions of `seed`'s stream when randomized."""
    all_ids, all_labels = encode_rows(rows, ids, masked=settings.ask == "mask")
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
