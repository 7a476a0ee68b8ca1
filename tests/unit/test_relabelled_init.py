"""A fine-tuned model directory (a run's best/) as the init of a task with another label count: the backbone and the
head's other weights are kept and the output layer, whose shape num_labels sets, starts fresh with a one-line notice,
as from an HF classifier saved for another task. Any other shape that no longer fits stays an error."""

from __future__ import annotations

import csv
import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import hf_config, make_hf, tiny_config
from safetensors.torch import load_file

import roformer
from roformer.config import load
from roformer.config_yaml import write_yaml
from roformer.data.builtin import generate_documents
from roformer.data.tokenizer import Tokenizer, train_tokenizer
from roformer.model.pretrained import load_pretrained
from roformer.model.weights import WEIGHTS_FILE, load_weights
from roformer.train.config import FinetuneConfig
from roformer.train.finetune import finetune

NOTICE = "freshly initialised for sequence_classification: out.weight, out.bias"


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    return [s.strip() for d in generate_documents(60, seed=3) for s in d.split(" . ") if s.strip()][:60]


@pytest.fixture(scope="module")
def tokenizer(sentences: list[str]) -> Tokenizer:
    return train_tokenizer(sentences, vocab_size=200)


def write_rows(path: Path, sentences: list[str], labels: list[object]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["sentence", "label"])
        writer.writerows(zip(sentences, labels))
    return path


def run_config(path: Path, init: Path, kind: str, sentences: list[str], labels: list[object], max_steps: int) -> Path:
    """A fine-tuning YAML of `kind` (classification or regression) on the sentences and labels, from `init`."""
    folder = path.parent
    config = {
        "init": str(init),
        "data": {
            "type": kind,
            "task": f"toy-{kind}",
            "train_file": str(write_rows(folder / "train.csv", sentences[:40], labels[:40])),
            "validation_file": str(write_rows(folder / "dev.csv", sentences[40:], labels[40:])),
            "text_columns": ["sentence"],
            "max_length": 32,
        },
        "train": {"max_steps": max_steps, "batch_size": 8, "lr": 1e-3, "seeds": [0], "progress": False},
    }
    write_yaml(path, config)
    return path


@pytest.fixture(scope="module")
def best(tmp_path_factory: pytest.TempPathFactory, tokenizer: Tokenizer, sentences: list[str]) -> Path:
    """best/ of a 3-label fine-tuning run from a tiny random backbone (a few steps)."""
    tmp = tmp_path_factory.mktemp("three")
    roformer.Backbone(tiny_config(vocab_size=len(tokenizer))).save(tmp / "init")
    tokenizer.save_pretrained(tmp / "init")
    labels = [("red", "green", "blue")[i % 3] for i in range(len(sentences))]
    finetune(
        load(FinetuneConfig, run_config(tmp / "c.yaml", tmp / "init", "classification", sentences, labels, 3)),
        tmp / "run",
    )
    model = roformer.load(tmp / "run" / "best")
    assert isinstance(model, roformer.SequenceClassifier) and model.config.num_labels == 3
    return tmp / "run" / "best"


def same_weights_but_the_output_layer(model: roformer.Model, source: roformer.Model) -> None:
    ours, theirs = model.state_dict(), source.state_dict()
    assert set(ours) == set(theirs)
    for name, value in theirs.items():
        if name.startswith("out."):
            assert ours[name].shape[0] == model.config.num_labels != value.shape[0], name
        else:
            assert torch.equal(ours[name], value), name


@pytest.mark.parametrize("kind, labels", [("classification", 2), ("regression", 1)])
def test_a_finetuned_best_folder_inits_a_run_with_another_label_count(
    best: Path,
    sentences: list[str],
    tmp_path: Path,
    kind: str,
    labels: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    values = [i % 2 for i in range(len(sentences))] if kind == "classification" else [i / 7 for i in range(60)]
    config = load(FinetuneConfig, run_config(tmp_path / "c.yaml", best, kind, sentences, values, 0))
    with caplog.at_level(logging.INFO):
        finetune(config, tmp_path / "run")  # max_steps 0: best/ is the model as loaded, evaluated
    said = [r.getMessage() for r in caplog.records if "freshly initialised" in r.getMessage()]
    assert said == [f"{best}: {NOTICE}"]  # once per run, as for an HF init
    same_weights_but_the_output_layer(roformer.load(tmp_path / "run" / "best"), roformer.load(best))


def test_the_output_layer_alone_is_fresh_and_other_misfits_stay_errors(best: Path, caplog) -> None:
    with caplog.at_level(logging.INFO, logger="roformer.model.weights"):
        relabelled = load_pretrained(best, "sequence_classification", num_labels=5)
    assert caplog.messages == [f"{best}: {NOTICE}"]
    same_weights_but_the_output_layer(relabelled, roformer.load(best))
    assert roformer.load(best, num_labels=3).config.num_labels == 3  # the saved count: nothing fresh
    # a backbone that no longer fits is an error naming the folder, with or without a new label count
    for labels in (2, 3):
        with pytest.raises(roformer.CheckpointError, match=rf"^{best}: shape mismatch .*embeddings\.word\.weight"):
            load_pretrained(best, "sequence_classification", num_labels=labels, vocab_size=500)
    # without a new label count a head that does not fit is an error too (the old behaviour, kept)
    two = roformer.SequenceClassifier(replace(relabelled.config, num_labels=2))
    with pytest.raises(roformer.CheckpointError, match=rf"^{best}: shape mismatch .*out\.weight \(3, 32\) vs \(2"):
        load_weights(two, load_file(str(best / WEIGHTS_FILE)), "sequence_classification", best)


def test_an_hf_classifier_with_another_label_count_gives_the_same_notice(tmp_path: Path, caplog) -> None:
    make_hf("roformer-cls").save_pretrained(tmp_path)
    assert hf_config("roformer").num_labels == 3
    with caplog.at_level(logging.INFO, logger="roformer.model.weights"):
        load_pretrained(tmp_path, "sequence_classification", num_labels=2)
    assert caplog.messages == [f"{tmp_path}: {NOTICE}"]
