"""Retrieval and reranking: metrics equal to sentence-transformers' evaluator, the BEIR reader, TREC files, configs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from helpers import REPO, small_beir

from roformer.config import from_dict, load
from roformer.errors import ConfigError, UserError
from roformer.tasks.beir import read_beir
from roformer.tasks.build import make_task
from roformer.tasks.config import FinetuneDataConfig
from roformer.tasks.ir_metrics import METRICS, rank_by_cosine, ranking_metrics
from roformer.tasks.rerank import CandidatePairs
from roformer.tasks.retrieval import read_run, training_pairs, write_run
from roformer.train.config import FinetuneConfig

GOLDEN = json.loads((REPO / "tests" / "golden" / "ir_metrics.json").read_text())


def test_metrics_equal_sentence_transformers_information_retrieval_evaluator() -> None:
    """scripts/references/ir_metrics_golden.py: the evaluator's own ranking and metrics of the same vectors (ties
    included)."""
    queries, corpus, qrels = GOLDEN["queries"], GOLDEN["corpus"], GOLDEN["qrels"]
    ranked = rank_by_cosine(torch.tensor(list(queries.values())), torch.tensor(list(corpus.values())), list(corpus))
    names = [n for n in GOLDEN["metrics"] if "@" in n and not n.startswith("precision")]
    assert set(METRICS) <= set(names) | {"accuracy@1", "accuracy@10", "ndcg_binary@10"}
    gold = [dict.fromkeys(qrels[q], 1) for q in queries]
    ours = ranking_metrics([[d for d, _ in hits] for hits in ranked], gold, [*names, "ndcg_binary@10"])
    for name in names:
        assert ours[name] == pytest.approx(GOLDEN["metrics"][name], abs=1e-6), name
    assert ours["ndcg_binary@10"] == pytest.approx(GOLDEN["metrics"]["ndcg@10"], abs=1e-6)  # the evaluator's reading
    first = [d for d, _ in ranked[0]]
    assert first.index("d10") + 1 == first.index("d9")  # a tie: ascending id as text, as the evaluator orders it
    chunked = rank_by_cosine(torch.tensor(list(queries.values())), torch.tensor(list(corpus.values())), list(corpus),
                             chunk=7)  # fmt: skip
    assert [[d for d, _ in hits] for hits in chunked] == [[d for d, _ in hits] for hits in ranked]  # queries in chunks


def test_graded_ndcg_equals_pytrec_eval_as_beir_reports_it() -> None:
    """scripts/references/ndcg_golden.py: trec_eval's ndcg_cut_10 on graded judgments (grades 0-3), per query and the
    mean."""
    golden = json.loads((REPO / "tests" / "golden" / "ndcg_graded.json").read_text())
    queries = list(golden["rankings"])
    gold = [{doc: grade for doc, grade in golden["qrels"][q].items() if grade > 0} for q in queries]
    for query, relevant in zip(queries, gold):
        ours = ranking_metrics([golden["rankings"][query]], [relevant], ["ndcg@10"])["ndcg@10"]
        assert ours == pytest.approx(golden["ndcg_cut_10"][query], abs=1e-6), query
    mean = ranking_metrics([golden["rankings"][q] for q in queries], gold, ["ndcg@10", "ndcg_binary@10"])
    assert mean["ndcg@10"] == pytest.approx(golden["mean"], abs=1e-6)
    assert abs(mean["ndcg_binary@10"] - golden["mean"]) > 0.01  # graded judgments: the binary reading is another number


def test_graded_ndcg_equals_pytrec_eval_on_random_judgments() -> None:
    """The live reference where pytrec_eval installs (the dev extra); the golden file above holds everywhere."""
    pytrec_eval = pytest.importorskip("pytrec_eval")
    rng = torch.Generator().manual_seed(3)
    docs = [f"d{i}" for i in range(40)]
    qrels, rankings = {}, {}
    for q in range(30):
        picked = torch.randperm(40, generator=rng)[:12].tolist()
        grades = torch.randint(0, 4, (6,), generator=rng).tolist()
        qrels[f"q{q}"] = {docs[i]: g for i, g in zip(picked[:6], grades)} | {docs[picked[0]]: 2}
        rankings[f"q{q}"] = [docs[i] for i in picked[3:]]
    run = {q: {doc: float(len(r) - i) for i, doc in enumerate(r)} for q, r in rankings.items()}
    reference = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(run)
    for q, ranked in rankings.items():
        relevant = {doc: g for doc, g in qrels[q].items() if g > 0}
        ours = ranking_metrics([ranked], [relevant], ["ndcg@10"])["ndcg@10"]
        assert ours == pytest.approx(reference[q]["ndcg_cut_10"], abs=1e-6), q


def test_metric_definitions_on_a_hand_ranking() -> None:
    ranking, gold = [["a", "b", "c", "d"]], [{"b": 1, "d": 1, "z": 1}]
    out = ranking_metrics(ranking, gold, ["ndcg@10", "mrr@10", "recall@1", "recall@10", "map@100", "accuracy@1"])
    ideal = 1 + 1 / torch.log2(torch.tensor(3.0)).item() + 0.5
    dcg = 1 / torch.log2(torch.tensor(3.0)).item() + 1 / torch.log2(torch.tensor(5.0)).item()
    assert out["ndcg@10"] == pytest.approx(dcg / ideal)
    assert (out["mrr@10"], out["recall@1"], out["recall@10"], out["accuracy@1"]) == (0.5, 0.0, pytest.approx(2 / 3), 0)
    assert out["map@100"] == pytest.approx((1 / 2 + 2 / 4) / 3)
    assert ranking_metrics([["a"], ["b"]], [{"a": 1}, {}], ["recall@1"]) == {"recall@1": 1.0}  # unjudged: left out


def test_graded_and_binary_ndcg_on_a_hand_ranking() -> None:
    ranking, gold = [["a", "b", "c"]], [{"b": 2, "c": 1}]
    out = ranking_metrics(ranking, gold, ["ndcg@10", "ndcg_binary@10"])
    log2 = [torch.log2(torch.tensor(float(i + 2))).item() for i in range(3)]
    assert out["ndcg@10"] == pytest.approx((2 / log2[1] + 1 / log2[2]) / (2 / log2[0] + 1 / log2[1]))
    assert out["ndcg_binary@10"] == pytest.approx((1 / log2[1] + 1 / log2[2]) / (1 / log2[0] + 1 / log2[1]))
    binary = [{"b": 1, "c": 1}]  # on binary judgments the two are one number
    assert ranking_metrics(ranking, binary, ["ndcg@10"])["ndcg@10"] == out["ndcg_binary@10"]


def test_the_beir_reader_names_the_file_and_line_of_every_problem(tmp_path: Path) -> None:
    folder = small_beir(tmp_path / "beir")
    beir = read_beir(folder)
    assert len(beir.corpus) == 60 and set(beir.qrels) == {"train", "dev", "test"}
    assert len(beir.judged_queries("train")) == 80 and beir.relevant("train", "q0") == {"d0": 1}
    qrels = folder / "qrels" / "dev.tsv"
    good = qrels.read_text()
    for bad, message in [
        ("query-id\tdoc\tscore\n", r"dev.tsv:1: expected the header query-id <tab> corpus-id <tab> score"),
        (good + "q80\tnope\t1\n", r"dev.tsv:22: document 'nope' is not in corpus.jsonl"),
        (good + "nope\td1\t1\n", r"dev.tsv:22: query 'nope' is not in queries.jsonl"),
        (good + "q80\td1\thigh\n", r"dev.tsv:22: score 'high' is not an integer"),
        (good + "q80\td1\n", r"dev.tsv:22: expected query-id, corpus-id and score"),
        (good + "q80\td1\t--1\n", r"dev.tsv:22: score '--1' is not an integer"),
        (good + "q80\td1\t\u00b2\n", r"dev.tsv:22: score '\u00b2' is not an integer"),
        (good + "q80\td1\t1\nq80\td1\t2\n", r"dev.tsv:23: query 'q80' and document 'd1' are judged twice"),
    ]:
        qrels.write_text(bad)
        with pytest.raises(UserError, match=message):
            read_beir(folder)
    qrels.write_text(good)
    corpus = folder / "corpus.jsonl"
    corpus.write_text(corpus.read_text() + '{"_id": "d0", "text": "again"}\n')
    with pytest.raises(UserError, match=r"corpus.jsonl:61: id 'd0' is given twice"):
        read_beir(folder)
    for bad_id in ("null", "true", "1.5", '["d0"]'):
        corpus.write_text(f'{{"_id": {bad_id}, "text": "t"}}\n')
        with pytest.raises(
            UserError, match=rf"corpus.jsonl:1: `_id` must be a string or an integer, got {re.escape(bad_id)}"
        ):
            read_beir(folder)
    corpus.write_text('{"_id": "d0"}\n')
    with pytest.raises(UserError, match=r"corpus.jsonl:1: expected an object with `_id` and a `text` string"):
        read_beir(folder)
    with pytest.raises(UserError, match="no BEIR folder here"):
        read_beir(tmp_path / "missing")


def test_training_pairs_take_judged_negatives_then_seeded_random_ones(tmp_path: Path) -> None:
    beir = read_beir(small_beir(tmp_path / "beir"))
    pairs = training_pairs(beir, hard_negatives=True)
    assert pairs[0] == ("q0", "d0", "d1")  # judged 0 in qrels/train.tsv
    assert all(n is not None and n not in beir.relevant("train", q) for q, _, n in pairs)
    assert pairs == training_pairs(beir, hard_negatives=True)  # seeded: the same in every run and process
    assert [n for _, _, n in training_pairs(beir, hard_negatives=False)] == [None] * len(pairs)


def test_trec_run_files_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "dev.trec"
    write_run(path, ["q1", "q2"], [[("d2", 0.9), ("d1", 0.5)], [("d1", 0.7)]])
    assert path.read_text().splitlines()[0] == "q1 Q0 d2 1 0.900000 roformer"
    assert read_run(path) == {"q1": ["d2", "d1"], "q2": ["d1"]}
    for bad in ("q1 Q0 d2 one 0.9 x\n", "q1 Q0 d2 \u00b2 0.9 x\n", "q1 Q0 d2 -1 0.9 x\n"):
        path.write_text(bad)
        with pytest.raises(UserError, match=r"dev.trec:1: expected `qid Q0 docid rank score tag`"):
            read_run(path)
    path.write_text("q1 Q0 d2 1 0.9 x\nq2 Q0 d2 1 0.9 x\nq1 Q0 d2 2 0.8 x\n")  # a query's document listed twice
    with pytest.raises(
        UserError, match=r"dev.trec:3: document 'd2' is ranked twice for query 'q1' \(first on line 1\)"
    ):
        read_run(path)


def test_a_test_split_that_judges_nothing_relevant_is_refused(tmp_path: Path) -> None:
    folder = small_beir(tmp_path / "beir")
    test = folder / "qrels" / "test.tsv"
    lines = test.read_text().splitlines()
    test.write_text("\n".join([lines[0], *(line.rsplit("\t", 1)[0] + "\t0" for line in lines[1:])]) + "\n")
    with pytest.raises(UserError, match=r"test.tsv: judges no document relevant"):
        read_beir(folder)


def test_retrieval_configs_read_a_beir_folder_and_nothing_else(tmp_path: Path) -> None:
    config = load(FinetuneConfig, REPO / "configs" / "finetune" / "cmrc2018-retrieval.yaml")
    assert Path(config.data.beir_dir) == REPO / "runs" / "data" / "cmrc2018-beir"  # relative to the config file
    with pytest.raises(ConfigError, match="set data.beir_dir"):
        from_dict(FinetuneDataConfig, {"type": "retrieval"})
    with pytest.raises(ConfigError, match="train_file, validation_file, test_file and hub_name would go unused"):
        from_dict(FinetuneDataConfig, {"type": "retrieval", "beir_dir": "b", "train_file": "t"})
    with pytest.raises(ConfigError, match="beir_dir: is for type: rerank or retrieval"):
        from_dict(FinetuneDataConfig, {"type": "classification", "train_file": "a", "validation_file": "b",
                                       "beir_dir": "c"})  # fmt: skip
    with pytest.raises(ConfigError, match="rerank.first_stage: the folder"):
        from_dict(FinetuneDataConfig, {"type": "rerank", "beir_dir": "b"})
    with pytest.raises(ConfigError, match=r"retrieval.depth must be >= 100"):
        from_dict(FinetuneDataConfig, {"type": "retrieval", "beir_dir": "b", "retrieval": {"depth": 10}})


def test_the_reranker_reorders_the_top_k_and_keeps_the_rest_of_the_first_stage(tmp_path: Path) -> None:
    beir = small_beir(tmp_path / "beir")
    first = tmp_path / "first"
    first.mkdir()
    order = [f"d{i}" for i in range(59, -1, -1)]  # d40 (q80's relevant document) is 20th of 60
    write_run(first / "dev.trec", ["q80"], [[(d, 1.0 - i / 100) for i, d in enumerate(order)]])
    write_run(first / "test.trec", ["q100"], [[("d40", 1.0)]])
    write_run(first / "train.trec", ["q0"], [[("d0", 0.9), ("d7", 0.8), ("d1", 0.7), ("d5", 0.6), ("d6", 0.5)]])
    data = from_dict(FinetuneDataConfig, {"type": "rerank", "beir_dir": str(beir), "max_eval_examples": 1,
                                          "rerank": {"first_stage": str(first), "top_k": 3}})  # fmt: skip
    task = make_task(data)
    assert task.queries == {"dev": ["q80"], "test": ["q100"]} and task.test_splits == ["test"]
    split = CandidatePairs([[1]] * 3, [[0]] * 3, None, [("q80", "d59"), ("q80", "d58"), ("q80", "d57")], "dev")
    ranked = task.ranking(split, [0.1, 0.5, 0.5])
    assert [d for d, _ in ranked[0][:4]] == ["d57", "d58", "d59", "d56"]  # equal logits by id; then the first stage
    assert all(a[1] >= b[1] for a, b in zip(ranked[0], ranked[0][1:]))  # scores fall with the rank
    assert task.evaluate(split, [0.1, 0.5, 0.5])["recall@100"] == 1.0
    positives = [(q, d) for q, d, t in task.pairs if t == 1.0]
    assert len(positives) == 80 and len(task.pairs) == 80 + 4 * 80
    # q0's negatives: its judged-0 document (d1), then the first stage's misses in rank order (train.trec)
    assert [d for q, d, t in task.pairs if q == "q0" and t == 0.0] == ["d1", "d7", "d5", "d6"]
    assert all(int(d[1:]) < 40 for _, d, t in task.pairs if t == 0.0)  # the pool: documents judged in training
    data.rerank.negative_pool = "corpus"
    assert any(int(d[1:]) >= 40 for _, d, t in make_task(data).pairs if t == 0.0)


def test_a_reranker_refuses_first_stages_that_do_not_fit_the_folder(tmp_path: Path) -> None:
    beir = small_beir(tmp_path / "beir")
    first = tmp_path / "first"
    first.mkdir()
    write_run(first / "test.trec", ["q100"], [[("d40", 1.0)]])
    data = from_dict(
        FinetuneDataConfig, {"type": "rerank", "beir_dir": str(beir), "rerank": {"first_stage": str(first)}}
    )
    write_run(first / "dev.trec", ["q80"], [[("d40", 1.0), ("nope", 0.5)]])
    with pytest.raises(UserError, match=r"dev.trec:2: document 'nope' is not in corpus.jsonl"):
        make_task(data)
    write_run(first / "dev.trec", ["elsewhere"], [[("d40", 1.0)]])
    with pytest.raises(UserError, match=r"dev.trec: ranks none of the dev split's judged queries"):
        make_task(data)
    (beir / "qrels" / "dev.tsv").unlink()
    with pytest.raises(UserError, match=r"qrels/dev.tsv is missing or judges no document relevant"):
        make_task(data)
    corpus = beir / "corpus.jsonl"
    corpus.write_text('{"_id": "d 1", "text": "x"}\n')
    with pytest.raises(UserError, match=r"corpus.jsonl:1: id 'd 1' is empty or holds whitespace"):
        read_beir(beir)
