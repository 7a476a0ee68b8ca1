"""The shared reader of the text types: rows of one text or several, each with a label of one kind.

Classification, regression and multi-label classification (roformer.tasks.classify), similarity and triplet compose
it. It names the text fields (`text_columns`, or the type's default), leaves out rows labelled with one of
`data.skip_labels`, lets the label kind take what it needs of the whole training split (a label set) before
`max_train_examples` and `max_eval_examples` cut the splits, so label ids do not depend on the cut, and reads every
row's label through that kind. What a label field holds (a class, a score, a set of labels, a candidate's column) is
the kind's (`LabelKind`); how rows are read, checked and cut is the same for every type.

A missing label (no field, an empty cell, JSON null, NaN) is an error naming the file and line; a test file is
scored when every row has a label, predicted only when none has, and refused when only some have.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from roformer.errors import UserError
from roformer.files import atomic_copy
from roformer.tasks.base import cut_to_limits, write_tsv
from roformer.tasks.glue_metrics import compute
from roformer.tasks.records import Record, example_id, field, text_field

if TYPE_CHECKING:
    from roformer.tasks.config import FinetuneDataConfig

logger = logging.getLogger(__name__)

PREDICTIONS_FILE = "{split}.tsv"
Example = tuple[tuple[str, ...], Any, str]  # (texts, label or None, id)


def label_text(value: Any) -> str:
    """A label as the text it is known by: ints and strings as written, booleans as `true`/`false` (CLUEWSC)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def score_of(raw: Any, where: str) -> float:
    """A regression or similarity label: a finite number.

    NaN and infinities are refused here: a loss over them is not finite, and the engine would skip every batch that
    holds one without saying which row is to blame.

    Raises:
        UserError: it is not one, naming the file and line.
    """
    try:
        score = float(raw)
    except (TypeError, ValueError):
        raise UserError(f"{where}: score {raw!r} is not a number") from None
    if not math.isfinite(score):
        raise UserError(f"{where}: score {raw!r} is not a finite number")
    return score


def is_missing(raw: Any) -> bool:
    """Whether a label field holds no label: absent or JSON null, an empty (or blank) cell, or a NaN.

    A NaN is a float NaN (parquet, pandas, JSON's NaN) or a cell that spells one (`NaN`, `nan`: what pandas writes for
    a missing value in a CSV file, and what float() reads as NaN), never a class of its own.
    """
    if raw is None:
        return True
    if isinstance(raw, str):
        return not raw.strip() or raw.strip().lstrip("+-").lower() == "nan"
    return isinstance(raw, float) and math.isnan(raw)


def default_columns(first: Record) -> list[str]:
    """The text fields when text_columns is not given: `text` and, where the rows have one, `text_pair`."""
    return ["text", "text_pair"] if "text_pair" in first.fields else ["text"]


class LabelKind(Protocol):
    """What a text type's label field holds, and how the reader checks and reads it.

    Attributes:
        missing_label: What the error for a row without a label says after its file and line; None for the reader's
            own (`no label in 'label' (...)`).
    """

    missing_label: str | None

    def missing(self, raw: Any) -> bool:
        """Whether a label field's value (None: no such field) holds no label."""

    def fit(self, train: list[Record], raw: Callable[[Record], Any]) -> None:
        """Take what the kind needs of the whole training split (`raw(record)`: its label, refusing a missing one)."""

    def parse(self, raw: Any, where: str) -> Any:
        """A row's label from its field's value (not missing); `where` is the row's file and line for errors."""

    def name(self, value: Any) -> str:
        """How a label or prediction is written in a predictions file."""


class Scores:
    """Labels that are finite numbers: regression's and similarity's (one output, Pearson and Spearman)."""

    missing_label = None
    head_size = 1
    head_labels = None  # the head's one output has no name

    def __init__(self, data: FinetuneDataConfig) -> None:
        self.labels: list[str] = []  # scores, not classes

    def missing(self, raw: Any) -> bool:
        """An absent field, an empty cell, null or NaN."""
        return is_missing(raw)

    def fit(self, train: list[Record], raw: Callable[[Record], Any]) -> None:
        """Nothing to take: a score means the same in every split."""

    def parse(self, raw: Any, where: str) -> float:
        """The score (`score_of`)."""
        return score_of(raw, where)

    def name(self, value: Any) -> str:
        """The score, 6 significant digits."""
        return f"{float(value):.6g}"

    def batch_labels(self, values: list[float]) -> torch.Tensor:
        """The scores of a batch, (B,) float."""
        return torch.tensor(values, dtype=torch.float)

    def predict(self, logits: torch.Tensor) -> list[float]:
        """The head's one output of each row."""
        return logits.squeeze(-1).cpu().tolist()

    def evaluate(self, metrics: tuple[str, ...], predictions: list[float], labels: list[float]) -> dict[str, float]:
        """The metrics (Pearson, Spearman) and their mean, `score`."""
        return compute(metrics, predictions, labels)


class TextRows:
    """The rows of every split of a text type: their texts, labels (of one `LabelKind`) and ids, read and checked.

    Args:
        data: The data: section.
        records: The rows of every split (`read_split_records`).
        kind: What the label field holds.
        columns: The text fields (`data.text_columns` or the type's default), one per text of a row.
        counts: The fewest and most text fields the type reads.
        what: What the type reads, for the error when `columns` has another count (`reads one text or a pair`).
        unlabelled_splits: Splits whose rows need no label and are read without one (similarity's training pairs
            under in-batch negatives).

    Attributes:
        examples: Every split's examples after the cut: (texts, label or None, id).
        rows: The records those examples were read from, in the same order (a type reads other fields of them).
    """

    def __init__(
        self,
        data: FinetuneDataConfig,
        records: dict[str, list[Record]],
        kind: LabelKind,
        columns: list[str],
        counts: tuple[int, int],
        what: str,
        unlabelled_splits: tuple[str, ...] = (),
    ) -> None:
        self.data, self.kind, self.columns = data, kind, columns
        self.missing_label = kind.missing_label or (
            f"no label in {data.label_column!r} (an absent field, an empty cell, null or NaN)"
        )
        fewest, most = counts
        if not fewest <= len(columns) <= most:
            raise UserError(f"text_columns: type {data.type} {what}, got {columns}")
        kept = {name: self._kept(name, rows) for name, rows in records.items()}
        kind.fit(kept["train"], self.label_or_refusal)  # the whole file: ids do not change with max_train_examples
        self.rows = cut_to_limits(kept, data.max_train_examples, data.max_eval_examples)
        self.examples = {
            name: self._examples(rows, name not in unlabelled_splits and self._labelled(name, rows))
            for name, rows in self.rows.items()
        }

    @property
    def test_splits(self) -> list[str]:
        """The test split, where there is one."""
        return [name for name in ("test",) if name in self.rows]

    def raw(self, record: Record) -> Any:
        """The label field's value, None where the row has no such field (an unlabelled test row)."""
        try:
            return field(record, self.data.label_column)
        except UserError:
            return None

    def label_or_refusal(self, record: Record) -> Any:
        """The label field's value of a row that must have a label.

        Raises:
            UserError: it has none, naming the file and line.
        """
        raw = self.raw(record)
        if self.kind.missing(raw):
            raise UserError(f"{record.where}: {self.missing_label}")
        return raw

    def _kept(self, split: str, rows: list[Record]) -> list[Record]:
        """The rows of `split` without those whose label is in data.skip_labels (counted in the log)."""
        if not self.data.skip_labels:
            return rows
        skip = set(self.data.skip_labels)
        kept = [r for r in rows if self._unlabelled(r) or label_text(self.raw(r)) not in skip]
        if len(kept) < len(rows):
            logger.info("%s: left out %d rows labelled %s", split, len(rows) - len(kept), sorted(skip))
        if not kept and split != "test":
            raise UserError(f"{rows[0].where.rpartition(':')[0]}: every row of the {split} split has a skipped label")
        return kept

    def _unlabelled(self, record: Record) -> bool:
        """No label field, or one the kind reads as missing (never a skipped label)."""
        raw = self.raw(record)
        return raw is None or self.kind.missing(raw)

    def _labelled(self, split: str, rows: list[Record]) -> bool:
        """Train and dev rows must have labels; a test file may have them on every row (scored) or on none.

        Raises:
            UserError: a test file labelled on some rows only (the others would go unscored without a word).
        """
        if split != "test":
            return True
        unlabelled = [r for r in rows if self.kind.missing(self.raw(r))]
        if unlabelled and len(unlabelled) < len(rows):
            raise UserError(
                f"{unlabelled[0].where}: {self.missing_label}, but {len(rows) - len(unlabelled)} of the test split's "
                f"{len(rows)} rows have one: label every row (scored) or none (predicted only)"
            )
        return not unlabelled

    def _examples(self, rows: list[Record], labelled: bool) -> list[Example]:
        return [
            (
                tuple(text_field(r, c) for c in self.columns),
                self.kind.parse(self.label_or_refusal(r), r.where) if labelled else None,
                example_id(r, self.data.id_column, i),
            )
            for i, r in enumerate(rows)
        ]


def segmented(texts: list[str], segment: Callable[[str], str] | None) -> list[str]:
    """`texts`, each cut into words by `segment` first when there is one (jieba for a word-level vocabulary)."""
    return [segment(t) for t in texts] if segment else texts


def write_predictions(
    folder: Path, encoded: dict[str, Any], predictions: dict[str, list[Any]], name: Callable[[Any], str]
) -> None:
    """`<split>.tsv` of every split: index, prediction (and label where the split has labels), written by `name`."""
    for split, values in predictions.items():
        rows = zip(encoded[split].index, map(name, values))
        header = ["index", "prediction"]
        if encoded[split].labelled:
            rows = ((i, p, name(y)) for (i, p), y in zip(rows, encoded[split].labels))
            header.append("label")
        write_tsv(folder / PREDICTIONS_FILE.format(split=split), header, rows)


def tsv_file(split: str) -> str:
    """A text type's predictions file of `split`: `<split>.tsv`."""
    return PREDICTIONS_FILE.format(split=split)


def copy_predictions(
    run_folder: Path, submission: Path, splits: list[str], file_of: Callable[[str], str] = tsv_file
) -> None:
    """The selected run's prediction files of `splits` into the submission folder.

    Args:
        run_folder: The selected run's predictions folder.
        submission: The job's submission folder.
        splits: The splits whose files are copied (the test splits; a ranking type's dev split too).
        file_of: A split's file name (`<split>.tsv` by default).
    """
    for split in splits:
        name = file_of(split)
        atomic_copy(run_folder / name, submission / name)
