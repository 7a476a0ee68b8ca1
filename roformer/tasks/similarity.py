"""Sentence similarity with a bi-encoder (`type: similarity`): the cosine of two texts' vectors scores the pair.

Each text of a pair is encoded alone and pooled into a vector (`data.similarity.pooling`).

Training: CoSENT on pairs with scores (Su 2022, "CoSENT: a more efficient sentence vector scheme than
Sentence-BERT"; text2vec trains its Chinese models so), or in-batch negatives on pairs without scores (each text's
partner against every other partner in the batch: InfoNCE, as SimCSE and sentence-transformers'
MultipleNegativesRankingLoss). Evaluation: the Spearman correlation (and Pearson, if asked) of the cosines with the
gold scores, as the STS benchmarks are reported. The model is a bare backbone: its `best/` directory is what
`roformer embed` and `SentenceEncoder` read, with the pooling it was trained with in `best/sentence.json`.

Rows come from any file or hub dataset as for classification (roformer.tasks.classify: two `text_columns`, the score in
`label_column`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F

from roformer.config import check_types
from roformer.data.tokenizer import jieba_presegmenter
from roformer.errors import ConfigError
from roformer.tasks.base import NO_FACTS, HeadOutputs, ModelFacts, Publishes, TaskSpec, pad_rows, sentence_file
from roformer.tasks.baselines import Guess, label_guess
from roformer.tasks.config import FinetuneDataConfig, Pooling
from roformer.tasks.objectives import cosent_loss, in_batch_negatives_loss
from roformer.tasks.records import Record, read_split_records, text_field
from roformer.tasks.texts import (
    Example,
    Scores,
    TextRows,
    copy_predictions,
    default_columns,
    segmented,
    write_predictions,
)

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer


@dataclass
class SimilarityConfig:
    """`data.similarity:` of `type: similarity`: a bi-encoder whose cosine of two texts' vectors scores them.

    Attributes:
        loss: `cosent` (pairs with scores: Su 2022's CoSENT, as text2vec trains: every pair of pairs in a batch
            whose gold scores are ordered should have their cosines ordered the same way, log(1 + sum exp(scale x
            (cos_lower - cos_higher)))); `in_batch_negatives` (pairs without scores, each text's partner against the
            other texts of the batch: InfoNCE with temperature 1 / scale, as SimCSE and sentence-transformers'
            MultipleNegativesRankingLoss).
        pooling: How a text's vector is read from the backbone (roformer.model.model.pool_states).
        scale: The cosines' multiplier in the loss (CoSENT's lambda, 20; 1 / InfoNCE's temperature, 20 = 0.05).
        negative_column: `in_batch_negatives`: a field of the training rows holding a hard negative of each pair (a
            triplet: anchor, positive, negative), scored against each anchor beside the batch's positives; null =
            pairs only.
    """

    loss: Literal["cosent", "in_batch_negatives"] = "cosent"
    pooling: Pooling = "mean"
    scale: float = 20.0
    negative_column: str | None = None

    def __post_init__(self) -> None:
        check_types(self)
        if self.scale <= 0:  # check_types refuses NaN and infinities
            raise ConfigError(f"similarity.scale must be > 0, got {self.scale}")
        if self.negative_column and self.loss != "in_batch_negatives":
            raise ConfigError("similarity.negative_column is for loss: in_batch_negatives (CoSENT reads scored pairs)")


@dataclass
class PairRows:
    """A split of text pairs, each text's token ids on its own: row i is (first[i], second[i]).

    With triplets (a training split with hard negatives) row i also has third[i].
    """

    first: list[list[int]]
    second: list[list[int]]
    labels: list[float | None]
    index: list[str]
    third: list[list[int]] | None = None

    @property
    def texts(self) -> list[list[list[int]]]:
        """The split's columns of texts: the pair's two, and the negatives when it has them."""
        return [self.first, self.second] + ([self.third] if self.third is not None else [])

    @property
    def sequences(self) -> int:
        """Texts per row, each padded to the batch's length: 2, or 3 with negatives."""
        return len(self.texts)

    @property
    def lengths(self) -> list[int]:
        """The longest text's tokens of every row: what its batch is padded to."""
        return [max(map(len, row)) for row in zip(*self.texts)]

    @property
    def tokens(self) -> list[int]:
        """Real tokens of every row: all its texts."""
        return [sum(map(len, row)) for row in zip(*self.texts)]

    @property
    def labelled(self) -> bool:
        return bool(self.labels) and self.labels[0] is not None


class SimilarityTask(HeadOutputs):
    """Score text pairs by the cosine of their vectors (a bi-encoder), trained with CoSENT or in-batch negatives.

    Rows are read by the shared text reader (roformer.tasks.texts.TextRows) with score labels; the training rows of
    in-batch negatives need none.

    Args:
        data: The data: section (type similarity, two text columns).
        records: The rows of every split (`read_split_records`).
    """

    architecture = "backbone"
    micro_batch_loss = "the sentence-vector loss compares a micro-batch's pairs with each other"

    def __init__(self, data: FinetuneDataConfig, records: dict[str, list[Record]]) -> None:
        assert data.similarity is not None  # FinetuneDataConfig fills the section of its type
        super().__init__(data)
        self.settings = data.similarity
        self.columns = data.text_columns or default_columns(records["train"][0])
        unlabelled = ("train",) if self.settings.loss == "in_batch_negatives" else ()
        self.scores = Scores(data)
        rows = TextRows(data, records, self.scores, self.columns, (2, 2), "scores a pair of texts", unlabelled)
        self.examples = {name: self._with_negatives(name, rows) for name in rows.examples}
        self.num_labels = 1
        self.pooling = self.settings.pooling
        self.test_splits = rows.test_splits

    def model_files(self, eval_batch_size: int) -> dict[str, str]:
        """`sentence.json`: the pooling the vectors were trained in (`roformer embed` pools the same way)."""
        return sentence_file(self.pooling)

    @classmethod
    def from_config(cls, data: FinetuneDataConfig) -> SimilarityTask:
        """The task of a data: section, its splits read and checked (cut to data.max_*_examples)."""
        return cls(data, read_split_records(data))

    def _with_negatives(self, split: str, rows: TextRows) -> list[Example]:
        """The reader's examples; with hard negatives, a training example's texts are a triplet."""
        examples = rows.examples[split]
        negative = self.settings.negative_column
        if split != "train" or negative is None:
            return examples
        negatives = [text_field(r, negative) for r in rows.rows[split]]
        return [((*texts, third), label, i) for (texts, label, i), third in zip(examples, negatives)]

    # ------------------------------------------------------------------------------------------------------------
    # The protocol

    def encode(self, tokenizer: Tokenizer, max_length: int, model: ModelFacts = NO_FACTS) -> dict[str, PairRows]:
        """Every split's texts tokenized one by one (a bi-encoder reads each text alone)."""
        segment = jieba_presegmenter(tokenizer) if self.data.jieba else None
        out = {}
        for name, examples in self.examples.items():
            columns = zip(*(texts for texts, _, _ in examples))  # the first texts, the second (and the negatives)
            first, second, *third = (
                tokenizer(segmented(list(column), segment), truncation=True, max_length=max_length)["input_ids"]
                for column in columns
            )
            labels, index = [e[1] for e in examples], [e[2] for e in examples]
            out[name] = PairRows(first, second, labels, index, third[0] if third else None)
        return out

    def collate(self, split: PairRows, rows: list[int], pad_id: int, cap: int) -> dict[str, torch.Tensor]:
        """The first texts of `rows`, then their second texts (then their negatives): `pair_batch`."""
        return pair_batch(split, rows, pad_id, lambda longest: self.padded_length(longest, cap))

    def vectors(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """The (B, C) vectors of a batch's first and second texts (and negatives), float32."""
        return pair_vectors(model, batch, self.pooling)

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """CoSENT over the batch's scored pairs, or InfoNCE with the batch's other partners as negatives."""
        first, second, *negatives = self.vectors(model, batch)
        if self.settings.loss == "in_batch_negatives":
            return in_batch_negatives_loss(first, second, self.settings.scale, *negatives)
        return cosent_loss(F.cosine_similarity(first, second, dim=-1), batch["labels"], self.settings.scale)

    def outputs(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], split: Any = None) -> torch.Tensor:
        """The cosine of each pair's vectors (B,)."""
        first, second = self.vectors(model, batch)
        return F.cosine_similarity(first, second, dim=-1)

    def predictions(self, logits: torch.Tensor, split: PairRows, rows: list[int]) -> list[Any]:
        """Each pair's cosine."""
        return logits.cpu().tolist()

    def evaluate(self, split: PairRows, predictions: list[float]) -> dict[str, float]:
        """The configured correlations of the cosines with the gold scores, and `score`, their mean."""
        return self.scores.evaluate(self.metrics, predictions, split.labels)

    def trivial_guess(self, train: PairRows) -> Guess | None:
        """The mean training score for every pair (a constant: its correlations are 0)."""
        return label_guess(train.labels)

    def write_predictions(self, folder: Path, encoded: dict[str, PairRows], predictions: dict[str, list[Any]]) -> None:
        """`<split>.tsv` of every split: index, cosine (and the gold score where the split has scores)."""
        write_predictions(folder, encoded, predictions, self.scores.name)

    def write_submission(self, run_folder: Path, submission: Path) -> None:
        """The selected run's test predictions, when there is a test split."""
        copy_predictions(run_folder, submission, self.test_splits)


def pair_batch(split: PairRows, rows: list[int], pad_id: int, padded: Callable[[int], int]) -> dict[str, torch.Tensor]:
    """The first texts of `rows`, then their second texts (then their negatives), as one (2B or 3B, T) batch.

    Padded to `padded(longest text)`; the scores too when labelled, and `texts_per_row` (2 or 3) for the loss to split
    the vectors.
    """
    texts = [column[r] for column in split.texts for r in rows]
    length = padded(max(len(t) for t in texts))
    batch = pad_rows(texts, [[0] * len(t) for t in texts], list(range(len(texts))), pad_id, length)
    batch["texts_per_row"] = torch.tensor(split.sequences)  # 2, or 3: the batch's last third are negatives
    if split.labelled:
        batch["labels"] = torch.tensor([split.labels[r] for r in rows], dtype=torch.float)
    return batch


def pair_vectors(model: torch.nn.Module, batch: dict[str, torch.Tensor], pooling: str) -> list[torch.Tensor]:
    """The (B, C) vectors of a `pair_batch`'s first and second texts (and negatives), float32."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], pooling=pooling)
    return list(out.embeddings.float().chunk(int(batch["texts_per_row"])))


SPECS = (
    TaskSpec(
        name="similarity",
        summary="a bi-encoder of text pairs (sentence embeddings): CoSENT or in-batch negatives, Spearman of cosines",
        builder=SimilarityTask.from_config,
        architecture="backbone",
        metrics=("pearson", "spearman"),
        default_metrics=("spearman",),
        predictions="dev.tsv",
        docs="embeddings.md#fine-tuning-for-similarity-type-similarity",
        section="similarity",
        settings=SimilarityConfig,
        capabilities=(Publishes,),
    ),
)
