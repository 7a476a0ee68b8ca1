"""Retrieval then reranking end to end: a bi-encoder trained on a BEIR folder, its TREC runs, a reranker on them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import small_beir

from roformer.cli import main
from roformer.tasks.beir import read_beir
from roformer.tasks.ir_metrics import METRICS, ranking_metrics
from roformer.tasks.retrieval import read_run
from roformer.train.run_dir import RESULTS_FILE


def finetune(config: str, out: Path, sets: list[str]) -> dict:
    args = ["finetune", "--config", config, "--output-dir", str(out)]
    assert main([*args, *sum((["--set", s] for s in sets), [])]) == 0
    return json.loads((out / RESULTS_FILE).read_text())


def scored_from_run_file(run: Path, beir_dir: Path, split: str) -> dict[str, float]:
    """The metrics of a TREC run file against the folder's qrels: what the file holds is what was scored."""
    beir, ranked = read_beir(beir_dir), read_run(run)
    queries = beir.judged_queries(split)
    return ranking_metrics([ranked[q] for q in queries], [beir.relevant(split, q) for q in queries], METRICS)


def test_retrieval_then_reranking(pretrained: Path, tmp_path: Path) -> None:
    beir = small_beir(tmp_path / "beir")
    common = [f"init={pretrained}", f"data.beir_dir={beir}", "data.max_length=32", "train.lrs=[1.0e-3]",
              "train.seeds=[0]", "train.batch_size=16", "train.progress=false"]  # fmt: skip
    sets = [*common, "train.max_steps=20", "data.retrieval.rank_train=true"]
    retrieval = finetune("finetune/retrieval", tmp_path / "retrieval", sets)
    dev = retrieval["runs"][0]["dev"]["dev"]
    assert set(METRICS) <= set(dev) and dev["score"] == dev["ndcg@10"]
    assert set(retrieval["test"]) == {"test", "train_queries"}  # the training queries ranked too (rank_train)
    submission = tmp_path / "retrieval" / "submission"
    assert sorted(p.name for p in submission.iterdir()) == ["dev.trec", "test.trec", "train.trec"]
    train_run = read_run(submission / "train.trec")
    assert len(train_run) == 80 and all(len(ranked) == 60 for ranked in train_run.values())
    lines = (submission / "dev.trec").read_text().splitlines()
    assert len(lines) == 20 * 60 and lines[0].split()[1::2] == ["Q0", "1", "roformer"]  # every document of 60 ranked
    for split, scores in (("dev", dev), ("test", retrieval["runs"][0]["test"]["test"])):
        from_file = scored_from_run_file(submission / f"{split}.trec", beir, split)
        assert from_file == pytest.approx({m: scores[m] for m in METRICS}, abs=1e-12), split
    sentence = json.loads((tmp_path / "retrieval" / "best" / "sentence.json").read_text())
    assert sentence == {"pooling": "mean"}  # `roformer embed` reads best/ as it was trained

    rerank = finetune(
        "finetune/rerank",
        tmp_path / "rerank",
        [*common, "train.max_steps=10", f"data.rerank.first_stage={submission}", "data.rerank.top_k=5"],
    )
    reranked = rerank["runs"][0]["dev"]["dev"]
    first_stage = read_run(submission / "dev.trec")
    mine = read_run(tmp_path / "rerank" / "submission" / "dev.trec")
    for query, ranking in mine.items():  # the top 5 reordered, the rest as the first stage had it
        assert sorted(ranking[:5]) == sorted(first_stage[query][:5]) and ranking[5:] == first_stage[query][5:]
    assert reranked["recall@100"] == dev["recall@100"]  # no document enters or leaves the first stage's 60
    assert reranked == pytest.approx(
        {
            **scored_from_run_file(tmp_path / "rerank" / "submission" / "dev.trec", beir, "dev"),
            "score": reranked["score"],
        }
    )
