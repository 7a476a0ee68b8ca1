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

Training lengths (content tokens) are drawn from `train_lengths` [shortest, longest]; the dev split (which selects
checkpoints) is drawn alike from another seed; the test splits `test_<m>x` hold rows of exactly m times the longest
trained length, for every m of `test_multiples`. `randomized_positions: L` gives every row a sorted sample of
positions from [0, L) in place of 0..T-1 (Ruoss et al. 2023, sec. 3), in training and evaluation alike, drawn with the
row, so that test lengths reuse positions seen in training; it applies to every encoding that reads positions.

The model is built from the config's `model:` section (`init:` empty) with this task's vocabulary: the specials, the
symbols and the task's markers, as a word-level tokenizer written with the model.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

from roformer.config import check_types
from roformer.errors import ConfigError, UserError
from roformer.files import atomic_write_text
from roformer.labels import IGNORE_INDEX
from roformer.tasks.base import HeadOutputs, TaskSpec, TokenRows, with_score

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer
    from roformer.model.config import ModelConfig
    from roformer.tasks.config import FinetuneDataConfig

SYNTHETIC_TASKS = ("shift", "missing-duplicate", "passkey-binding", "mqar")
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MARKERS = ("[KEY]", "[ASK]")  # passkey-binding's tag of the true key and its question
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
        offset: shift: the distance k to the answer's source.
        direction: shift: `left` (the symbol at i - k) or `right` (at i + k).
        mask_rate: shift: the fraction of positions masked (at least one per row).
        distractors: passkey-binding: untagged keys per 16 content tokens (at least one).
        train_lengths: [shortest, longest] content tokens of training rows (and of the dev split).
        test_multiples: Test splits at these multiples of the longest trained length (`test_2x`, ...).
        train_examples: Rows of the training split.
        eval_examples: Rows of the dev split and of every test split.
        randomized_positions: L: positions are a sorted sample from [0, L) (Ruoss et al. 2023); null: 0..T-1.
    """

    task: Literal["shift", "missing-duplicate", "passkey-binding", "mqar"] = "shift"
    seed: int = 0
    symbols: int = 16
    keys: int = 10
    pairs: int = 4
    query_gap_power: float | None = None
    offset: int = 2
    direction: Literal["left", "right"] = "left"
    mask_rate: float = 0.15
    distractors: int = 2
    train_lengths: list[int] = field(default_factory=lambda: [8, 32])
    test_multiples: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    train_examples: int = 20000
    eval_examples: int = 500
    randomized_positions: int | None = None

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
        answers = {"shift": self.symbols, "missing-duplicate": 2, "passkey-binding": self.keys, "mqar": self.symbols}
        return 1.0 / answers[self.task]


# ----------------------------------------------------------------------------------------------------------------
# The vocabulary


def vocabulary(settings: SyntheticConfig) -> list[str]:
    """The task's tokens in id order: the specials, the markers, the symbols (`s0`...), keys (`k0`...), values."""
    symbols = [f"s{i}" for i in range(settings.symbols)]
    keys = [f"k{i}" for i in range(settings.keys)] if settings.task == "passkey-binding" else []
    values = [f"v{i}" for i in range(settings.symbols)] if settings.task == "mqar" else []
    bits = ["0", "1"] if settings.task == "missing-duplicate" else []
    return [*SPECIALS, *MARKERS, *(bits or symbols), *keys, *values]


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
    wanted = max(1, round(settings.mask_rate * length))
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
    count = min(len(free), max(1, settings.distractors * length // 16))
    for i in rng.sample(free, count):  # uniform keys, the answer's among them: copying a key is at chance
        content[i] = f"k{rng.randrange(settings.keys)}"
    return content, {ask + 1: key}


def mqar_row(settings: SyntheticConfig, length: int, rng: random.Random) -> Row:
    """`pairs` key-value pairs, then filler in which every key is asked once more, its value masked after it."""
    keys = rng.sample(range(settings.symbols), min(settings.pairs, settings.symbols))
    values = [rng.randrange(settings.symbols) for _ in keys]
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
    positions: list[list[int]] | None
    length: int | None = None
    labelled: bool = True


def generate_split(
    settings: SyntheticConfig, ids: dict[str, int], rows: int, lengths: tuple[int, int], seed: int
) -> SyntheticSplit:
    """`rows` rows of content lengths drawn uniformly from `lengths` (inclusive), from `seed` alone."""
    rng = random.Random(seed)
    generate = GENERATORS[settings.task]
    all_ids, all_labels, all_positions = [], [], []
    for _ in range(rows):
        content, answers = generate(settings, rng.randint(*lengths), rng)
        row = [ids["[CLS]"]] + [ids["[MASK]"] if i in answers else ids[t] for i, t in enumerate(content)]
        row.append(ids["[SEP]"])
        labels = [IGNORE_INDEX] * len(row)
        for i, answer in answers.items():
            labels[1 + i] = ids[answer]
        all_ids.append(row)
        all_labels.append(labels)
        if settings.randomized_positions is not None:
            all_positions.append(sorted(rng.sample(range(settings.randomized_positions), len(row))))
    fixed = lengths[0] if lengths[0] == lengths[1] else None
    return SyntheticSplit(all_ids, all_labels, all_positions or None, fixed)


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

    @classmethod
    def from_config(cls, data: FinetuneDataConfig) -> SyntheticTask:
        """The task of a data: section (its splits are generated when encoded)."""
        return cls(data)

    def tokenizer(self) -> Tokenizer:
        """The task's own vocabulary, written with the model it trains."""
        return word_level_tokenizer(self.tokens)

    def check_model(self, config: ModelConfig) -> None:
        """A learned position table must hold the longest test row (or the randomized range).

        Raises:
            UserError: it does not, naming model.max_position_embeddings and what it needs.
        """
        needed = self.settings.randomized_positions or self.settings.longest_row + 2
        if config.position_encoding == "learned" and config.max_position_embeddings < needed:
            raise UserError(
                f"model.max_position_embeddings ({config.max_position_embeddings}) must hold {needed} positions: the "
                "longest test row, or synthetic.randomized_positions"
            )

    def encode(self, tokenizer: Tokenizer, max_length: int) -> dict[str, SyntheticSplit]:
        """Every split generated in the tokenizer's ids (the task's own vocabulary).

        Raises:
            UserError: a test row longer than `max_length` (data.max_length), which would be cut.
        """
        settings = self.settings
        if settings.longest_row + 2 > max_length:
            raise UserError(
                f"data.max_length ({max_length}) is shorter than the longest test row ({settings.longest_row} "
                f"tokens + [CLS] and [SEP]): raise it"
            )
        ids = tokenizer.get_vocab()
        return {name: self.split(name, ids) for name in ["train", *self.dev_splits, *self.test_splits]}

    def split(self, name: str, ids: dict[str, int]) -> SyntheticSplit:
        """One split (`train`, `dev` or `test_<m>x`) in the token ids `ids`: each split from a seed of its own."""
        settings = self.settings
        shortest, longest = settings.train_lengths
        if name == "train":
            return generate_split(settings, ids, settings.train_examples, (shortest, longest), settings.seed)
        if name == "dev":
            seed = settings.seed + DEV_SEED_OFFSET
            return generate_split(settings, ids, settings.eval_examples, (shortest, longest), seed)
        m = int(name.removeprefix("test_").removesuffix("x"))
        seed = settings.seed + (m + 1) * DEV_SEED_OFFSET
        return generate_split(settings, ids, settings.eval_examples, (longest * m, longest * m), seed)

    def collate(self, split: SyntheticSplit, rows: list[int], pad_id: int, cap: int) -> dict[str, torch.Tensor]:
        """Padded ids, mask and labels of `rows`, and `position_ids` when the positions are randomized."""
        length = self.padded_length(max(len(split.ids[r]) for r in rows), cap)
        ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        labels = torch.full((len(rows), length), IGNORE_INDEX, dtype=torch.long)
        positions = torch.zeros((len(rows), length), dtype=torch.long) if split.positions is not None else None
        for i, r in enumerate(rows):
            n = len(split.ids[r])
            ids[i, :n], labels[i, :n], mask[i, :n] = torch.tensor(split.ids[r]), torch.tensor(split.labels[r]), 1
            if positions is not None:
                positions[i, :n] = torch.tensor(split.positions[r])
        batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
        if positions is not None:
            batch["position_ids"] = positions
        return batch

    def outputs(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The MLM logits (B, T, V), the randomized positions given."""
        return model(**{k: v for k, v in batch.items() if k != "labels"}).logits

    def predictions(self, logits: torch.Tensor, split: SyntheticSplit, rows: list[int]) -> list[list[int]]:
        """Per row, the predicted id at every asked position, in order."""
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
        for split in self.dev_splits + self.test_splits:
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
