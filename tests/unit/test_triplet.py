"""The triplet task (CAIL2019-SCM): two text pairs a row, BCE targets, accuracy over triplets, folds, the mean head."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

import roformer
from roformer.config import from_dict
from roformer.data.builtin import generate_documents
from roformer.data.tokenizer import train_tokenizer
from roformer.errors import CheckpointError, ConfigError, UserError
from roformer.model.hf import to_hf
from roformer.model.model import pool_states
from roformer.tasks.config import FinetuneDataConfig
from roformer.tasks.records import read_split_records
from roformer.tasks.triplet import TripletTask, fold_of_rows

ROWS = [
    {"A": "a cat sat on the mat", "B": "a cat sat", "C": "the dog ran far away", "label": "B"},
    {"A": "one two three", "B": "red car", "C": "one two", "label": "C"},
    {"A": "a cat sat on the mat", "B": "the mat", "C": "a red car"},
    {"A": "the dog", "B": "a dog ran", "C": "one", "label": "B"},
]


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def data(tmp_path: Path, rows: list[dict] = ROWS, dev: list[dict] | None = None, **triplet) -> FinetuneDataConfig:
    files = {"train_file": str(write_rows(tmp_path / "train.json", rows))}
    if not triplet.get("folds"):
        files["validation_file"] = str(write_rows(tmp_path / "dev.json", dev or rows))
    return from_dict(FinetuneDataConfig, {"type": "triplet", **files, "triplet": triplet})


@pytest.fixture(scope="module")
def tokenizer():
    words = "a cat sat on the mat one two three red car dog ran far away"
    return train_tokenizer(list(generate_documents(100)) + [words], vocab_size=200)


def test_a_triplet_is_two_pairs_of_the_anchor_cut_longest_first(tmp_path: Path, tokenizer) -> None:
    task = TripletTask.from_config(data(tmp_path, unlabelled_closer="B"))
    assert task.architecture == "sequence_classification" and task.num_labels == 1 and task.metrics == ("accuracy",)
    train = task.encode(tokenizer, 8)["train"]
    assert train.labels == [0, 1, 0, 0] and train.sequences == 2  # row 3 has no label: B, the unlabelled closer
    assert train.ids[0][0] == tokenizer("a cat sat on the mat", "a cat sat", truncation=True, max_length=8)["input_ids"]
    assert (
        train.ids[0][1]
        == tokenizer("a cat sat on the mat", "the dog ran far away", truncation=True, max_length=8)["input_ids"]
    )
    assert max(map(len, (p for pairs in train.ids for p in pairs))) <= 8
    assert set(train.types[0][1]) == {0, 1}  # the candidate is the second segment


def test_collate_gives_each_pair_its_target_and_the_loss_is_bce(tmp_path: Path, tokenizer) -> None:
    task = TripletTask.from_config(data(tmp_path, unlabelled_closer="B", mirror=True))
    train = task.encode(tokenizer, 16)["train"]
    assert train.sequences == 4  # mirrored in training: (B, A), (C, A) too
    assert train.ids[1][2] == tokenizer("red car", "one two three", truncation=True, max_length=16)["input_ids"]
    assert task.encode(tokenizer, 16)["dev"].sequences == 2  # evaluated as given
    batch = task.collate(train, [1, 0], tokenizer.pad_token_id, 16)
    assert batch["input_ids"].shape[0] == 8
    assert batch["pair_targets"].tolist() == [0, 1, 0, 1, 1, 0, 1, 0]  # row 1: C closer; row 0: B closer
    config = roformer.ModelConfig(vocab_size=200, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                                  num_labels=1, classifier_head="mean")  # fmt: skip
    model = roformer.SequenceClassifier(config).eval()
    logits = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]).logits[:, 0]
    assert_close(task.loss(model, batch), F.binary_cross_entropy_with_logits(logits, batch["pair_targets"]))
    assert_close(task.outputs(model, batch), logits.view(2, 4)[:, :2])


def test_accuracy_counts_a_triplet_right_only_when_its_closer_pair_scores_strictly_higher(tmp_path: Path) -> None:
    task = TripletTask.from_config(data(tmp_path, unlabelled_closer="B"))
    split = type("Split", (), {"labels": [0, 1, 0, 1]})()
    scores = [(2.0, 1.0), (0.5, 0.7), (1.0, 1.0), (3.0, -1.0)]  # right, right, tie (wrong), wrong
    assert task.evaluate(split, scores) == {"accuracy": 0.5, "score": 0.5}
    assert [task.choice(s) for s in scores] == ["B", "C", "tie", "B"]


def test_labels_name_candidate_columns_and_a_missing_one_is_an_error_naming_the_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"train.json:3: no 'label' \(set data.triplet.unlabelled_closer"):
        TripletTask.from_config(data(tmp_path))
    with pytest.raises(UserError, match=r"train.json:1: label 'D' names no candidate column \['B', 'C'\]"):
        TripletTask.from_config(data(tmp_path, [{**ROWS[0], "label": "D"}]))
    with pytest.raises(UserError, match="unlabelled_closer: 'A' is not a candidate column"):
        TripletTask.from_config(data(tmp_path, unlabelled_closer="A"))


def test_folds_group_rows_by_anchor_and_each_run_holds_out_its_fold(tmp_path: Path, tokenizer) -> None:
    anchors = ["x", "y", "x", "z", "w", "y", "v", "x"]
    folds = fold_of_rows(anchors, 3)
    assert folds == fold_of_rows(anchors, 3) and set(folds) == {0, 1, 2}
    assert len({folds[i] for i, a in enumerate(anchors) if a == "x"}) == 1  # one anchor, one fold
    rows = [{"A": f"{a} one", "B": "one two", "C": "red car"} for a in ("a cat", "the dog", "red", "two", "sat")]
    task = TripletTask.from_config(data(tmp_path, rows, unlabelled_closer="B", folds=2, mirror=True))
    encoded = task.encode(tokenizer, 16)
    assert "dev" not in encoded
    assert task.cross_validation_folds == 2 and task.splits_for_run(encoded, None) is encoded
    held = [task.splits_for_run(encoded, fold) for fold in (0, 1)]
    assert sorted(held[0]["dev"].index + held[1]["dev"].index) == sorted(encoded["train"].index)
    assert not set(held[0]["dev"].index) & set(held[0]["train"].index)
    assert held[0]["dev"].sequences == 2 and held[0]["train"].sequences == 4  # held out as given; trained mirrored


def test_the_triplet_config_checks_folds_against_the_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="validation_file would go unused"):
        from_dict(FinetuneDataConfig, {"type": "triplet", "train_file": "a", "validation_file": "b",
                                       "triplet": {"folds": 5}})  # fmt: skip
    with pytest.raises(ConfigError, match="triplet.folds must be >= 2"):
        from_dict(FinetuneDataConfig, {"type": "triplet", "train_file": "a", "triplet": {"folds": 1}})
    with pytest.raises(ConfigError, match="needs train_file and validation_file"):
        from_dict(FinetuneDataConfig, {"type": "triplet", "train_file": "a"})
    with pytest.raises(ConfigError, match="triplet: is for type: triplet"):
        from_dict(FinetuneDataConfig, {"type": "classification", "train_file": "a", "validation_file": "b",
                                       "triplet": {}})  # fmt: skip


def test_the_mean_head_is_the_masked_mean_then_a_linear_unit() -> None:
    """`classifier_head: mean`: the RoFormer authors' SCM head (GlobalAveragePooling1D over real tokens, Dense(1))."""
    config = roformer.ModelConfig(vocab_size=50, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                                  num_labels=1, classifier_head="mean")  # fmt: skip
    model = roformer.SequenceClassifier(config).eval()
    ids, mask = torch.randint(5, 50, (2, 7)), torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    out = model(ids, mask, output_hidden_states=True)
    last = out.hidden_states[-1]
    expected = model.out(torch.stack([last[0].mean(0), last[1, :4].mean(0)]))
    assert_close(out.logits, expected)
    assert_close(pool_states(last, mask, "mean"), torch.stack([last[0].mean(0), last[1, :4].mean(0)]))
    with pytest.raises(CheckpointError, match="HF RoFormer has no mean classifier head"):
        to_hf(model)


def test_folds_need_files(tmp_path: Path) -> None:
    rows = [{"A": f"{a} one", "B": "one two", "C": "red car"} for a in ("a cat", "the dog", "red", "two", "sat")]
    triplet = {"folds": 2, "unlabelled_closer": "B"}
    hub = from_dict(FinetuneDataConfig, {"type": "triplet", "hub_name": "x/y", "triplet": triplet})
    with pytest.raises(UserError, match="triplet.folds cross-validates train_file"):
        TripletTask(hub, read_split_records(data(tmp_path, rows, unlabelled_closer="B")))


def test_a_test_file_labelled_on_some_rows_only_is_refused(tmp_path: Path) -> None:
    """As for every text type (roformer.tasks.texts): label every test row (scored) or none (predicted only)."""
    config = data(tmp_path, [ROWS[0], ROWS[1]])
    config.test_file = str(write_rows(tmp_path / "test.json", ROWS))  # row 3 has no label, the others have
    with pytest.raises(UserError, match=r"test.json:3: no 'label' .*but 3 of the test split's 4 rows have one"):
        TripletTask.from_config(config)
    config.test_file = str(
        write_rows(tmp_path / "test.json", [{k: v for k, v in r.items() if k != "label"} for r in ROWS])
    )
    assert TripletTask.from_config(config).examples["test"][0][1] is None  # none labelled: predicted only
