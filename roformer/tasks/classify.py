"""Classification, regression and multi-label classification of one text or a pair, from any local file or hub dataset.

`TextTask` is the fine-tuning task (roformer.tasks.base.FinetuneTask) of `type: classification`, `regression` and
`multi_label_classification`: one task class, composed of the shared text reader (roformer.tasks.texts.TextRows:
csv/tsv/json/jsonl/parquet files or a hub dataset, the text and label fields named in the config, skipped labels, cuts,
missing and partial labels refused with file and line) and a label kind that owns what differs between the three:
`Classes` (the label set is `data.labels` or every label of the training split, sorted numerically when all labels are
integers, taken before `max_train_examples` cuts the split, so label ids do not depend on the cut; a dev or test label
outside it is an error naming the file and line), `Scores` (a finite number) and `LabelSets`.

Multi-label: the label field is a list (or a JSON list, or names separated by commas in a csv cell); the head has one
sigmoid output per label (binary cross-entropy), a label is predicted when its probability reaches `data.threshold`,
and the metrics are micro and macro F1 over labels.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from roformer.data.text import is_integer_text
from roformer.data.tokenizer import jieba_presegmenter
from roformer.errors import UserError
from roformer.tasks.base import NO_FACTS, Encoded, HeadOutputs, ModelFacts, Publishes, TaskSpec, labels_file, pad_rows
from roformer.tasks.baselines import Guess, label_guess
from roformer.tasks.config import FinetuneDataConfig
from roformer.tasks.glue_metrics import METRICS, compute
from roformer.tasks.records import Record, read_split_records
from roformer.tasks.texts import (
    PREDICTIONS_FILE,
    LabelKind,
    Scores,
    TextRows,
    copy_predictions,
    default_columns,
    is_missing,
    label_text,
    segmented,
    write_predictions,
)

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer

MULTI_LABEL_METRICS = ("micro_f1", "macro_f1", "subset_accuracy")


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


def sorted_labels(labels: set[str]) -> list[str]:
    """The label set in id order: numerically when every label is an integer (TNEWS's 100..116), else by text."""
    if all(is_integer_text(label) for label in labels):
        return sorted(labels, key=int)
    return sorted(labels)


class HeadLabels(LabelKind, Protocol):
    """A label kind a sequence classifier's head predicts: its outputs, batch labels, predictions and metrics."""

    head_size: int  # the head's outputs
    head_labels: list[str] | None  # their names, None for a score

    def batch_labels(self, values: list[Any]) -> torch.Tensor:
        """The labels of a batch as the head's loss reads them."""

    def predict(self, logits: torch.Tensor) -> list[Any]:
        """What each row of a batch's logits predicts."""

    def evaluate(self, metrics: tuple[str, ...], predictions: list[Any], labels: list[Any]) -> dict[str, float]:
        """The metrics of predictions against labels, with `score`, their mean."""


class Classes:
    """One label of a set per row (`type: classification`): softmax over the set, accuracy, F1, MCC.

    The set is `data.labels` or every label of the training split, sorted (`sorted_labels`).
    """

    missing_label = None

    def __init__(self, data: FinetuneDataConfig) -> None:
        self.given = data.labels
        self.labels: list[str] = []

    @property
    def head_size(self) -> int:
        """One output per class."""
        return len(self.labels)

    @property
    def head_labels(self) -> list[str]:
        """The classes in id order."""
        return list(self.labels)

    def missing(self, raw: Any) -> bool:
        """An absent field, an empty cell, null or NaN."""
        return is_missing(raw)

    def names_in(self, raw: Any, where: str) -> list[str]:
        """The label names a field holds: one."""
        return [label_text(raw)]

    def fit(self, train: list[Record], raw: Callable[[Record], Any]) -> None:
        """The label set: data.labels, or every label of the training split (two at least).

        Raises:
            UserError: a training split with one label only (a classifier of one class learns nothing).
        """
        if self.given is not None:
            self.labels = list(self.given)
            return
        seen: set[str] = set()
        for record in train:
            seen.update(self.names_in(raw(record), record.where))
        self.check_seen(seen, train)
        self.labels = sorted_labels(seen)

    def check_seen(self, seen: set[str], train: list[Record]) -> None:
        """Refuse a training split of one label."""
        if len(seen) < 2:
            raise UserError(
                f"{train[0].where.rpartition(':')[0]}: the training split has one label only {sorted(seen)}"
            )

    def ids(self, raw: Any, where: str) -> list[int]:
        """The ids of the labels a field names.

        Raises:
            UserError: a label outside the label set, naming the file and line.
        """
        names = self.names_in(raw, where)
        unknown = [n for n in names if n not in self.labels]
        if unknown:
            origin = "data.labels" if self.given is not None else "the training split's labels"
            raise UserError(f"{where}: label {unknown[0]!r} is not one of {origin} {self.labels}")
        return [self.labels.index(n) for n in names]

    def parse(self, raw: Any, where: str) -> int:
        """The class id."""
        return self.ids(raw, where)[0]

    def name(self, value: Any) -> str:
        """The class's name."""
        return self.labels[int(value)]

    def batch_labels(self, values: list[int]) -> torch.Tensor:
        """The class ids of a batch, (B,) long."""
        return torch.tensor(values, dtype=torch.long)

    def predict(self, logits: torch.Tensor) -> list[int]:
        """The argmax class of each row."""
        return logits.argmax(-1).cpu().tolist()

    def evaluate(self, metrics: tuple[str, ...], predictions: list[int], labels: list[int]) -> dict[str, float]:
        """The metrics (accuracy, F1, MCC, ...) and their mean, `score`."""
        return compute(metrics, predictions, labels)


class LabelSets(Classes):
    """Any set of labels per row (`type: multi_label_classification`): a sigmoid per label, micro and macro F1.

    A label field is a list, a JSON list or names separated by commas; an empty cell is the empty set (a label). A
    label is predicted when its probability reaches `data.threshold`.
    """

    def __init__(self, data: FinetuneDataConfig) -> None:
        super().__init__(data)
        self.threshold = data.threshold

    def missing(self, raw: Any) -> bool:
        """An absent field, null or NaN (an empty cell is the empty set)."""
        return not isinstance(raw, str) and is_missing(raw)

    def names_in(self, raw: Any, where: str) -> list[str]:
        """The label names a field holds (`label_list`)."""
        return label_list(raw, where)

    def check_seen(self, seen: set[str], train: list[Record]) -> None:
        """Any number of labels will do: each is a yes/no question of its own."""

    def parse(self, raw: Any, where: str) -> list[int]:
        """The ids of the row's labels."""
        return self.ids(raw, where)

    def name(self, value: Any) -> str:
        """The names, joined by commas."""
        return ",".join(self.labels[i] for i in value)

    def batch_labels(self, values: list[list[int]]) -> torch.Tensor:
        """Multi-hot float rows (B, labels) for binary cross-entropy."""
        hot = torch.zeros((len(values), self.head_size))
        for i, ids in enumerate(values):
            hot[i, ids] = 1.0
        return hot

    def predict(self, logits: torch.Tensor) -> list[list[int]]:
        """The labels whose probability reaches data.threshold."""
        chosen = (torch.sigmoid(logits) >= self.threshold).cpu()
        return [row.nonzero().flatten().tolist() for row in chosen]

    def evaluate(self, metrics: tuple[str, ...], predictions: list[list[int]], labels: list[list[int]]) -> dict:
        """Micro and macro F1 over labels, subset accuracy (`multi_label_metrics`), and `score`."""
        return multi_label_metrics(metrics, predictions, labels, self.head_size)


class TextTask(HeadOutputs):
    """Classify one text or a pair, score it, or tag it with a set of labels: rows from any file or hub dataset.

    Args:
        data: The data: section (type classification, regression or multi_label_classification).
        records: The rows of every split (`read_split_records`).
        kind: What the label field holds: `Classes`, `Scores` or `LabelSets`.
    """

    architecture = "sequence_classification"

    def __init__(self, data: FinetuneDataConfig, records: dict[str, list[Record]], kind: HeadLabels) -> None:
        super().__init__(data)
        self.kind = kind
        columns = data.text_columns or default_columns(records["train"][0])
        self.rows = TextRows(data, records, kind, columns, (1, 2), "reads one text or a pair")
        self.columns, self.examples = columns, self.rows.examples
        self.labels = kind.labels
        self.num_labels, self.label_names = kind.head_size, kind.head_labels
        self.test_splits = self.rows.test_splits

    @classmethod
    def reading(cls, kind: Callable[[FinetuneDataConfig], HeadLabels]) -> Callable[[FinetuneDataConfig], TextTask]:
        """The builder of a type whose labels are of `kind`: its data: section to its task, splits read."""

        def build(data: FinetuneDataConfig) -> TextTask:
            return cls(data, read_split_records(data), kind(data))

        return build

    def model_files(self, eval_batch_size: int) -> dict[str, str]:
        """`labels.json`: the head's outputs by name, so that best/ is usable without the run's config."""
        return labels_file(self.label_names)

    # ------------------------------------------------------------------------------------------------------------
    # The protocol

    def encode(self, tokenizer: Tokenizer, max_length: int, model: ModelFacts = NO_FACTS) -> dict[str, Encoded]:
        """Every split tokenized: one text or a pair (`[CLS] A [SEP] B [SEP]`), truncated longest-first."""
        segment = jieba_presegmenter(tokenizer) if self.data.jieba else None
        out = {}
        for name, examples in self.examples.items():
            texts = [segmented(list(texts), segment) for texts, _, _ in examples]
            first = [t[0] for t in texts]
            second = [t[1] for t in texts] if len(self.columns) == 2 else None
            tokens = tokenizer(first, second, truncation=True, max_length=max_length, return_token_type_ids=True)
            out[name] = Encoded(
                tokens["input_ids"], tokens["token_type_ids"], [e[1] for e in examples], [e[2] for e in examples]
            )
        return out

    def collate(self, split: Encoded, rows: list[int], pad_id: int, cap: int) -> dict[str, torch.Tensor]:
        """The padded batch of `rows`: class ids, float scores, or multi-hot float rows (binary cross-entropy)."""
        length = self.padded_length(max(len(split.ids[r]) for r in rows), cap)
        batch = pad_rows(split.ids, split.types, rows, pad_id, length)
        if split.labelled:
            batch["labels"] = self.kind.batch_labels([split.labels[r] for r in rows])
        return batch

    def predictions(self, logits: torch.Tensor, split: Encoded, rows: list[int]) -> list[Any]:
        """The class (argmax), the score, or the labels whose probability reaches data.threshold."""
        return self.kind.predict(logits)

    def evaluate(self, split: Encoded, predictions: list[Any]) -> dict[str, float]:
        """The configured metrics and `score`, their mean (multi-label: micro and macro F1 over labels)."""
        return self.kind.evaluate(self.metrics, predictions, split.labels)

    def label_name(self, value: Any) -> str:
        """How a prediction or label is written: its name, the score, or the names joined by commas."""
        return self.kind.name(value)

    def trivial_guess(self, train: Encoded) -> Guess | None:
        """The commonest training class (or label set) for every row; regression: the training mean."""
        return label_guess(train.labels)

    def write_predictions(self, folder: Path, encoded: dict[str, Encoded], predictions: dict[str, list[Any]]) -> None:
        """`<split>.tsv` of every split: index, prediction (and label where the split has labels)."""
        write_predictions(folder, encoded, predictions, self.label_name)

    def write_submission(self, run_folder: Path, submission: Path) -> None:
        """The selected run's test predictions, when there is a test split."""
        copy_predictions(run_folder, submission, self.test_splits)


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


def _text_type(
    name: str,
    summary: str,
    kind: Callable[[FinetuneDataConfig], HeadLabels],
    metrics: tuple[str, ...],
    default_metrics: tuple[str, ...],
) -> TaskSpec:
    """A type `TextTask` reads: the same task class, head, predictions file and page; its labels and metrics differ."""
    return TaskSpec(
        name=name,
        summary=summary,
        builder=TextTask.reading(kind),
        architecture="sequence_classification",
        metrics=metrics,
        default_metrics=default_metrics,
        predictions=PREDICTIONS_FILE.format(split="dev"),
        docs="task-classification.md",
        capabilities=(Publishes,),
    )


SPECS = (
    _text_type(
        "classification",
        "one text or a pair into one of a set of labels, from any file or hub dataset",
        Classes,
        tuple(METRICS),
        ("accuracy",),
    ),
    _text_type("regression", "one text or a pair scored by a number", Scores, tuple(METRICS), ("pearson", "spearman")),
    _text_type(
        "multi_label_classification",
        "one text or a pair tagged with any set of labels (a sigmoid each)",
        LabelSets,
        MULTI_LABEL_METRICS,
        ("micro_f1", "macro_f1"),
    ),
)
