"""Classification, regression and multi-label tasks from any file (roformer.tasks.classify, roformer.tasks.records)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from roformer.config import load
from roformer.data.tokenizer import train_tokenizer
from roformer.errors import ConfigError, UserError
from roformer.tasks.base import Encoded
from roformer.tasks.build import make_task
from roformer.tasks.classify import label_list, multi_label_metrics, sorted_labels
from roformer.tasks.config import FinetuneDataConfig
from roformer.tasks.glue import GlueTask
from roformer.tasks.glue_tasks import get_task
from roformer.tasks.records import Record, field, read_records, text_field
from roformer.train.config import FinetuneConfig

REPO = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def data_config(tmp_path: Path, train: str, dev: str, suffix: str = ".csv", **kwargs) -> FinetuneDataConfig:
    files = {
        "train_file": write(tmp_path / f"train{suffix}", train),
        "validation_file": write(tmp_path / f"dev{suffix}", dev),
    }
    return FinetuneDataConfig(
        type=kwargs.pop("type", "classification"), **{k: str(v) for k, v in files.items()}, **kwargs
    )


# ----------------------------------------------------------------------------------------------------------------
# Records


def test_csv_records_name_their_line_and_quoted_newlines_count(tmp_path: Path) -> None:
    path = write(tmp_path / "a.csv", 'text,label\n"two\nlines",pos\nplain,neg\n')
    records = read_records(path)
    assert [r.fields for r in records] == [{"text": "two\nlines", "label": "pos"}, {"text": "plain", "label": "neg"}]
    assert [r.where for r in records] == [f"{path}:3", f"{path}:4"]


def test_tsv_quotes_are_text_and_a_header_can_be_given(tmp_path: Path) -> None:
    path = write(tmp_path / "a.data", 'he said "hi\tsame\t3\n')
    (record,) = read_records(path, "tsv", ["sentence1", "sentence2", "score"])
    assert record.fields == {"sentence1": 'he said "hi', "sentence2": "same", "score": "3"}


def test_a_row_with_the_wrong_cell_count_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "a.tsv", "text\tlabel\nok\t1\nbad\n")
    with pytest.raises(UserError, match=rf"{path}:3: 1 cells, expected 2"):
        read_records(path)
    path = write(tmp_path / "b.tsv", "text\tlabel\nok\t1\tx\n")
    with pytest.raises(UserError, match=rf"{path}:2: 3 cells, expected 2"):
        read_records(path)


def test_json_lines_crlf_and_a_bad_line(tmp_path: Path) -> None:
    path = write(tmp_path / "a.json", '{"a": 1}\r\n\r\n{"a": 2}\r\n')
    assert [(r.fields["a"], r.where.rsplit(":", 1)[1]) for r in read_records(path)] == [(1, "1"), (2, "3")]
    write(path, '{"a": 1}\n{"a": \n')
    with pytest.raises(UserError, match=rf"{path}:2: not a JSON line"):
        read_records(path)
    write(path, '[{"a": 1}, 3]')
    with pytest.raises(UserError, match=r"\[1\]: expected a JSON object"):
        read_records(path)


def test_parquet_records(tmp_path: Path) -> None:
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"text": ["a", "b"], "label": [0, 1]}), tmp_path / "a.parquet")
    assert [r.fields for r in read_records(tmp_path / "a.parquet")] == [
        {"text": "a", "label": 0},
        {"text": "b", "label": 1},
    ]


def test_missing_and_unknown_files(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="data file not found"):
        read_records(tmp_path / "absent.csv")
    with pytest.raises(UserError, match="set data.format"):
        read_records(write(tmp_path / "a.txt", "x"))
    (tmp_path / "latin.csv").write_bytes("text\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(UserError, match="not UTF-8"):
        read_records(tmp_path / "latin.csv")


def test_fields_nested_templates_and_lists() -> None:
    record = Record({"text": "t", "target": {"span1_text": "树叶", "span2_text": "他"}, "keyword": ["a", "b"]}, "f:1")
    assert field(record, "target.span1_text") == "树叶"
    assert text_field(record, "{target.span2_text}指的是{target.span1_text}") == "他指的是树叶"
    assert text_field(record, "keyword") == "a b"
    with pytest.raises(UserError, match=r"f:1: no field 'target.span3_text'"):
        field(record, "target.span3_text")


# ----------------------------------------------------------------------------------------------------------------
# Labels


def test_label_sets_are_read_from_training_and_sorted_numerically_when_numbers(tmp_path: Path) -> None:
    assert sorted_labels({"100", "16", "2"}) == ["2", "16", "100"]
    assert sorted_labels({"pos", "neg"}) == ["neg", "pos"]
    task = make_task(data_config(tmp_path, "text,label\na,pos\nb,neg\nc,pos\n", "text,label\nd,neg\n"))
    assert (task.labels, task.num_labels, task.metrics) == (["neg", "pos"], 2, ("accuracy",))
    assert task.examples["train"][0] == (("a",), 1, "0")


def test_a_dev_label_outside_the_set_names_file_and_line(tmp_path: Path) -> None:
    config = data_config(tmp_path, "text,label\na,pos\nb,neg\n", "text,label\nd,neg\ne,meh\n")
    with pytest.raises(UserError, match=r"dev.csv:3: label 'meh' is not one of the training split's labels"):
        make_task(config)
    given = data_config(tmp_path, "text,label\na,pos\nb,neg\n", "text,label\nd,neg\n", labels=["neg", "good"])
    with pytest.raises(UserError, match=r"train.csv:2: label 'pos' is not one of data.labels"):
        make_task(given)


def test_skipped_labels_and_json_booleans_and_ints(tmp_path: Path) -> None:
    rows = [{"s": "a", "label": "-"}, {"s": "b", "label": True}, {"s": "c", "label": False}, {"s": "d", "label": 3}]
    train = "\n".join(json.dumps(r) for r in rows)
    config = data_config(
        tmp_path, train, json.dumps({"s": "e", "label": "true"}), ".jsonl", text_columns=["s"], skip_labels=["-"]
    )
    task = make_task(config)
    assert task.labels == ["3", "false", "true"] and len(task.examples["train"]) == 3
    assert task.examples["dev"][0][1] == 2


def test_regression_scores_must_be_numbers(tmp_path: Path) -> None:
    task = make_task(data_config(tmp_path, "text,label\na,1.5\nb,3\n", "text,label\nc,0\n", type="regression"))
    assert (task.num_labels, task.metrics, task.examples["train"][1][1]) == (1, ("pearson", "spearman"), 3.0)
    with pytest.raises(UserError, match=r"dev.csv:2: score 'x' is not a number"):
        make_task(data_config(tmp_path, "text,label\na,1\n", "text,label\nc,x\n", type="regression"))

    for bad in ("inf", "-Infinity"):  # float() reads them; every batch holding one would be skipped
        config = data_config(tmp_path, f"text,label\na,1\nb,{bad}\n", "text,label\nc,0\n", type="regression")
        with pytest.raises(UserError, match=rf"train.csv:3: score '{bad}' is not a finite number"):
            make_task(config)
    config = data_config(tmp_path, "text,label\na,1\nb,nan\n", "text,label\nc,0\n", type="regression")
    with pytest.raises(UserError, match=r"train.csv:3: no label in 'label'"):  # pandas' missing value
        make_task(config)
    config = data_config(
        tmp_path,
        '{"text": "a", "label": 1}\n{"text": "b", "label": NaN}',
        '{"text": "c", "label": 0}',
        ".jsonl",
        type="regression",
    )
    with pytest.raises(UserError, match=r"train.jsonl:2: .*(not a finite number|no label)"):
        make_task(config)


@pytest.mark.parametrize(
    ("suffix", "train", "line"),
    [
        (".csv", "text,label\na,pos\nb,\nc,neg\n", 3),  # an empty cell
        (".csv", "text,label\na,pos\nb, \nc,neg\n", 3),  # a blank one
        (".csv", "text,label\na,pos\nb,NaN\nc,neg\n", 3),  # what pandas writes for a missing value
        (".csv", "text,label\na,pos\nc,neg\nb,nan\n", 4),
        (".jsonl", '{"text": "a", "label": "pos"}\n{"text": "c", "label": "neg"}\n{"text": "b", "label": null}', 3),
        (".jsonl", '{"text": "a", "label": "pos"}\n{"text": "b", "label": NaN}\n{"text": "c", "label": "neg"}', 2),
        (".jsonl", '{"text": "a", "label": "pos"}\n{"text": "c", "label": "neg"}\n{"text": "b"}', 3),
    ],
)
def test_a_missing_classification_label_is_refused_not_a_class(
    tmp_path: Path, suffix: str, train: str, line: int
) -> None:
    dev = "text,label\nd,neg\n" if suffix == ".csv" else '{"text": "d", "label": "neg"}'
    config = data_config(tmp_path, train, dev, suffix)
    with pytest.raises(UserError, match=rf"train{suffix}:{line}: no label in 'label'|train{suffix}:{line}: no field"):
        make_task(config)
    config = data_config(tmp_path, "text,label\na,pos\nb,neg\n", "text,label\nd,neg\ne,\n")
    with pytest.raises(UserError, match=r"dev.csv:3: no label in 'label'"):
        make_task(config)  # a dev row too: it would be scored against a class of its own


def test_a_test_file_labelled_on_some_rows_only_is_refused(tmp_path: Path) -> None:
    config = data_config(tmp_path, "text,label\na,x\nb,y\n", "text,label\nc,x\n")
    config.test_file = str(write(tmp_path / "test.csv", "text,label\nd,y\ne,\nf,x\n"))
    with pytest.raises(UserError, match=r"test.csv:3: no label in 'label'.*2 of the test split's 3 rows have one"):
        make_task(config)
    config.test_file = str(write(tmp_path / "test.csv", "text,label\nd,\ne,\n"))  # a column of empty cells
    assert make_task(config).test_splits == ["test"]
    tokenizer = train_tokenizer(["a b c d e"] * 5, vocab_size=60)
    assert not make_task(config).encode(tokenizer, 16)["test"].labelled


def test_the_label_set_is_the_whole_training_files_whatever_max_train_examples_keeps(tmp_path: Path) -> None:
    train, dev = "text,label\na,b\nb,a\nc,c\n", "text,label\nd,c\n"
    full = make_task(data_config(tmp_path, train, dev))
    cut = make_task(data_config(tmp_path, train, dev, max_train_examples=2))
    assert cut.labels == full.labels == ["a", "b", "c"]  # was ["a", "b"], and the dev label c refused
    assert len(cut.examples["train"]) == 2 and cut.examples["dev"][0][1] == 2


def test_multi_label_fields(tmp_path: Path) -> None:
    assert label_list("a, b", "w") == ["a", "b"] and label_list('["a", 1]', "w") == ["a", "1"]
    assert label_list(["x"], "w") == ["x"]
    config = data_config(
        tmp_path, 'text,label\nt1,"a,b"\nt2,c\nt3,\n', 'text,label\nt4,"[""c""]"\n', type="multi_label_classification"
    )
    task = make_task(config)
    assert task.labels == ["a", "b", "c"] and [e[1] for e in task.examples["train"]] == [[0, 1], [2], []]
    assert task.metrics == ("micro_f1", "macro_f1")


def test_test_files_with_labels_are_scored_and_without_are_not(tmp_path: Path) -> None:
    config = data_config(tmp_path, "text,label\na,x\nb,y\n", "text,label\nc,x\n")
    config.test_file = str(write(tmp_path / "test.csv", "text,label\nd,y\n"))
    tokenizer = train_tokenizer(["a b c d"] * 5, vocab_size=60)
    assert make_task(config).encode(tokenizer, 16)["test"].labelled
    config.test_file = str(write(tmp_path / "test.csv", "id,text\n7,d\n"))
    task = make_task(config)
    encoded = task.encode(tokenizer, 16)
    assert not encoded["test"].labelled and encoded["test"].index == ["7"] and task.test_splits == ["test"]


# ----------------------------------------------------------------------------------------------------------------
# Batches, predictions, metrics


def test_collate_predictions_and_files(tmp_path: Path) -> None:
    config = data_config(tmp_path, "text,text_pair,label\na b,c,x\nb,c d a,y\n", "text,text_pair,label\nc,d,y\n")
    task = make_task(config)
    assert task.columns == ["text", "text_pair"]
    tokenizer = train_tokenizer(["a b c d"] * 5, vocab_size=60)
    encoded = task.encode(tokenizer, 16)
    batch = task.collate(encoded["train"], [0, 1], tokenizer.pad_token_id, 16)
    assert batch["input_ids"].shape == (2, 8) and batch["labels"].tolist() == [0, 1]
    assert batch["token_type_ids"][1].tolist()[:7] == [0, 0, 0, 1, 1, 1, 1]
    predictions = task.predictions(torch.tensor([[0.0, 2.0]]), encoded["dev"], [0])
    assert predictions == [1] and task.evaluate(encoded["dev"], predictions)["score"] == 1.0
    task.write_predictions(tmp_path, encoded, {"dev": predictions})
    assert (tmp_path / "dev.tsv").read_text() == "index\tprediction\tlabel\n0\ty\ty\n"


def test_multi_label_batches_are_multi_hot_and_predictions_thresholded(tmp_path: Path) -> None:
    config = data_config(
        tmp_path, 'text,label\na,"x,z"\nb,y\n', "text,label\nc,y\n", type="multi_label_classification", threshold=0.6
    )
    task = make_task(config)
    encoded = task.encode(train_tokenizer(["a b c"] * 5, vocab_size=60), 16)
    assert task.collate(encoded["train"], [0, 1], 0, 16)["labels"].tolist() == [[1, 0, 1], [0, 1, 0]]
    logits = torch.tensor([[0.5, 0.0, -3.0]])  # sigmoid: 0.62, 0.5, 0.05
    assert task.predictions(logits, encoded["dev"], [0]) == [[0]]
    assert task.label_name([0, 2]) == "x,z"


def test_multi_label_metrics_equal_scikit_learn() -> None:
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    for _ in range(20):
        gold = [list(np.flatnonzero(rng.random(5) < 0.3)) for _ in range(30)]
        predicted = [list(np.flatnonzero(rng.random(5) < 0.3)) for _ in range(30)]
        ours = multi_label_metrics(("micro_f1", "macro_f1", "subset_accuracy"), predicted, gold, 5)
        y, p = np.zeros((30, 5), int), np.zeros((30, 5), int)
        for i in range(30):
            y[i, gold[i]], p[i, predicted[i]] = 1, 1
        assert ours["micro_f1"] == pytest.approx(metrics.f1_score(y, p, average="micro", zero_division=0))
        assert ours["macro_f1"] == pytest.approx(metrics.f1_score(y, p, average="macro", zero_division=0))
        assert ours["subset_accuracy"] == pytest.approx(metrics.accuracy_score(y, p))


# ----------------------------------------------------------------------------------------------------------------
# Config


def test_config_checks_of_the_task_types() -> None:
    with pytest.raises(ConfigError, match="needs train_file and validation_file"):
        FinetuneDataConfig(type="classification")
    with pytest.raises(ConfigError, match="source: glue_dir is for type: glue"):
        FinetuneDataConfig(type="regression", source="glue_dir", train_file="a", validation_file="b")
    with pytest.raises(ConfigError, match="qa: is for type: question_answering"):
        FinetuneDataConfig(type="classification", train_file="a", validation_file="b", qa={})
    with pytest.raises(ConfigError, match=r"metrics: unknown \['micro_f1'\]"):
        FinetuneDataConfig(type="classification", train_file="a", validation_file="b", metrics=["micro_f1"])
    with pytest.raises(ConfigError, match="needs a choices: section"):
        FinetuneDataConfig(type="multiple_choice", train_file="a", validation_file="b")
    data = FinetuneDataConfig(type="token_classification", train_file="a", validation_file="b")
    assert (data.source, data.task, data.tagging.scheme) == ("files", "token_classification", "auto")
    with pytest.raises(ConfigError, match=r"metrics: unknown \['spearman'\] for task mrpc \(known: f1, accuracy\)"):
        FinetuneDataConfig(type="glue", task="mrpc", glue_dir="g", metrics=["spearman"])
    with pytest.raises(ConfigError, match=r"metrics: unknown \['f1'\] for type triplet \(known: accuracy\)"):
        FinetuneDataConfig(type="triplet", train_file="a", validation_file="b", metrics=["f1"])
    with pytest.raises(ConfigError, match=r"metrics: a metric named twice"):
        FinetuneDataConfig(type="question_answering", train_file="a", validation_file="b", metrics=["f1", "f1"])
    data = FinetuneDataConfig(task="mrpc", glue_dir="glue", metrics=["f1"])
    glue = GlueTask(data, get_task("mrpc"), {})  # data.metrics picks the task's F1 alone
    scores = glue.evaluate(Encoded([], [], [1, 1, 0, 0], []), [1, 0, 0, 0])
    assert scores["score"] == scores["f1"] == pytest.approx(2 / 3) and "accuracy" not in scores


def test_a_section_of_another_type_in_a_file_names_the_file(tmp_path: Path) -> None:
    path = write(
        tmp_path / "c.yaml",
        "init: m\ndata:\n  type: classification\n  train_file: a\n  validation_file: b\n  tagging:\n    scheme: IOB1\n",
    )
    with pytest.raises(ConfigError, match=rf"{path}.*tagging: is for type: token_classification"):
        load(FinetuneConfig, path)


# ----------------------------------------------------------------------------------------------------------------
# Shipped configs on the real data


@pytest.mark.parametrize(
    ("name", "sizes", "num_labels"),
    [
        ("fewclue-bustm", (160, 160, 1772), 2),
        ("fewclue-cluewsc", (160, 159, 976), 2),
        ("fewclue-csl", (160, 160, 2838), 2),
        ("fewclue-csldcp", (2036, 2068, 1784), 67),
        ("fewclue-eprstmt", (160, 160, 610), 2),
        ("fewclue-iflytek", (3024, 1373, 1749), 119),
        ("fewclue-ocnli", (160, 160, 2520), 3),
        ("fewclue-tnews", (1185, 1098, 2010), 15),
        ("ocnli", (9985, 2950, 3000), 3),
        ("chinese-stsb", (5231, 1458, 1361), 1),
    ],
)
def test_shipped_text_task_configs_read_the_real_data(
    shared_data: Path, name: str, sizes: tuple[int, int, int], num_labels: int
) -> None:
    config = load(FinetuneConfig, REPO / "configs" / "finetune" / f"{name}.yaml")
    task = make_task(config.data)
    assert tuple(len(task.examples[s]) for s in ("train", "dev", "test")) == sizes
    assert task.num_labels == num_labels and task.name == name


def test_cluewsc_pairs_the_text_with_its_span_question(shared_data: Path) -> None:
    task = make_task(load(FinetuneConfig, REPO / "configs" / "finetune" / "fewclue-cluewsc.yaml").data)
    texts, label, index = task.examples["train"][0]
    assert texts[1] == "他指的是树叶" and task.labels[label] == "false" and index == "0"


def test_labels_that_only_look_like_integers_are_classes_by_their_text(tmp_path: Path) -> None:
    """`"²".isdigit()` is true but int() refuses it: such a label set is sorted as text, not a traceback."""
    task = make_task(data_config(tmp_path, "text,label\na,1\nb,\u00b2\nc,10\n", "text,label\nd,1\n"))
    assert task.labels == ["1", "10", "\u00b2"]
