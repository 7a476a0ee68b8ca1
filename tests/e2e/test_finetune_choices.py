"""`type: multiple_choice` end to end: a tiny RoFormer fine-tuned on a toy SWAG-style task picks its answers."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest

import roformer
from roformer.config import load
from roformer.config_yaml import write_yaml
from roformer.data.builtin import generate_documents
from roformer.train.config import FinetuneConfig
from roformer.train.finetune import finetune

ENDINGS = [f"ending{j}" for j in range(4)]


def toy_rows(count: int, seed: int) -> list[dict[str, str]]:
    """Questions whose right ending repeats two words of the context; the wrong ones use words it does not have."""
    rng = random.Random(seed)
    sentences = [s.split() for d in generate_documents(count, seed=seed) for s in d.split(" . ") if len(s.split()) >= 6]
    vocabulary = sorted({w for s in sentences for w in s})
    rows = []
    for words in rng.sample(sentences, count):
        context = words[:8]
        absent = [w for w in vocabulary if w not in context]
        endings = [" ".join(rng.sample(absent, 2)) for _ in ENDINGS]
        label = rng.randrange(len(ENDINGS))
        endings[label] = " ".join(rng.sample(context, 2))
        rows.append({"id": f"q{len(rows)}", "sent1": " ".join(context), **dict(zip(ENDINGS, endings)), "label": label})
    return rows


def write_csv(path: Path, rows: list[dict], with_label: bool = True) -> Path:
    columns = ["id", "sent1", *ENDINGS] + (["label"] if with_label else [])
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.fixture(scope="module")
def toy_mc(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("toy-mc")
    rows = toy_rows(460, seed=3)
    return {
        "train_file": write_csv(folder / "train.csv", rows[:320]),
        "validation_file": write_csv(folder / "dev.csv", rows[320:400]),
        "test_file": write_csv(folder / "test.csv", rows[400:], with_label=False),
    }


def test_a_multiple_choice_task_fine_tunes_predicts_and_publishes(
    tmp_path: Path, pretrained: Path, toy_mc: dict[str, Path]
) -> None:
    config = {
        "init": str(pretrained),
        "data": {
            "type": "multiple_choice",
            "task": "toy-mc",
            **{k: str(v) for k, v in toy_mc.items()},
            "max_length": 32,
            "choices": {"context_column": "sent1", "choice_columns": ENDINGS},
        },
        "train": {"max_steps": 40, "batch_size": 8, "lr": 1e-3, "seed": 0, "progress": False},
    }
    write_yaml(tmp_path / "c.yaml", config)
    run = tmp_path / "run"
    results = finetune(load(FinetuneConfig, tmp_path / "c.yaml"), run)

    assert results["task"] == "toy-mc" and results["metrics"] == ["accuracy"]
    written = json.loads((run / "results.json").read_text())
    accuracy = written["summary"]["dev"]["accuracy"]["mean"]
    assert accuracy >= 0.4  # chance is 0.25
    predictions = run / "predictions" / "lr0.001-seed0"
    dev = [json.loads(line) for line in (predictions / "dev.jsonl").read_text().splitlines()]
    assert [row["id"] for row in dev] == [f"q{i}" for i in range(320, 400)]
    assert sum(row["prediction"] == row["label"] for row in dev) / len(dev) == pytest.approx(accuracy)
    test = [json.loads(line) for line in (run / "submission" / "test.jsonl").read_text().splitlines()]
    assert len(test) == 60 and all(set(row) == {"id", "prediction"} and 0 <= row["prediction"] < 4 for row in test)
    model = roformer.load(run / "best")
    assert model.architecture == "multiple_choice" and model.config.num_labels == 4
