"""Fine-tuning tasks: what `roformer finetune` asks of a kind of downstream work (`FinetuneTask`), and `make_task`.

The fine-tuning recipe (roformer.train.finetune) trains every (lr, seed) run, keeps the best dev checkpoint, selects
and publishes; everything that depends on the task comes from its task object: the model head and its outputs, the
encoded splits, how a batch is padded, how logits become predictions, which metrics score them and which files the
predictions are written to (a benchmark's server format included). GLUE (roformer.data.glue.GlueTask) is the first.
An encoded split is an `Encoded` (ragged token ids and types, labels, example ids): the recipe reads only its
lengths (batch order, padding counts) and its labels (the metrics); the rest is the task's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from roformer.data.config import GlueDataConfig
from roformer.data.glue import Encoded, GlueTask

if TYPE_CHECKING:
    import torch

    from roformer.data.tokenizer import Tokenizer


class FinetuneTask(Protocol):
    """One downstream task with its splits read: what the fine-tuning recipe asks of it.

    Attributes:
        name: The task's name in results.json, the metrics events (`task`) and the logs, e.g. `rte`.
        tracker_project: The experiment tracker's project of its runs.
        architecture: The model `roformer.load` builds for it, e.g. `sequence_classification`.
        num_labels: The outputs of that model's head.
        metrics: The dev metrics, by name in roformer.data.glue_metrics.METRICS, scored against a split's labels;
            their mean (`score`) selects checkpoints and learning rates.
        dev_splits: The labelled dev splits present; the first one selects checkpoints and learning rates.
        test_splits: The unlabelled splits present, predicted by every run.
    """

    name: str
    tracker_project: str
    architecture: str
    num_labels: int
    metrics: tuple[str, ...]
    dev_splits: list[str]
    test_splits: list[str]

    def encode(self, tokenizer: Tokenizer, max_length: int) -> dict[str, Encoded]:
        """Every split tokenized with `tokenizer`, cut to `max_length` tokens (ragged: batches pad on their own)."""

    def padded_length(self, longest: int, cap: int) -> int:
        """The length of a batch whose longest example has `longest` tokens (at most `cap`, unless longer)."""

    def collate(self, split: Encoded, rows: list[int], pad_id: int, cap: int) -> dict[str, torch.Tensor]:
        """The model inputs of `rows` of `split`, padded to `padded_length`, with `labels` when the split has them."""

    def predictions(self, logits: torch.Tensor) -> list[int | float]:
        """One prediction per row of a batch's logits (what the metrics and the prediction files take)."""

    def evaluate(self, split: Encoded, predictions: list[int | float]) -> dict[str, float]:
        """The dev metrics of `predictions` against `split`'s labels, `score` (the selection metric) among them."""

    def write_predictions(
        self, folder: Path, encoded: dict[str, Encoded], predictions: dict[str, list[int | float]]
    ) -> None:
        """One run's predictions of every dev and test split, as files in the existing `folder`."""

    def write_submission(self, run_folder: Path, submission: Path) -> None:
        """The selected run's submission files (from what `write_predictions` wrote in `run_folder`) in `submission`."""


def make_task(data: GlueDataConfig) -> FinetuneTask:
    """The task of a fine-tuning config's data: section, its splits read.

    Every data: section is a GLUE task's today; another kind of task brings its data config and a branch here.

    Raises:
        UserError: missing or unreadable data files, labels outside the task's label set, an empty training split.
    """
    return GlueTask.from_config(data)
