"""passkey-MLM's inputs (issue 55): the distractor digits in its haystack, which make copying a digit fail."""

from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from roformer.data.builtin import generate_documents
from roformer.data.tokenizer import train_tokenizer
from roformer.errors import ConfigError
from roformer.study.compare import probe_table
from roformer.study.markdown import probe_results_table
from roformer.study.probes import (
    MLM_KEYS,
    Haystack,
    ProbeSettings,
    mlm_distractors,
    mlm_key_ids,
    mlm_rounds,
    mlm_samples,
    probe_rows,
)
from roformer.study.stats import wilson_interval

SAMPLES = 500  # a 95% Wilson interval of about +-2.7 points at 10%


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return train_tokenizer(["the pass key is 0 1 2 3 4 5 6 7 8 9 . once upon a time there was a cat"] * 4, 120)


@pytest.fixture(scope="module")
def plain(tokenizer: Any) -> Haystack:
    """Filler without a digit of its own (the built-in corpus has none): the key would be the only digit."""
    return Haystack(tokenizer, list(generate_documents(100)), seed=0)


@pytest.fixture(scope="module")
def numbered(tokenizer: Any) -> Haystack:
    """Filler with digits of its own, unevenly (7 in every document, others in some), as in real text."""
    documents = [f"{d} 7 {i % 10} 7" for i, d in enumerate(generate_documents(100))]
    return Haystack(tokenizer, documents, seed=0)


def digits_of(tokenizer: Any) -> list[int]:
    return [ids[0] for ids in mlm_key_ids(tokenizer)]


def test_the_distractors_per_length_are_the_documented_ones() -> None:
    """docs/long-context.md's table: each of the ten digits once per 256 tokens, at least once; the key is one."""
    assert {n: mlm_distractors(n) for n in (128, 256, 512, 1024, 2048)} == {
        128: 9,
        256: 9,
        512: 19,
        1024: 39,
        2048: 79,
    }
    assert [mlm_rounds(n) for n in (32, 511, 512, 2048)] == [1, 1, 2, 8]
    assert mlm_distractors(512, digits_every=128) == 39 and mlm_distractors(2048, digits_every=0) == 0


@pytest.mark.parametrize(("length", "distance"), [(32, 7), (32, 23), (64, 20), (128, 16), (128, 104), (512, 488)])
def test_every_input_holds_the_stated_distractors_outside_the_statements(
    tokenizer: Any, numbered: Haystack, length: int, distance: int
) -> None:
    """Besides the key exactly `mlm_distractors` digits, none in the key's statement or its masked copy (which are
    intact), each digit as often as every other; the filler's own digits are gone; the key is never the first digit
    nor the one nearest its masked copy."""
    digits = digits_of(tokenizer)
    head = tokenizer("the pass key is", add_special_tokens=False)["input_ids"]
    dot = tokenizer(".", add_special_tokens=False)["input_ids"]
    ids, masked, answers = mlm_samples(tokenizer, numbered, length, distance, 40, seed=length + distance)
    assert ids.shape == (40, length)
    for row, mask, answer in zip(ids.tolist(), masked.tolist(), answers, strict=True):
        key = mask - distance
        statement = key - len(head)  # where "the pass key is K ." starts
        copy = statement + distance
        assert row[statement : statement + len(head) + 1 + len(dot)] == [*head, digits[answer], *dot]
        assert row[copy : copy + len(head) + 1 + len(dot)] == [*head, tokenizer.mask_token_id, *dot]
        assert row[mask] == tokenizer.mask_token_id and row[0] == tokenizer.cls_token_id
        places = [i for i, token in enumerate(row) if token in digits]
        distractors = [i for i in places if i != key]
        assert key in places and len(distractors) == mlm_distractors(length)
        assert not any(statement <= i < statement + len(head) + 1 + len(dot) for i in distractors)
        assert not any(copy <= i < copy + len(head) + 1 + len(dot) for i in distractors)
        assert Counter(row[i] for i in places) == dict.fromkeys(digits, mlm_rounds(length))
        assert places[0] != key and min(places, key=lambda i: abs(i - mask)) != key


def copy_a_digit(ids: torch.Tensor, masked: torch.Tensor, digits: list[int], how: str, seed: int = 0) -> list[int]:
    """A model without the skill: the key index it guesses from the digits elsewhere in each input."""
    rng = random.Random(seed)
    guesses = []
    for row, mask in zip(ids.tolist(), masked.tolist(), strict=True):
        places = [i for i, token in enumerate(row) if token in digits]
        if how == "any":  # one of the digits in the text
            token = row[rng.choice(places)]
        elif how == "most":  # the most frequent (ties: the first key)
            counts = Counter(row[i] for i in places)
            token = max(digits, key=lambda d: counts[d])
        else:  # the one nearest the masked copy
            token = row[min(places, key=lambda i: abs(i - mask))]
        guesses.append(digits.index(token))
    return guesses


@pytest.mark.parametrize("distance", [16, 60])
def test_copying_a_digit_from_the_text_is_at_chance_with_distractors_and_perfect_without(
    tokenizer: Any, plain: Haystack, distance: int
) -> None:
    """What the distractors fix: without them the key is the only digit of the input, and copying any digit fills
    every masked copy; with them, the digit a copier picks is the key as often as chance (10%, within the 95%
    interval over 500 inputs), or less for the one nearest the copy (never the key; of the others, none is the key's
    digit in one round of the ten)."""
    digits = digits_of(tokenizer)
    for how in ("any", "most", "nearest"):
        ids, masked, answers = mlm_samples(tokenizer, plain, 128, distance, SAMPLES, seed=5, digits_every=0)
        assert copy_a_digit(ids, masked, digits, how) == answers  # the probe before issue 55
        ids, masked, answers = mlm_samples(tokenizer, plain, 128, distance, SAMPLES, seed=5)
        correct = sum(g == a for g, a in zip(copy_a_digit(ids, masked, digits, how), answers, strict=True))
        low, high = wilson_interval(correct, SAMPLES)
        assert (correct == 0) if how == "nearest" else (low <= 0.1 <= high), (how, correct)


class BagOfDigitsMLM(torch.nn.Module):
    """An MLM that fills every position by how often each token occurs in its input: copying the commonest digit."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.config = SimpleNamespace(position_encoding="none", holds_positions=lambda length: True)
        self.vocab_size = vocab_size

    def forward(self, ids: torch.Tensor) -> SimpleNamespace:
        counts = torch.nn.functional.one_hot(ids, self.vocab_size).sum(dim=1, keepdim=True)
        return SimpleNamespace(logits=counts.expand(-1, ids.shape[1], -1).float())


def test_a_copying_model_scores_chance_through_the_probe_and_the_rows_state_the_distractors(
    tokenizer: Any, plain: Haystack
) -> None:
    """Through probe_rows: the commonest-digit MLM is at chance with distractors, perfect without; each row says how
    many distractors its inputs hold, and a setting that cannot hold them is a row that says so."""
    model = BagOfDigitsMLM(len(tokenizer))
    settings = ProbeSettings("passkey-mlm", [128], SAMPLES, distances=[40], batch_size=100)
    (row,) = probe_rows(model, tokenizer, settings, plain)
    assert row["distractors"] == 9 and row["interval"][0] <= 0.1 <= row["interval"][1]
    (before,) = probe_rows(
        model, tokenizer, ProbeSettings("passkey-mlm", [128], 50, distances=[40], digits_every=0), plain
    )
    assert before["distractors"] == 0 and before["accuracy"] == 1.0
    (short,) = probe_rows(model, tokenizer, ProbeSettings("passkey-mlm", [64], 5, distances=[9], digits_every=4), plain)
    assert (
        short["distractors"] == 159
        and short["error"] == "159 distractor digits do not fit 64 tokens beside the key and its copy"
    )


def test_the_inputs_are_the_seeds_alone(tokenizer: Any) -> None:
    """The same seed gives the same inputs (a haystack built anew included); another seed others; `digits_every=0`
    gives the inputs of the probe before issue 55, token for token."""
    documents = [f"{d} 7 {i % 10}" for i, d in enumerate(generate_documents(100))]
    first = mlm_samples(tokenizer, Haystack(tokenizer, documents, seed=1), 128, 30, 20, seed=3)
    again = mlm_samples(tokenizer, Haystack(tokenizer, documents, seed=1), 128, 30, 20, seed=3)
    other = mlm_samples(tokenizer, Haystack(tokenizer, documents, seed=1), 128, 30, 20, seed=4)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1]) and first[2] == again[2]
    assert not torch.equal(first[0], other[0])
    haystack = Haystack(tokenizer, documents, seed=1)
    ids, masked, answers = mlm_samples(tokenizer, haystack, 128, 30, 20, seed=3, digits_every=0)
    assert torch.equal(ids, torch.tensor(pre_issue_55(tokenizer, haystack, 128, 30, 20, seed=3)))


def pre_issue_55(tokenizer: Any, haystack: Haystack, length: int, distance: int, samples: int, seed: int) -> list:
    """passkey-MLM's inputs as the probe drew them before distractors (its code then, verbatim but for names)."""
    rng = random.Random(seed)
    head = tokenizer("the pass key is", add_special_tokens=False)["input_ids"]
    dot = tokenizer(".", add_special_tokens=False)["input_ids"]
    span, body, rows = len(head) + 1 + len(dot), length - 2, []
    for _ in range(samples):
        answer = rng.randrange(len(MLM_KEYS))
        filler = haystack.take(body, rng)
        at = rng.randrange(body - distance - span + 1)
        filler[at : at + span] = [*head, digits_of(tokenizer)[answer], *dot]
        filler[at + distance : at + distance + span] = [*head, tokenizer.mask_token_id, *dot]
        rows.append([tokenizer.cls_token_id, *filler, tokenizer.sep_token_id])
    return rows


def test_distances_and_settings_that_cannot_hold_the_distractors_say_so(tokenizer: Any, plain: Haystack) -> None:
    """A distractor needs a filler token before the key and one between it and its copy: one fewer distance at
    each end than without (span 6 here: 7 to 23 of 32 tokens, 6 to 24 without)."""
    with pytest.raises(ValueError, match=r"distance 6 does not fit 32 tokens \(distances 7 to 23 do\)"):
        mlm_samples(tokenizer, plain, 32, 6, 5, seed=0)
    assert mlm_samples(tokenizer, plain, 32, 6, 5, seed=0, digits_every=0)[0].shape == (5, 32)
    with pytest.raises(ConfigError, match="digits_every must be >= 0"):
        ProbeSettings("passkey-mlm", digits_every=-1)


def test_the_readers_take_probe_files_with_and_without_the_distractor_count() -> None:
    """Files written before issue 55 have no `distractors` in their rows: compare and the printed table read both."""
    row = {"probe": "passkey-mlm", "length": 128, "scaling": "none", "distance": 16, "chance": 0.1, "accuracy": 0.2,
           "interval": [0.1, 0.3], "samples": 50, "seconds": 1.0}  # fmt: skip
    files = [
        {"model": "m", "label": "rotary", "seed": 0, "probe": "passkey-mlm", "scaling": "none", "rows": [row]},
        {"model": "m", "label": "rotary", "seed": 1, "probe": "passkey-mlm", "scaling": "none",
         "rows": [{**row, "distractors": 9, "accuracy": 0.1}]},
    ]  # fmt: skip
    (table,) = probe_table(files)
    assert table["seeds"] == 2 and table["accuracy"] == pytest.approx(0.15)
    printed = probe_results_table([row, {**row, "distractors": 9}])
    assert printed.count("| passkey-mlm | 128 | 16 | none | 0.200 |") == 2
