"""The synthetic tasks' position-blind floors, each against a brute force of its generator, and the rows every arm
of a seed shares: randomized positions change no row, and no dev (or test_1x) row is a training row."""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections import Counter, defaultdict
from dataclasses import replace
from fractions import Fraction
from itertools import product
from pathlib import Path

import numpy as np
import pytest

from roformer.config import load
from roformer.errors import ConfigError
from roformer.tasks.build import make_task
from roformer.tasks.synthetic import SyntheticTask
from roformer.tasks.synthetic_floors import commonest_share, floors, frequent_bit_level, position_blind_floor
from roformer.tasks.synthetic_rows import (
    GENERATORS,
    Row,
    SyntheticConfig,
    generate_rows,
    generate_split,
    row_key,
    split_lengths,
    split_seed,
    vocabulary,
)
from roformer.train.config import FinetuneConfig

REPO = Path(__file__).resolve().parents[2]

# ----------------------------------------------------------------------------------------------------------------
# Brute forces


def enumerated_commonest_share(draws: int, alphabet: int) -> Fraction:
    """E[largest count] / draws over every one of the alphabet^draws equally likely draws, in exact fractions."""
    total = sum(max(Counter(draw).values()) for draw in product(range(alphabet), repeat=draws))
    return Fraction(total, alphabet**draws * draws)


def bag(row: Row) -> tuple[tuple[str, int], ...]:
    """What a model that ignores positions sees of a row: the multiset of its tokens, [MASK] at the asked ones."""
    content, answers = row
    return tuple(sorted(Counter("[MASK]" if i in answers else t for i, t in enumerate(content)).items()))


def best_guess_by_bag(rows: list[Row], whole: bool = False) -> float:
    """The accuracy of one answer per bag (for all its masks), the answer chosen by counting, not by any derivation.

    Accuracy over the answers, or with `whole` the share of rows with every answer right. Cross-fitted: each half's
    answer per bag is the one that scores best in the other half (a bag the other half lacks is left out), so the
    count's luck does not inflate the level.
    """

    def scores(row: Row) -> Counter[str]:  # what each answer would score on the row
        answers = list(row[1].values())
        if whole:
            return Counter({answers[0]: 1} if len(set(answers)) == 1 else {})
        return Counter(answers)

    seen = [(bag(row), scores(row), 1 if whole else len(row[1])) for row in rows]
    halves = seen[::2], seen[1::2]
    right = total = 0
    for fit, score in (halves, halves[::-1]):
        hits: dict[tuple, Counter[str]] = defaultdict(Counter)
        for tokens, scored, _ in fit:
            hits[tokens].update(scored)
        best = {
            tokens: max(counts.items(), key=lambda item: item[1])[0] if counts else ""
            for tokens, counts in hits.items()
        }
        for tokens, scored, answers in score:
            if tokens in best:
                right += scored[best[tokens]]
                total += answers
    return right / total


def rows_of(settings: SyntheticConfig, count: int, seed: int = 0) -> list[Row]:
    return generate_rows(settings, count, tuple(settings.train_lengths), seed)


# ----------------------------------------------------------------------------------------------------------------
# The floors


@pytest.mark.parametrize(("draws", "alphabet"), [(1, 1), (1, 5), (2, 3), (3, 3), (4, 16), (5, 10), (7, 4), (6, 5)])
def test_the_commonest_share_is_the_enumerated_one(draws: int, alphabet: int) -> None:
    assert commonest_share(draws, alphabet) == pytest.approx(float(enumerated_commonest_share(draws, alphabet)), 1e-12)


@pytest.mark.parametrize(("draws", "alphabet"), [(33, 10), (218, 16)])
def test_the_commonest_share_of_many_draws_is_a_monte_carlo_of_them(draws: int, alphabet: int) -> None:
    """The long rows' case (passkey-binding's 33 keys at 8x, shift's 218 symbols), against 20,000 seeded draws."""
    counts = np.random.default_rng(0).multinomial(draws, [1 / alphabet] * alphabet, size=20000)
    shares = counts.max(axis=1) / draws
    assert abs(commonest_share(draws, alphabet) - shares.mean()) < 4 * shares.std() / np.sqrt(len(shares))


@pytest.mark.parametrize(
    ("settings", "lengths"),
    [
        ({"task": "shift", "symbols": 3, "offset": 2}, (6, 8)),
        ({"task": "shift", "symbols": 3, "offset": 2, "mask_rate": 0.2}, (10, 11)),  # two masks a row
        ({"task": "shift", "symbols": 2, "offset": 1, "mask_rate": 0.9}, (6, 6)),  # masks fall short: Monte Carlo
        ({"task": "missing-duplicate"}, (2, 9)),
        ({"task": "passkey-binding", "symbols": 2, "keys": 3, "distractors": 2}, (16, 16)),
        ({"task": "passkey-binding", "symbols": 2, "keys": 3, "distractors": 2}, (12, 16)),
        ({"task": "mqar", "symbols": 3, "pairs": 2}, (8, 10)),
    ],
)
def test_each_floor_is_the_best_guess_a_bag_of_tokens_allows(settings: dict, lengths: tuple[int, int]) -> None:
    """The floor, derived per task, against the best answer per bag found by counting 40,000 rows of the generator
    (small alphabets, so that every bag recurs): nothing a model that ignores positions can do scores more."""
    config = SyntheticConfig(**settings, train_lengths=list(lengths))  # type: ignore[arg-type]
    floor = position_blind_floor(config, lengths)
    rows = rows_of(config, 40000)
    counted = best_guess_by_bag(rows), best_guess_by_bag(rows, whole=True)
    assert abs(floor.accuracy - counted[0]) < 0.01 and abs(floor.sequence_accuracy - counted[1]) < 0.01, (
        floor,
        counted,
    )
    assert floor.accuracy > config.chance and floor.kind == "position_blind"
    short = settings.get("mask_rate") == 0.9  # the greedy placement can fall short of its masks: counted
    assert ("Monte Carlo of 20000 rows" in floor.method) if short else floor.method == "exact"


def test_missing_duplicate_is_answered_by_its_bag_alone_and_the_frequent_bit_is_not() -> None:
    """Every bit stands twice, so the masked bit is the one whose visible count is odd: the bag answers every row.
    The guess of the more frequent visible bit is exactly 1/2 at even lengths (the mask tips a tie against it)."""
    settings = SyntheticConfig(task="missing-duplicate", train_lengths=[8, 32])
    for content, answers in rows_of(settings, 3000):
        ((at, answer),) = answers.items()
        ones = sum(t == "1" for i, t in enumerate(content) if i != at)
        assert answer == ("1" if ones % 2 else "0")
    assert position_blind_floor(settings, (8, 32)).accuracy == 1.0
    for length in (8, 9, 32, 33):
        rows = generate_rows(settings, 20000, (length, length), seed=1)
        hits = 0.0
        for content, answers in rows:
            ((at, answer),) = answers.items()
            ones = sum(t == "1" for i, t in enumerate(content) if i != at)
            zeros = len(content) - 1 - ones
            hits += 0.5 if ones == zeros else float(("1" if ones > zeros else "0") == answer)
        assert abs(frequent_bit_level(length // 2, length % 2) - hits / len(rows)) < 0.01
    assert frequent_bit_level(16, 0) == pytest.approx(0.5, abs=1e-12)
    kinds = [f.kind for f in floors(settings, (32, 32))]
    assert kinds == ["frequent_bit", "position_blind"]  # read against the frequent bit; the parity bound beside it


def test_the_floors_at_the_shipped_lengths() -> None:
    """The values docs/length-generalization.md states (1x-8x of the shipped configs, 32-256 tokens)."""
    shipped = {
        "shift": ([8, 32], [16.0, 12.9, 10.8, 9.4]),
        "missing-duplicate": ([8, 32], [50.0] * 4),  # its reading level: the frequent visible bit
        "passkey-binding": ([16, 32], [35.8, 28.6, 23.1, 19.2]),
        "mqar": ([16, 32], [33.7] * 4),
    }
    for task, (lengths, expected) in shipped.items():
        config = load(FinetuneConfig, REPO / "configs" / "synthetic" / f"{task}.yaml")
        settings = config.data.synthetic
        assert settings.train_lengths == lengths
        levels = [floors(settings, split_lengths(settings, f"test_{m}x"))[0] for m in (1, 2, 4, 8)]
        assert [round(100 * level.accuracy, 1) for level in levels] == expected, task


def test_results_json_carries_every_split_baseline() -> None:
    """`baseline` of each dev and test split: the floor's accuracy, sequence accuracy and score (what selects)."""
    config = load(FinetuneConfig, REPO / "configs" / "synthetic" / "passkey-binding.yaml")
    task = make_task(config.data)
    baselines = {split: task.baseline({}, split) for split in task.evaluated_splits}
    assert list(baselines) == ["dev", "test_1x", "test_2x", "test_4x", "test_8x"]
    baseline = baselines["test_8x"]
    assert baseline["kind"] == "position_blind" and round(baseline["accuracy"], 3) == 0.192
    assert baseline["score"] == baseline["accuracy"] == baseline["sequence_accuracy"]  # one answer a row
    assert baseline["method"] == "exact" and baseline["references"] == []
    json.dumps(baselines)  # results.json holds them as they are
    missing = make_task(load(FinetuneConfig, REPO / "configs" / "synthetic" / "missing-duplicate.yaml").data)
    baseline = missing.baseline({}, "test_1x")
    assert baseline["kind"] == "frequent_bit" and baseline["accuracy"] == pytest.approx(0.5)
    assert baseline["references"][0]["kind"] == "position_blind" and baseline["references"][0]["accuracy"] == 1.0


# ----------------------------------------------------------------------------------------------------------------
# The rows every arm of a seed shares

TASKS = {
    "shift": {"task": "shift", "symbols": 2, "train_lengths": [3, 6]},
    "missing-duplicate": {"task": "missing-duplicate", "train_lengths": [4, 12]},
    "passkey-binding": {"task": "passkey-binding", "symbols": 2, "keys": 2, "distractors": 1, "train_lengths": [5, 8]},
    "mqar": {"task": "mqar", "symbols": 3, "pairs": 1, "train_lengths": [4, 8]},
}


def task_of(settings: dict, **extra: object) -> SyntheticTask:
    """The task of `settings` (2,000 training rows, 300 per evaluation split), as `roformer finetune` makes it."""
    data = load(FinetuneConfig, REPO / "configs" / "synthetic" / "shift.yaml").data
    synthetic = SyntheticConfig(**{**settings, "train_examples": 2000, "eval_examples": 300, **extra})
    return make_task(replace(data, synthetic=synthetic))


@pytest.mark.parametrize("task", list(TASKS))
def test_randomized_positions_change_no_row(task: str) -> None:
    """The positions come from a stream of their own: an arm with them trains and is tested on the very rows (ids
    and answers) of the arm without, in every split."""
    plain, randomized = task_of(TASKS[task]), task_of(TASKS[task], randomized_positions=200)
    ids = {t: i for i, t in enumerate(plain.tokens)}
    for name in ["train", *plain.evaluated_splits]:
        a, b = plain.split(name, ids), randomized.split(name, ids)
        assert (a.ids, a.labels) == (b.ids, b.labels) and a.positions is None
        assert all(p == sorted(set(p)) and len(p) == len(row) for p, row in zip(b.positions, b.ids, strict=True))
    assert randomized.split("dev", ids).positions != randomized.split("test_1x", ids).positions[:300]


def test_the_training_rows_of_a_default_arm_are_the_rows_it_always_had() -> None:
    """The first 2,000 training rows of every shipped task (no randomized positions), hashed before issue 62's
    changes: the runs made before them stay comparable."""
    pinned = {
        "shift": "a3c360b57a58c726",
        "missing-duplicate": "a01e09190bab4312",
        "passkey-binding": "60d3ca473c3d284e",
        "mqar": "55cbe6b78625e171",
    }
    for task, digest in pinned.items():
        settings = load(FinetuneConfig, REPO / "configs" / "synthetic" / f"{task}.yaml").data.synthetic
        ids = {t: i for i, t in enumerate(vocabulary(settings))}
        split = generate_split(settings, ids, 2000, tuple(settings.train_lengths), settings.seed)
        assert hashlib.sha256(json.dumps([split.ids, split.labels]).encode()).hexdigest()[:16] == digest, task


@pytest.mark.parametrize("task", list(TASKS))
def test_no_dev_or_test_1x_row_is_a_training_row(task: str) -> None:
    """Small alphabets, so that rows drawn without the rule would repeat training rows (checked), and with it do not."""
    task_object = task_of(TASKS[task])
    settings = task_object.settings
    training = {row_key(row) for row in task_object.rows("train")}
    for name in ("dev", "test_1x"):
        lengths, seed = split_lengths(settings, name), split_seed(settings, name)
        unchecked = generate_rows(settings, settings.eval_examples, lengths, seed)
        assert any(row_key(row) in training for row in unchecked)  # the rule has work to do here
        kept = task_object.rows(name)
        assert len(kept) == settings.eval_examples and not any(row_key(row) in training for row in kept)
        assert kept == task_object.rows(name)  # deterministic
    longer = split_lengths(settings, "test_2x")  # longer than any training row: drawn as they come
    assert task_object.rows("test_2x") == generate_rows(settings, 300, longer, split_seed(settings, "test_2x"))


def test_missing_duplicate_dev_rows_no_longer_repeat_training_rows_at_the_shipped_lengths() -> None:
    """49 of the 200 dev rows of the shipped study were training rows; none is now."""
    path = REPO / "configs" / "synthetic" / "missing-duplicate.yaml"
    config = load(FinetuneConfig, path, ["data.synthetic.eval_examples=200"])
    task_object = make_task(config.data)
    training = {row_key(row) for row in task_object.rows("train")}
    settings = task_object.settings
    before = generate_rows(settings, 200, (8, 32), split_seed(settings, "dev"))
    assert sum(row_key(row) in training for row in before) == 49
    assert not any(row_key(row) in training for row in task_object.rows("dev"))


def test_a_task_with_too_few_distinct_rows_for_a_disjoint_dev_split_is_refused() -> None:
    """Bits of 1-2 (24 distinct rows of 2-4 tokens), all in 2,000 training rows: no dev row can be new."""
    task_object = task_of({"task": "missing-duplicate", "train_lengths": [2, 4]})
    with pytest.raises(ConfigError, match=r"^data\.synthetic\.train_lengths: missing-duplicate has too few distinct"):
        task_object.rows("dev")


def test_mqar_with_more_pairs_than_symbols_is_refused() -> None:
    """mqar's keys are distinct symbols: 17 pairs of 16 symbols wrote 16 pairs silently; now refused, naming pairs."""
    with pytest.raises(ConfigError, match=r"pairs \(17\) must be <= symbols \(16\)"):
        SyntheticConfig(task="mqar", pairs=17, symbols=16, train_lengths=[68, 80])
    SyntheticConfig(task="shift", pairs=17, symbols=16)  # only mqar reads pairs
    settings = SyntheticConfig(task="mqar", pairs=16, symbols=16, train_lengths=[64, 64])
    assert len(GENERATORS["mqar"](settings, 64, random.Random(0))[1]) == 16


# ----------------------------------------------------------------------------------------------------------------
# mqar in Zoology's regime


def test_mqar_in_zoology_s_regime_has_its_own_values_distinct_and_a_constant_filler() -> None:
    """Keys and values apart (values of their own count), values without replacement, one filler token: only the
    pairs and the queries hold keys, and the bag's best guess is right once a row (1 / pairs)."""
    from roformer.tasks.synthetic_rows import FILLER, mqar_row, vocabulary

    settings = SyntheticConfig(
        task="mqar", symbols=64, values=32, pairs=4, distinct_values=True, filler="constant", train_lengths=[32, 32]
    )
    tokens = vocabulary(settings)
    assert tokens[-1] == FILLER and sum(t.startswith("v") for t in tokens) == 32 and settings.chance == 1 / 32
    rng = random.Random(0)
    for _ in range(500):
        content, answers = mqar_row(settings, 32, rng)
        values = [t for t in content if t.startswith("v")]
        assert len(values) == len(set(values)) == 4  # each value once, in its pair
        assert sorted(answers.values()) == sorted(values)
        keys = [t for t in content if t.startswith("s")]
        assert len(keys) == 8 and set(content) - {*keys, *values} == {FILLER}  # 4 pairs' keys, 4 queries' keys
    floor = position_blind_floor(settings, (32, 32))
    assert floor.accuracy == pytest.approx(0.25) and floor.sequence_accuracy == 0.0
    plain = SyntheticConfig(task="mqar", symbols=16, pairs=4, train_lengths=[16, 32])
    assert FILLER not in vocabulary(plain) and plain.value_symbols == 16  # the shipped task's ids are unchanged


def test_mqar_asked_at_the_key_labels_the_query_key_itself_unmasked() -> None:
    """`ask: key` (Zoology's framing): the same rows, each answer one position earlier, at its query key, which is
    not masked; no [MASK] is left in the row, and the floor is the same 1 / pairs."""
    from roformer.tasks.synthetic_rows import FILLER, encode_rows, mqar_row, vocabulary

    fields = dict(task="mqar", symbols=64, values=32, pairs=4, distinct_values=True, filler="constant",
                  train_lengths=[32, 32])  # fmt: skip
    at_mask, at_key = SyntheticConfig(**fields), SyntheticConfig(**fields, ask="key")
    ids = {t: i for i, t in enumerate(vocabulary(at_key))}
    for seed in range(50):
        (content, after), (same, answers) = (
            mqar_row(at_mask, 32, random.Random(seed)),
            mqar_row(at_key, 32, random.Random(seed)),
        )
        assert same == content and answers == {at - 1: v for at, v in after.items()}
        assert all(content[at].startswith("s") and content[at + 1] == FILLER for at in answers)
        [row], [labels] = encode_rows([(same, answers)], ids, masked=False)
        assert ids["[MASK]"] not in row and all(row[1 + at] == ids[content[at]] for at in answers)
        assert sorted(labels[1 + at] for at in answers) == sorted(ids[v] for v in answers.values())
    assert position_blind_floor(at_key, (32, 32)).accuracy == pytest.approx(0.25)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"task": "shift", "values": 8}, "values shapes mqar's rows; shift has no values"),
        ({"task": "shift", "filler": "constant"}, "filler shapes mqar's rows"),
        ({"task": "passkey-binding", "ask": "key"}, "ask shapes mqar's rows; passkey-binding has no values"),
        ({"task": "mqar", "pairs": 4, "values": 3, "distinct_values": True, "train_lengths": [16, 32]},
         "distinct_values needs at least pairs (4) values, got 3"),
        ({"task": "mqar", "values": 0, "train_lengths": [16, 32]}, "values must be >= 1"),
    ],
)  # fmt: skip
def test_zoology_s_options_are_mqar_s_and_consistent(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        SyntheticConfig(**settings)
