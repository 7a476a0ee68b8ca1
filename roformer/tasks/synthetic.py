"""`type: synthetic`: tasks where position is the whole difficulty, generated from a seed and trained from scratch.

The tasks, their settings (`data.synthetic`, `SyntheticConfig`), rows and splits are roformer.tasks.synthetic_rows';
their position-blind floors roformer.tasks.synthetic_floors'. Here is the task type: the model is built from the
config's `model:` section (`init:` empty) with the task's vocabulary (the specials, the symbols and the task's
markers, as a word-level tokenizer written with the model), trained by its MLM head at the [MASK] positions, scored
at every test length beside the split's position-blind floor and, with `extensions`, under each test-time context
extension method (roformer.tasks.extensions).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from roformer.errors import ConfigError, UserError
from roformer.files import atomic_write_text
from roformer.labels import IGNORE_INDEX
from roformer.tasks.base import NO_FACTS, ChecksModel, HeadOutputs, ModelFacts, ScoresVariants, TaskSpec, with_score
from roformer.tasks.extensions import EvalVariant, parse_extensions
from roformer.tasks.synthetic_floors import Floor, floors
from roformer.tasks.synthetic_rows import (
    Row,
    SyntheticConfig,
    SyntheticSplit,
    encode_synthetic_split,
    generate_rows,
    row_key,
    split_lengths,
    split_seed,
    test_split_name,
    vocabulary,
    word_level_tokenizer,
)

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer
    from roformer.model.config import ModelConfig
    from roformer.tasks.config import FinetuneDataConfig

# ----------------------------------------------------------------------------------------------------------------
# The task


class SyntheticTask(HeadOutputs):
    """A generated task trained from scratch by the MLM head: `type: synthetic`.

    Args:
        data: The data: section (its `synthetic:` settings).
    """

    architecture = "masked_lm"
    num_labels = 2  # unused by the MLM head
    micro_batch_loss = "the MLM loss is a mean over a micro-batch's masked tokens"

    def __init__(self, data: FinetuneDataConfig) -> None:
        super().__init__(data)
        self.settings: SyntheticConfig = data.synthetic or SyntheticConfig()
        self.tokens = vocabulary(self.settings)
        self.extensions = parse_extensions(self.settings.extensions)  # checked when the config was read
        self.test_splits = [test_split_name(m) for m in self.settings.test_multiples]
        self._training_rows: list[Row] | None = None
        self._floors: dict[str, list[Floor]] | None = None

    @classmethod
    def from_config(cls, data: FinetuneDataConfig) -> SyntheticTask:
        """The task of a data: section (its splits are generated when encoded)."""
        return cls(data)

    def tokenizer(self) -> Tokenizer:
        """The task's own vocabulary, written with the model it trains."""
        return word_level_tokenizer(self.tokens)

    def check_model(self, config: ModelConfig) -> ModelFacts:
        """What the model must take: the longest test row (or randomized range), its positions and extensions.

        A learned position table must hold the longest test row (or the randomized range); real positions and every
        test-time extension must be defined for the encoding.

        Raises:
            UserError: naming the field: model.max_position_embeddings and what it needs, randomized_kind: float
                for an encoding of integer positions, or an extension the encoding has no meaning for.
        """
        settings = self.settings
        needed = settings.randomized_positions or settings.longest_row + 2
        if not config.holds_positions(needed):
            raise UserError(
                f"model.max_position_embeddings ({config.max_position_embeddings}) must hold {needed} positions: the "
                "longest test row, or synthetic.randomized_positions"
            )
        spec = config.encoding
        if settings.randomized_kind == "float" and spec.acts != "nothing" and not spec.real_positions:
            raise UserError(
                f"data.synthetic.randomized_kind: float draws real positions; {spec.name} reads them as table rows or "
                "buckets (use randomized_kind: integer)"
            )
        for extension in self.extensions:
            reason = extension.refusal(config)
            if reason is not None:
                raise UserError(f"data.synthetic.extensions: {extension.label}: {reason}")
            for split in self.test_splits:
                try:
                    extension.variant(config, *self.extension_lengths(split))  # ModelConfig's own checks
                except ConfigError as e:
                    raise UserError(f"data.synthetic.extensions: {extension.label} at {split}: {e}") from None
        return NO_FACTS

    def extension_lengths(self, split: str) -> tuple[int, int, int | None]:
        """(trained, split, trained positions): what extensions scale between.

        The lengths are the longest rows with [CLS] and [SEP]; the trained range of positions is given where it is
        not the trained length (`randomized_positions`, else None). That range holds the longest test row, so a test
        row's positions never leave it and the position methods' default factor is 1: there is nothing to extend.
        """
        settings = self.settings
        trained, length = split_lengths(settings, "train")[1] + 2, split_lengths(settings, split)[1] + 2
        return trained, length, settings.randomized_positions

    def test_variants(self, config: ModelConfig, split: str) -> dict[str, EvalVariant]:
        """{label: how the model is evaluated under it} for every `extensions` method at the test split `split`."""
        if split not in self.test_splits:
            return {}
        lengths = self.extension_lengths(split)
        return {e.label: e.variant(config, *lengths) for e in self.extensions}

    def encode(self, tokenizer: Tokenizer, max_length: int, model: ModelFacts = NO_FACTS) -> dict[str, SyntheticSplit]:
        """Every split generated in the tokenizer's ids (the task's own vocabulary).

        Raises:
            UserError: a test row longer than `max_length` (data.max_length), which would be cut.
        """
        self.check_length(max_length)
        ids = tokenizer.get_vocab()
        return {name: self.split(name, ids) for name in ["train", *self.evaluated_splits]}

    def check_length(self, max_length: int) -> None:
        """The longest test row must fit `max_length` (data.max_length, capped at a learned table) uncut.

        Raises:
            UserError: it does not, naming data.max_length.
        """
        if self.settings.longest_row + 2 > max_length:
            raise UserError(
                f"data.max_length ({max_length}) is shorter than the longest test row ({self.settings.longest_row} "
                f"tokens + [CLS] and [SEP]): raise it"
            )

    def split(self, name: str, ids: dict[str, int]) -> SyntheticSplit:
        """One split (`train`, `dev` or `test_<m>x`) in the token ids `ids`: each split from a seed of its own."""
        lengths = split_lengths(self.settings, name)
        return encode_synthetic_split(self.settings, ids, self.rows(name), lengths, split_seed(self.settings, name))

    def rows(self, name: str) -> list[Row]:
        """A split's generated rows; dev's and those of a test split at a trained length exclude the training rows.

        Raises:
            ConfigError: too few distinct rows to keep them apart (`generate_rows`).
        """
        settings = self.settings
        lengths, seed = split_lengths(settings, name), split_seed(settings, name)
        if name == "train":
            if self._training_rows is None:  # kept: every split apart from it asks for it
                self._training_rows = generate_rows(settings, settings.train_examples, lengths, seed)
            return self._training_rows
        shortest, longest = settings.train_lengths
        trained = lengths[0] <= longest and lengths[1] >= shortest  # it could draw a training row
        exclude = {row_key(row) for row in self.rows("train")} if trained else frozenset()
        return generate_rows(settings, settings.eval_examples, lengths, seed, exclude)

    def floors(self) -> dict[str, list[Floor]]:
        """Per dev and test split, its position-blind floor and the simpler guesses worth reading against."""
        if self._floors is None:  # computed once: every run of the job asks for them
            self._floors = {
                name: floors(self.settings, split_lengths(self.settings, name)) for name in self.evaluated_splits
            }
        return self._floors

    @property
    def evaluated_splits(self) -> list[str]:
        """The dev split, then the test splits."""
        return [*self.dev_splits, *self.test_splits]

    def baseline(self, splits: dict[str, Any], split: str) -> dict[str, Any]:
        """results.json's `baseline` of a dev or test split: its position-blind floor, simpler guesses beside it.

        `{"kind": "position_blind", "accuracy", "sequence_accuracy", "score", "guess", "method", "references": [...]}`,
        of the generator's distribution at the split's lengths (not of its few hundred rows, whose answers the floor
        does not look at); `references` holds the simpler guesses worth reading against (missing-duplicate's frequent
        bit), scored alike.
        """
        floor, *references = self.floors()[split]
        metrics = {"accuracy": floor.accuracy, "sequence_accuracy": floor.sequence_accuracy}
        return {
            **floor.to_dict(),
            "score": with_score(metrics, self.metrics)["score"],
            "references": [level.to_dict() for level in references],
        }

    def collate(self, split: SyntheticSplit, rows: list[int], pad_id: int, cap: int) -> dict[str, torch.Tensor]:
        """Padded ids, mask and labels of `rows`, and `position_ids` when the positions are randomized."""
        length = self.padded_length(max(len(split.ids[r]) for r in rows), cap)
        ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        labels = torch.full((len(rows), length), IGNORE_INDEX, dtype=torch.long)
        kind = torch.float32 if self.settings.randomized_kind == "float" else torch.long
        positions = torch.zeros((len(rows), length), dtype=kind) if split.positions is not None else None
        for i, r in enumerate(rows):
            n = len(split.ids[r])
            ids[i, :n], labels[i, :n], mask[i, :n] = torch.tensor(split.ids[r]), torch.tensor(split.labels[r]), 1
            if positions is not None:
                positions[i, :n] = torch.tensor(split.positions[r])
        batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
        if positions is not None:
            batch["position_ids"] = positions
        return batch

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The masked-token loss; with `masked_logits_only`, the vocabulary projection at the asked positions alone."""
        return model(**batch, masked_only=self.settings.masked_logits_only).loss

    def outputs(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], split: Any = None) -> torch.Tensor:
        """The MLM logits (B, T, V), the randomized positions given; or (N, V) at the asked positions alone.

        With `masked_logits_only` the asked positions alone, row by row: Zoology's 8,192 tokens over 500 rows of
        514 would be 8 GB of logits.
        """
        if self.settings.masked_logits_only:
            return model(**batch, masked_only=True).logits  # (N, V); the labels say where, and are not read
        return model(**{k: v for k, v in batch.items() if k != "labels"}).logits

    def predictions(self, logits: torch.Tensor, split: SyntheticSplit, rows: list[int]) -> list[list[int]]:
        """Per row, the predicted id at every asked position, in order (from (B, T, V) or the asked (N, V))."""
        if logits.dim() == 2:  # the asked positions' logits, row by row
            counts = [sum(label != IGNORE_INDEX for label in split.labels[r]) for r in rows]
            return [chunk.tolist() for chunk in logits.argmax(-1).cpu().split(counts)]
        best = logits.argmax(-1).cpu()  # (B, T)
        return [
            [int(best[i, p]) for p, label in enumerate(split.labels[r]) if label != IGNORE_INDEX]
            for i, r in enumerate(rows)
        ]

    def evaluate(self, split: SyntheticSplit, predictions: list[list[int]]) -> dict[str, float]:
        """`accuracy` over the asked positions, `sequence_accuracy` over rows (all of a row's answers right)."""
        right = rows_right = total = 0
        for labels, predicted in zip(split.labels, predictions, strict=True):
            gold = [label for label in labels if label != IGNORE_INDEX]
            hits = sum(p == g for p, g in zip(predicted, gold, strict=True))
            right, total, rows_right = right + hits, total + len(gold), rows_right + (hits == len(gold))
        scores = {"accuracy": right / total, "sequence_accuracy": rows_right / len(split.labels)}
        return with_score(scores, self.metrics)

    def write_predictions(
        self, folder: Path, encoded: dict[str, SyntheticSplit], predictions: dict[str, list[list[int]]]
    ) -> None:
        """`<split>.jsonl` per dev and test split: every row's ids, answers and predictions (token names)."""
        names = self.tokens
        for split in self.evaluated_splits:
            data = encoded[split]
            lines = []
            for ids, labels, predicted in zip(data.ids, data.labels, predictions[split], strict=True):
                gold = [names[label] for label in labels if label != IGNORE_INDEX]
                row = {
                    "input": " ".join(names[i] for i in ids),
                    "answers": gold,
                    "predicted": [names[p] for p in predicted],
                }
                lines.append(json.dumps(row))
            atomic_write_text(folder / f"{split}.jsonl", "".join(line + "\n" for line in lines))

    def write_submission(self, run_folder: Path, submission: Path) -> None:
        """Nothing: a synthetic task has no benchmark server."""


SPECS = (
    TaskSpec(
        name="synthetic",
        summary="generated length-generalization tasks (shift, missing-duplicate, passkey-binding, mqar), from scratch",
        builder=SyntheticTask.from_config,
        architecture="masked_lm",
        metrics=("accuracy", "sequence_accuracy"),
        default_metrics=("accuracy",),
        predictions="dev.jsonl",
        docs="length-generalization.md",
        section="synthetic",
        settings=SyntheticConfig,
        needs_validation_file=lambda data: False,
        own_vocabulary=True,
        capabilities=(ChecksModel, ScoresVariants),
    ),
)
