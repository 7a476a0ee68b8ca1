"""Multiple-choice data for fine-tuning (`type: multiple_choice`): questions with K candidates, one of them right.

`ChoicesTask` is the fine-tuning task (roformer.tasks.base.FinetuneTask) of a multiple-choice config. A row of an
encoded split is one question with its K candidates, each encoded as its own sequence; the model
(roformer.model.model.MultipleChoice) scores every candidate with one output and a softmax over the K picks one.
The `data.choices:` section (roformer.tasks.choices.ChoicesConfig) says where the parts are. Two layouts:

- SWAG-style pairs: each candidate is the pair (context, question + " " + candidate), or (context, candidate) without
  `question_column`, truncated longest-first to max_length.
- CHID-style cloze (`blank`): the context holds one placeholder (`#idiom#`) and each candidate fills it; the filled
  context is read alone. The two sides of the blank and the candidate are tokenized separately, so the blank's edges
  are word boundaries (Chinese text, which WordPiece splits into characters, tokenizes the same either way). A
  context longer than max_length keeps a window centred on the candidate, which is never cut: each side gets half the
  room the candidate leaves, and a side with fewer tokens gives the rest to the other.

Labels are the right candidate's index (an int, or digits as text: csv cells) or the candidate's text. Every question
of a task has the same number of candidates K. A test split may be unlabelled (no label field, null, empty, or -1: the
hub's mark), and is then only predicted. Predictions are written as JSON lines, `<split>.jsonl`:
`{"id": ..., "prediction": index, "label": index}` (no label in an unlabelled split).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from roformer.config import check_types
from roformer.data.text import is_integer_text
from roformer.data.tokenizer import jieba_presegmenter
from roformer.errors import ConfigError, UserError
from roformer.files import atomic_copy, atomic_write_text
from roformer.tasks.base import NO_FACTS, ChecksModel, HeadOutputs, ModelFacts, TaskSpec, cut_to_limits, pad_rows
from roformer.tasks.baselines import Guess, label_guess
from roformer.tasks.config import FinetuneDataConfig
from roformer.tasks.glue_metrics import compute
from roformer.tasks.records import Record, example_id, field, read_split_records, text_field

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer
    from roformer.model.config import ModelConfig


Segmenter = Callable[[str], str]  # text -> the same text with words separated by spaces (jieba)

NO_LABEL = (None, "", -1, "-1")  # how a test split says it has no labels (-1: the hub's mark)


@dataclass
class ChoicesConfig:
    """`data.choices:` of `type: multiple_choice`: a context (and question) with K candidate answers.

    Attributes:
        context_column: The field with the context (SWAG `sent1`; CHID `content`).
        question_column: A field joined to each candidate as its text (SWAG `sent2`, the start of the ending);
            null = the candidate alone.
        choices_column: A field holding the list of candidates (CHID `candidates`); or
        choice_columns: one field per candidate (SWAG `ending0`..`ending3`).
        blank: A placeholder in the context that each candidate fills (CHID `#idiom#`): the model reads the filled
            context alone instead of the pair (context, candidate).
    """

    context_column: str = "context"
    question_column: str | None = None
    choices_column: str | None = None
    choice_columns: list[str] = dataclasses.field(default_factory=list)
    blank: str | None = None

    def __post_init__(self) -> None:
        check_types(self)
        if bool(self.choices_column) == bool(self.choice_columns):
            raise ConfigError("choices: name either choices_column (a list field) or choice_columns (one per choice)")
        if self.blank and self.question_column:
            raise ConfigError("choices: blank and question_column do not go together (a filled context is read alone)")


@dataclass(frozen=True)
class ChoiceQuestion:
    """One multiple-choice example, as read.

    Attributes:
        context: The context (SWAG's first sentence; CHID's passage, holding the blank).
        question: Text joined before every candidate (SWAG's start of the ending); None = the candidate alone.
        choices: The K candidates.
        label: The index of the right candidate; None in an unlabelled test split.
        id: The example's id, written with its prediction.
        where: `file:line` of the row, for error messages.
    """

    context: str
    question: str | None
    choices: tuple[str, ...]
    label: int | None
    id: str
    where: str


# ----------------------------------------------------------------------------------------------------------------
# Reading


def read_choices(record: Record, settings: ChoicesConfig) -> tuple[str, ...]:
    """The candidates of a record: a list field (a JSON list in a csv cell too), or one field per candidate.

    Raises:
        UserError: a missing field, a value that is not a list, an empty candidate; naming file and line.
    """
    if settings.choices_column:
        values = field(record, settings.choices_column)
        if isinstance(values, str) and values.lstrip().startswith("["):
            try:
                values = json.loads(values)
            except json.JSONDecodeError:
                pass  # reported as "not a list" below
        if not isinstance(values, list):
            raise UserError(f"{record.where}: field {settings.choices_column!r} is not a list of candidates")
    else:
        values = [field(record, column) for column in settings.choice_columns]
    for j, value in enumerate(values):
        if value is None or not str(value).strip():
            raise UserError(f"{record.where}: candidate {j} is empty")
    return tuple(str(value) for value in values)


def parse_choice_label(value: Any, choices: tuple[str, ...], where: str) -> int:
    """The index of the right candidate: an int, digits as text (csv), or the text of one of the candidates.

    Digits are read as an index even when a candidate is spelled the same (csv cells are all text).

    Raises:
        UserError: a value that is neither, or an index out of range, naming `where`.
    """
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # parquet and pandas-written files may hold 2.0
    if is_integer_text(value):
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < len(choices):
            raise UserError(f"{where}: label {value} is out of range ({len(choices)} candidates: 0-{len(choices) - 1})")
        return value
    matches = [j for j, choice in enumerate(choices) if isinstance(value, str) and choice.strip() == value.strip()]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise UserError(f"{where}: label {value!r} matches candidates {matches} (it must name one)")
    raise UserError(f"{where}: label {value!r} is neither a candidate's index nor one of the candidates {choices}")


def read_label(record: Record, column: str, choices: tuple[str, ...], labelled: bool) -> int | None:
    """The record's label (`parse_choice_label`); None when an unlabelled split's record has none.

    Raises:
        UserError: a labelled split's record without a label, or a bad label, naming file and line.
    """
    try:
        value = field(record, column)
    except UserError:
        if labelled:
            raise
        value = None
    if value in NO_LABEL:
        if labelled:
            raise UserError(f"{record.where}: no label in {column!r} (training and dev examples need one)")
        return None
    return parse_choice_label(value, choices, record.where)


def read_questions(records: list[Record], data: FinetuneDataConfig, labelled: bool) -> list[ChoiceQuestion]:
    """The questions of one split's records.

    Args:
        records: The split's rows.
        data: The data: section (its `choices:` section names the fields).
        labelled: Whether every row needs a label (training and dev); a test split has labels on every row or none.

    Raises:
        UserError: a missing field, a bad label, a blank missing or repeated, a test split labelled only in part.
    """
    settings = data.choices
    assert settings is not None  # FinetuneDataConfig fills it for type: multiple_choice
    questions = []
    for number, record in enumerate(records):
        context = text_field(record, settings.context_column)
        if settings.blank and context.count(settings.blank) != 1:
            raise UserError(
                f"{record.where}: {context.count(settings.blank)} blanks {settings.blank!r} in "
                f"{settings.context_column!r}, one expected"
            )
        question = text_field(record, settings.question_column) if settings.question_column else None
        choices = read_choices(record, settings)
        label = read_label(record, data.label_column, choices, labelled)
        ids = example_id(record, data.id_column, number)
        questions.append(ChoiceQuestion(context, question, choices, label, ids, record.where))
    check_all_or_none_labelled(questions)
    return questions


def check_all_or_none_labelled(questions: list[ChoiceQuestion]) -> None:
    """An unlabelled split has no labels at all: evaluating a part of it would silently score a subset.

    Raises:
        UserError: naming the first unlabelled row and a labelled one.
    """
    labelled = [q for q in questions if q.label is not None]
    if labelled and len(labelled) < len(questions):
        missing = next(q for q in questions if q.label is None)
        raise UserError(f"{missing.where}: no label, but {labelled[0].where} has one (label every row or none)")


def check_same_count(splits: dict[str, list[ChoiceQuestion]]) -> int:
    """K, the number of candidates every question of every split has.

    Raises:
        UserError: a question with another count (naming it and the first question), or fewer than 2 candidates.
    """
    first = next(q for questions in splits.values() for q in questions)
    count = len(first.choices)
    if count < 2:
        raise UserError(f"{first.where}: {count} candidate; multiple choice needs at least 2")
    for questions in splits.values():
        for q in questions:
            if len(q.choices) != count:
                raise UserError(
                    f"{q.where}: {len(q.choices)} candidates, but {first.where} has {count} "
                    "(every question of a task needs the same number)"
                )
    return count


def load_questions(data: FinetuneDataConfig) -> dict[str, list[ChoiceQuestion]]:
    """Every split's questions (train and dev labelled), cut to max_train_examples / max_eval_examples.

    Raises:
        UserError: anything `read_split_records` or `read_questions` refuses.
    """
    records = cut_to_limits(read_split_records(data), data.max_train_examples, data.max_eval_examples)
    return {split: read_questions(rows, data, labelled=split != "test") for split, rows in records.items()}


# ----------------------------------------------------------------------------------------------------------------
# Encoding


@dataclass
class EncodedChoices:
    """A split tokenized: K rows of ids per question, question after question (ragged: batches pad).

    Attributes:
        ids: Token ids of every (question, candidate): question i's candidate j is row i * K + j.
        types: Their token types (0 for the first text, 1 for the second of a pair).
        labels: The right candidate of every question (None: unlabelled).
        index: The id of every question.
        num_choices: K.
        lengths: The tokens of every question's longest candidate: batch order and padding.
    """

    ids: list[list[int]]
    types: list[list[int]]
    labels: list[int | None]
    index: list[str]
    num_choices: int
    lengths: list[int]

    @classmethod
    def of(
        cls, ids: list[list[int]], types: list[list[int]], questions: list[ChoiceQuestion], num_choices: int
    ) -> EncodedChoices:
        """The encoded split of `questions`, whose candidates' ids and types are `ids` and `types`."""
        K = num_choices
        lengths = [max(len(row) for row in ids[i * K : (i + 1) * K]) for i in range(len(questions))]
        return cls(ids, types, [q.label for q in questions], [q.id for q in questions], K, lengths)

    @property
    def labelled(self) -> bool:
        """Whether the split has labels."""
        return bool(self.labels) and self.labels[0] is not None

    @property
    def sequences(self) -> int:
        """K: a row holds every candidate of its question."""
        return self.num_choices

    @property
    def tokens(self) -> list[int]:
        """Real tokens of every question: all its candidates'."""
        K = self.num_choices
        return [sum(len(row) for row in self.ids[i * K : (i + 1) * K]) for i in range(len(self.lengths))]


def identity(text: str) -> str:
    """No pre-segmentation."""
    return text


def encode_pairs(
    questions: list[ChoiceQuestion],
    tokenizer: Tokenizer,
    max_length: int,
    num_choices: int,
    segment: Segmenter = identity,
) -> EncodedChoices:
    """SWAG-style: each candidate as the pair `[CLS] context [SEP] question candidate [SEP]`, cut longest-first.

    Without a question the second text is the candidate alone.
    """
    firsts, seconds = [], []
    for q in questions:
        context = segment(q.context)
        lead = segment(q.question) + " " if q.question else ""
        for choice in q.choices:
            firsts.append(context)
            seconds.append(lead + segment(choice))
    if not firsts:
        return EncodedChoices.of([], [], questions, num_choices)
    out = tokenizer(firsts, seconds, truncation="longest_first", max_length=max_length, return_token_type_ids=True)
    return EncodedChoices.of(out["input_ids"], out["token_type_ids"], questions, num_choices)


def blank_window(left: int, middle: int, right: int, budget: int) -> tuple[int, int]:
    """How many tokens of the left and right context to keep around `middle` tokens, `budget` tokens in all.

    Each side gets half the room the middle leaves (the right one the odd token); a side with fewer tokens than its
    half gives the rest to the other. Assumes `middle <= budget`.

    Returns:
        (tokens kept at the end of the left side, tokens kept at the start of the right side).
    """
    room = budget - middle
    keep_left = min(left, max(room // 2, room - right))
    return keep_left, min(right, room - keep_left)


def encode_filled(
    questions: list[ChoiceQuestion],
    blank: str,
    tokenizer: Tokenizer,
    max_length: int,
    num_choices: int,
    segment: Segmenter = identity,
) -> EncodedChoices:
    """CHID-style: each candidate in the context's blank, `[CLS] left candidate right [SEP]`, windowed on the blank.

    The sides of the blank are tokenized once per question, the candidates once each (see the module docstring).

    Raises:
        UserError: a candidate longer than max_length - 2 tokens (it cannot be read whole), naming file and line.
    """
    sides = [q.context.split(blank) for q in questions]  # two each: read_questions checked one blank
    texts = [segment(side) for pair in sides for side in pair] + [segment(c) for q in questions for c in q.choices]
    tokens = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    cls, sep, budget = tokenizer.cls_token_id, tokenizer.sep_token_id, max_length - 2
    ids = []
    for i, q in enumerate(questions):
        left, right = tokens[2 * i], tokens[2 * i + 1]
        for j in range(num_choices):
            middle = tokens[2 * len(questions) + i * num_choices + j]
            if len(middle) > budget:
                raise UserError(
                    f"{q.where}: candidate {j} has {len(middle)} tokens, more than max_length - 2 = {budget}"
                )
            keep_left, keep_right = blank_window(len(left), len(middle), len(right), budget)
            ids.append([cls, *left[len(left) - keep_left :], *middle, *right[:keep_right], sep])
    return EncodedChoices.of(ids, [[0] * len(row) for row in ids], questions, num_choices)


# ----------------------------------------------------------------------------------------------------------------
# The fine-tuning task


class ChoicesTask(HeadOutputs):
    """A multiple-choice task with its splits read: the fine-tuning task of `type: multiple_choice`.

    Args:
        data: The data: section (its `choices:` section says where the candidates are).
        splits: Its questions per split: `train`, `dev` and optionally `test` (`load_questions`).
        segment: Pre-segmentation of every text before tokenizing (jieba), or none.
    """

    architecture = "multiple_choice"

    def __init__(
        self, data: FinetuneDataConfig, splits: dict[str, list[ChoiceQuestion]], segment: Segmenter = identity
    ) -> None:
        assert data.choices is not None  # FinetuneDataConfig requires the section for this type
        super().__init__(data)
        self.splits, self.settings, self.segment = splits, data.choices, segment
        self.num_choices = check_same_count(splits)
        # informational: MultipleChoice scores each candidate with one output whatever num_labels says
        self.num_labels = self.num_choices
        self.test_splits = ["test"] if "test" in splits else []

    @classmethod
    def from_config(cls, data: FinetuneDataConfig) -> ChoicesTask:
        """The task of a data: section, its splits read (and jieba loaded when `data.jieba`).

        Raises:
            UserError: unreadable data, bad rows (naming file and line), jieba missing.
        """
        segment = jieba_presegmenter() if data.jieba else identity
        return cls(data, load_questions(data), segment)

    def check_model(self, config: ModelConfig) -> ModelFacts:
        """A warning that `classifier_head: mlp` reads each candidate's last position, padding included (as HF does)."""
        if config.classifier_head != "mlp":
            return NO_FACTS
        # HF's sequence summary: a padding position for all but the longest
        return ModelFacts(
            warnings=(
                "multiple choice with classifier_head: mlp scores each candidate at the last position, padding "
                "included (as HF does): predictions depend on how batches are padded; model.classifier_head: pooler "
                "reads [CLS]",
            )
        )

    def encode(self, tokenizer: Tokenizer, max_length: int, model: ModelFacts = NO_FACTS) -> dict[str, EncodedChoices]:
        """Every split tokenized: K sequences per question, at most `max_length` tokens each."""
        K, blank = self.num_choices, self.settings.blank
        # jieba: the tokenizer's vocabulary decides which words stay whole (the others are spelled out)
        segment = identity if self.segment is identity else jieba_presegmenter(tokenizer)
        if blank:
            return {
                name: encode_filled(questions, blank, tokenizer, max_length, K, segment)
                for name, questions in self.splits.items()
            }
        return {
            name: encode_pairs(questions, tokenizer, max_length, K, segment) for name, questions in self.splits.items()
        }

    def collate(self, split: EncodedChoices, rows: list[int], pad_id: int, cap: int) -> dict[str, torch.Tensor]:
        """(B, K, T) input_ids, token_type_ids and attention_mask of `rows`; labels (B,) when the split has them."""
        K = split.num_choices
        length = self.padded_length(max(split.lengths[r] for r in rows), cap)
        flat = [r * K + j for r in rows for j in range(K)]
        batch = {
            key: value.view(len(rows), K, length)
            for key, value in pad_rows(split.ids, split.types, flat, pad_id, length).items()
        }
        if split.labels[rows[0]] is not None:
            batch["labels"] = torch.tensor([split.labels[r] for r in rows], dtype=torch.long)
        return batch

    def predictions(self, logits: torch.Tensor, split: EncodedChoices, rows: list[int]) -> list[int]:
        """The chosen candidate of every row: the argmax of its (K,) scores."""
        return logits.argmax(-1).cpu().tolist()

    def evaluate(self, split: EncodedChoices, predictions: list[int]) -> dict[str, float]:
        """The metrics (accuracy) of the chosen indices against the labels, and `score`, their mean."""
        return compute(self.metrics, predictions, split.labels)

    def trivial_guess(self, train: EncodedChoices) -> Guess | None:
        """The candidate position most often right in training, for every question."""
        guess = label_guess(train.labels)
        return None if guess is None else Guess("commonest_answer", guess.predict)

    def write_predictions(
        self, folder: Path, encoded: dict[str, EncodedChoices], predictions: dict[str, list[int]]
    ) -> None:
        """`<split>.jsonl` of every dev and test split: `{"id", "prediction", "label"}` (no label when unlabelled)."""
        for split in self.dev_splits + self.test_splits:
            lines = []
            for index, predicted, label in zip(encoded[split].index, predictions[split], encoded[split].labels):
                row = {"id": index, "prediction": predicted} | ({} if label is None else {"label": label})
                lines.append(json.dumps(row, ensure_ascii=False) + "\n")
            atomic_write_text(folder / f"{split}.jsonl", "".join(lines))

    def write_submission(self, run_folder: Path, submission: Path) -> None:
        """Copy the selected run's test predictions (`test.jsonl`) into `submission` (nothing without a test split)."""
        for split in self.test_splits:
            atomic_copy(run_folder / f"{split}.jsonl", submission / f"{split}.jsonl")


SPECS = (
    TaskSpec(
        name="multiple_choice",
        summary="a context (and question) with K candidates, one right (SWAG, CHID)",
        builder=ChoicesTask.from_config,
        architecture="multiple_choice",
        metrics=("accuracy",),
        default_metrics=("accuracy",),
        predictions="dev.jsonl",
        docs="task-multiple-choice.md",
        section="choices",
        settings=ChoicesConfig,
        section_required=True,
        capabilities=(ChecksModel,),
    ),
)
