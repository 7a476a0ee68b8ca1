"""`roformer probe`: synthetic long-context probes of a pretrained model, by input length (and distance).

Three probes, every input built in token ids of exactly the length asked (`[CLS] ... [SEP]`), its filler cut from a
haystack of real text (`--haystack DIR`, default the built-in corpus) and seeded:

- `passkey` and `needle`: LongEmbed's synthetic retrieval protocol (Zhu et al. 2024) for embeddings. A corpus of 100
  candidate documents of the length, each a haystack with one fact planted at a random place (`passkey`: "the pass
  key of NAME is NUMBER. remember it."; `needle`: "the SECRET of NAME is hidden in the PLACE."), and 50 queries that
  ask for the fact of 50 of them ("what is the pass key of NAME?"). Query and documents are embedded with the
  backbone (mean pooling, unit length) and the documents ranked by cosine: accuracy@1, which is nDCG@1 with one
  relevant document.
- `passkey-mlm`: an encoder-native probe. A one-token key ("the pass key is 7.") is planted in the haystack and its
  masked copy ("the pass key is [MASK].") `distance` tokens after it; the MLM head must put the key first among the
  ten candidate keys (chance 10%), by length and distance. The haystack holds distractor digits, bare digit tokens
  at random places outside the two statements (one before the key, one between it and its copy), so that the key is
  not the only digit a model can copy: the input holds each of the ten digits equally often (`digits_every`,
  `mlm_distractors`), the key's occurrence included, so the digits a model sees, as a bag, say nothing about the key,
  and the key is never the first digit nor the one nearest its masked copy.

Each row has the accuracy, its 95% Wilson interval over the samples, the sample count and the seconds it took. A
length a learned position table cannot reach is a row that says so; `--scaling` runs a rotary model under PI, NTK,
YaRN or SelfExtend (roformer.study.length_eval.scaled, the factor for the length) and is refused for other
encodings.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from roformer.data.builtin import generate_documents
from roformer.data.text import expand_paths, read_documents
from roformer.data.tokenizer import load_tokenizer
from roformer.errors import ConfigError, UserError
from roformer.files import atomic_write_text, check_output_file
from roformer.model.model import load
from roformer.model.weights import MODEL_CONFIG_FILE, read_model_config
from roformer.study.length_eval import SCALING_METHODS, check_device, default_device, scaled
from roformer.study.runs import arm_label
from roformer.study.stats import wilson_interval
from roformer.train.run_dir import pretraining_length

PROBES = ("passkey", "needle", "passkey-mlm")
CANDIDATES = 100  # LongEmbed: every query ranks the same 100 documents
NAMES = tuple(
    "alice bruno chen dara emil fatima goran hana ivan jonas kemal lena mateo nadia oscar priya quinn rosa sven tomas "
    "uma victor wanda xavier yara zoran".split()
)
SECRETS = ("key", "map", "coin", "ring", "letter", "book", "stone", "watch")
PLACES = ("garden", "cellar", "tower", "library", "kitchen", "harbour", "forest", "attic", "station", "chapel")
MLM_KEYS = tuple(str(k) for k in range(10))  # single tokens in any WordPiece vocabulary with digits
DIGITS_EVERY = 256  # passkey-mlm: each of the ten digits once per 256 tokens of input (at least once)


@dataclass(frozen=True)
class ProbeSettings:
    """What one probe file measures, checked on construction (the command's flags and an experiment's `probes:`).

    Attributes:
        probe: `passkey`, `needle` or `passkey-mlm`.
        lengths: Input lengths (>= 32).
        samples: Queries (or masked keys) per length; retrieval asks 1 to CANDIDATES of its documents.
        scaling: Rotary context scaling: `none`, `linear`, `ntk`, `yarn` or `self_extend` (the factor per length).
        distances: passkey-mlm's key-to-copy distances; None = `default_distances` of each length.
        haystack: A folder of text the filler is cut from; None = the built-in corpus.
        trained_length: The model's training length, for a scaling (None: the model's pretraining.json).
        batch_size: Inputs per forward.
        seed: Seed of the haystack's order, the planted facts and the keys.
        digits_every: passkey-mlm: the input holds each of the ten digits once per this many tokens (at least
            once), the key and `mlm_distractors` distractors; 0 = no distractors, the inputs of the probe before
            issue 55 (the filler's own digits kept).
    """

    probe: str
    lengths: tuple[int, ...] = (128, 256, 512, 1024, 2048)
    samples: int = 50
    scaling: str = "none"
    distances: tuple[int, ...] | None = None
    haystack: str | None = None
    trained_length: int | None = None
    batch_size: int = 8
    seed: int = 0
    digits_every: int = DIGITS_EVERY

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", tuple(self.lengths))  # lists from YAML and argparse: hashable, fixed
        if self.distances is not None:
            object.__setattr__(self, "distances", tuple(self.distances) or None)
        if self.probe not in PROBES:
            raise ConfigError(f"probe: unknown probe {self.probe!r} (known: {', '.join(PROBES)})")
        if self.scaling not in SCALING_METHODS:
            raise ConfigError(f"scaling: unknown method {self.scaling!r} (known: {', '.join(SCALING_METHODS)})")
        if not self.lengths or min(self.lengths) < 32:
            raise ConfigError(f"lengths: lengths must be >= 32, got {list(self.lengths)}")
        if self.samples < 1:
            raise ConfigError(f"samples must be >= 1, got {self.samples}")
        if self.probe != "passkey-mlm" and self.samples > CANDIDATES:
            raise ConfigError(
                f"samples: {self.probe} asks 1 to {CANDIDATES} of its {CANDIDATES} documents, got {self.samples}"
            )
        if self.distances is not None and min(self.distances) < 1:
            raise ConfigError(f"distances must be >= 1, got {list(self.distances)}")
        if self.digits_every < 0:
            raise ConfigError(f"digits_every must be >= 0 (0: no distractor digits), got {self.digits_every}")
        if self.batch_size < 1 or (self.trained_length is not None and self.trained_length < 1):
            raise ConfigError(
                f"batch_size and trained_length must be >= 1, got {self.batch_size}, {self.trained_length}"
            )


def haystack_documents(folder: str | None, seed: int = 0) -> list[str]:
    """The haystack's documents: every text file under `folder`, or 2,000 of the built-in corpus.

    Raises:
        UserError: the folder holds no text.
    """
    if folder is None:
        return list(generate_documents(2000, seed))
    documents = [d for path in expand_paths([folder]) for d in read_documents(path, decode_errors="replace")]
    if not documents:
        raise UserError(f"--haystack {folder}: no text documents found")
    return documents


class Haystack:
    """Filler token ids cut from the haystack's documents (shuffled, seeded), as much as asked."""

    def __init__(self, tokenizer: Any, documents: list[str], seed: int) -> None:
        order = list(documents)
        random.Random(seed).shuffle(order)
        ids = tokenizer(order[:2000], add_special_tokens=False)["input_ids"]
        self.stream = [token for row in ids for token in row]
        if len(self.stream) < 64:
            raise UserError("the haystack holds fewer than 64 tokens")
        self._streams: dict[frozenset[int], list[int]] = {frozenset(): self.stream}

    def take(self, n: int, rng: random.Random, without: frozenset[int] = frozenset()) -> list[int]:
        """`n` filler tokens from a place `rng` draws (wrapping round): the same for every model given the same rng.

        Args:
            n: How many tokens.
            rng: Draws the place.
            without: Tokens left out of the filler (passkey-mlm's digits, which it plants itself in known numbers).

        Raises:
            UserError: the haystack holds fewer than 64 tokens besides `without`.
        """
        if without not in self._streams:
            self._streams[without] = [token for token in self.stream if token not in without]
            if len(self._streams[without]) < 64:
                raise UserError("the haystack holds fewer than 64 tokens besides the digits")
        stream = self._streams[without]
        start = rng.randrange(len(stream))
        return [stream[(start + i) % len(stream)] for i in range(n)]


def framed(tokenizer: Any, body: list[int]) -> list[int]:
    return [tokenizer.cls_token_id, *body, tokenizer.sep_token_id]


def planted(filler: list[int], fact: list[int], rng: random.Random) -> list[int]:
    """`fact` inserted into `filler` at a random place, the filler shortened so the length is kept."""
    room = filler[: len(filler) - len(fact)]
    at = rng.randrange(len(room) + 1)
    return room[:at] + fact + room[at:]


def retrieval_samples(
    probe: str, tokenizer: Any, haystack: Haystack, length: int, samples: int, seed: int
) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """(documents, queries, the index of each query's document): LongEmbed's passkey or needle at `length` tokens.

    Raises:
        ValueError: a fact is longer than a document of `length` tokens can hold.
    """
    rng = random.Random(seed)
    facts, questions = [], []
    for i in range(CANDIDATES):
        name = f"{NAMES[i % len(NAMES)]} {NAMES[(i // len(NAMES) + 7 * i) % len(NAMES)]}"  # 100 distinct names
        if probe == "passkey":
            number = rng.randrange(10000, 100000)
            facts.append(f"the pass key of {name} is {number}. remember it. {number} is the pass key of {name}.")
            questions.append(f"what is the pass key of {name}?")
        else:
            secret, place = rng.choice(SECRETS), rng.choice(PLACES)
            facts.append(f"the {secret} of {name} is hidden in the {place}.")
            questions.append(f"where is the {secret} of {name} hidden?")
    fact_ids = tokenizer(facts, add_special_tokens=False)["input_ids"]
    longest = max(map(len, fact_ids))
    if longest > length - 2:
        raise ValueError(f"its facts take up to {longest} tokens: a document of {length} cannot hold one")
    documents = [framed(tokenizer, planted(haystack.take(length - 2, rng), fact, rng)) for fact in fact_ids]
    targets = rng.sample(range(CANDIDATES), samples)
    asked = tokenizer([questions[t] for t in targets], add_special_tokens=False)["input_ids"]
    queries = [framed(tokenizer, ids) for ids in asked]
    return documents, queries, targets


def mlm_key_ids(tokenizer: Any) -> list[list[int]]:
    """The one-token ids of the ten keys, as the probe plants them.

    Raises:
        UserError: a digit is not one token of its own (several pieces, or [UNK]), or the tokenizer has no [MASK].
    """
    key_ids = [tokenizer(k, add_special_tokens=False)["input_ids"] for k in MLM_KEYS]
    flat = [k[0] for k in key_ids if len(k) == 1]
    if len(flat) != len(MLM_KEYS) or len(set(flat)) != len(MLM_KEYS) or tokenizer.unk_token_id in flat:
        raise UserError("passkey-mlm needs the digits 0-9 as ten distinct single tokens of the vocabulary")
    if tokenizer.mask_token_id is None:
        raise UserError("passkey-mlm needs a [MASK] token in the vocabulary")
    return key_ids


def mlm_rounds(length: int, digits_every: int = DIGITS_EVERY) -> int:
    """How many times each of the ten digits occurs in a passkey-mlm input of `length` tokens (the key's included)."""
    return max(1, length // digits_every) if digits_every else 0


def mlm_distractors(length: int, digits_every: int = DIGITS_EVERY) -> int:
    """The distractor digits of a passkey-mlm input of `length` tokens: every digit occurrence but the key's.

    128 and 256 tokens: 9; 512: 19; 1024: 39; 2048: 79 (`digits_every` 256: one digit per 25.6 tokens, 12.8 at 128).
    """
    rounds = mlm_rounds(length, digits_every)
    return len(MLM_KEYS) * rounds - 1 if rounds else 0


def mlm_samples(
    tokenizer: Any,
    haystack: Haystack,
    length: int,
    distance: int,
    samples: int,
    seed: int,
    digits_every: int = DIGITS_EVERY,
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """(ids (S, length), the masked position of each, the key's index in MLM_KEYS).

    Each input is filler, the key's statement at a random place and its masked copy `distance` tokens later. With
    `digits_every`, the filler has no digit tokens of its own and `mlm_distractors(length, digits_every)` bare digits
    overwrite filler tokens outside the two statements: one at a random place before the key, one between the key
    and its copy, the rest anywhere. With the key they are each of the ten digits `mlm_rounds` times, whatever the key
    is, so a model that copies digits from the text without telling the key's from the others is at chance, and the
    key is never the first digit of the input nor the one nearest its masked copy. Drawn from `seed` alone (the same
    inputs for every model).

    Raises:
        ValueError: the distance (or the distractors) does not fit the length (saying which distances do), for the
            probe's row.
    """
    rng = random.Random(seed)
    head = tokenizer("the pass key is", add_special_tokens=False)["input_ids"]
    dot = tokenizer(".", add_special_tokens=False)["input_ids"]
    digits = [k[0] for k in mlm_key_ids(tokenizer)]
    span = len(head) + 1 + len(dot)  # "the pass key is K ."
    body = length - 2
    rounds = mlm_rounds(length, digits_every)
    lead = 1 if rounds else 0  # a filler token before the key and one between it and its copy, for a distractor each
    low, high = span + lead, body - span - lead
    if not low <= distance <= high:
        raise ValueError(f"distance {distance} does not fit {length} tokens (distances {low} to {high} do)")
    distractors = mlm_distractors(length, digits_every)
    if distractors > body - 2 * span:
        raise ValueError(f"{distractors} distractor digits do not fit {length} tokens beside the key and its copy")
    # With distractors the filler's own digits go: they would make some digits more frequent than others.
    without = frozenset(digits) if rounds else frozenset()
    rows, masked, answers = [], [], []
    for _ in range(samples):
        answer = rng.randrange(len(MLM_KEYS))
        filler = haystack.take(body, rng, without)
        at = lead + rng.randrange(body - distance - span - lead + 1)  # the planted key's statement starts here
        filler[at : at + span] = [*head, digits[answer], *dot]
        copy = at + distance
        filler[copy : copy + span] = [*head, tokenizer.mask_token_id, *dot]
        if rounds:  # drawn last, so that without distractors the rng runs as in the probe before issue 55
            values = [d for d in digits for _ in range(rounds)]
            values.remove(digits[answer])  # the key is one of its digit's occurrences
            rng.shuffle(values)
            before, between = rng.randrange(at), rng.randrange(at + span, copy)
            taken = {*range(at, at + span), *range(copy, copy + span), before, between}
            rest = [i for i in range(body) if i not in taken]
            places = [before, between, *rng.sample(rest, distractors - 2)]
            for i, value in zip(places, values, strict=True):
                filler[i] = value
        rows.append(framed(tokenizer, filler))
        masked.append(1 + copy + len(head))  # after [CLS]
        answers.append(answer)
    return torch.tensor(rows), torch.tensor(masked), answers


@torch.no_grad()
def embed_rows(model: Any, rows: list[list[int]], batch_size: int, device: torch.device) -> torch.Tensor:
    """Unit-length mean-pooled backbone vectors of token-id rows (padded per batch)."""
    vectors = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        width = max(map(len, chunk))
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, row in enumerate(chunk):
            ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
        vectors.append(model.embed(ids.to(device), mask.to(device), pooling="mean", normalize=True).cpu())
    return torch.cat(vectors)


def retrieval_accuracy(
    model: Any,
    documents: list[list[int]],
    queries: list[list[int]],
    targets: list[int],
    batch_size: int,
    device: torch.device,
) -> int:
    """How many queries rank their own document first (ties by document order)."""
    scores = embed_rows(model, queries, batch_size, device) @ embed_rows(model, documents, batch_size, device).T
    return int((scores.argmax(dim=1) == torch.tensor(targets)).sum())


@torch.no_grad()
def mlm_accuracy(
    model: Any,
    tokenizer: Any,
    ids: torch.Tensor,
    masked: torch.Tensor,
    answers: list[int],
    batch_size: int,
    device: torch.device,
) -> int:
    """How many masked copies the MLM head fills with their key, first among the ten candidate keys."""
    keys = torch.tensor([ids[0] for ids in mlm_key_ids(tokenizer)])  # as planted
    correct = 0
    for start in range(0, len(ids), batch_size):
        x = ids[start : start + batch_size].to(device)
        logits = model(x).logits  # (b, T, V)
        at = masked[start : start + batch_size].to(device)
        picked = logits[torch.arange(len(x), device=device), at][:, keys.to(device)]  # (b, 10)
        correct += int((picked.argmax(dim=1).cpu() == torch.tensor(answers[start : start + batch_size])).sum())
    return correct


def probe_rows(
    model: Any, tokenizer: Any, settings: ProbeSettings, haystack: Haystack, device: torch.device | None = None
) -> Iterator[dict[str, Any]]:
    """One row per length (and distance, for passkey-mlm): accuracy, 95% interval, samples, seconds.

    A passkey-mlm row also says how many distractor digits its inputs hold (`distractors`; files written before issue
    55 have none, and held none besides the filler's own digits).
    """
    device = device or torch.device("cpu")
    config = model.config
    probe, samples, seed, batch_size = settings.probe, settings.samples, settings.seed, settings.batch_size
    for length in settings.lengths:
        row = {"probe": probe, "length": length, "scaling": settings.scaling}
        if not config.holds_positions(length):
            yield {**row, "error": f"learned positions cover {config.max_position_embeddings} tokens, not {length}"}
            continue
        variant = model
        if settings.scaling != "none":
            variant, label = scaled(model, settings.scaling, None, length, settings.trained_length)
            row["scaling"] = label
        started = time.perf_counter()
        if probe == "passkey-mlm":
            distractors = mlm_distractors(length, settings.digits_every)
            for distance in settings.distances or default_distances(length):
                cell = {**row, "distance": distance, "distractors": distractors}
                draw = seed + length * 1000 + distance
                try:
                    made = mlm_samples(tokenizer, haystack, length, distance, samples, draw, settings.digits_every)
                except ValueError as e:  # a row that says so, as for a length a model cannot reach
                    yield {**cell, "error": str(e)}
                    continue
                t0 = time.perf_counter()
                correct = mlm_accuracy(variant, tokenizer, *made, batch_size, device)
                yield _scored({**cell, "chance": 1 / len(MLM_KEYS)}, correct, samples, t0)
            continue
        try:
            documents, queries, targets = retrieval_samples(probe, tokenizer, haystack, length, samples, seed + length)
        except ValueError as e:
            yield {**row, "error": str(e)}
            continue
        correct = retrieval_accuracy(variant, documents, queries, targets, batch_size, device)
        yield _scored({**row, "chance": 1 / CANDIDATES}, correct, samples, started)


def default_distances(length: int) -> list[int]:
    """Key-to-copy distances probed at a length: short, a quarter, half and most of it."""
    return sorted({16, length // 4, length // 2, length - 24})


def _scored(row: dict[str, Any], correct: int, samples: int, started: float) -> dict[str, Any]:
    low, high = wilson_interval(correct, samples)
    seconds = round(time.perf_counter() - started, 3)
    return {**row, "accuracy": correct / samples, "interval": [low, high], "samples": samples, "seconds": seconds}


def run_probe(
    model_dir: str | Path,
    settings: ProbeSettings,
    out: str | Path | None = None,
    device: str | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """`roformer probe`: check the output and the model, probe it at every length, write the JSON (if `out`).

    Raises:
        UserError: a scaling of a model without rotary positions (or without a recorded training length), a model
            that does not load or has no MLM head for passkey-mlm, a haystack without text, an output in the way.
    """
    if out is not None:
        check_output_file(Path(out))
        if Path(out).exists() and not overwrite:
            raise UserError(f"{out} exists (--overwrite replaces it)")
    device = device or default_device()
    check_device(device)
    architecture = "masked_lm" if settings.probe == "passkey-mlm" else None
    saved = read_model_config(model_dir)[0] if (Path(model_dir) / MODEL_CONFIG_FILE).is_file() else architecture
    if architecture is not None and saved != architecture:
        raise UserError(f"--probe passkey-mlm: {model_dir} holds a {saved} model, not a masked LM (no MLM head)")
    model = load(model_dir, architecture=architecture, device=device).eval()
    if settings.scaling != "none":
        if model.config.position_encoding != "rotary":
            raise UserError(
                f"--scaling {settings.scaling}: {model_dir} has {model.config.position_encoding} positions, not rotary"
            )
        trained_length = settings.trained_length or pretraining_length(Path(model_dir))
        if trained_length is None:
            raise UserError(f"--scaling: {model_dir} does not record its training length; pass --trained-length")
        settings = replace(settings, trained_length=trained_length)
    tokenizer = load_tokenizer(model_dir)
    stack = Haystack(tokenizer, haystack_documents(settings.haystack, settings.seed), settings.seed)
    rows = probe_rows(model, tokenizer, settings, stack, torch.device(device))
    label, run_seed = arm_label(Path(model_dir))
    result = {"model": str(model_dir), "label": label, "seed": run_seed, "probe": settings.probe}
    result |= {"scaling": settings.scaling, "haystack": settings.haystack or "builtin"}
    result["rows"] = list(rows)
    if out is not None:
        atomic_write_text(Path(out), json.dumps(result, indent=2))
    return result
