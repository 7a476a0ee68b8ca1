"""A corpus ranked by cosine, and retrieval metrics as BEIR, MTEB and sentence-transformers compute them.

`rank_by_cosine` orders every document for each query by the cosine of their vectors (normalised, then one matrix
product in float32, as `sentence_transformers.util.cos_sim`), equal scores by ascending document id as text (the
evaluator's total order, so `d10` comes before `d9`). `ranking_metrics` scores rankings against a query's judged
relevant documents (a qrels score above 0) and their grades:

- nDCG@k (`ndcg@k`): graded, as BEIR and MTEB report it through pytrec_eval (trec_eval's `ndcg_cut`): the sum over
  the top k of grade_i / log2(i + 2), over the same sum of the ideal ranking (the judged grades, highest first);
- nDCG@k with binary relevance (`ndcg_binary@k`): every relevant document's grade read as 1, as sentence-transformers'
  InformationRetrievalEvaluator computes it; the two are equal on binary qrels;
- MRR@k: 1 / rank of the first relevant document in the top k (0 if none);
- Recall@k: relevant documents in the top k / relevant documents;
- MAP@k: the mean of precision at each relevant document's rank in the top k, over min(k, relevant documents);
- Accuracy@k: whether any relevant document is in the top k.

Each is averaged over the queries that have a relevant document. tests/unit/test_retrieval.py checks them against the
evaluator's own output on the same vectors (scripts/references/ir_metrics_golden.py) and graded nDCG against
pytrec_eval's on graded judgments (scripts/references/ndcg_golden.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

METRICS = (
    "ndcg@10",
    "ndcg_binary@10",
    "mrr@10",
    "recall@1",
    "recall@10",
    "recall@100",
    "map@100",
    "accuracy@1",
    "accuracy@10",
)
DEFAULT_METRICS = ("ndcg@10",)  # BEIR's and MTEB's headline number
DEPTH = 100  # documents ranked per query: Recall@100 and the TREC run files


def rank_by_cosine(
    queries: torch.Tensor, documents: torch.Tensor, doc_ids: Sequence[str], depth: int = DEPTH, chunk: int = 256
) -> list[list[tuple[str, float]]]:
    """Each query's top `depth` documents with their cosines, best first (ties by ascending id).

    Args:
        queries: (Q, C) query vectors.
        documents: (D, C) document vectors, row i of document `doc_ids[i]`.
        doc_ids: The documents' ids.
        depth: How many to keep per query (all when the corpus is smaller).
        chunk: Queries scored at a time: a (chunk, D) matrix of cosines, not (Q, D).
    """
    documents = F.normalize(documents.float(), p=2, dim=1)
    queries = F.normalize(queries.float(), p=2, dim=1)
    depth = min(depth, len(doc_ids))
    id_rank = np.argsort(np.argsort(np.array(doc_ids, dtype=object)))  # position in ascending id order
    out = []
    for start in range(0, len(queries), chunk):
        cosines = queries[start : start + chunk] @ documents.T  # (chunk, D), as sentence-transformers' cos_sim
        cutoff = cosines.topk(depth, dim=1).values[:, -1].numpy()  # every document at least this may be in the top
        for row, floor in zip(cosines.numpy(), cutoff):
            candidates = np.flatnonzero(row >= floor)
            order = candidates[np.lexsort((id_rank[candidates], -row[candidates]))][:depth]
            out.append([(doc_ids[i], float(row[i])) for i in order])
    return out


def ranking_metrics(
    rankings: Sequence[Sequence[str]], relevant: Sequence[Mapping[str, int]], names: Sequence[str]
) -> dict[str, float]:
    """The named metrics (`ndcg@10`, `ndcg_binary@10`, `mrr@10`, `recall@100`, ...) averaged over queries.

    Args:
        rankings: Each query's ranked document ids, best first.
        relevant: Each query's relevant documents and their grades (> 0); a query without any is left out of every
            mean.
        names: Metric names, `<metric>@<k>`.
    """
    judged = [(ranked, gold) for ranked, gold in zip(rankings, relevant, strict=True) if gold]
    out = {}
    for name in names:
        metric, k = name.split("@")
        values = [_METRIC[metric](list(ranked[: int(k)]), gold, int(k)) for ranked, gold in judged]
        out[name] = float(np.mean(values)) if values else math.nan
    return out


def _dcg(grades: Iterable[float]) -> float:
    return sum(grade / math.log2(i + 2) for i, grade in enumerate(grades))


def _ndcg(top: list[str], gold: Mapping[str, int], k: int) -> float:
    ideal = sorted(gold.values(), reverse=True)[:k]
    return _dcg(gold.get(doc, 0) for doc in top) / _dcg(ideal)


def _ndcg_binary(top: list[str], gold: Mapping[str, int], k: int) -> float:
    return _ndcg(top, dict.fromkeys(gold, 1), k)


def _mrr(top: list[str], gold: Mapping[str, int], k: int) -> float:
    return next((1 / (i + 1) for i, doc in enumerate(top) if doc in gold), 0.0)


def _recall(top: list[str], gold: Mapping[str, int], k: int) -> float:
    return sum(doc in gold for doc in top) / len(gold)


def _map(top: list[str], gold: Mapping[str, int], k: int) -> float:
    hits, total = 0, 0.0
    for i, doc in enumerate(top):
        if doc in gold:
            hits += 1
            total += hits / (i + 1)
    return total / min(k, len(gold))


def _accuracy(top: list[str], gold: Mapping[str, int], k: int) -> float:
    return float(any(doc in gold for doc in top))


_METRIC = {
    "ndcg": _ndcg,
    "ndcg_binary": _ndcg_binary,
    "mrr": _mrr,
    "recall": _recall,
    "map": _map,
    "accuracy": _accuracy,
}
