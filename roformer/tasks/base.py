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

import json
import logging
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


logger = logging.getLogger(__name__)

# A fine-tuning config's data: section (roformer.tasks.config.FinetuneDataConfig) and a scratch model's vocabulary
# (its Vocabulary), as the declarations and the protocol name them: not imported, not even for annotations, since
# that config module checks its sections against the registry of these declarations (no circle of imports).
DataSection = Any
ScratchVocabulary = Any

MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # a batch's keys the model reads to predict
LABELS_FILE = "labels.json"  # best/: the names of the head's outputs in id order (classes, tags)
SENTENCE_FILE = "sentence.json"  # best/ of a sentence-vector task (similarity): the pooling its vectors were trained in


class HeadOutputs:
    """What task types share: the members given by the data: section and the type's declaration, and the head's outputs.

    Most tasks use their model as its head does: the head computes the loss and the logits (a task may compute its
    own). The members every task has are set here, once, from the data: section; a type sets only what is its own.
    What a type can do beyond the data path (`CAPABILITIES`) it implements and declares in its `TaskSpec`.

    Args:
        data: The data: section: the task's name (`data.task`), its padding multiple, the selecting `data.metrics`
            and, through `data.spec`, the type's default metrics and tracker project.
        default_metrics: What selects when `data.metrics` is null, where the data decides it (a GLUE task's own
            metrics, plain tags' accuracy); None: the declaration's `default_metrics`.
        name: The task's name where it is not `data.task` as written (GLUE's canonical `sst2` for `SST-2`).
    """

    micro_batch_loss: str | None = None  # the loss is a mean of per-example terms: any batch_size, the same step

    def __init__(
        self, data: DataSection, default_metrics: Sequence[str] | None = None, name: str | None = None
    ) -> None:
        self.data = data
        self.spec = data.spec
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

    def outputs(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], split: Any) -> torch.Tensor:
        """What `predictions` reads of a batch of `split`'s rows: the head's logits, whatever the split."""
        return model(**{k: batch[k] for k in MODEL_INPUTS if k in batch}).logits

    def baseline(self, splits: dict[str, Any], split: str) -> dict[str, Any] | None:
        """The trivial baseline of a labelled split (roformer.tasks.baselines): its kind and its metrics, or None.

        The constant guess comes from the training split (`trivial_guess`); None where a type has none.
        """
        guess = self.trivial_guess(splits["train"])
        return None if guess is None else scored(guess, splits[split], self.evaluate)

    def trivial_guess(self, train: Any) -> Guess | None:
        """The constant answer of a model that learned nothing of the input (None: the type defines none)."""
        return None


@dataclass(frozen=True)
class ModelFacts:
    """What a task learns of its model before encoding (`ChecksModel.check_model`), passed to `encode`.

    Attributes:
        eos_id: The id that ends a target (an encoder-decoder's `eos_token_id`), None where targets have none.
        warnings: What the model's settings mean for the task that its user should hear (logged once).
    """

    eos_id: int | None = None
    warnings: tuple[str, ...] = ()


NO_FACTS = ModelFacts()  # what `encode` is given for a type without `ChecksModel`


class FinetuneTask(Protocol):
    """One downstream task with its splits read: its data path, what the fine-tuning recipe asks of every task.

    Read, encode, batch, predict, score, write: nothing else is asked of a type. What only some types do (batches by
    a token budget, cross-validation, files published beside the model, checks of the model, scored variants,
    results of their own) are capabilities (`CAPABILITIES`): a type implements one's members and declares it in its
    `TaskSpec.capabilities`, and the recipe asks the declaration, checked against the type once when it is built.

    Attributes:
        spec: The type's declaration (its capabilities among it).
        name: The task's name in results.json, the metrics events (`task`) and the logs, e.g. `rte`.
        tracker_project: The experiment tracker's project of its runs.
        architecture: The model `roformer.load` builds for it, e.g. `sequence_classification`.
        num_labels: The outputs of that model's head (None: a model without a label count, an encoder-decoder).
        metrics: The names of the dev metrics `evaluate` returns; their mean (`score`) selects checkpoints and
            learning rates.
        dev_splits: The labelled dev splits present; the first one selects checkpoints and learning rates.
        test_splits: The other splits present, predicted by every run (scored too when labelled).
        micro_batch_loss: Why the loss depends on which examples share a micro-batch (a mean over a micro-batch's
            tokens, a loss comparing its pairs), said when a resume changes batch_size; None for a mean of
            per-example terms, which any batch_size gives alike.
    """

    spec: TaskSpec
    name: str
    tracker_project: str
    architecture: str
    num_labels: int | None
    metrics: tuple[str, ...]
    dev_splits: list[str]
    test_splits: list[str]
    micro_batch_loss: str | None

    def encode(self, tokenizer: Tokenizer, max_length: int, model: ModelFacts = NO_FACTS) -> dict[str, EncodedSplit]:
        """Every split tokenized with `tokenizer`, rows of at most `max_length` tokens (ragged: batches pad).

        `model` is what the type's `check_model` learned of the model (`ModelFacts()` for a type without
        `ChecksModel`): translation's targets end with the model's eos.
        """

    def padded_length(self, longest: int, cap: int) -> int:
        """The length of a batch whose longest row has `longest` tokens (at most `cap`, unless longer)."""

    def collate(self, split: EncodedSplit, rows: list[int], pad_id: int, cap: int) -> dict[str, torch.Tensor]:
        """The model inputs of `rows` of `split`, padded to `padded_length`, with their labels when it has them."""

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The training loss of a batch (`HeadOutputs`: the model head's)."""

    def outputs(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], split: EncodedSplit) -> Any:
        """What `predictions` reads of a batch of `split`'s rows (`HeadOutputs`: the head's logits).

        A type whose outputs depend on the split (translation: the split's search, `eval_beam` or `beam`) reads them
        from the split here: a batch holds tensors only.
        """

    def predictions(self, logits: torch.Tensor, split: EncodedSplit, rows: list[int]) -> list[Any]:
        """What each row of a batch's logits predicts (picklable: several processes gather them)."""

    def evaluate(self, split: EncodedSplit, predictions: list[Any]) -> dict[str, float]:
        """The metrics of row predictions against the split's labels, `score` (the selection metric) among them."""

    def baseline(self, splits: dict[str, EncodedSplit], split: str) -> dict[str, Any] | None:
        """A labelled split's trivial baseline `{"kind": ..., <metric>: ...}` (`HeadOutputs`: from `trivial_guess`)."""

    def write_predictions(
        self, folder: Path, encoded: dict[str, EncodedSplit], predictions: dict[str, list[Any]]
    ) -> None:
        """One run's predictions of every dev and test split, as files in the existing `folder`."""

    def write_submission(self, run_folder: Path, submission: Path) -> None:
        """The selected run's submission files (from what `write_predictions` wrote in `run_folder`) in `submission`."""


class TokenBatches(Protocol):
    """Batches by a token budget (fairseq's `--max-tokens`), each weighted by its loss terms: translation."""

    def token_batches(self, split: EncodedSplit, cap: int) -> list[list[int]]:
        """The training split's fixed batches, each a micro-batch of one process.

        Trained in a seeded order per epoch: every step takes the next processes x grad_accum of them, in place of
        `train.batch_size` rows.
        """

    def loss_weight(self, split: EncodedSplit, rows: list[int]) -> int:
        """The terms a batch's loss averages over: a step's loss is the mean over all its micro-batches' terms."""

    def padded_tokens(self, split: EncodedSplit, rows: list[int], cap: int) -> int:
        """Positions a batch of `rows` computes, padding included (throughput and padding figures)."""


class CrossValidates(Protocol):
    """A k-fold cross-validation of the training file: the grid's third axis (triplet's few-shot sets)."""

    cross_validation_folds: int | None  # k (every (lr, seed) runs once per held-out fold); None: no folds

    def splits_for_run(self, encoded: dict[str, EncodedSplit], fold: int | None) -> dict[str, EncodedSplit]:
        """The splits of the run holding out `fold` (None: the encoded splits as they are)."""


class Publishes(Protocol):
    """Files beside every fine-tuned model: what using it needs without the run's config."""

    def model_files(self, eval_batch_size: int) -> dict[str, str]:
        """{name: text} (`labels.json`: the outputs' names, `sentence.json`: the pooling, `translation.json`).

        `eval_batch_size` is the run's prediction batch (a file may record it, to predict in the same batches).
        """


class ChecksModel(Protocol):
    """Reads the model's config before encoding: refuses what cannot work, says what its settings mean."""

    def check_model(self, config: Any) -> ModelFacts:
        """What the task learns of the model (`ModelFacts`), raising UserError for a model it cannot take."""


class ScoresVariants(Protocol):
    """Scores the best model under variants on test splits (a synthetic task's test-time context extensions)."""

    def test_variants(self, config: ModelConfig, split: str) -> dict[str, EvalVariant]:
        """{label: a variant} scored on `split`: results.json's `test.<split>.extensions.<label>`."""


class ReportsResults(Protocol):
    """Fields of results.json of the type's own, from the selected run's record (translation's BLEU table)."""

    def result_notes(self, selected: dict[str, Any]) -> dict[str, Any]:
        """The fields, by name."""


class OwnVocabulary(Protocol):
    """Makes its own tokenizer, so a model trains from scratch (`TaskSpec.own_vocabulary`: synthetic, translation).

    A type that also fine-tunes a pretrained model (`TaskSpec.pretrained_init`) reads its tokenizer with
    `pretrained_tokenizer(init)`.
    """

    def tokenizer(self) -> Tokenizer:
        """The tokenizer of the task's own vocabulary."""


# a capability: the members a type implements to have it (checked against its declaration once: `check_capabilities`)
CAPABILITIES: dict[type, tuple[str, ...]] = {
    TokenBatches: ("token_batches", "loss_weight", "padded_tokens"),
    CrossValidates: ("splits_for_run",),
    Publishes: ("model_files",),
    ChecksModel: ("check_model",),
    ScoresVariants: ("test_variants",),
    ReportsResults: ("result_notes",),
    OwnVocabulary: ("tokenizer",),
}


def check_capabilities(spec: TaskSpec, task: object) -> None:
    """The capabilities `spec` declares are those `task` implements, each member of each.

    Raises:
        RuntimeError: a declared capability the type lacks a member of, or one implemented and not declared (it
            would never be asked for): a programming error of the type's module.
    """
    for capability, members in CAPABILITIES.items():
        present = [name for name in members if callable(getattr(task, name, None))]
        declared = spec.declares(capability)
        if declared and len(present) < len(members):
            missing = ", ".join(name for name in members if name not in present)
            raise RuntimeError(f"task type {spec.name!r} declares {capability.__name__} but has no {missing}")
        if not declared and present:
            raise RuntimeError(
                f"task type {spec.name!r} has {present[0]} but does not declare {capability.__name__} in its TaskSpec"
            )


def learn_model(task: FinetuneTask, config: Any) -> ModelFacts:
    """What `task` learns of its model's `config` (`ChecksModel`; else nothing), its warnings logged once here.

    Raises:
        UserError: a model the task cannot take (the type's `check_model`).
    """
    if not task.spec.declares(ChecksModel):
        return NO_FACTS
    facts = task.check_model(config)
    for warning in facts.warnings:
        logger.warning(warning)
    return facts


def labels_file(names: list[str] | None) -> dict[str, str]:
    """`labels.json` of a head whose outputs have `names` (None: outputs without names, no file): `Publishes`."""
    return {} if names is None else {LABELS_FILE: json.dumps(names, ensure_ascii=False)}


def sentence_file(pooling: str) -> dict[str, str]:
    """`sentence.json`: the pooling a sentence-vector model was trained with (`roformer embed` pools the same way)."""
    return {SENTENCE_FILE: json.dumps({"pooling": pooling})}


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
        capabilities: What the type does beyond the data path (`CAPABILITIES`: `TokenBatches`, `CrossValidates`,
            `Publishes`, `ChecksModel`, `ScoresVariants`, `ReportsResults`), each implemented by its task class;
            `OwnVocabulary` follows `own_vocabulary`.
        submission_folder: The run directory's folder of the selected run's published files (`write_submission`).
    """

    name: str
    summary: str
    builder: Callable[[DataSection], FinetuneTask]
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
    metrics_of: Callable[[DataSection], tuple[str, ...]] | None = None
    check: Callable[[DataSection], None] | None = None
    needs_validation_file: Callable[[DataSection], bool] | None = None
    own_vocabulary: bool = False
    pretrained_init: bool = False
    scratch_model: Callable[[dict[str, Any], ScratchVocabulary], Any] | None = None
    data_keys: tuple[str, ...] = ()
    capabilities: tuple[type, ...] = ()
    submission_folder: str = "submission"

    def declares(self, capability: type) -> bool:
        """Whether the type has `capability` (one of `CAPABILITIES`)."""
        return capability in self.capabilities or (capability is OwnVocabulary and self.own_vocabulary)

    def known_metrics(self, data: DataSection) -> tuple[str, ...]:
        """The metrics `data.metrics` may name for `data`."""
        return self.metrics_of(data) if self.metrics_of is not None else self.metrics
