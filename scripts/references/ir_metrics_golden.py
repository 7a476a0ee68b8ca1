#!/usr/bin/env python
"""Golden retrieval metrics of sentence-transformers' InformationRetrievalEvaluator, for tests/unit/test_retrieval.py.

Our metrics (roformer.tasks.ir_metrics: nDCG@10, MRR@10, Recall@1/10/100, MAP@100) must equal sentence-transformers'
on the same vectors. sentence-transformers is not one of our dependencies, so this script:

1. builds a throwaway virtualenv with `torch==2.13.0` (the local CPU wheel, as the README installs it, so that no CUDA
   build is pulled) and `sentence-transformers` from PyPI, and re-runs itself inside it;
2. draws seeded vectors for 150 documents, 1-4 relevant documents per query and 30 queries, each near its first
   relevant one (dimension 6; some documents duplicated, so that scores tie and the tie order, by ascending corpus id
   as text, is tested: `d10` before `d9`; one query's relevant document is such a duplicate);
3. runs the evaluator's own ranking and metrics (`compute_all_metrics`: cosine scores, top-k, ties) with its
   `embed_inputs` returning those vectors, and writes the vectors, the relevance judgments and every metric.

Writes tests/golden/ir_metrics.json (about 15 KB). Regenerate with

    python scripts/references/ir_metrics_golden.py --venv /tmp/ir-golden-venv

(creates the venv if it is missing). Deterministic: the same seed gives the same JSON; the sentence-transformers
version that wrote it is recorded in the file.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "tests" / "golden" / "ir_metrics.json"
QUERIES, DOCUMENTS, DIM = 30, 150, 6
AT = {"accuracy_at_k": [1, 10, 100], "precision_recall_at_k": [1, 10, 100], "mrr_at_k": [10], "ndcg_at_k": [10],
      "map_at_k": [100]}  # fmt: skip


def ensure_venv(venv: Path) -> Path:
    """The venv's python, with torch (CPU) and sentence-transformers installed."""
    python = venv / "bin" / "python"
    if not python.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "torch==2.13.0"], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "sentence-transformers"], check=True)
    return python


def draw() -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, list[str]]]:
    """Seeded query and document vectors (some documents duplicated) and each query's relevant documents."""
    rng = random.Random(0)
    docs = {f"d{i}": [round(rng.gauss(0, 1), 4) for _ in range(DIM)] for i in range(DOCUMENTS)}
    for copy, original in [("d10", "d9"), ("d100", "d99"), ("d21", "d3"), ("d120", "d12")]:
        docs[copy] = list(docs[original])  # equal scores for every query: ties broken by the id as text
    qrels = {f"q{i}": sorted(rng.sample(sorted(docs), rng.randint(1, 4))) for i in range(QUERIES)}
    qrels["q0"] = ["d9"]  # its tie with d10 decides Recall@1
    queries = {  # near the first of their relevant documents, so that the metrics span their range
        q: [round(x + rng.gauss(0, 0.7), 4) for x in docs[relevant[0]]] for q, relevant in qrels.items()
    }
    return queries, docs, qrels


def evaluate(queries: dict, docs: dict, qrels: dict) -> dict[str, float]:
    """sentence-transformers' metrics of these vectors (run inside the venv)."""
    import sentence_transformers
    import torch
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator
    from sentence_transformers.util import cos_sim

    evaluator = InformationRetrievalEvaluator(
        {q: q for q in queries}, {d: d for d in docs}, {q: set(r) for q, r in qrels.items()},
        score_functions={"cosine": cos_sim}, show_progress_bar=False, **AT,
    )  # fmt: skip
    query_vectors = torch.tensor(list(queries.values()))
    evaluator.embed_inputs = lambda model, sentences, **kwargs: query_vectors
    scores = evaluator.compute_all_metrics(None, corpus_embeddings=torch.tensor(list(docs.values())))["cosine"]
    out = {f"{name.split('@')[0]}@{k}": float(v) for name, by_k in scores.items() for k, v in by_k.items()}
    return {**out, "sentence_transformers": sentence_transformers.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--venv", type=Path, default=Path("/tmp/ir-golden-venv"))
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.inside:
        python = ensure_venv(args.venv)
        subprocess.run([str(python), __file__, "--inside"], check=True)
        return
    queries, docs, qrels = draw()
    golden = {"queries": queries, "corpus": docs, "qrels": qrels, "metrics": evaluate(queries, docs, qrels)}
    OUT.write_text(json.dumps(golden, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
