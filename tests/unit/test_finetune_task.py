"""The fine-tuning task protocol (roformer.tasks.base) and its GLUE implementation (roformer.tasks.glue.GlueTask)."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

from roformer.tasks.base import CAPABILITIES, FinetuneTask, HeadOutputs
from roformer.tasks.build import make_task
from roformer.tasks.config import FinetuneDataConfig
from roformer.tasks.glue import Encoded, GlueTask
from roformer.tasks.glue_tasks import TASKS, Example, get_task

REPO = Path(__file__).resolve().parents[2]

# Outputs of each GLUE task's classifier: its label names (STS-B: one score)
NUM_LABELS = {"cola": 2, "sst2": 2, "mrpc": 2, "stsb": 1, "qqp": 2, "mnli": 3, "qnli": 2, "rte": 2, "wnli": 2}


def glue_data(name: str, multiple: int = 8, metrics: list[str] | None = None) -> FinetuneDataConfig:
    """The data: section of GLUE task `name` (its folder is never read: the tests give the splits)."""
    return FinetuneDataConfig(task=name, glue_dir="glue", pad_to_multiple_of=multiple, metrics=metrics)


def glue_task(name: str, splits: tuple[str, ...] = ("train", "dev", "test"), multiple: int = 8) -> GlueTask:
    """A GLUE task whose splits (by name) hold one example each."""
    pair = ("a cat sat", "a cat sits")
    return GlueTask(glue_data(name, multiple), get_task(name), {split: [Example(pair, None, "0")] for split in splits})


def encoded(lengths: list[int], labels: list[int | float | None]) -> Encoded:
    ids = [[2] + [5 + i for i in range(n - 2)] + [3] for n in lengths]
    return Encoded(ids, [[0] * n for n in lengths], labels, [str(i) for i in range(len(lengths))])


def test_every_glue_task_is_a_sequence_classifier_with_its_label_count() -> None:
    assert set(NUM_LABELS) == set(TASKS)
    for name, labels in NUM_LABELS.items():
        task = glue_task(name)
        assert (task.name, task.architecture, task.num_labels) == (name, "sequence_classification", labels)
        assert task.metrics == TASKS[name].metrics and task.tracker_project == f"roformer-glue-{name}"


def test_the_members_every_type_shares_are_set_once_from_the_data_section() -> None:
    """HeadOutputs gives name, tracker project, padding multiple, selecting metrics and dev split from data: and the
    type's declaration; a type passes only what its data decides (GLUE: the canonical name, the task's metrics)."""
    data = FinetuneDataConfig(type="triplet", task="scm", train_file="a", validation_file="b", pad_to_multiple_of=4)
    shared = HeadOutputs(data)
    assert (shared.name, shared.tracker_project, shared.multiple) == ("scm", "roformer-scm", 4)
    assert shared.metrics == data.spec.default_metrics == ("accuracy",) and shared.dev_splits == ["dev"]
    assert shared.spec is data.spec  # and no capability: a type implements and declares its own
    assert not [name for members in CAPABILITIES.values() for name in members if hasattr(shared, name)]
    sst2 = GlueTask(glue_data("SST-2", multiple=16), get_task("SST-2"), {"train": [], "dev": []})
    assert (sst2.name, sst2.tracker_project, sst2.multiple) == ("sst2", "roformer-glue-sst2", 16)
    assert sst2.metrics == ("accuracy",) and sst2.dev_splits == ["dev"]
    assert GlueTask(glue_data("mrpc", metrics=["f1"]), get_task("mrpc"), {}).metrics == ("f1",)  # data.metrics wins
    assert HeadOutputs(data, default_metrics=("f1",)).metrics == ("f1",)  # decided from the data where it is


def test_glue_task_gives_every_member_of_the_protocol() -> None:
    members = set(FinetuneTask.__annotations__) | {n for n in vars(FinetuneTask) if not n.startswith("_")}
    members -= {"__annotations__"}
    assert {"architecture", "num_labels", "encode", "collate", "predictions", "write_predictions"} <= members
    task = glue_task("rte")
    assert [m for m in sorted(members) if not hasattr(task, m)] == []


def test_only_the_splits_present_are_evaluated_and_predicted() -> None:
    mnli = glue_task("mnli", ("train", "dev_matched", "dev_mismatched", "test_matched", "ax"))
    assert mnli.dev_splits == ["dev_matched", "dev_mismatched"]  # the first selects
    assert mnli.test_splits == ["test_matched", "ax"]  # AX: predicted with the MNLI model
    assert glue_task("rte", ("train", "dev")).test_splits == []


def test_predictions_are_the_argmax_or_the_regression_score() -> None:
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.5], [-2.0, -3.0, -1.0]])
    split = Encoded([[2]] * 3, [[0]] * 3, [None] * 3, ["0", "1", "2"])
    assert glue_task("mnli").predictions(logits, split, [0, 1, 2]) == [1, 0, 2]
    scores = glue_task("stsb").predictions(torch.tensor([[2.5], [-0.25], [5.75]]), split, [0, 1, 2])
    assert scores == [2.5, -0.25, 5.75] and all(isinstance(s, float) for s in scores)


def test_server_format_names_classes_and_clips_sts_b_scores_to_three_decimals() -> None:
    rte, mnli, stsb = glue_task("rte"), glue_task("mnli"), glue_task("stsb")
    assert [rte.server_label(v) for v in (0, 1)] == ["entailment", "not_entailment"]
    assert [mnli.server_label(v) for v in (0, 1, 2)] == ["entailment", "neutral", "contradiction"]
    assert [glue_task("sst2").server_label(v) for v in (1, 0)] == ["1", "0"]
    assert [stsb.server_label(v) for v in (3.14159, 5.4, -0.2, 2)] == ["3.142", "5.000", "0.000", "2.000"]


def test_a_runs_prediction_files_and_the_submission(tmp_path: Path) -> None:
    mnli = glue_task("mnli", ("train", "dev_matched", "test_matched", "test_mismatched", "ax"))
    splits = {
        "dev_matched": encoded([4, 5], [2, 0]),
        "test_matched": encoded([4], [None]),
        "test_mismatched": encoded([4, 4], [None, None]),
        "ax": encoded([6], [None]),
    }
    predictions = {"dev_matched": [2, 1], "test_matched": [0], "test_mismatched": [1, 2], "ax": [2]}
    run = tmp_path / "lr1e-05-seed0"
    run.mkdir()
    mnli.write_predictions(run, splits, predictions)
    files = {p.name: p.read_text() for p in run.iterdir()}
    assert files == {
        "dev_matched.tsv": "index\tprediction\tlabel\n0\tcontradiction\tcontradiction\n1\tneutral\tentailment\n",
        "MNLI-m.tsv": "index\tprediction\n0\tentailment\n",
        "MNLI-mm.tsv": "index\tprediction\n0\tneutral\n1\tcontradiction\n",
        "AX.tsv": "index\tprediction\n0\tcontradiction\n",
    }
    submission = tmp_path / "submission"
    submission.mkdir()
    mnli.write_submission(run, submission)
    server = {"MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv"}  # the dev file stays with the run
    assert {p.name: p.read_text() for p in submission.iterdir()} == {k: v for k, v in files.items() if k in server}


def test_sts_b_dev_files_hold_clipped_scores_for_predictions_and_labels(tmp_path: Path) -> None:
    stsb = glue_task("stsb")
    stsb.write_predictions(
        tmp_path,
        {"dev": encoded([4, 4], [4.25, 0.0]), "test": encoded([4], [None])},
        {
            "dev": [5.3, 0.12345],
            "test": [-1.0],
        },
    )
    assert (tmp_path / "dev.tsv").read_text() == "index\tprediction\tlabel\n0\t5.000\t4.250\n1\t0.123\t0.000\n"
    assert (tmp_path / "STS-B.tsv").read_text() == "index\tprediction\n0\t0.000\n"


def test_collate_pads_to_the_multiple_within_the_cap_with_labels_of_the_tasks_kind() -> None:
    rte, stsb = glue_task("rte"), glue_task("stsb")
    split = encoded([4, 10], [1, 0])
    batch = rte.collate(split, [1, 0], pad_id=0, cap=64)
    assert batch["input_ids"].shape == (2, 16) and rte.padded_length(10, cap=64) == 16
    assert batch["attention_mask"].tolist()[1] == [1] * 4 + [0] * 12 and batch["input_ids"][1, 4:].eq(0).all()
    assert batch["labels"].dtype == torch.long and batch["labels"].tolist() == [0, 1]  # the rows' order
    assert rte.collate(split, [1], pad_id=0, cap=12)["input_ids"].shape == (1, 12)  # the cap wins over the multiple
    assert glue_task("rte", multiple=1).collate(split, [1], 0, 64)["input_ids"].shape == (1, 10)
    scores = stsb.collate(encoded([4], [3.5]), [0], pad_id=0, cap=64)["labels"]
    assert scores.dtype == torch.float and scores.tolist() == [3.5]  # MSE loss
    assert "labels" not in rte.collate(encoded([4], [None]), [0], 0, 64)  # a test split


def test_encode_tokenizes_every_split_pairs_with_token_types_truncated() -> None:
    from roformer.data.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(["a cat sat on the mat", "a dog sits on a log"] * 5, vocab_size=60)
    task = GlueTask(
        glue_data("rte"),
        get_task("rte"),
        {
            "train": [Example(("a cat sat", "a dog sits"), 0, "0")],
            "dev": [Example(("a cat sat on the mat " * 4, "a dog"), 1, "7")],
        },
    )
    splits = task.encode(tokenizer, max_length=12)
    assert set(splits) == {"train", "dev"} and splits["dev"].labels == [1] and splits["dev"].index == ["7"]
    ids, types = splits["train"].ids[0], splits["train"].types[0]
    assert ids[0] == tokenizer.cls_token_id and ids.count(tokenizer.sep_token_id) == 2
    assert types == [0] * (ids.index(tokenizer.sep_token_id) + 1) + [1] * (
        len(ids) - ids.index(tokenizer.sep_token_id) - 1
    )
    assert len(splits["dev"].ids[0]) == 12  # cut to max_length, specials included


def test_make_task_reads_the_splits_of_a_glue_config(tmp_path: Path) -> None:
    (tmp_path / "train.csv").write_text("sentence,label\na cat,1\na dog,0\nthe mat,1\n")
    (tmp_path / "dev.csv").write_text("sentence,label\na log,0\n")
    (tmp_path / "test.csv").write_text("idx,sentence\n5,a cat sat\n")
    files = {"train_file": "train.csv", "validation_file": "dev.csv", "test_file": "test.csv"}
    data = FinetuneDataConfig(task="SST-2", source="files", **{k: str(tmp_path / v) for k, v in files.items()})
    task = make_task(data)
    assert isinstance(task, GlueTask) and task.name == "sst2" and task.num_labels == 2
    assert (task.dev_splits, task.test_splits) == (["dev"], ["test"])
    assert [len(task.splits[s]) for s in ("train", "dev", "test")] == [3, 1, 1]
    assert task.splits["test"][0].index == "5" and task.splits["test"][0].label is None


def test_shipped_glue_configs_get_their_glue_task(shared_data: Path) -> None:
    """Today's configs: make_task gives the GLUE task of data.task, its splits read from the official layout."""
    from roformer.config import load
    from roformer.train.config import FinetuneConfig

    for name, dev in (("rte", 277), ("stsb", 1500), ("cola", 1043)):
        overrides = [f"data.glue_dir={shared_data / 'glue'}", "data.max_train_examples=10"]
        task = make_task(load(FinetuneConfig, REPO / "configs" / "glue" / f"{name}.yaml", overrides).data)
        assert isinstance(task, GlueTask) and task.name == name and len(task.splits[task.dev_splits[0]]) == dev


def code_of(path: Path) -> tuple[str, set[str]]:
    """A module's code without docstrings and comments, and the modules it imports from."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            node.body = body[1:] or [ast.Pass()]
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    return ast.unparse(tree), imported


def test_the_training_floor_knows_no_glue() -> None:
    """Fine-tuning's recipe asks the task object: no GLUE module, look-up, head name or server file in its code."""
    code, imported = code_of(REPO / "roformer" / "train" / "finetune.py")
    # the metrics module stays: its registry scores any task's named metrics, its statistics any scores
    assert not imported & {"roformer.tasks.glue", "roformer.tasks.glue_tasks"}, imported
    for glue_only in ("get_task", "sequence_classification", ".tsv", "is_regression", ".labels[", "roformer-glue"):
        assert glue_only not in code, glue_only


def test_a_dev_split_is_scored_by_the_tasks_official_metrics() -> None:
    """MRPC: accuracy and F1 of the positive class, the selection score their mean (BERT's convention here)."""
    split = encoded([4, 4, 4, 4], [1, 1, 0, 0])
    metrics = glue_task("mrpc").evaluate(split, [1, 0, 0, 0])
    assert metrics["accuracy"] == 0.75 and abs(metrics["f1"] - 2 / 3) < 1e-12
    assert set(metrics) == set(TASKS["mrpc"].metrics) | {"score"} and abs(metrics["score"] - (0.75 + 2 / 3) / 2) < 1e-12
    rte = glue_task("rte").evaluate(split, [0, 0, 0, 0])
    assert rte["accuracy"] == 0.5 and rte["score"] == rte["accuracy"]
