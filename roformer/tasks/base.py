"""What `roformer finetune` asks of a kind of downstream work (`FinetuneTask`), a type's declaration, shared parts.

The fine-tuning recipe (roformer.train.finetune) trains every (lr, seed) run, keeps the best dev checkpoint, selects
and publishes; everything that depends on the task comes from its task object: the model head and its outputs, the
encoded splits, how a batch is padded, how logits become predictions, which metrics score them and which files the
predictions are written to (a benchmark's server format included). An encoded split is the task's own
(`EncodedSplit`): the recipe reads only its `lengths` (rows, batch order, padding counts); what a row holds (an
example, a window of a long context, a set of K choices) and how rows become predictions of examples is the task's.
Each type's module ends in its `TaskSpec` declarations, which roformer.tasks.registry collects: the types are listed
nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import torch

from roformer.files import atomic_write_text
from roformer.tasks.baselines import Guess, scored

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer
    from roformer.model.config import ModelConfig
    from roformer.tasks.config import FinetuneDataConfig, Vocabulary
    from roformer.tasks.extensions import EvalVariant


class TokenRows:
    """A split whose rows are lists of token ids (`ids`), one sequence each: their lengths are their sizes."""

    ids: list[list[int]]
    sequences = 1  # a row is one sequence

    @property
    def lengths(self) -> list[int]:
        """Tokens of every row."""
        return [len(row) for row in self.ids]

    @property
    def tokens(self) -> list[int]:
        """Real tokens of every row: its length."""
        return self.lengths


@dataclass
class Encoded(TokenRows):
    """Token ids and types of a split, ragged (padding happens per batch): one row per example."""

    ids: list[list[int]]
    types: list[list[int]]
    labels: list[int | float | None]
    index: list[str]

    @property
    def labelled(self) -> bool:
        """Whether the split has labels (dev) or not (GLUE's test splits)."""
        return bool(self.labels) and self.labels[0] is not None


class EncodedSplit(Protocol):
    """A split tokenized for one tokenizer and length: rows, each what one entry of a batch holds.

    Attributes:
        lengths: Tokens of every row (the longest choice of a multiple-choice row): batch order and padding.
        labelled: Whether the split has labels: a dev split always, a test split when its file has them (then
            the selected checkpoint of every run is scored on it too).
        tokens: Real tokens of every row (all K candidates of a multiple-choice row): throughput and padding.
        sequences: Sequences a row holds, each padded to the batch's length (multiple choice: K; else 1).
    """

    lengths: list[int]
    labelled: bool
    tokens: list[int]
    sequences: int


MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # a batch's keys the model reads to predict


class HeadOutputs:
    """What task types share: the members given by the data: section and the type's declaration, and the head's outputs.

    Most tasks use their model as its head does: the head computes the loss and the logits (a task may compute its
    own). The members every task has are set here, once, from the data: section; a type sets only what is its own.

    Args:
        data: The data: section: the task's name (`data.task`), its padding multiple, the selecting `data.metrics`
            and, through `data.spec`, the type's default metrics and tracker project.
        default_metrics: What selects when `data.metrics` is null, where the data decides it (a GLUE task's own
            metrics, plain tags' accuracy); None: the declaration's `default_metrics`.
        name: The task's name where it is not `data.task` as written (GLUE's canonical `sst2` for `SST-2`).
    """

    pooling: str | None = None  # a head's outputs are its logits, not sentence vectors
    micro_batch_loss: str | None = None  # the loss is a mean of per-example terms: any batch_size, the same step
    cross_validation_folds: int | None = None  # the dev split is the dev file's: one run per (lr, seed)
    label_names: list[str] | None = None  # the head's outputs have no names (scores, spans, candidates)
    submission_folder = "submission"  # where the selected run's files are published (write_submission)

    def __init__(
        self, data: FinetuneDataConfig, default_metrics: Sequence[str] | None = None, name: str | None = None
    ) -> None:
        self.data = data
        self.name = name or data.task
        self.tracker_project = data.spec.tracker_project.format(task=self.name)
        self.multiple = data.pad_to_multiple_of  # batches are padded to a multiple of this
        defaults = data.spec.default_metrics if default_metrics is None else default_metrics
        self.metrics = tuple(data.metrics or defaults)  # their mean, `score`, selects
        self.dev_splits = ["dev"]  # the dev file's split (GLUE's MNLI has two)

    def padded_length(self, longest: int, cap: int) -> int:
        """`longest` rounded up to data.pad_to_multiple_of (`multiple`), within `cap` (`padded_length`)."""
        return padded_length(longest, self.multiple, cap)

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The training loss of a batch (with its labels)."""
        return model(**batch).loss

    def outputs(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """What `predictions` reads of a batch: the head's logits."""
        return model(**{k: batch[k] for k in MODEL_INPUTS if k in batch}).logits

    def split_outputs(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], split: Any) -> Any:
        """What `predictions` reads of a batch of `split`'s rows: its `outputs`, whatever the split."""
        return self.outputs(model, batch)

    def splits_for_run(self, encoded: dict[str, Any], fold: int | None) -> dict[str, Any]:
        """The encoded splits a run trains and evaluates on: the same for every run (no folds)."""
        return encoded

    def check_model(self, config: ModelConfig) -> None:
        """Say what the model's settings mean for the task, before training (nothing to say by default)."""

    def token_batches(self, split: Any, cap: int) -> list[list[int]] | None:
        """The training split's fixed batches by a token budget (each a micro-batch of one process), or None.

        None (the default): steps are `train.batch_size` examples per micro-batch and process, from seeded
        per-epoch permutations. A list: every step trains on the next processes x grad_accum of these batches, in
        a seeded order per epoch (fairseq's `--max-tokens`).
        """
        return None

    def loss_weight(self, split: Any, rows: list[int]) -> int:
        """The number of terms the loss of a batch of `rows` averages over: its rows (a mean per example).

        Token batches hold different numbers of rows (and tokens): each micro-batch's mean is weighted by this
        count over the step's, so that the step's loss is the mean over all its terms, however they are batched.
        """
        return len(rows)

    def padded_tokens(self, split: Any, rows: list[int], cap: int) -> int:
        """Positions a batch of `rows` computes, padding included: `sequences` rows of its padded length."""
        return split.sequences * len(rows) * self.padded_length(max(split.lengths[r] for r in rows), cap)

    def result_notes(self, selected: dict[str, Any]) -> dict[str, Any]:
        """Fields of results.json of the type's own, from the selected run's record (none by default)."""
        return {}

    def baseline(self, splits: dict[str, Any], split: str) -> dict[str, Any] | None:
        """The trivial baseline of a labelled split (roformer.tasks.baselines): its kind and its metrics, or None.

        The constant guess comes from the training split (`trivial_guess`); None where a type has none.
        """
        guess = self.trivial_guess(splits["train"])
        return None if guess is None else scored(guess, splits[split], self.evaluate)

    def trivial_guess(self, train: Any) -> Guess | None:
        """The constant answer of a model that learned nothing of the input (None: the type defines none)."""
        return None

    def model_files(self, eval_batch_size: int) -> dict[str, str]:
        """Files written beside every fine-tuned model of the task ({name: text}; none by default).

        `eval_batch_size` is the run's prediction batch (a file may record it, to predict in the same batches).
        """
        return {}

    def test_variants(self, config: ModelConfig, split: str) -> dict[str, EvalVariant]:
        """{label: a variant} the best model is also scored under on the test split `split` (none by default).

        A synthetic task's test-time context extensions (roformer.tasks.extensions); results.json gives each
        variant's metrics under `test.<split>.extensions.<label>`.
        """
        return {}


class FinetuneTask(Protocol):
    """One downstream task with its splits read: what the fine-tuning recipe asks of it.

    Attributes:
        name: The task's name in results.json, the metrics events (`task`) and the logs, e.g. `rte`.
        tracker_project: The experiment tracker's project of its runs.
        architecture: The model `roformer.load` builds for it, e.g. `sequence_classification`.
        num_labels: The outputs of that model's head (None: a model without a label count, an encoder-decoder).
        metrics: The names of the dev metrics `evaluate` returns; their mean (`score`) selects checkpoints and
            learning rates.
        dev_splits: The labelled dev splits present; the first one selects checkpoints and learning rates.
        test_splits: The other splits present, predicted by every run (scored too when labelled).
        label_names: The names of the head's outputs in id order (classes, tags), written as `labels.json` beside
            the fine-tuned model; None where outputs have no names (regression, QA, multiple choice).
        pooling: A sentence-vector task's pooling (`similarity`), written as `sentence.json` beside the fine-tuned
            backbone for `roformer embed`; None for a head's task.
        micro_batch_loss: Why the loss depends on which examples share a micro-batch (a mean over a micro-batch's
            tokens, a loss comparing its pairs), said when a resume changes batch_size; None for a mean of
            per-example terms, which any batch_size gives alike.
        cross_validation_folds: k of a k-fold cross-validation of the training file: the grid's third axis (every
            (lr, seed) runs once per held-out fold, `fold` in its record); None: no folds.
        submission_folder: The run directory's folder of the selected run's published files (`submission`;
            translation's `hypotheses`).
    """

    name: str
    tracker_project: str
    architecture: str
    num_labels: int | None
    metrics: tuple[str, ...]
    dev_splits: list[str]
    test_splits: list[str]
    label_names: list[str] | None
    pooling: str | None
    micro_batch_loss: str | None
    cross_validation_folds: int | None
    submission_folder: str

    def encode(self, tokenizer: Tokenizer, max_length: int) -> dict[str, EncodedSplit]:
        """Every split tokenized with `tokenizer`, rows of at most `max_length` tokens (ragged: batches pad)."""

    def padded_length(self, longest: int, cap: int) -> int:
        """The length of a batch whose longest row has `longest` tokens (at most `cap`, unless longer)."""

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The training loss of a batch (`HeadOutputs`: the model head's)."""

    def outputs(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """What `predictions` reads of a batch (`HeadOutputs`: the head's logits)."""

    def split_outputs(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], split: EncodedSplit) -> Any:
        """What `predictions` reads of a batch of `split`'s rows, which predicting asks for (`HeadOutputs`: `outputs`).

        A type whose outputs depend on the split (translation: the split's search, `eval_beam` or `beam`) reads them
        from the split here: a batch holds tensors only.
        """

    def splits_for_run(self, encoded: dict[str, EncodedSplit], fold: int | None) -> dict[str, EncodedSplit]:
        """The splits of the run holding out `fold` (`HeadOutputs`: the same for all; cross-validation: its folds)."""

    def check_model(self, config: ModelConfig) -> None:
        """Warn when the model's settings do not mean what the task needs (`HeadOutputs`: nothing to say)."""

    def collate(self, split: EncodedSplit, rows: list[int], pad_id: int, cap: int) -> dict[str, torch.Tensor]:
        """The model inputs of `rows` of `split`, padded to `padded_length`, with their labels when it has them."""

    def token_batches(self, split: EncodedSplit, cap: int) -> list[list[int]] | None:
        """The training split's batches by a token budget, or None: batches of `train.batch_size` examples."""

    def loss_weight(self, split: EncodedSplit, rows: list[int]) -> int:
        """The terms a batch's loss averages over (`HeadOutputs`: its rows): token batches weight their means by it."""

    def padded_tokens(self, split: EncodedSplit, rows: list[int], cap: int) -> int:
        """Positions a batch of `rows` computes, padding included (throughput and padding figures)."""

    def result_notes(self, selected: dict[str, Any]) -> dict[str, Any]:
        """results.json fields of the type's own, from the selected run's record (`HeadOutputs`: none)."""

    def model_files(self, eval_batch_size: int) -> dict[str, str]:
        """Files beside every fine-tuned model ({name: text}): what using it needs (`HeadOutputs`: none)."""

    def test_variants(self, config: ModelConfig, split: str) -> dict[str, EvalVariant]:
        """{label: a model variant} the best model is also scored under on `split` (`HeadOutputs`: none)."""

    def baseline(self, splits: dict[str, EncodedSplit], split: str) -> dict[str, Any] | None:
        """A labelled split's trivial baseline `{"kind": ..., <metric>: ...}` (`HeadOutputs`: from `trivial_guess`)."""

    def predictions(self, logits: torch.Tensor, split: EncodedSplit, rows: list[int]) -> list[Any]:
        """What each row of a batch's logits predicts (picklable: several processes gather them)."""

    def evaluate(self, split: EncodedSplit, predictions: list[Any]) -> dict[str, float]:
        """The metrics of row predictions against the split's labels, `score` (the selection metric) among them."""

    def write_predictions(
        self, folder: Path, encoded: dict[str, EncodedSplit], predictions: dict[str, list[Any]]
    ) -> None:
        """One run's predictions of every dev and test split, as files in the existing `folder`."""

    def write_submission(self, run_folder: Path, submission: Path) -> None:
        """The selected run's submission files (from what `write_predictions` wrote in `run_folder`) in `submission`."""


def pad_rows(
    ids: list[list[int]], types: list[list[int]], rows: list[int], pad_id: int, length: int
) -> dict[str, torch.Tensor]:
    """`input_ids`, `token_type_ids` and `attention_mask` (B, length) of `rows`, right-padded with `pad_id`."""
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    token_types = torch.zeros((len(rows), length), dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(ids[r])
        input_ids[i, :n] = torch.tensor(ids[r])
        token_types[i, :n] = torch.tensor(types[r])
        mask[i, :n] = 1
    return {"input_ids": input_ids, "token_type_ids": token_types, "attention_mask": mask}


def with_score(metrics: dict[str, float], selecting: Sequence[str]) -> dict[str, float]:
    """`metrics` and `score`, the mean of the `selecting` ones (data.metrics, or the type's default): what selects."""
    return {**metrics, "score": sum(metrics[name] for name in selecting) / len(selecting)}


def padded_length(longest: int, multiple: int, cap: int | None = None) -> int:
    """`longest` rounded up to a multiple of `multiple`, but not past `cap` (unless `longest` already is).

    Tensor cores and the fused attention kernels want multiples of 8; the cap is the longest length the model
    accepts (a learned position table).
    """
    rounded = -(-longest // multiple) * multiple
    return rounded if cap is None else max(longest, min(rounded, cap))


T = TypeVar("T")


def cut_to_limits(splits: dict[str, list[T]], max_train: int | None, max_eval: int | None) -> dict[str, list[T]]:
    """The first `max_train` examples of the training split and the first `max_eval` of every other (None: all)."""
    return {name: examples[: max_train if name == "train" else max_eval] for name, examples in splits.items()}


def write_tsv(path: Path, header: list[str], rows: Iterable[Iterable[object]]) -> None:
    """A tab-separated file with a header line, written atomically (complete or absent)."""
    lines = ["\t".join(header)] + ["\t".join(str(c) for c in row) for row in rows]
    atomic_write_text(path, "".join(line + "\n" for line in lines))


@dataclass(frozen=True)
class TaskSpec:
    """A task type's declaration: the last lines of its module, collected by roformer.tasks.registry.

    What the rest of the package knows of a type comes from here: the config's types, sections and metric checks, the
    CLI help, the docs' table of types and the contract tests' tables.

    Attributes:
        name: The type, as `data.type` names it.
        summary: One line for the CLI help and the docs.
        builder: The task of a data: section, its splits read (the task class's `from_config`).
        architecture: The model head it fine-tunes (roformer.model.model.ARCHITECTURES; `backbone`: vectors).
        metrics: What its evaluation gives and `data.metrics` may name (their mean selects); empty when they depend
            on the data: section (`metrics_of`).
        default_metrics: What selects when `data.metrics` is null (empty: decided by the task from its data).
        predictions: The file each run writes of its (first) dev split's predictions.
        docs: Its page under docs/ (with an anchor, if it is a section of one).
        tracker_project: The experiment tracker's project of its runs, `{task}` standing for the task's name.
        section: Its settings' key under `data:` (`data.tagging`), or None.
        settings: The dataclass of that section (filled with its defaults when the config has none).
        section_required: The section must be written (it has no useful defaults: multiple choice's columns).
        folders: Keys under `data:` of its own that name a folder it reads (`data.beir_dir`), resolved against the
            config file's folder as `train_file` is; several types may declare one key.
        metrics_of: The metrics `data.metrics` may name for a given data: section (GLUE: the task's own).
        check: Checks of the whole data: section that belong to this type (e.g. cross-validation folds), raising
            ConfigError.
        needs_validation_file: Whether a `files` source needs `validation_file` for this data: section.
        own_vocabulary: The task makes its own tokenizer (`task.tokenizer()`), so a model can be trained from
            scratch: `init:` empty, the config's `model:` section the whole model (synthetic tasks, translation).
        pretrained_init: With `own_vocabulary`: `init:` may also name a pretrained model of `architecture`, whose
            tokenizer the task then reads (`task.pretrained_tokenizer(init)`) and whose `model:` section is
            overrides, as for every other type (translation fine-tunes a converted encoder-decoder).
        scratch_model: The config of the model trained from scratch, from the `model:` section and the task's
            `Vocabulary` (raising ConfigError naming `model.<key>`); None: a `ModelConfig` of the section.
        data_keys: Fields of `data:` that only this type reads (translation's `source_lang`, `train_prefix`...):
            another type's config that sets one is refused, naming it.
    """

    name: str
    summary: str
    builder: Callable[[FinetuneDataConfig], FinetuneTask]
    architecture: str
    metrics: tuple[str, ...]
    default_metrics: tuple[str, ...]
    predictions: str
    docs: str
    tracker_project: str = "roformer-{task}"
    section: str | None = None
    settings: type | None = None
    section_required: bool = False
    folders: tuple[str, ...] = ()
    metrics_of: Callable[[FinetuneDataConfig], tuple[str, ...]] | None = None
    check: Callable[[FinetuneDataConfig], None] | None = None
    needs_validation_file: Callable[[FinetuneDataConfig], bool] | None = None
    own_vocabulary: bool = False
    pretrained_init: bool = False
    scratch_model: Callable[[dict[str, Any], Vocabulary], Any] | None = None
    data_keys: tuple[str, ...] = ()

    def known_metrics(self, data: FinetuneDataConfig) -> tuple[str, ...]:
        """The metrics `data.metrics` may name for `data`."""
        return self.metrics_of(data) if self.metrics_of is not None else self.metrics
