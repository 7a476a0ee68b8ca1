#!/usr/bin/env python
"""Golden graded nDCG@10 of pytrec_eval (trec_eval's `ndcg_cut_10`, what BEIR and MTEB report), for the tests.

Our `ndcg@10` (roformer.tasks.ir_metrics) must equal BEIR's headline number on graded judgments. pytrec_eval is not
one of our dependencies (a C extension, not built for every platform), so this script:

1. builds a throwaway virtualenv with `pytrec-eval-terrier` (the maintained wheels of pytrec_eval, imported as
   `pytrec_eval`) and re-runs itself inside it;
2. draws seeded graded judgments (grades 0-3, some queries with judged non-relevant documents, some relevant documents
   never retrieved) and seeded rankings of 1-25 documents per query (scores strictly decreasing, so that trec_eval's
   own tie order never decides);
3. runs `pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"})` as BEIR's `EvaluateRetrieval.evaluate` does, and
   writes the rankings, the judgments and every query's nDCG@10 with their mean.

Writes tests/golden/ndcg_graded.json (a few KB). Regenerate with

    python scripts/references/ndcg_golden.py --venv /tmp/ndcg-golden-venv

(creates the venv if it is missing). Deterministic: the same seed gives the same JSON; the pytrec_eval version that
wrote it is recorded in the file.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "tests" / "golden" / "ndcg_graded.json"
QUERIES, DOCUMENTS = 25, 60


def ensure_venv(venv: Path) -> Path:
    """The venv's python, with pytrec-eval-terrier installed."""
    python = venv / "bin" / "python"
    if not python.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "pytrec-eval-terrier"], check=True)
    return python


def draw() -> tuple[dict[str, dict[str, int]], dict[str, list[str]]]:
    """Seeded graded judgments (every query has a relevant document) and rankings, best first."""
    rng = random.Random(0)
    documents = [f"d{i}" for i in range(DOCUMENTS)]
    qrels, rankings = {}, {}
    for i in range(QUERIES):
        judged = rng.sample(documents, rng.randint(2, 8))
        grades = {doc: rng.choice([0, 1, 1, 2, 3]) for doc in judged}
        grades[judged[0]] = rng.randint(1, 3)  # at least one relevant
        qrels[f"q{i}"] = grades
        found = [doc for doc in judged if rng.random() < 0.7]  # most judged documents retrieved, some never
        others = rng.sample([d for d in documents if d not in grades], rng.randint(0, 25 - len(found)))
        ranked = found + others
        rng.shuffle(ranked)
        rankings[f"q{i}"] = ranked or [judged[0]]
    return qrels, rankings


def evaluate(qrels: dict[str, dict[str, int]], rankings: dict[str, list[str]]) -> tuple[dict[str, float], str]:
    """pytrec_eval's nDCG@10 of each query (inside the venv) and its version."""
    from importlib.metadata import version

    import pytrec_eval

    run = {q: {doc: float(len(ranked) - rank) for rank, doc in enumerate(ranked)} for q, ranked in rankings.items()}
    scores = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
    return {q: scores[q]["ndcg_cut_10"] for q in rankings}, version("pytrec-eval-terrier")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--venv", type=Path, default=Path("/tmp/ndcg-golden-venv"))
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.inside:
        python = ensure_venv(args.venv)
        subprocess.run([str(python), __file__, "--inside"], check=True)
        return
    qrels, rankings = draw()
    per_query, pytrec_version = evaluate(qrels, rankings)
    golden = {
        "pytrec_eval": pytrec_version,
        "qrels": qrels,
        "rankings": rankings,
        "ndcg_cut_10": per_query,
        "mean": sum(per_query.values()) / len(per_query),
    }
    OUT.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT} (pytrec_eval {pytrec_version}, mean nDCG@10 {golden['mean']:.6f})")


if __name__ == "__main__":
    main()
