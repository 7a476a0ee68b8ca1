"""`type: question_answering` end to end: a tiny RoFormer fine-tuned on a toy SQuAD file answers its questions.

Each context is filler words of the pretraining corpus with one number word in it; the question asks for that number
by a subject word that stands just before it ("where is the <subject> ?"). Some contexts are longer than max_length, so
their answers sit in later windows and the prediction is the best span over all of a question's windows.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import roformer
from roformer.config import load
from roformer.config_yaml import write_yaml
from roformer.data.builtin import NUMBERS, BuiltinCorpus
from roformer.train.config import FinetuneConfig
from roformer.train.finetune import finetune


def toy_squad(path: Path, count: int, seed: int) -> Path:
    """`count` questions in SQuAD v1.1's layout; every third context is 40-70 words (several 64-token windows)."""
    rng = random.Random(seed)
    corpus = BuiltinCorpus(0)
    fillers = corpus.fillers[:40]
    articles = []
    for i in range(count):
        words = rng.choices(fillers, k=rng.randint(40, 70) if i % 3 == 0 else rng.randint(6, 14))
        subject, number = rng.choice(corpus.subjects[:5]), rng.choice(NUMBERS)
        at = rng.randint(0, len(words))
        words[at:at] = [subject, number]
        context = " ".join(words)
        start = len(" ".join(words[: at + 1])) + 1
        assert context[start : start + len(number)] == number
        qa = {
            "id": f"toy-{seed}-{i}",
            "question": f"where is the {subject} ?",
            "answers": [{"text": number, "answer_start": start}],
        }
        articles.append({"title": str(i), "paragraphs": [{"context": context, "qas": [qa]}]})
    path.write_text(json.dumps({"version": "1.1", "data": articles}))
    return path


def test_a_qa_task_fine_tunes_predicts_and_publishes(tmp_path: Path, pretrained: Path) -> None:
    train, dev = toy_squad(tmp_path / "train.json", 300, seed=1), toy_squad(tmp_path / "dev.json", 60, seed=2)
    config = {
        "init": str(pretrained),
        "data": {
            "type": "question_answering",
            "task": "toy-qa",
            "train_file": str(train),
            "validation_file": str(dev),
            "test_file": str(dev),
            "max_length": 64,
            "beyond_pretraining_length": True,  # the tiny model was pretrained on 32 tokens; rotary goes past it
            "qa": {"doc_stride": 16, "max_answer_length": 4},
        },
        "train": {"max_steps": 40, "batch_size": 16, "lr": 1e-3, "progress": False, "log_every": 20},
    }
    write_yaml(tmp_path / "c.yaml", config)
    results = finetune(load(FinetuneConfig, tmp_path / "c.yaml"), tmp_path / "run")

    run = tmp_path / "run"
    assert results == json.loads((run / "results.json").read_text())
    assert results["task"] == "toy-qa" and results["metrics"] == ["exact_match", "f1"]
    (record,) = results["runs"]
    metrics = record["dev"]["dev"]
    assert set(metrics) == {"exact_match", "f1", "score"}
    assert metrics["score"] == (metrics["exact_match"] + metrics["f1"]) / 2
    print(metrics)
    assert metrics["exact_match"] > 0.5, metrics  # the number word is the only one of its kind: learnt in 40 steps

    (folder,) = (run / "predictions").iterdir()
    predicted = json.loads((folder / "dev_predictions.json").read_text())
    questions = [a["paragraphs"][0]["qas"][0]["id"] for a in json.loads(dev.read_text())["data"]]
    assert list(predicted) == questions and all(isinstance(text, str) for text in predicted.values())
    assert sum(text in NUMBERS for text in predicted.values()) > 30
    nbest = json.loads((folder / "dev_nbest.json").read_text())
    for q in questions:  # the best 5 of the n-best, their probabilities a softmax over all n-best scores
        probabilities = [a["probability"] for a in nbest[q]]
        assert 0 < len(probabilities) <= 5 and probabilities == sorted(probabilities, reverse=True)
        assert sum(probabilities) <= 1 + 1e-9 and nbest[q][0]["text"] == predicted[q]
    assert (run / "submission" / "test_predictions.json").read_bytes() == (
        folder / "test_predictions.json"
    ).read_bytes()
    model = roformer.load(run / "best")
    assert model.architecture == "question_answering"
