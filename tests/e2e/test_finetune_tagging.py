"""`roformer finetune` on token classification: a tiny pretrained model learns a toy NER task from CoNLL files."""

from __future__ import annotations

import json
import random
from pathlib import Path

import roformer
from roformer.config import load
from roformer.config_yaml import write_yaml
from roformer.data.builtin import BRACKETS, NUMBERS, BuiltinCorpus
from roformer.tasks.conll import read_conll
from roformer.train.config import FinetuneConfig

PEOPLE = NUMBERS[:8]  # words of the pretraining corpus, so the tiny tokenizer has them
PLACES = [word for pair in BRACKETS for word in pair]


def toy_sentence(rng: random.Random, fillers: list[str]) -> list[tuple[str, str]]:
    """Filler words with a person (one or two words: B-PER I-PER) and sometimes a place (B-LOC) among them."""
    words = [(w, "O") for w in rng.sample(fillers, rng.randint(3, 7))]
    if rng.random() < 0.6:
        words.insert(rng.randint(0, len(words)), (rng.choice(PLACES), "B-LOC"))
    person = [(w, "I-PER") for w in rng.sample(PEOPLE, rng.randint(1, 2))]
    person[0] = (person[0][0], "B-PER")
    at = rng.randint(0, len(words))
    return words[:at] + person + words[at:]


def write_toy_ner(folder: Path) -> dict[str, Path]:
    """train/dev/test CoNLL files (word, a POS-like column, tag), each starting with a -DOCSTART- line."""
    rng = random.Random(0)
    fillers = BuiltinCorpus(0).fillers[:30]
    paths = {}
    for split, count in (("train", 400), ("dev", 48), ("test", 32)):
        blocks = ["-DOCSTART- -X- O"]
        for _ in range(count):
            blocks.append("\n".join(f"{w} X {tag}" for w, tag in toy_sentence(rng, fillers)))
        paths[split] = folder / f"{split}.txt"
        paths[split].write_text("\n\n".join(blocks) + "\n")
    return paths


def test_finetune_learns_a_toy_ner_task(tmp_path: Path, pretrained: Path) -> None:
    from roformer.train.finetune import finetune

    files = write_toy_ner(tmp_path)
    config = {
        "init": str(pretrained),
        "data": {
            "type": "token_classification",
            "task": "toy-ner",
            "train_file": str(files["train"]),
            "validation_file": str(files["dev"]),
            "test_file": str(files["test"]),
            "max_length": 32,
        },
        "train": {"max_steps": 60, "batch_size": 16, "lr": 1e-3, "progress": False, "log_every": 20},
    }
    write_yaml(tmp_path / "c.yaml", config)
    results = finetune(load(FinetuneConfig, tmp_path / "c.yaml"), tmp_path / "run")

    run = tmp_path / "run"
    assert results == json.loads((run / "results.json").read_text())
    assert results["task"] == "toy-ner" and results["metrics"] == ["f1"]
    (record,) = results["runs"]
    dev = record["dev"]["dev"]
    assert {"precision", "recall", "f1", "accuracy", "score"} <= set(dev) and dev["score"] == dev["f1"]
    assert dev["f1"] > 0.5, dev  # word identity decides the tag: learnt in 60 steps
    assert set(record["test"]["test"]) == set(dev)  # a labelled test file is scored too

    (folder,) = (run / "predictions").iterdir()
    lines = (folder / "dev.conll").read_text().split("\n")
    inputs = [line for line in files["dev"].read_text().split("\n") if line and not line.startswith("-DOCSTART-")]
    written = [line for line in lines if line]
    assert [line.rsplit(" ", 1)[0] for line in written] == inputs  # each input line, one column more
    assert all(len(line.split()) == 4 for line in written)
    assert len(read_conll(folder / "dev.conll")) == 48
    assert json.loads((folder / "dev.report.json").read_text())["PER"]["support"] == 48
    assert (run / "submission" / "test.conll").read_bytes() == (folder / "test.conll").read_bytes()
    model = roformer.load(run / "best")
    assert model.architecture == "token_classification" and model.config.num_labels == 4
