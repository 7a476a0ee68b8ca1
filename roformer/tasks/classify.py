"""Classification, regression and multi-label classification of one text or a pair, from any local file or hub dataset.

`TextTask` is the fine-tuning task (roformer.tasks.base.FinetuneTask) of `type: classification`, `regression` and
`multi_label_classification`. Rows come from csv/tsv/json/jsonl/parquet files or a hub dataset (roformer.tasks.records),
with the text and label fields named in the config (`text_columns`, `label_column`; nested JSON fields and templates
allowed). The label set is `data.labels` or, when not given, every label of the training split (sorted: numerically
when all labels are integers), taken before `max_train_examples` cuts the split, so label ids do not depend on the
cut; a dev or test label outside it is an error naming the file and line. A missing label (no field, an empty cell,
JSON null, NaN) is an error naming the file and line, as is a score that is not a finite number; a test file is scored
when every row has a label, predicted only when none has, and refused when only some have.

Multi-label: the label field is a list (or a JSON list, or names separated by commas in a csv cell); the head has one
sigmoid output per label (binary cross-entropy), a label is predicted when its probability reaches `data.threshold`,
and the metrics are micro and macro F1 over labels.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from roformer.data.tokenizer import jieba_presegmenter
from roformer.errors import UserError
from roformer.files import atomic_copy
from roformer.tasks.base import Encoded, HeadOutputs, TaskSpec, cut_to_limits, pad_rows, padded_length, write_tsv
from roformer.tasks.config import FinetuneDataConfig
from roformer.tasks.glue_metrics import METRICS, compute
from roformer.tasks.records import Record, example_id, field, read_split_records, text_field

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

MULTI_LABEL_METRICS = ("micro_f1", "macro_f1", "subset_accuracy")
PREDICTIONS_FILE = "{split}.tsv"


def label_text(value: Any) -> str:
    """A label as the text it is known by: ints and strings as written, booleans as `true`/`false` (CLUEWSC)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def label_list(value: Any, where: str) -> list[str]:
    """A multi-label field: a list, a JSON list in a string, or names separated by commas (a csv cell)."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                raise UserError(f"{where}: labels {text!r} are not a JSON list") from None
        else:
            value = [part for part in (p.strip() for p in text.split(",")) if part]
    if not isinstance(value, list):
        raise UserError(f"{where}: expected a list of labels, got {value!r}")
    return [label_text(v) for v in value]


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
    """Whether a label field holds no label: absent or JSON null, an empty (or blank) cell, or a float NaN."""
    if raw is None:
        return True
    if isinstance(raw, str):
        return not raw.strip()
    return isinstance(raw, float) and math.isnan(raw)


def sorted_labels(labels: set[str]) -> list[str]:
    """The label set in id order: numerically when every label is an integer (TNEWS's 100..116), else by text."""
    if all(label.lstrip("-").isdigit() for label in labels):
        return sorted(labels, key=int)
    return sorted(labels)


class TextTask(HeadOutputs):
    """Classify one text or a pair (or score it, or tag it with a set of labels): rows from any file or hub dataset.

    Args:
        data: The data: section (type classification, regression or multi_label_classification).
        records: The rows of every split (`read_split_records`).
    """

    architecture = "sequence_classification"
    text_count = (1, 2)  # the fewest and most text_columns

    def __init__(self, data: FinetuneDataConfig, records: dict[str, list[Record]]) -> None:
        self.data, self.type = data, data.type
        self.missing_label = f"no label in {data.label_column!r} (an absent field, an empty cell, null or NaN)"
        self.name = data.task
        self.tracker_project = f"roformer-{data.task}"
        self.columns = data.text_columns or self._default_columns(records["train"][0])
        fewest, most = self.text_count
        if not fewest <= len(self.columns) <= most:
            wanted = "one text or a pair" if self.text_count == (1, 2) else f"{most} texts"
            raise UserError(f"text_columns: type {self.type} reads {wanted}, got {self.columns}")
        self.metrics = tuple(data.metrics or data.spec.default_metrics)
        kept = {name: self._kept(name, rows) for name, rows in records.items()}
        self.labels = self._label_set(kept["train"])  # of the whole file: ids do not change with max_train_examples
        kept = cut_to_limits(kept, data.max_train_examples, data.max_eval_examples)
        self.num_labels = 1 if self.type == "regression" else len(self.labels)
        self.label_names = None if self.type == "regression" else list(self.labels)
        self.examples = {name: self._examples(name, rows) for name, rows in kept.items()}
        self.dev_splits = ["dev"]
        self.test_splits = [name for name in ("test",) if name in kept]

    @classmethod
    def from_config(cls, data: FinetuneDataConfig) -> TextTask:
        """The task of a data: section, its splits read and checked (cut to data.max_*_examples)."""
        return cls(data, read_split_records(data))

    @staticmethod
    def _default_columns(first: Record) -> list[str]:
        return ["text", "text_pair"] if "text_pair" in first.fields else ["text"]

    def _kept(self, split: str, rows: list[Record]) -> list[Record]:
        """The rows of `split` without those whose label is in data.skip_labels (counted in the log)."""
        if not self.data.skip_labels:
            return rows
        skip = set(self.data.skip_labels)
        kept = [r for r in rows if self._missing(self._raw_or_none(r)) or label_text(self._raw(r)) not in skip]
        if len(kept) < len(rows):
            logger.info("%s: left out %d rows labelled %s", split, len(rows) - len(kept), sorted(skip))
        if not kept and split != "test":
            raise UserError(f"{rows[0].where.rpartition(':')[0]}: every row of the {split} split has a skipped label")
        return kept

    def _raw(self, record: Record) -> Any:
        return field(record, self.data.label_column)

    def _raw_or_none(self, record: Record) -> Any:
        """The label field's value, None where the row has no such field (an unlabelled test row)."""
        try:
            return field(record, self.data.label_column)
        except UserError:
            return None

    def _label_set(self, train: list[Record]) -> list[str]:
        if self.type == "regression":
            return []
        if self.data.labels is not None:
            return list(self.data.labels)
        seen: set[str] = set()
        for record in train:
            raw = self._raw(record)
            if self._missing(raw):
                raise UserError(f"{record.where}: {self.missing_label}")
            seen.update(
                label_list(raw, record.where) if self.type == "multi_label_classification" else [label_text(raw)]
            )
        if len(seen) < 2 and self.type == "classification":
            raise UserError(
                f"{train[0].where.rpartition(':')[0]}: the training split has one label only {sorted(seen)}"
            )
        return sorted_labels(seen)

    def _missing(self, raw: Any) -> bool:
        """Whether a row's label field holds no label (multi-label: an empty cell is the empty set, a label)."""
        if self.type == "multi_label_classification" and isinstance(raw, str):
            return False
        return is_missing(raw)

    def _labelled(self, split: str, rows: list[Record]) -> bool:
        """Train and dev rows must have labels; a test file may have them on every row (scored) or on none.

        Raises:
            UserError: a test file labelled on some rows only (the others would go unscored without a word).
        """
        if split != "test":
            return True
        unlabelled = [r for r in rows if self._missing(self._raw_or_none(r))]
        if unlabelled and len(unlabelled) < len(rows):
            raise UserError(
                f"{unlabelled[0].where}: {self.missing_label}, but {len(rows) - len(unlabelled)} of the test split's "
                f"{len(rows)} rows have one: label every row (scored) or none (predicted only)"
            )
        return not unlabelled

    def _examples(self, split: str, rows: list[Record]) -> list[tuple[tuple[str, ...], Any, str]]:
        labelled = self._labelled(split, rows)
        return [
            (
                tuple(text_field(r, c) for c in self.columns),
                self._label(r) if labelled else None,
                example_id(r, self.data.id_column, i),
            )
            for i, r in enumerate(rows)
        ]

    def _label(self, record: Record) -> int | float | list[int]:
        """A row's label: a class id, a score or the ids of its labels.

        Raises:
            UserError: a label outside the label set, a score that is not a number, naming the file and line.
        """
        raw = self._raw(record)
        if self._missing(raw):
            raise UserError(f"{record.where}: {self.missing_label}")
        if self.type == "regression":
            return score_of(raw, record.where)
        names = label_list(raw, record.where) if self.type == "multi_label_classification" else [label_text(raw)]
        unknown = [n for n in names if n not in self.labels]
        if unknown:
            origin = "data.labels" if self.data.labels is not None else "the training split's labels"
            raise UserError(f"{record.where}: label {unknown[0]!r} is not one of {origin} {self.labels}")
        ids = [self.labels.index(n) for n in names]
        return ids if self.type == "multi_label_classification" else ids[0]

    # ------------------------------------------------------------------------------------------------------------
    # The protocol

    def encode(self, tokenizer: Tokenizer, max_length: int) -> dict[str, Encoded]:
        """Every split tokenized: one text or a pair (`[CLS] A [SEP] B [SEP]`), truncated longest-first."""
        segment = jieba_presegmenter(tokenizer) if self.data.jieba else None
        out = {}
        for name, examples in self.examples.items():
            texts = [[segment(t) if segment else t for t in texts] for texts, _, _ in examples]
            first = [t[0] for t in texts]
            second = [t[1] for t in texts] if len(self.columns) == 2 else None
            tokens = tokenizer(first, second, truncation=True, max_length=max_length, return_token_type_ids=True)
            out[name] = Encoded(
                tokens["input_ids"], tokens["token_type_ids"], [e[1] for e in examples], [e[2] for e in examples]
            )
        return out

    def padded_length(self, longest: int, cap: int) -> int:
        """`longest` rounded up to data.pad_to_multiple_of, within `cap`."""
        return padded_length(longest, self.data.pad_to_multiple_of, cap)

    def collate(self, split: Encoded, rows: list[int], pad_id: int, cap: int) -> dict[str, torch.Tensor]:
        """The padded batch of `rows`: class ids, float scores, or multi-hot float rows (binary cross-entropy)."""
        length = self.padded_length(max(len(split.ids[r]) for r in rows), cap)
        batch = pad_rows(split.ids, split.types, rows, pad_id, length)
        if split.labelled:
            if self.type == "multi_label_classification":
                hot = torch.zeros((len(rows), self.num_labels))
                for i, r in enumerate(rows):
                    hot[i, split.labels[r]] = 1.0
                batch["labels"] = hot
            else:
                dtype = torch.float if self.type == "regression" else torch.long
                batch["labels"] = torch.tensor([split.labels[r] for r in rows], dtype=dtype)
        return batch

    def predictions(self, logits: torch.Tensor, split: Encoded, rows: list[int]) -> list[Any]:
        """The class (argmax), the score, or the labels whose probability reaches data.threshold."""
        if self.type == "regression":
            return logits.squeeze(-1).cpu().tolist()
        if self.type == "multi_label_classification":
            chosen = (torch.sigmoid(logits) >= self.data.threshold).cpu()
            return [row.nonzero().flatten().tolist() for row in chosen]
        return logits.argmax(-1).cpu().tolist()

    def evaluate(self, split: Encoded, predictions: list[Any]) -> dict[str, float]:
        """The configured metrics and `score`, their mean (multi-label: micro and macro F1 over labels)."""
        if self.type == "multi_label_classification":
            return multi_label_metrics(self.metrics, predictions, split.labels, self.num_labels)
        return compute(self.metrics, predictions, split.labels)

    def label_name(self, value: Any) -> str:
        """How a prediction or label is written: its name, the score, or the names joined by commas."""
        if self.type == "regression":
            return f"{float(value):.6g}"
        if self.type == "multi_label_classification":
            return ",".join(self.labels[i] for i in value)
        return self.labels[int(value)]

    def write_predictions(self, folder: Path, encoded: dict[str, Encoded], predictions: dict[str, list[Any]]) -> None:
        """`<split>.tsv` of every split: index, prediction (and label where the split has labels)."""
        for split, values in predictions.items():
            rows = zip(encoded[split].index, map(self.label_name, values))
            header = ["index", "prediction"]
            if encoded[split].labelled:
                rows = ((i, p, self.label_name(y)) for (i, p), y in zip(rows, encoded[split].labels))
                header.append("label")
            write_tsv(folder / PREDICTIONS_FILE.format(split=split), header, rows)

    def write_submission(self, run_folder: Path, submission: Path) -> None:
        """The selected run's test predictions, when there is a test split."""
        for split in self.test_splits:
            name = PREDICTIONS_FILE.format(split=split)
            atomic_copy(run_folder / name, submission / name)


def multi_label_metrics(
    names: tuple[str, ...], predictions: list[list[int]], labels: list[list[int]], num_labels: int
) -> dict[str, float]:
    """Micro F1 (over every (example, label) decision), macro F1 (the mean of the per-label F1s), subset accuracy.

    A label that is never gold nor predicted has F1 0 in the macro mean, as in scikit-learn's `zero_division=0`.
    """
    predicted, gold = _multi_hot(predictions, num_labels), _multi_hot(labels, num_labels)
    tp = (predicted & gold).sum(axis=0)
    fp = (predicted & ~gold).sum(axis=0)
    fn = (~predicted & gold).sum(axis=0)
    micro_denominator = 2 * tp.sum() + fp.sum() + fn.sum()
    per_label = np.divide(2 * tp, 2 * tp + fp + fn, out=np.zeros(num_labels), where=(2 * tp + fp + fn) > 0)
    values = {
        "micro_f1": float(2 * tp.sum() / micro_denominator) if micro_denominator else 0.0,
        "macro_f1": float(per_label.mean()),
        "subset_accuracy": float((predicted == gold).all(axis=1).mean()),
    }
    chosen = {name: values[name] for name in names}
    return {**chosen, "score": float(np.mean(list(chosen.values())))}


def _multi_hot(rows: list[list[int]], num_labels: int) -> np.ndarray:
    hot = np.zeros((len(rows), num_labels), dtype=bool)
    for i, ids in enumerate(rows):
        hot[i, ids] = True
    return hot


def _text_type(name: str, summary: str, metrics: tuple[str, ...], default_metrics: tuple[str, ...]) -> TaskSpec:
    """A type `TextTask` reads: the same task class, head, predictions file and page; its labels and metrics differ."""
    return TaskSpec(
        name=name,
        summary=summary,
        builder=TextTask.from_config,
        architecture="sequence_classification",
        metrics=metrics,
        default_metrics=default_metrics,
        predictions=PREDICTIONS_FILE.format(split="dev"),
        docs="task-classification.md",
    )


SPECS = (
    _text_type(
        "classification",
        "one text or a pair into one of a set of labels, from any file or hub dataset",
        tuple(METRICS),
        ("accuracy",),
    ),
    _text_type("regression", "one text or a pair scored by a number", tuple(METRICS), ("pearson", "spearman")),
    _text_type(
        "multi_label_classification",
        "one text or a pair tagged with any set of labels (a sigmoid each)",
        MULTI_LABEL_METRICS,
        ("micro_f1", "macro_f1"),
    ),
)
