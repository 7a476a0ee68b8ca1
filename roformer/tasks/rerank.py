"""Cross-encoder reranking (`type: rerank`): a one-logit sequence classifier reorders a first stage's top k per query.

Data: a BEIR folder (`data.beir_dir`, roformer.tasks.beir) and the first stage's ranking of each split as a TREC run
file, `<split>.trec` in `data.rerank.first_stage` (a `type: retrieval` job's submission/ folder, or any run files).

Training: every relevant (query, document) judgment of qrels/train.tsv is a pair labelled 1; each training query also
gets `negatives` pairs labelled 0, the documents judged 0 for it first, then the first stage's best non-relevant
documents when it ranked the training split (`train.trec`), else seeded random non-relevant ones; the last two are
drawn from the documents judged in training (`negative_pool`), where the positives come from. Each pair is one
sequence `[CLS] query [SEP] document [SEP]` cut longest-first to `max_length`, scored by one logit (a sequence
classifier with one output) with binary cross-entropy, as sentence-transformers' CrossEncoder trains a reranker.

Evaluation: each judged query's first `top_k` documents of the first stage are scored and reordered by logit (equal
logits by document id); the rest of the first stage's ranking follows in its order, so Recall@100 counts the
documents the reranker never saw. The metrics are the retrieval type's (roformer.tasks.ir_metrics), nDCG@10 selecting,
and every run writes its reranked `<split>.trec`.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from roformer.config import PATH, check_types
from roformer.data.tokenizer import jieba_presegmenter
from roformer.errors import ConfigError, UserError
from roformer.tasks.base import MODEL_INPUTS, NO_FACTS, HeadOutputs, ModelFacts, TokenRows, pad_rows, with_score
from roformer.tasks.beir import Beir, read_beir
from roformer.tasks.config import FinetuneDataConfig
from roformer.tasks.ir_metrics import METRICS, ranking_metrics
from roformer.tasks.objectives import pair_bce_loss
from roformer.tasks.retrieval import (
    RUN_FILE,
    check_beir_source,
    check_judged,
    ranking_type,
    read_run,
    run_file,
    write_run,
)
from roformer.tasks.texts import copy_predictions, segmented

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


@dataclass
class RerankConfig:
    """`data.rerank:` of `type: rerank`: a cross-encoder reordering a first stage's top k.

    Attributes:
        first_stage: The folder of the first stage's TREC run files, `<split>.trec` for dev (and test; `train.trec`
            to draw training negatives from): a retrieval job's submission/ (relative to the config file).
        top_k: Documents of the first stage reranked per query.
        negatives: Non-relevant documents paired with each training query (labelled 0).
        negative_pool: Where the first stage's misses and the random negatives come from: `training`, the documents
            judged in qrels/train.tsv (any score), the pool the positives come from, so that the reranker cannot
            learn which documents were ever relevant in training instead of what makes one relevant to a query (on
            the CMRC 2018 set, whose training and dev passages are apart, negatives from the whole corpus taught a
            reranker to put training passages first: dev Recall@1 fell below chance); `corpus`, every document.
    """

    first_stage: str | None = field(default=None, metadata=PATH)
    top_k: int = 20
    negatives: int = 4
    negative_pool: Literal["training", "corpus"] = "training"

    def __post_init__(self) -> None:
        check_types(self)
        if self.top_k < 1 or self.negatives < 1:
            raise ConfigError(f"rerank.top_k and rerank.negatives must be >= 1, got {self.top_k}, {self.negatives}")


@dataclass
class CandidatePairs(TokenRows):
    """(query, document) pairs as single sequences, with their targets (training) or queries (reranking).

    Attributes:
        ids: Token ids of each pair, `[CLS] query [SEP] document [SEP]`.
        types: Their token types.
        targets: Training: 1.0 for a relevant document, 0.0 for a negative; None when reranking.
        pairs: (query id, document id) of each row.
        split: The split they are of.
    """

    ids: list[list[int]]
    types: list[list[int]]
    targets: list[float] | None
    pairs: list[tuple[str, str]]
    split: str
    labelled = True  # training pairs have targets; a reranked split's queries have judgments

    @property
    def index(self) -> list[str]:
        """The rows' names, `query/document`."""
        return [f"{q}/{d}" for q, d in self.pairs]


class RerankTask(HeadOutputs):
    """Rerank a first stage's top k per query with a one-logit cross-encoder trained on judged pairs.

    Args:
        data: The data: section (type rerank, `beir_dir`, `rerank.first_stage`).
        beir: The folder's contents (`read_beir`).
    """

    architecture = "sequence_classification"

    def __init__(self, data: FinetuneDataConfig, beir: Beir) -> None:
        assert data.rerank is not None  # FinetuneDataConfig fills the section of its type
        super().__init__(data)
        self.settings, self.beir = data.rerank, beir
        self.num_labels = 1
        self.test_splits = [s for s in ("test",) if s in beir.qrels and beir.judged_queries(s)]
        check_judged(beir, data.beir_dir)
        folder = Path(self.settings.first_stage)
        runs = {split: folder / RUN_FILE.format(split=split) for split in self.dev_splits + self.test_splits}
        self.first_stage = {split: read_run(path, beir.corpus) for split, path in runs.items()}
        train_run = folder / RUN_FILE.format(split="train")
        self.pairs = self._training_pairs(read_run(train_run, beir.corpus) if train_run.is_file() else {})
        self.pairs = self.pairs[: data.max_train_examples]
        self.queries = {s: beir.judged_queries(s)[: data.max_eval_examples] for s in self.first_stage}
        for split, queries in self.queries.items():
            unranked = [q for q in queries if q not in self.first_stage[split]]
            if len(unranked) == len(queries):
                raise UserError(f"{runs[split]}: ranks none of the {split} split's judged queries (another set's run?)")
            if unranked:
                message = "%s: %d %s queries are not in the first stage's run (they rank nothing)"
                logger.warning(message, self.name, len(unranked), split)

    @classmethod
    def from_config(cls, data: FinetuneDataConfig) -> RerankTask:
        """The task of a data: section, its BEIR folder and first-stage run files read and checked."""
        return cls(data, read_beir(Path(data.beir_dir)))

    def _training_pairs(self, ranked: dict[str, list[str]]) -> list[tuple[str, str, float]]:
        """(query, document, target) of qrels/train.tsv's relevant judgments and `negatives` negatives a query."""
        rng = random.Random(0)
        documents = list(self.beir.corpus)
        if self.settings.negative_pool == "training":  # judged in training: positives and negatives from one pool
            documents = list(dict.fromkeys(doc for judged in self.beir.qrels["train"].values() for doc in judged))
        pool = set(documents)
        pairs = []
        for query in self.beir.judged_queries("train"):
            relevant = self.beir.relevant("train", query)
            judged = [doc for doc, score in self.beir.qrels["train"][query].items() if score <= 0]
            ranked_negatives = [doc for doc in ranked.get(query, []) if doc not in relevant and doc in pool]
            negatives = list(dict.fromkeys(judged + ranked_negatives))[: self.settings.negatives]
            if len(relevant) + self.settings.negatives > len(documents):
                wanted = self.settings.negatives
                raise UserError(
                    f"query {query!r}: the {self.settings.negative_pool} pool has too few documents for {wanted} "
                    "negatives"
                )
            while len(negatives) < self.settings.negatives:
                doc = rng.choice(documents)
                if doc not in relevant and doc not in negatives:
                    negatives.append(doc)
            pairs += [(query, doc, 1.0) for doc in self.beir.qrels["train"][query] if doc in relevant]
            pairs += [(query, doc, 0.0) for doc in negatives]
        return pairs

    def encode(self, tokenizer: Tokenizer, max_length: int, model: ModelFacts = NO_FACTS) -> dict[str, CandidatePairs]:
        """The training pairs and each split's (query, candidate) pairs, as `[CLS] query [SEP] document [SEP]`."""
        segment = jieba_presegmenter(tokenizer) if self.data.jieba else None

        def rows(split: str, pairs: list[tuple[str, str]], targets: list[float] | None) -> CandidatePairs:
            queries = segmented([self.beir.queries[q] for q, _ in pairs], segment)
            documents = segmented([self.beir.corpus[d] for _, d in pairs], segment)
            tokens = tokenizer(queries, documents, truncation=True, max_length=max_length, return_token_type_ids=True)
            return CandidatePairs(tokens["input_ids"], tokens["token_type_ids"], targets, pairs, split)

        out = {"train": rows("train", [(q, d) for q, d, _ in self.pairs], [t for _, _, t in self.pairs])}
        for split, queries in self.queries.items():
            candidates = [(q, d) for q in queries for d in self.first_stage[split].get(q, [])[: self.settings.top_k]]
            out[split] = rows(split, candidates, None)
        return out

    def collate(self, split: CandidatePairs, rows: list[int], pad_id: int, cap: int) -> dict[str, torch.Tensor]:
        """The padded pairs of `rows`, with their 0/1 targets when training."""
        length = self.padded_length(max(len(split.ids[r]) for r in rows), cap)
        batch = pad_rows(split.ids, split.types, rows, pad_id, length)
        if split.targets is not None:
            batch["pair_targets"] = torch.tensor([split.targets[r] for r in rows])
        return batch

    def outputs(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], split: Any = None) -> torch.Tensor:
        """The one logit of every pair (B,), float32."""
        return model(**{k: batch[k] for k in MODEL_INPUTS if k in batch}).logits[:, 0].float()

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Binary cross-entropy of every pair's logit against its target."""
        return pair_bce_loss(self.outputs(model, batch), batch["pair_targets"])

    def predictions(self, logits: torch.Tensor, split: CandidatePairs, rows: list[int]) -> list[Any]:
        """Each pair's logit."""
        return logits.cpu().tolist()

    def ranking(self, split: CandidatePairs, logits: list[float]) -> list[list[tuple[str, float]]]:
        """Each query's reranked top k (by logit, ties by id), then the rest of its first-stage ranking.

        The rest's scores continue below the lowest logit, one apart, so a run file sorted by score keeps the order.
        """
        scored: dict[str, list[tuple[str, float]]] = {q: [] for q in self.queries[split.split]}
        for (query, doc), logit in zip(split.pairs, logits, strict=True):
            scored[query].append((doc, logit))
        out = []
        for query, hits in scored.items():
            hits.sort(key=lambda hit: (-hit[1], hit[0]))
            floor = hits[-1][1] if hits else 0.0
            rest = self.first_stage[split.split].get(query, [])[self.settings.top_k :]
            out.append(hits + [(doc, floor - i - 1.0) for i, doc in enumerate(rest)])
        return out

    def evaluate(self, split: CandidatePairs, predictions: list[Any]) -> dict[str, float]:
        """The retrieval metrics of the reranked rankings, and `score`, the mean of the selecting ones."""
        ranked = [[doc for doc, _ in hits] for hits in self.ranking(split, predictions)]
        relevant = [self.beir.relevant(split.split, q) for q in self.queries[split.split]]
        return with_score(ranking_metrics(ranked, relevant, METRICS), self.metrics)

    def write_predictions(
        self, folder: Path, encoded: dict[str, CandidatePairs], predictions: dict[str, list[Any]]
    ) -> None:
        """`<split>.trec` of every split: the reranked top k, then the rest of the first stage's ranking."""
        for split, values in predictions.items():
            write_run(folder / run_file(split), self.queries[split], self.ranking(encoded[split], values))

    def write_submission(self, run_folder: Path, submission: Path) -> None:
        """The selected run's reranked TREC files."""
        copy_predictions(run_folder, submission, self.dev_splits + self.test_splits, run_file)


def _check(data: FinetuneDataConfig) -> None:
    """A BEIR folder and the first stage's run files."""
    check_beir_source(data)
    if not data.rerank.first_stage:
        raise ConfigError("rerank.first_stage: the folder of the first stage's <split>.trec files is required")


SPECS = (
    ranking_type(
        name="rerank",
        summary="a cross-encoder reordering a first stage's top k per query (BEIR folder, TREC runs): nDCG@10",
        builder=RerankTask.from_config,
        architecture="sequence_classification",
        docs="retrieval.md#reranking-type-rerank",
        section="rerank",
        settings=RerankConfig,
        check=_check,
    ),
)
