"""Entity-level scores of tag sequences (NER): conlleval's chunks, as seqeval computes them by default.

A tag is a prefix and an entity type split at the first `-` (`B-PER` = `B` + `PER`; `O`, or a tag without `-`, has
no type). Entities (chunks) are read left to right with the rules of conlleval's `endOfChunk` / `startOfChunk`, as
seqeval's default mode extends them to `E-` and `S-` tags (`seqeval.metrics.sequence_labeling.get_entities`):

- a chunk ends before a tag when the previous tag is `E` or `S`; when a `B` or `I` is followed by `B`, `S` or `O`;
  or when the type changes (the previous tag not `O` or `.`);
- a chunk starts at a `B` or `S`; at an `I` or `E` after `O`, `E` or `S`; or wherever the type changes (the tag not
  `O` or `.`).

These rules read IOB1, IOB2 and IOBES alike, which is why the scheme is not an argument here: an `I-` after `O`
or after another type starts an entity (IOB1's rule, lenient in IOB2), a `B-` after an `I-` of its type starts a new
one, and a well-formed IOBES sequence gives exactly its `S` and `B..E` entities. On ill-formed IOBES sequences
(`B-X O`, a lone `E-X`) this is seqeval's lenient default, not its `mode="strict"`, which drops such chunks: model
predictions are scored as conlleval would, every predicted chunk counted.

An entity is right when its type, first and last word all match a gold entity (of the same sentence). Precision,
recall and F1 are micro-averaged over types (total counts), with 0 where a denominator is 0 (seqeval's
`zero_division=0`); token accuracy is the fraction of tags equal to the gold tag.

Plain tags (POS tags, IO tags such as `PER`: no tag with a `B-`, `I-`, `E-` or `S-` prefix, `has_entities`) mark no
entities: every entity score of theirs is 0 whatever the predictions. They are scored per word instead
(`tag_report`: each tag's precision, recall and F1 over words, as scikit-learn's `classification_report` of the
flattened tags, and token accuracy).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

Chunk = tuple[str, int, int]  # (type, first word, last word), both ends included

OUTSIDE = ("O", ".")  # conlleval: tags outside every chunk (`.`: its sentence-end tag of chunking data)
ENTITY_PREFIXES = ("B", "I", "E", "S")  # the prefixes that mark entities in IOB1, IOB2 and IOBES


def split_tag(tag: str) -> tuple[str, str]:
    """The prefix and the type of a tag: `B-PER` -> (`B`, `PER`), `O` -> (`O`, ``), `B-A-B` -> (`B`, `A-B`)."""
    prefix, _, kind = tag.partition("-")
    return prefix, kind


def has_entities(tags: Sequence[str]) -> bool:
    """Whether a tag set marks entities: a tag other than `O` is a prefix of an entity scheme and a type (`B-PER`)."""
    return any(prefix in ENTITY_PREFIXES and kind for prefix, kind in map(split_tag, tags) if prefix not in OUTSIDE)


def _chunk_ends(previous: str, tag: str, previous_type: str, kind: str) -> bool:
    """Whether a chunk ends between a word tagged (`previous`, `previous_type`) and the next (`tag`, `kind`)."""
    if previous in ("E", "S"):
        return True
    if previous in ("B", "I") and tag in ("B", "S", "O"):
        return True
    return previous not in OUTSIDE and previous_type != kind


def _chunk_starts(previous: str, tag: str, previous_type: str, kind: str) -> bool:
    """Whether a chunk starts at a word tagged (`tag`, `kind`) after one tagged (`previous`, `previous_type`)."""
    if tag in ("B", "S"):
        return True
    if previous in ("E", "S", "O") and tag in ("E", "I"):
        return True
    return tag not in OUTSIDE and previous_type != kind


def chunks(tags: Sequence[str]) -> list[Chunk]:
    """The entities of one sentence's tags, in order (see the module's rules).

    Example: `chunks(["B-PER", "I-PER", "O", "I-LOC"]) == [("PER", 0, 1), ("LOC", 3, 3)]`.
    """
    found: list[Chunk] = []
    previous, previous_type, first = "O", "", 0
    for i, tag in enumerate([*tags, "O"]):  # the closing `O` ends an entity at the sentence's end
        prefix, kind = split_tag(tag)
        if _chunk_ends(previous, prefix, previous_type, kind):
            found.append((previous_type, first, i - 1))
        if _chunk_starts(previous, prefix, previous_type, kind):
            first = i
        previous, previous_type = prefix, kind
    return found


@dataclass(frozen=True)
class ChunkCounts:
    """Entities of one type (or all): in the gold tags, predicted, and predicted right."""

    gold: int = 0
    predicted: int = 0
    correct: int = 0

    def scores(self) -> dict[str, float]:
        """Precision, recall and F1 (0 where undefined) and the support (gold entities)."""
        precision = self.correct / self.predicted if self.predicted else 0.0
        recall = self.correct / self.gold if self.gold else 0.0
        # seqeval's own formula (not 2c / (g + p)): the same value, to the last bit
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return {"precision": precision, "recall": recall, "f1": f1, "support": float(self.gold)}


def _check_aligned(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> None:
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predicted")
    for i, (g, p) in enumerate(zip(gold, predicted)):
        if len(g) != len(p):
            raise ValueError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted")


def count_chunks(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict[str, ChunkCounts]:
    """Per entity type (sorted), the gold, predicted and correct entities of aligned sentences.

    Raises:
        ValueError: the sentences or their lengths differ.
    """
    _check_aligned(gold, predicted)
    gold_count: Counter[str] = Counter()
    predicted_count: Counter[str] = Counter()
    correct_count: Counter[str] = Counter()
    for gold_tags, predicted_tags in zip(gold, predicted):
        gold_chunks, predicted_chunks = set(chunks(gold_tags)), set(chunks(predicted_tags))
        gold_count.update(kind for kind, _, _ in gold_chunks)
        predicted_count.update(kind for kind, _, _ in predicted_chunks)
        correct_count.update(kind for kind, _, _ in gold_chunks & predicted_chunks)
    kinds = sorted(set(gold_count) | set(predicted_count))
    return {k: ChunkCounts(gold_count[k], predicted_count[k], correct_count[k]) for k in kinds}


def _total(counts: dict[str, ChunkCounts]) -> ChunkCounts:
    values = counts.values()
    return ChunkCounts(sum(c.gold for c in values), sum(c.predicted for c in values), sum(c.correct for c in values))


def token_accuracy(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> float:
    """The fraction of tags equal to the gold tag, over all words (0 when there are none).

    Raises:
        ValueError: the sentences or their lengths differ.
    """
    _check_aligned(gold, predicted)
    words = sum(len(g) for g in gold)
    right = sum(g == p for gold_tags, tags in zip(gold, predicted) for g, p in zip(gold_tags, tags))
    return right / words if words else 0.0


def tag_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict[str, float]:
    """Entity-level `precision`, `recall` and `f1` (micro over types) and token `accuracy`.

    Raises:
        ValueError: the sentences or their lengths differ.
    """
    scores = _total(count_chunks(gold, predicted)).scores()
    del scores["support"]
    return {**scores, "accuracy": token_accuracy(gold, predicted)}


def classification_report(
    gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]
) -> dict[str, dict[str, float]]:
    """Per entity type and `micro avg`: precision, recall, f1 and support.

    As seqeval's `classification_report(output_dict=True)`, with `f1` for `f1-score` and no macro or weighted means.

    Raises:
        ValueError: the sentences or their lengths differ.
    """
    counts = count_chunks(gold, predicted)
    report = {kind: c.scores() for kind, c in counts.items()}
    report["micro avg"] = _total(counts).scores()
    return report


def tag_report(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> dict[str, dict[str, float]]:
    """Per tag (sorted), each word's tag read as a class: precision, recall, f1 and support (gold words); `accuracy`.

    For plain tags (POS): scikit-learn's `classification_report(output_dict=True)` of the flattened word tags, with
    `f1` for `f1-score`, 0 where a denominator is 0, and no macro or weighted means.

    Raises:
        ValueError: the sentences or their lengths differ.
    """
    _check_aligned(gold, predicted)
    pairs = [(g, p) for gold_tags, tags in zip(gold, predicted) for g, p in zip(gold_tags, tags)]
    gold_count = Counter(g for g, _ in pairs)
    predicted_count = Counter(p for _, p in pairs)
    correct_count = Counter(g for g, p in pairs if g == p)
    tags = sorted(set(gold_count) | set(predicted_count))
    report: dict[str, dict[str, float]] = {
        tag: ChunkCounts(gold_count[tag], predicted_count[tag], correct_count[tag]).scores() for tag in tags
    }
    report["accuracy"] = {"accuracy": token_accuracy(gold, predicted), "support": float(len(pairs))}
    return report
