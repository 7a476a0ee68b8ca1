"""GLUE data for fine-tuning: the task's splits, tokenized examples, padded batches and the GLUE server's files.

`GlueTask` is the fine-tuning task (roformer.tasks.base.FinetuneTask) of every GLUE config: the training floor asks
it for everything GLUE-shaped (the classifier and its labels, the splits, predictions from logits, the server format).
The `data:` section is roformer.tasks.config.FinetuneDataConfig.
Task metadata and the readers of the three sources (official TSV layout, hub, local files) are in
roformer.tasks.glue_tasks; the official metrics in roformer.tasks.glue_metrics.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from roformer.errors import UserError
from roformer.files import atomic_copy
from roformer.tasks.base import (
    NO_FACTS,
    Encoded,
    HeadOutputs,
    ModelFacts,
    Publishes,
    TaskSpec,
    cut_to_limits,
    labels_file,
    pad_rows,
    padded_length,
    write_tsv,
)
from roformer.tasks.baselines import Guess, label_guess
from roformer.tasks.config import FinetuneDataConfig
from roformer.tasks.glue_metrics import compute
from roformer.tasks.glue_tasks import Example, Split, Task, get_task, read_files, read_glue_dir, read_hub

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer


def load_glue_splits(data: FinetuneDataConfig, task: Task | None = None) -> dict[str, list[Example]]:
    """All splits of the configured task and source (train labelled, dev labelled, test splits unlabelled).

    Args:
        data: The data: section.
        task: Its task's metadata when the caller has looked it up already (else `get_task(data.task)`).
    """
    task = task or get_task(data.task)
    if data.source == "glue_dir":
        splits = read_glue_dir(task, data.glue_dir)
    elif data.source == "hub":
        splits = read_hub(task, data.hub_name)
    else:
        given = [
            (task.dev, data.validation_file, data.validation_mismatched_file),
            (task.test, data.test_file, data.test_mismatched_file),
        ]
        files = {"train": data.train_file}
        for splits_of_kind, first, second in given:
            for split, path in zip(splits_of_kind, (first, second)):
                if path:
                    files[split.name] = path
        splits = read_files(task, files, data.text_columns, data.label_column)
    if not splits["train"]:
        raise UserError(f"{task.name}: the training split is empty")
    return cut_to_limits(splits, data.max_train_examples, data.max_eval_examples)


def encode_glue(examples: list[Example], tokenizer: Tokenizer, max_length: int) -> Encoded:
    """Tokenize single sentences or pairs (`[CLS] A [SEP] B [SEP]`, token types 0/1), truncated longest-first."""
    if not examples:
        return Encoded([], [], [], [])
    first = [e.texts[0] for e in examples]
    second = [e.texts[1] for e in examples] if len(examples[0].texts) > 1 else None
    out = tokenizer(first, second, truncation=True, max_length=max_length, return_token_type_ids=True)
    return Encoded(out["input_ids"], out["token_type_ids"], [e.label for e in examples], [e.index for e in examples])


def collate(
    encoded: Encoded, rows: list[int], pad_id: int, regression: bool, multiple: int = 1, cap: int | None = None
) -> dict[str, torch.Tensor]:
    """Pad the chosen rows to their longest, rounded up to `multiple`; labels when the split has them."""
    length = padded_length(max(len(encoded.ids[r]) for r in rows), multiple, cap)
    batch = pad_rows(encoded.ids, encoded.types, rows, pad_id, length)
    if encoded.labels[rows[0]] is not None:
        batch["labels"] = torch.tensor(
            [encoded.labels[r] for r in rows], dtype=torch.float if regression else torch.long
        )
    return batch


# ----------------------------------------------------------------------------------------------------------------
# The fine-tuning task


class GlueTask(HeadOutputs):
    """A GLUE task with its splits read: the fine-tuning task (roformer.tasks.base.FinetuneTask) of a GLUE config.

    Every GLUE task classifies one text or a pair (STS-B: one score); the dev files and the server's test files
    (SST-2.tsv, MNLI-m.tsv, AX.tsv, ...) hold label names, or STS-B's scores clipped to [0, 5] with 3 decimals.

    Args:
        data: The data: section (its metrics select among the task's: null = all of them).
        task: The task's metadata (`get_task(data.task)`): its name is the canonical one (`sst2` for `SST-2`).
        splits: Its examples per split (`load_glue_splits`): only the splits present are evaluated and predicted.
    """

    architecture = "sequence_classification"

    def __init__(self, data: FinetuneDataConfig, task: Task, splits: dict[str, list[Example]]) -> None:
        super().__init__(data, default_metrics=task.metrics, name=task.name)
        self.meta, self.splits = task, splits
        self.num_labels = task.num_labels
        self.label_names = list(task.labels) if task.labels is not None else None
        self.dev_splits = [s.name for s in task.dev if s.name in splits]  # MNLI: matched and mismatched
        self.server_splits: list[Split] = [s for s in task.test + task.extra_tests if s.name in splits]
        self.test_splits = [s.name for s in self.server_splits]

    def model_files(self, eval_batch_size: int) -> dict[str, str]:
        """`labels.json`: the head's outputs by name, so that best/ is usable without the run's config."""
        return labels_file(self.label_names)

    @classmethod
    def from_config(cls, data: FinetuneDataConfig) -> GlueTask:
        """The task of a data: section, its splits read (the one look-up of the task's metadata)."""
        task = get_task(data.task)
        return cls(data, task, load_glue_splits(data, task))

    def encode(self, tokenizer: Tokenizer, max_length: int, model: ModelFacts = NO_FACTS) -> dict[str, Encoded]:
        """Every split tokenized, single sentences or pairs, truncated longest-first to `max_length` tokens."""
        return {name: encode_glue(examples, tokenizer, max_length) for name, examples in self.splits.items()}

    def collate(self, split: Encoded, rows: list[int], pad_id: int, cap: int) -> dict[str, torch.Tensor]:
        """The padded batch of `rows` (see `collate`): float labels for STS-B's MSE loss, class ids otherwise."""
        return collate(split, rows, pad_id, self.meta.is_regression, self.multiple, cap)

    def predictions(self, logits: torch.Tensor, split: Encoded, rows: list[int]) -> list[int | float]:
        """The predicted class of every row (argmax), or STS-B's score (the one output)."""
        values = logits.squeeze(-1) if self.meta.is_regression else logits.argmax(-1)
        return values.cpu().tolist()

    def evaluate(self, split: Encoded, predictions: list[int | float]) -> dict[str, float]:
        """The task's official metrics (roformer.tasks.glue_metrics) and `score`, the one that selects."""
        return compute(self.metrics, predictions, split.labels)

    def trivial_guess(self, train: Encoded) -> Guess | None:
        """The commonest training class (or label set) for every row; regression: the training mean."""
        return label_guess(train.labels)

    def server_label(self, value: int | float) -> str:
        """Server format: class names for classification, the score (3 decimals, clipped to [0, 5]) for STS-B."""
        if self.meta.labels is None:
            return f"{min(5.0, max(0.0, float(value))):.3f}"
        return self.meta.labels[int(value)]

    def write_predictions(
        self, folder: Path, encoded: dict[str, Encoded], predictions: dict[str, list[int | float]]
    ) -> None:
        """Dev predictions as `<split>.tsv` (index, prediction, label) and every test split's server file."""
        label = self.server_label
        for split in self.dev_splits:
            rows = zip(encoded[split].index, map(label, predictions[split]), map(label, encoded[split].labels))
            write_tsv(folder / f"{split}.tsv", ["index", "prediction", "label"], rows)
        for test in self.server_splits:
            rows = zip(encoded[test.name].index, map(label, predictions[test.name]))
            write_tsv(folder / test.submission, ["index", "prediction"], rows)

    def write_submission(self, run_folder: Path, submission: Path) -> None:
        """Copy the server files of one run (written by `write_predictions` into `run_folder`) into `submission`."""
        for test in self.server_splits:
            atomic_copy(run_folder / test.submission, submission / test.submission)


SPECS = (
    TaskSpec(
        name="glue",
        summary="a GLUE task by name (data.task): its official metrics, the server's test files",
        builder=GlueTask.from_config,
        architecture="sequence_classification",
        metrics=(),
        default_metrics=(),
        predictions="dev.tsv",
        docs="fine-tuning.md",
        tracker_project="roformer-glue-{task}",
        metrics_of=lambda data: get_task(data.task).metrics,
        capabilities=(Publishes,),
    ),
)
