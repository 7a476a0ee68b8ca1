"""Which of two candidates is closer to an anchor text (`type: triplet`): CAIL2019-SCM, similar case matching.

A row is a triplet (A, B, C) and its label names the closer candidate. As in the RoFormer authors' recipe
(ZhuiyiTechnology/roformer, `finetune_scm.py`; the paper's Table 5), each triplet becomes two text pairs, (A, B) and
(A, C), each read as one sequence `[CLS] A [SEP] X [SEP]` cut longest-first to `max_length` (the longer text loses
its tail, so at 512 each document keeps about 254 tokens, at 1024 about 510). The model scores a pair with one logit
over the mean of its last hidden states (`classifier_head: mean`, a sequence classifier with one output), trained
with binary cross-entropy: the closer pair 1, the other 0. A triplet is right when its closer pair scores strictly
higher (a tie is wrong, as in the authors' accuracy). Each pair is scored alone, so the order of the candidates
in a row cannot be learned: data whose closer candidate is always B (CAIL2019-SCM's released training files) is no
easier than data in any order.

`data.triplet.mirror` adds each pair with its texts swapped to the training rows; `data.triplet.folds` cross-validates
one file (rows grouped by anchor: an anchor text is held out with all its rows; a document may still recur as a
candidate on both sides, as in CAIL2019-SCM's sample, whose documents form one connected web of triplets).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from roformer.config import check_types
from roformer.data.tokenizer import jieba_presegmenter
from roformer.errors import ConfigError, UserError
from roformer.tasks.base import (
    MODEL_INPUTS,
    NO_FACTS,
    CrossValidates,
    HeadOutputs,
    ModelFacts,
    TaskSpec,
    pad_rows,
    write_tsv,
)
from roformer.tasks.baselines import Guess, commonest
from roformer.tasks.config import FinetuneDataConfig
from roformer.tasks.objectives import pair_bce_loss
from roformer.tasks.records import Record, read_split_records
from roformer.tasks.texts import PREDICTIONS_FILE, TextRows, copy_predictions, segmented

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer

EVALUATED_PAIRS = 2  # (anchor, first candidate), (anchor, second candidate): what prediction scores


@dataclass
class TripletConfig:
    """`data.triplet:` of `type: triplet`: which of two candidates is closer to an anchor text (CAIL2019-SCM).

    Each row holds an anchor (the first of `text_columns`) and two candidates (the other two); the label names the
    closer candidate's column. The model scores each (anchor, candidate) pair as a text pair (one logit, trained with
    binary cross-entropy: the closer pair 1, the other 0); a row is right when its closer pair scores higher. This is
    the RoFormer authors' CAIL2019-SCM recipe (`finetune_scm.py`).

    Attributes:
        unlabelled_closer: The candidate column that is closer in a row without a label (CAIL2019-SCM's released
            training files carry none: its rules guarantee sim(A, B) > sim(A, C)); null = such a row is unlabelled
            (a test row, predicted only).
        mirror: Also train on every pair with its two texts swapped (candidate first, anchor second), as CAIL2019
            competitors augmented; the evaluation reads the pairs as given.
        folds: k-fold cross-validation of `train_file` instead of a `validation_file`: rows are grouped by anchor
            text (an anchor's rows stay in one fold; a candidate document may recur in others), the groups dealt into
            `folds` folds in a fixed shuffled order, and every (lr, seed) of the grid runs once per fold, holding it
            out as its dev split (`fold` in results.json's runs): results.json gives the mean and interval over
            folds (and seeds), the cross-validation estimate. `best/` is the best of those runs, a model trained on
            the other k-1 folds and selected on its own held-out fold (so its dev score is the best fold's).
    """

    unlabelled_closer: str | None = None
    mirror: bool = False
    folds: int | None = None

    def __post_init__(self) -> None:
        check_types(self)
        if self.folds is not None and self.folds < 2:
            raise ConfigError(f"triplet.folds must be >= 2 or null (a validation_file), got {self.folds}")


@dataclass
class TripletRows:
    """A split of triplets as text pairs, each row's pairs side by side.

    Row i's pairs are ids[i][0] (anchor, first candidate), ids[i][1] (anchor, second candidate), and in a mirrored
    training split ids[i][2], ids[i][3] (the same pairs, texts swapped). Labels are the closer candidate's position
    (0: the first, 1: the second), None when unlabelled.
    """

    ids: list[list[list[int]]]
    types: list[list[list[int]]]
    labels: list[int | None]
    index: list[str]

    @property
    def sequences(self) -> int:
        """Pairs per row, each a sequence of the batch: 2, or 4 mirrored."""
        return len(self.ids[0]) if self.ids else EVALUATED_PAIRS

    @property
    def lengths(self) -> list[int]:
        """The longest pair of every row: what its batch is padded to."""
        return [max(map(len, pairs)) for pairs in self.ids]

    @property
    def tokens(self) -> list[int]:
        """Real tokens of every row: all its pairs."""
        return [sum(map(len, pairs)) for pairs in self.ids]

    @property
    def labelled(self) -> bool:
        return bool(self.labels) and self.labels[0] is not None

    def subset(self, rows: list[int], pairs: int | None = None) -> TripletRows:
        """Rows `rows` of this split, with their first `pairs` pairs (all by default)."""
        return TripletRows(
            [self.ids[r][:pairs] for r in rows],
            [self.types[r][:pairs] for r in rows],
            [self.labels[r] for r in rows],
            [self.index[r] for r in rows],
        )


def fold_of_rows(anchors: list[str], folds: int) -> list[int]:
    """Each row's fold: rows grouped by anchor text, the groups in a fixed shuffled order dealt round-robin.

    A document that anchors several rows (CAIL2019-SCM's sample: 210 distinct anchors in 500 rows) has them all in one
    fold, so no held-out row's anchor anchors a training row. Candidates are not grouped: in that sample most
    documents are also another row's candidate, and the triplets link all but a few documents into one web, so no
    split keeps every document on one side. The order is seeded (0), the same in every run and process.
    """
    groups = list(dict.fromkeys(anchors))  # first-appearance order, then shuffled with a fixed seed
    random.Random(0).shuffle(groups)
    fold = {anchor: i % folds for i, anchor in enumerate(groups)}
    return [fold[a] for a in anchors]


class Candidates:
    """Labels that name the closer of a row's two candidate columns, read as its position (0: the first, 1: the second).

    A row without a label is closer at `unlabelled_closer` when that is set (CAIL2019-SCM's training files), else
    unlabelled (a test row, predicted only).
    """

    def __init__(self, candidates: list[str], closer: str | None, label_column: str) -> None:
        self.candidates, self.closer = candidates, closer
        self.missing_label = (
            f"no {label_column!r} (set data.triplet.unlabelled_closer to the candidate that is closer in unlabelled "
            "rows, e.g. B for CAIL2019-SCM's training files)"
        )

    def missing(self, raw: Any) -> bool:
        """No label field (or null), unless unlabelled rows have their closer candidate configured."""
        return raw is None and self.closer is None

    def fit(self, train: list[Record], raw: Callable[[Record], Any]) -> None:
        """Nothing to take: the candidates are the columns."""

    def parse(self, raw: Any, where: str) -> int:
        """The closer candidate's position.

        Raises:
            UserError: a label naming no candidate column, with file and line.
        """
        name = self.closer if raw is None else str(raw)
        if name not in self.candidates:
            raise UserError(f"{where}: label {raw!r} names no candidate column {self.candidates}")
        return self.candidates.index(name)

    def name(self, value: Any) -> str:
        """The candidate's column."""
        return self.candidates[int(value)]


class TripletTask(HeadOutputs):
    """Triplets (anchor, two candidates) scored as two text pairs by a one-logit head; accuracy over triplets.

    Rows are read by the shared text reader (roformer.tasks.texts.TextRows) with `Candidates` labels.

    Args:
        data: The data: section (type triplet; `text_columns` anchor and candidates, default A, B, C).
        records: The rows of every split (`read_split_records`).
    """

    architecture = "sequence_classification"

    def __init__(self, data: FinetuneDataConfig, records: dict[str, list[Record]]) -> None:
        assert data.triplet is not None  # FinetuneDataConfig fills the section of its type
        super().__init__(data)
        self.settings = data.triplet
        self.columns = data.text_columns or ["A", "B", "C"]
        self.candidates = list(self.columns[1:])
        closer = self.settings.unlabelled_closer
        if closer is not None and closer not in self.candidates:
            raise UserError(f"triplet.unlabelled_closer: {closer!r} is not a candidate column {self.candidates}")
        self.kind = Candidates(self.candidates, closer, data.label_column)
        rows = TextRows(data, records, self.kind, self.columns, (3, 3), "reads an anchor and two candidates")
        self.examples = rows.examples
        self.num_labels = 1
        self.test_splits = rows.test_splits
        self.cross_validation_folds = self.settings.folds
        if self.settings.folds:
            if data.source != "files":
                raise UserError("triplet.folds cross-validates train_file (source: files), not a hub dataset's splits")
            anchors = [texts[0] for texts, _, _ in self.examples["train"]]
            self.row_folds = fold_of_rows(anchors, self.settings.folds)
            if len(set(self.row_folds)) < self.settings.folds:
                raise UserError(
                    f"triplet.folds: {self.settings.folds} folds, but the training rows have "
                    f"{len(set(anchors))} distinct anchors"
                )

    @classmethod
    def from_config(cls, data: FinetuneDataConfig) -> TripletTask:
        """The task of a data: section, its splits read and checked (cut to data.max_*_examples)."""
        return cls(data, read_split_records(data))

    def label_name(self, value: Any) -> str:
        """The candidate column a label names."""
        return self.kind.name(value)

    # ------------------------------------------------------------------------------------------------------------
    # The protocol

    def encode(self, tokenizer: Tokenizer, max_length: int, model: ModelFacts = NO_FACTS) -> dict[str, TripletRows]:
        """Every split's triplets as pairs `[CLS] A [SEP] X [SEP]`, cut longest-first (and mirrored in training)."""
        segment = jieba_presegmenter(tokenizer) if self.data.jieba else None
        out = {}
        for name, examples in self.examples.items():
            columns = zip(*(texts for texts, _, _ in examples))
            anchor, first, second = (segmented(list(column), segment) for column in columns)
            pairs = [(anchor, first), (anchor, second)]
            if self.settings.mirror and name == "train":
                pairs += [(first, anchor), (second, anchor)]
            encoded = [
                tokenizer(a, b, truncation=True, max_length=max_length, return_token_type_ids=True) for a, b in pairs
            ]
            ids = [list(row) for row in zip(*(e["input_ids"] for e in encoded))]
            types = [list(row) for row in zip(*(e["token_type_ids"] for e in encoded))]
            out[name] = TripletRows(ids, types, [e[1] for e in examples], [e[2] for e in examples])
        return out

    def splits_for_run(self, encoded: dict[str, TripletRows], fold: int | None) -> dict[str, TripletRows]:
        """The splits of the run holding out `fold`: with `folds`, the other folds train and `fold` is `dev`.

        The held-out fold's pairs are read as given, not mirrored. Without folds: the splits as they are.
        """
        if fold is None:
            return encoded
        train = encoded["train"]
        kept = [r for r, held in enumerate(self.row_folds) if held != fold]
        dev = [r for r, held in enumerate(self.row_folds) if held == fold]
        return {**encoded, "train": train.subset(kept), "dev": train.subset(dev, EVALUATED_PAIRS)}

    def collate(self, split: TripletRows, rows: list[int], pad_id: int, cap: int) -> dict[str, torch.Tensor]:
        """Every pair of `rows` as one (B * pairs, T) batch, row by row.

        With labels, each pair's target too: 1 for the anchor with its closer candidate (in either order), else 0.
        """
        pairs = split.sequences
        ids = [p for r in rows for p in split.ids[r]]
        types = [t for r in rows for t in split.types[r]]
        length = self.padded_length(max(len(p) for p in ids), cap)
        batch = pad_rows(ids, types, list(range(len(ids))), pad_id, length)
        batch["pairs_per_row"] = torch.tensor(pairs)
        if split.labelled:
            # pair j holds candidate j % 2 (mirrored pairs repeat the order)
            targets = [float(j % 2 == split.labels[r]) for r in rows for j in range(pairs)]
            batch["pair_targets"] = torch.tensor(targets)
        return batch

    def pair_logits(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The one logit of every pair of the batch, (B * pairs,), float32."""
        return model(**{k: batch[k] for k in MODEL_INPUTS if k in batch}).logits[:, 0].float()

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Binary cross-entropy of every pair's logit against its target (the authors' sigmoid unit)."""
        return pair_bce_loss(self.pair_logits(model, batch), batch["pair_targets"])

    def outputs(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], split: Any = None) -> torch.Tensor:
        """Each row's two scores (B, 2): the anchor with its first and with its second candidate."""
        return self.pair_logits(model, batch).view(-1, int(batch["pairs_per_row"]))[:, :EVALUATED_PAIRS]

    def predictions(self, logits: torch.Tensor, split: TripletRows, rows: list[int]) -> list[Any]:
        """Each row's two scores."""
        return [tuple(row) for row in logits.cpu().tolist()]

    def evaluate(self, split: TripletRows, predictions: list[Any]) -> dict[str, float]:
        """Accuracy: the fraction of triplets whose closer candidate scores strictly higher (a tie is wrong)."""
        right = [scores[y] > scores[1 - y] for scores, y in zip(predictions, split.labels, strict=True)]
        accuracy = sum(right) / len(right)
        return {"accuracy": accuracy, "score": accuracy}

    def trivial_guess(self, train: TripletRows) -> Guess | None:
        """The candidate more often closer in training, for every triplet (scores that always pick it)."""
        known = [label for label in train.labels if label is not None]
        if not known:
            return None
        scores = (1.0, 0.0) if commonest(known) == 0 else (0.0, 1.0)
        return Guess("majority_class", lambda split: [scores] * len(split.labels))

    def choice(self, scores: tuple[float, float]) -> str:
        """The candidate a row's scores pick, `tie` when they are equal."""
        if scores[0] == scores[1]:
            return "tie"
        return self.candidates[0] if scores[0] > scores[1] else self.candidates[1]

    def write_predictions(
        self, folder: Path, encoded: dict[str, TripletRows], predictions: dict[str, list[Any]]
    ) -> None:
        """`<split>.tsv`: index, the chosen candidate, both scores (and the label where the split has labels)."""
        for split, values in predictions.items():
            header = ["index", "prediction", *(f"score_{c}" for c in self.candidates)]
            rows = [[i, self.choice(s), f"{s[0]:.6g}", f"{s[1]:.6g}"] for i, s in zip(encoded[split].index, values)]
            if encoded[split].labelled:
                header.append("label")
                rows = [[*row, self.label_name(y)] for row, y in zip(rows, encoded[split].labels)]
            write_tsv(folder / PREDICTIONS_FILE.format(split=split), header, rows)

    def write_submission(self, run_folder: Path, submission: Path) -> None:
        """The selected run's test predictions, when there is a test split."""
        copy_predictions(run_folder, submission, self.test_splits)


def _check_folds(data: FinetuneDataConfig) -> None:
    """Cross-validation folds hold out parts of train_file: no validation_file beside them."""
    if not data.triplet.folds:
        return
    if data.validation_file:
        raise ConfigError("triplet.folds holds out folds of train_file: validation_file would go unused")
    if data.source == "files" and not data.train_file:
        raise ConfigError("triplet.folds needs train_file (its rows are dealt into folds)")


SPECS = (
    TaskSpec(
        name="triplet",
        summary="which of two candidates is closer to an anchor (CAIL2019-SCM): two scored pairs a row",
        builder=TripletTask.from_config,
        architecture="sequence_classification",
        metrics=("accuracy",),
        default_metrics=("accuracy",),
        predictions=PREDICTIONS_FILE.format(split="dev"),
        docs="chinese.md#cail2019-scm-type-triplet",
        section="triplet",
        settings=TripletConfig,
        check=_check_folds,
        needs_validation_file=lambda data: not (data.triplet and data.triplet.folds),
        capabilities=(CrossValidates,),
    ),
)
