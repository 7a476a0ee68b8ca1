"""The similarity task: CoSENT and in-batch negatives against their definitions, pairs read and batched, its config."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import get_args

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from roformer.config import from_dict
from roformer.data.builtin import generate_documents
from roformer.data.tokenizer import train_tokenizer
from roformer.errors import ConfigError, UserError
from roformer.model.config import POOLINGS
from roformer.tasks.config import FinetuneDataConfig, Pooling
from roformer.tasks.objectives import cosent_loss, in_batch_negatives_loss
from roformer.tasks.similarity import SimilarityTask


def test_cosent_is_its_formula() -> None:
    """log(1 + sum over (i, j) with s_i > s_j of exp(scale (cos_j - cos_i))), written as a loop."""
    torch.manual_seed(0)
    cosines, scores = torch.rand(6) * 2 - 1, torch.tensor([0.0, 5.0, 2.5, 2.5, 1.0, 4.0])
    total = sum(
        math.exp(20 * (cosines[j] - cosines[i]).item())
        for i, j in itertools.product(range(6), repeat=2)
        if scores[i] > scores[j]
    )
    assert cosent_loss(cosines, scores, 20.0).item() == pytest.approx(math.log(1 + total), rel=1e-6)


def test_cosent_reads_only_the_order_of_the_scores() -> None:
    cosines = torch.tensor([0.9, 0.1, 0.5])
    assert_close(
        cosent_loss(cosines, torch.tensor([5.0, 0.0, 1.0]), 20.0),
        cosent_loss(cosines, torch.tensor([9.0, 1.0, 2.0]), 20.0),
    )
    assert cosent_loss(cosines, torch.tensor([5.0, 0.0, 1.0]), 20.0) < cosent_loss(
        cosines, torch.tensor([0.0, 5.0, 1.0]), 20.0
    )
    assert cosent_loss(cosines, torch.tensor([1.0, 1.0, 1.0]), 20.0).item() == 0.0  # no ordered pair: log(1)


def test_in_batch_negatives_is_cross_entropy_over_scaled_cosines() -> None:
    torch.manual_seed(0)
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    cos = torch.stack([F.cosine_similarity(a[i : i + 1], b, dim=-1) for i in range(4)])  # (4, 4)
    expected = -sum(torch.log_softmax(20 * cos[i], dim=0)[i] for i in range(4)) / 4
    assert_close(in_batch_negatives_loss(a, b, 20.0), expected)


def test_the_config_pooling_names_are_the_models() -> None:
    assert get_args(Pooling) == POOLINGS


def data(tmp_path: Path, rows: list[str], **similarity) -> FinetuneDataConfig:
    for name in ("train", "dev"):
        (tmp_path / f"{name}.tsv").write_text("".join(rows), encoding="utf-8")
    columns = ["a", "b", "score"] if rows[0].count("\t") == 2 else ["a", "b"]
    return from_dict(
        FinetuneDataConfig,
        {
            "type": "similarity",
            "train_file": str(tmp_path / "train.tsv"),
            "validation_file": str(tmp_path / "dev.tsv"),
            "column_names": columns,
            "text_columns": ["a", "b"],
            "label_column": "score",
            "similarity": similarity,
        },
    )


ROWS = ["a cat sat\ta cat sat down\t4.5\n", "the dog\ta red car\t0.5\n", "one two\tone two three four\t3\n"]


def test_pairs_are_read_tokenized_alone_and_batched_first_then_second(tmp_path: Path) -> None:
    task = SimilarityTask.from_config(data(tmp_path, ROWS))
    assert task.architecture == "backbone" and task.pooling == "mean" and task.metrics == ("spearman",)
    tokenizer = train_tokenizer(
        list(generate_documents(100)) + ["a cat sat down the dog red car one two three four"], vocab_size=200
    )
    train = task.encode(tokenizer, 16)["train"]
    assert train.labels == [4.5, 0.5, 3.0] and train.sequences == 2
    assert train.first[0] == tokenizer("a cat sat")["input_ids"]  # alone: no pair packing, no second segment
    assert train.lengths[2] == len(tokenizer("one two three four")["input_ids"])
    batch = task.collate(train, [2, 0], tokenizer.pad_token_id, 16)
    assert batch["input_ids"].shape[0] == 4 and batch["labels"].tolist() == [3.0, 4.5]
    assert batch["attention_mask"][0].sum() == len(train.first[2]) and batch["attention_mask"][2].sum() == len(
        train.second[2]
    )


def test_in_batch_negatives_trains_on_pairs_without_scores(tmp_path: Path) -> None:
    rows = ["a cat\ta cat sat\n", "the dog\ta dog ran\n"]
    config = data(tmp_path, rows, loss="in_batch_negatives")
    config.column_names = ["a", "b", "score"]
    (tmp_path / "train.tsv").write_text("".join(r.rstrip("\n") + "\t\n" for r in rows), encoding="utf-8")
    (tmp_path / "dev.tsv").write_text("".join(ROWS), encoding="utf-8")
    task = SimilarityTask.from_config(config)
    assert [e[1] for e in task.examples["train"]] == [None, None]
    assert [e[1] for e in task.examples["dev"]] == [4.5, 0.5, 3.0]


def test_bad_scores_and_settings_are_named(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"train\.tsv:2: score 'high' is not a number"):
        SimilarityTask.from_config(data(tmp_path, [ROWS[0], "x\ty\thigh\n"]))
    with pytest.raises(UserError, match=r"train\.tsv:2: score 'inf' is not a finite number"):
        SimilarityTask.from_config(data(tmp_path, [ROWS[0], "x\ty\tinf\n"]))
    with pytest.raises(UserError, match=r"train\.tsv:2: no label in 'score' \(.*NaN\)"):  # a missing value
        SimilarityTask.from_config(data(tmp_path, [ROWS[0], "x\ty\tnan\n"]))
    with pytest.raises(ConfigError, match="similarity.scale must be > 0"):
        data(tmp_path, ROWS, scale=0.0)
    with pytest.raises(ConfigError, match="similarity: is for type: similarity"):
        from_dict(
            FinetuneDataConfig, {"type": "regression", "train_file": "a", "validation_file": "b", "similarity": {}}
        )
    config = data(tmp_path, ROWS)
    config.text_columns = ["a"]
    with pytest.raises(UserError, match="scores a pair of texts"):
        SimilarityTask.from_config(config)
    assert json.dumps(config.similarity.pooling) == '"mean"'


def test_hard_negatives_join_the_candidates_of_every_anchor() -> None:
    torch.manual_seed(0)
    a, b, c = torch.randn(3, 8), torch.randn(3, 8), torch.randn(3, 8)
    candidates = F.normalize(torch.cat([b, c]), dim=-1)  # (6, 8): the positives, then the hard negatives
    logits = 20 * F.normalize(a, dim=-1) @ candidates.T
    expected = -sum(torch.log_softmax(logits[i], dim=0)[i] for i in range(3)) / 3
    assert_close(in_batch_negatives_loss(a, b, 20.0, c), expected)


def test_triplets_are_read_and_batched_as_a_third_text(tmp_path: Path) -> None:
    (tmp_path / "train.csv").write_text("a,b,c\na cat,a cat sat,the red car\nthe dog,a dog ran,one two\n")
    (tmp_path / "dev.csv").write_text("a,b,score\na cat,a cat sat,4\nthe dog,one two,0\n")
    section = {"loss": "in_batch_negatives", "negative_column": "c"}
    config = from_dict(
        FinetuneDataConfig,
        {
            "type": "similarity",
            "train_file": str(tmp_path / "train.csv"),
            "validation_file": str(tmp_path / "dev.csv"),
            "text_columns": ["a", "b"],
            "label_column": "score",
            "similarity": section,
        },
    )
    task = SimilarityTask.from_config(config)
    words = "a cat sat the dog ran red car one two"
    tokenizer = train_tokenizer(list(generate_documents(100)) + [words], vocab_size=200)
    encoded = task.encode(tokenizer, 16)
    train, dev = encoded["train"], encoded["dev"]
    assert train.sequences == 3 and train.third[1] == tokenizer("one two")["input_ids"]
    assert dev.sequences == 2 and dev.third is None and dev.labels == [4.0, 0.0]
    batch = task.collate(train, [0, 1], tokenizer.pad_token_id, 16)
    assert batch["input_ids"].shape[0] == 6 and int(batch["texts_per_row"]) == 3 and "labels" not in batch
    with pytest.raises(ConfigError, match="negative_column is for loss: in_batch_negatives"):
        data(tmp_path, ROWS, negative_column="c")
