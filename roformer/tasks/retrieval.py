"""Dense retrieval with a bi-encoder (`type: retrieval`): rank a corpus for each query by the cosine of their vectors.

Data: a BEIR folder (`data.beir_dir`, roformer.tasks.beir): the corpus, the queries and qrels/{train,dev,test}.tsv.

Training: every (query, relevant document) pair of qrels/train.tsv, the query and the document each encoded alone and
pooled (`data.retrieval.pooling`), with in-batch negatives (InfoNCE: each query against every document of the batch,
as DPR, Karpukhin et al. 2020, and sentence-transformers' MultipleNegativesRankingLoss train); with `hard_negatives`
each pair also brings a document judged non-relevant to its query (score 0 in qrels/train.tsv; a seeded random
document that is not relevant where the query has none), scored against every query of the batch.

Evaluation: the whole corpus and each judged query of a split are encoded, every document ranked per query by cosine
(roformer.tasks.ir_metrics: equal scores by document id, as sentence-transformers' InformationRetrievalEvaluator),
and nDCG@10 (selects, by default), MRR@10, Recall@1/10/100, MAP@100 and Accuracy@1/10 computed as that evaluator
does. Every run writes its ranking of each split as a TREC run file, `<split>.trec` (`qid Q0 docid rank score tag`,
the top `depth` documents a query), and the selected run's files go to submission/, where a reranker
(`type: rerank`) reads them as its first stage. The model is a bare backbone: its `best/` is what `roformer embed`
reads, with its pooling in `best/sentence.json`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from roformer.config import check_types
from roformer.data.text import is_integer_text
from roformer.data.tokenizer import jieba_presegmenter
from roformer.errors import ConfigError, UserError
from roformer.files import atomic_write_text
from roformer.tasks.base import (
    NO_FACTS,
    HeadOutputs,
    ModelFacts,
    Publishes,
    TaskSpec,
    TokenRows,
    pad_rows,
    sentence_file,
    with_score,
)
from roformer.tasks.beir import Beir, read_beir
from roformer.tasks.config import FinetuneDataConfig, Pooling
from roformer.tasks.ir_metrics import DEFAULT_METRICS, DEPTH, METRICS, rank_by_cosine, ranking_metrics
from roformer.tasks.objectives import in_batch_negatives_loss
from roformer.tasks.similarity import PairRows, pair_batch, pair_vectors
from roformer.tasks.texts import copy_predictions, segmented

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer

RUN_FILE = "{split}.trec"
RUN_TAG = "roformer"  # the TREC run file's last column
TRAIN_QUERIES = "train_queries"  # the training queries ranked (`rank_train`): judged by qrels/train.tsv


def qrels_split(split: str) -> str:
    """The qrels file that judges an evaluated split: its own, or train's for the ranked training queries."""
    return "train" if split == TRAIN_QUERIES else split


def run_file(split: str) -> str:
    """The TREC run file of an evaluated split: `dev.trec`, `test.trec`, `train.trec` (the training queries)."""
    return RUN_FILE.format(split=qrels_split(split))


@dataclass
class RetrievalConfig:
    """`data.retrieval:` of `type: retrieval`: a bi-encoder trained with in-batch negatives, ranking by cosine.

    Attributes:
        pooling: How a text's vector is read from the backbone (roformer.model.model.pool_states).
        scale: The cosines' multiplier in the loss (1 / InfoNCE's temperature: 20 = 0.05, sentence-transformers').
        hard_negatives: Give each training pair a document judged non-relevant to its query (score 0 in
            qrels/train.tsv, in turn; a seeded random non-relevant document where there is none) beside the batch's
            other documents.
        depth: Documents ranked per query in the TREC run files (and the deepest metric, Recall@100, needs 100).
        rank_train: Also rank the training queries at every evaluation: `train.trec` beside the dev and test files
            (a reranker's hard negatives: the first stage's misses), their metrics reported as the test split
            `train_queries`.
    """

    pooling: Pooling = "mean"
    scale: float = 20.0
    hard_negatives: bool = True
    depth: int = DEPTH
    rank_train: bool = False

    def __post_init__(self) -> None:
        check_types(self)
        if self.scale <= 0:
            raise ConfigError(f"retrieval.scale must be > 0, got {self.scale}")
        if self.depth < DEPTH:
            raise ConfigError(f"retrieval.depth must be >= {DEPTH} (Recall@{DEPTH}), got {self.depth}")


@dataclass
class RankingRows(TokenRows):
    """A split to rank: its judged queries' token ids, then every document's, one row each (encoded alone).

    Attributes:
        ids: Token ids of the queries (the first `len(query_ids)` rows), then of the documents.
        query_ids: The queries' ids.
        doc_ids: The documents' ids, in corpus order.
        relevant: Each query's relevant documents.
    """

    ids: list[list[int]]
    query_ids: list[str]
    doc_ids: list[str]
    relevant: list[dict[str, int]]
    labelled = True  # its queries have judgments: every split is scored

    def vectors(self, predictions: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """The (Q, C) query and (D, C) document vectors of the split's row predictions."""
        stacked = torch.from_numpy(np.stack(predictions))
        return stacked[: len(self.query_ids)], stacked[len(self.query_ids) :]


def training_pairs(beir: Beir, hard_negatives: bool) -> list[tuple[str, str, str | None]]:
    """(query, relevant document, negative or None) of every relevant judgment of qrels/train.tsv, in file order.

    The negative is the query's next document judged 0 (in turn), else a random document not relevant to it (seeded:
    the same in every run and process).
    """
    rng = random.Random(0)
    documents = list(beir.corpus)
    pairs = []
    for query, judged in beir.qrels["train"].items():
        relevant = beir.relevant("train", query)
        judged_negatives = [doc for doc, score in judged.items() if score <= 0]
        for i, doc in enumerate(d for d in judged if d in relevant):
            negative = None
            if hard_negatives:
                negative = judged_negatives[i % len(judged_negatives)] if judged_negatives else None
                while negative is None or negative in relevant:
                    if len(relevant) == len(documents):
                        raise UserError(f"query {query!r}: every document is relevant, none can be a negative")
                    negative = rng.choice(documents)
            pairs.append((query, doc, negative))
    return pairs


class RetrievalTask(HeadOutputs):
    """Rank a BEIR corpus for each query by cosine with a bi-encoder trained on in-batch negatives.

    Args:
        data: The data: section (type retrieval, `beir_dir`).
        beir: The folder's contents (`read_beir`).
    """

    architecture = "backbone"
    micro_batch_loss = "in-batch negatives score each query against the other documents of its micro-batch"

    def __init__(self, data: FinetuneDataConfig, beir: Beir) -> None:
        assert data.retrieval is not None  # FinetuneDataConfig fills the section of its type
        super().__init__(data)
        self.settings, self.beir = data.retrieval, beir
        check_judged(beir, data.beir_dir)
        self.num_labels = 1
        self.pooling = self.settings.pooling
        self.test_splits = [s for s in ("test",) if s in beir.qrels and beir.judged_queries(s)]
        self.test_splits += [TRAIN_QUERIES] if self.settings.rank_train else []
        self.pairs = training_pairs(beir, self.settings.hard_negatives)[: data.max_train_examples]
        self.queries = {
            s: beir.judged_queries(qrels_split(s))[: data.max_eval_examples] for s in self.dev_splits + self.test_splits
        }

    def model_files(self, eval_batch_size: int) -> dict[str, str]:
        """`sentence.json`: the pooling the vectors were trained in (`roformer embed` pools the same way)."""
        return sentence_file(self.pooling)

    @classmethod
    def from_config(cls, data: FinetuneDataConfig) -> RetrievalTask:
        """The task of a data: section, its BEIR folder read and checked."""
        return cls(data, read_beir(Path(data.beir_dir)))

    def encode(
        self, tokenizer: Tokenizer, max_length: int, model: ModelFacts = NO_FACTS
    ) -> dict[str, PairRows | RankingRows]:
        """The training pairs (each text alone: a bi-encoder) and, per evaluated split, its queries and the corpus."""
        segment = jieba_presegmenter(tokenizer) if self.data.jieba else None

        def tokens(texts: list[str]) -> list[list[int]]:
            return tokenizer(segmented(texts, segment), truncation=True, max_length=max_length)["input_ids"]

        documents = dict(zip(self.beir.corpus, tokens(list(self.beir.corpus.values()))))
        queries = self.beir.queries
        train = PairRows(
            tokens([queries[q] for q, _, _ in self.pairs]),
            [documents[d] for _, d, _ in self.pairs],
            [None] * len(self.pairs),
            [f"{q}/{d}" for q, d, _ in self.pairs],
            [documents[n] for _, _, n in self.pairs] if self.settings.hard_negatives else None,
        )
        out: dict[str, PairRows | RankingRows] = {"train": train}
        for split, chosen in self.queries.items():
            relevant = [self.beir.relevant(qrels_split(split), q) for q in chosen]
            rows = tokens([queries[q] for q in chosen]) + list(documents.values())
            out[split] = RankingRows(rows, chosen, list(documents), relevant)
        return out

    def collate(self, split: PairRows | RankingRows, rows: list[int], pad_id: int, cap: int) -> dict[str, torch.Tensor]:
        """Training: the queries, documents (and negatives) of `rows` (`pair_batch`); ranking: the texts of `rows`."""
        if isinstance(split, PairRows):
            return pair_batch(split, rows, pad_id, lambda longest: self.padded_length(longest, cap))
        length = self.padded_length(max(len(split.ids[r]) for r in rows), cap)
        texts = [split.ids[r] for r in rows]
        return pad_rows(texts, [[0] * len(t) for t in texts], list(range(len(rows))), pad_id, length)

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """InfoNCE: each query against its document, every other document of the batch (and the negatives)."""
        queries, documents, *negatives = pair_vectors(model, batch, self.pooling)
        return in_batch_negatives_loss(queries, documents, self.settings.scale, *negatives)

    def outputs(self, model: torch.nn.Module, batch: dict[str, torch.Tensor], split: Any = None) -> torch.Tensor:
        """The (B, C) vector of every text of a ranking batch, float32."""
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], pooling=self.pooling)
        return out.embeddings.float()

    def predictions(self, logits: torch.Tensor, split: RankingRows, rows: list[int]) -> list[Any]:
        """Each row's vector (a float32 array: gathered from every process, stacked by `evaluate`)."""
        return list(logits.cpu().numpy())

    def ranking(self, split: RankingRows, predictions: list[Any]) -> list[list[tuple[str, float]]]:
        """Each query's top `depth` documents and cosines."""
        queries, documents = split.vectors(predictions)
        return rank_by_cosine(queries, documents, split.doc_ids, self.settings.depth)

    def evaluate(self, split: RankingRows, predictions: list[Any]) -> dict[str, float]:
        """Every retrieval metric of the split's ranking, and `score`, the mean of the selecting ones."""
        ranked = [[doc for doc, _ in hits] for hits in self.ranking(split, predictions)]
        return with_score(ranking_metrics(ranked, split.relevant, METRICS), self.metrics)

    def write_predictions(
        self, folder: Path, encoded: dict[str, RankingRows], predictions: dict[str, list[Any]]
    ) -> None:
        """`<split>.trec` of every split: each query's top `depth` documents (`qid Q0 docid rank score tag`)."""
        for split, values in predictions.items():
            write_run(folder / run_file(split), encoded[split].query_ids, self.ranking(encoded[split], values))

    def write_submission(self, run_folder: Path, submission: Path) -> None:
        """The selected run's TREC files of every split (a reranker's first stage)."""
        copy_predictions(run_folder, submission, self.dev_splits + self.test_splits, run_file)


def check_judged(beir: Beir, folder: str) -> None:
    """A ranking type trains on qrels/train.tsv and selects on qrels/dev.tsv: both must judge a document relevant.

    Raises:
        UserError: one is missing or judges none relevant, naming the folder.
    """
    for split in ("train", "dev"):
        if split not in beir.qrels or not beir.judged_queries(split):
            raise UserError(f"{folder}: qrels/{split}.tsv is missing or judges no document relevant")


def write_run(path: Path, query_ids: list[str], ranking: list[list[tuple[str, float]]]) -> None:
    """A TREC run file: `qid Q0 docid rank score tag` per line, ranks from 1, each query's documents best first."""
    lines = [
        f"{query} Q0 {doc} {rank} {score:.6f} {RUN_TAG}\n"
        for query, hits in zip(query_ids, ranking, strict=True)
        for rank, (doc, score) in enumerate(hits, start=1)
    ]
    atomic_write_text(path, "".join(lines))


def read_run(path: Path, documents: dict[str, Any] | None = None) -> dict[str, list[str]]:
    """A TREC run file's ranking: {query id: document ids, best first} (by rank, as written).

    Args:
        path: The file.
        documents: The corpus its document ids must be in (None: not checked).

    Raises:
        UserError: a missing file, a line that is not `qid Q0 docid rank score tag` or a document not in the corpus,
            naming the file and line.
    """
    if not path.is_file():
        raise UserError(f"{path}: no TREC run file (a retrieval run's submission/ holds <split>.trec)")
    ranked: dict[str, list[tuple[int, str]]] = {}
    first_line: dict[tuple[str, str], int] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
        if not line.strip():
            continue
        cells = line.split()
        where = f"{path}:{number}"
        if len(cells) != 6 or not (is_integer_text(cells[3]) and int(cells[3]) >= 0):
            raise UserError(f"{where}: expected `qid Q0 docid rank score tag`, got {line!r}")
        query, doc = cells[0], cells[2]
        if documents is not None and doc not in documents:
            raise UserError(f"{where}: document {doc!r} is not in corpus.jsonl (a run of another corpus?)")
        if (query, doc) in first_line:  # pytrec_eval and sentence-transformers key a run by query and document
            raise UserError(
                f"{where}: document {doc!r} is ranked twice for query {query!r} (first on line "
                f"{first_line[query, doc]})"
            )
        first_line[query, doc] = number
        ranked.setdefault(query, []).append((int(cells[3]), doc))
    return {query: [doc for _, doc in sorted(hits)] for query, hits in ranked.items()}


def check_beir_source(data: FinetuneDataConfig) -> None:
    """A BEIR folder, and no files or hub dataset beside it."""
    if not data.beir_dir:
        raise ConfigError(
            f"type {data.type} reads a BEIR folder: set data.beir_dir (corpus.jsonl, queries.jsonl, qrels/)"
        )
    if data.train_file or data.validation_file or data.test_file or data.source == "hub":
        raise ConfigError(
            f"type {data.type} reads data.beir_dir only: train_file, validation_file, test_file and hub_name would go "
            "unused"
        )


def ranking_type(**declared: Any) -> TaskSpec:
    """The declaration of a type that ranks a BEIR folder's corpus: the retrieval metrics, TREC runs, `beir_dir`.

    Args:
        declared: The rest of its TaskSpec (name, summary, builder, architecture, docs, section, settings, check).
    """
    return TaskSpec(
        metrics=METRICS,
        default_metrics=DEFAULT_METRICS,
        predictions=RUN_FILE.format(split="dev"),
        folders=("beir_dir",),
        needs_validation_file=lambda data: False,  # the folder holds every split
        **declared,
    )


SPECS = (
    ranking_type(
        name="retrieval",
        summary="a bi-encoder ranking a BEIR corpus per query (in-batch negatives): nDCG@10, MRR@10, Recall@k",
        builder=RetrievalTask.from_config,
        architecture="backbone",
        docs="retrieval.md",
        section="retrieval",
        settings=RetrievalConfig,
        check=check_beir_source,
        capabilities=(Publishes,),
    ),
)
