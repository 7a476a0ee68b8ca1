"""GLUE task metadata (written once, as data) and the readers of its three sources.

Sources: a local GLUE directory in the official TSV layout (as the GLUE download script writes it), the hub
(`datasets`, `nyu-mll/glue`), or local csv/json/jsonl/tsv files with named columns.

The official TSVs have quirks every reader must handle: CoLA's train/dev files have no header (columns: source,
label, original mark, sentence) while its test file has one; MRPC's header starts with a UTF-8 byte-order mark;
many sentences contain `"` characters that are not quoting (so no quote processing at all); MNLI has matched and
mismatched dev/test files; the diagnostic set AX is predicted with the MNLI model.
"""

from __future__ import annotations

import csv
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roformer.data.text import is_integer_text
from roformer.errors import UserError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Example:
    """One GLUE example: one or two texts, a label id (classification), a score (regression) or None (test)."""

    texts: tuple[str, ...]
    label: int | float | None
    index: str


@dataclass(frozen=True)
class Split:
    """One evaluation or test split: its TSV file, hub split name and (test only) the server's file name."""

    name: str
    file: str
    hub_split: str
    submission: str | None = None


@dataclass(frozen=True)
class Task:
    """Everything that differs between GLUE tasks."""

    name: str
    directory: str
    text_columns: tuple[str, ...]  # TSV header names
    label_column: str
    labels: tuple[str, ...] | None  # label names in id order (the hub's order); None = regression
    metrics: tuple[str, ...]
    dev: tuple[Split, ...]
    test: tuple[Split, ...]
    hub_config: str
    hub_text_columns: tuple[str, ...]
    test_index_column: str = "index"
    headerless_columns: tuple[str, ...] | None = None  # train/dev files without a header (CoLA)
    extra_tests: tuple[Split, ...] = field(default_factory=tuple)  # AX, predicted with this task's model

    @property
    def is_regression(self) -> bool:
        """STS-B: one output, MSE loss."""
        return self.labels is None

    @property
    def num_labels(self) -> int:
        """Outputs of the classifier."""
        return 1 if self.labels is None else len(self.labels)


def _dev(submission_name: str) -> tuple[tuple[Split, ...], tuple[Split, ...]]:
    return (Split("dev", "dev.tsv", "validation"),), (Split("test", "test.tsv", "test", submission_name),)


_BINARY = ("0", "1")
_NLI3 = ("entailment", "neutral", "contradiction")
_NLI2 = ("entailment", "not_entailment")
_AX = Split("ax", "../diagnostic/diagnostic.tsv", "test", "AX.tsv")

TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task(
            "cola",
            "CoLA",
            ("sentence",),
            "label",
            _BINARY,
            ("matthews_corrcoef",),
            *_dev("CoLA.tsv"),
            "cola",
            ("sentence",),
            headerless_columns=("source", "label", "mark", "sentence"),
        ),
        Task(
            "sst2", "SST-2", ("sentence",), "label", _BINARY, ("accuracy",), *_dev("SST-2.tsv"), "sst2", ("sentence",)
        ),
        Task(
            "mrpc",
            "MRPC",
            ("#1 String", "#2 String"),
            "Quality",
            _BINARY,
            ("f1", "accuracy"),
            *_dev("MRPC.tsv"),
            "mrpc",
            ("sentence1", "sentence2"),
        ),
        Task(
            "stsb",
            "STS-B",
            ("sentence1", "sentence2"),
            "score",
            None,
            ("pearson", "spearman"),
            *_dev("STS-B.tsv"),
            "stsb",
            ("sentence1", "sentence2"),
        ),
        Task(
            "qqp",
            "QQP",
            ("question1", "question2"),
            "is_duplicate",
            _BINARY,
            ("f1", "accuracy"),
            *_dev("QQP.tsv"),
            "qqp",
            ("question1", "question2"),
            test_index_column="id",
        ),
        Task(
            "mnli",
            "MNLI",
            ("sentence1", "sentence2"),
            "gold_label",
            _NLI3,
            ("accuracy",),
            (
                Split("dev_matched", "dev_matched.tsv", "validation_matched"),
                Split("dev_mismatched", "dev_mismatched.tsv", "validation_mismatched"),
            ),
            (
                Split("test_matched", "test_matched.tsv", "test_matched", "MNLI-m.tsv"),
                Split("test_mismatched", "test_mismatched.tsv", "test_mismatched", "MNLI-mm.tsv"),
            ),
            "mnli",
            ("premise", "hypothesis"),
            extra_tests=(_AX,),
        ),
        Task(
            "qnli",
            "QNLI",
            ("question", "sentence"),
            "label",
            _NLI2,
            ("accuracy",),
            *_dev("QNLI.tsv"),
            "qnli",
            ("question", "sentence"),
        ),
        Task(
            "rte",
            "RTE",
            ("sentence1", "sentence2"),
            "label",
            _NLI2,
            ("accuracy",),
            *_dev("RTE.tsv"),
            "rte",
            ("sentence1", "sentence2"),
        ),
        Task(
            "wnli",
            "WNLI",
            ("sentence1", "sentence2"),
            "label",
            _BINARY,
            ("accuracy",),
            *_dev("WNLI.tsv"),
            "wnli",
            ("sentence1", "sentence2"),
        ),
    )
}


def get_task(name: str) -> Task:
    """The task called `name` (case-insensitive; `SST-2`, `sst-2` and `sst2` all work).

    Raises:
        UserError: an unknown task, listing the known ones.
    """
    key = name.lower().replace("-", "")
    if key not in TASKS:
        raise UserError(f"unknown GLUE task {name!r} (known: {', '.join(TASKS)})")
    return TASKS[key]


# ----------------------------------------------------------------------------------------------------------------
# Reading


def parse_label(task: Task, raw: Any, where: str) -> int | float:
    """A label id (classification: a name, or an id in range) or a float score (regression).

    Raises:
        UserError: a label outside the task's label set, naming `where`.
    """
    if task.labels is None:
        try:
            return float(raw)
        except (TypeError, ValueError):
            raise UserError(f"{where}: score {raw!r} is not a number") from None
    text = str(raw).strip()
    if text in task.labels:
        return task.labels.index(text)
    if isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < len(task.labels):
        return raw
    raise UserError(f"{where}: label {raw!r} is not one of the {task.name} labels {list(task.labels)}")


def read_tsv(path: Path, header: tuple[str, ...] | None = None) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """(column names, [(line number, cells)]) of a GLUE TSV; `header` for files without one.

    Quotes are data, not quoting (csv.QUOTE_NONE); a byte-order mark is dropped.

    Raises:
        UserError: a missing or unreadable file.
    """
    if not path.is_file():
        raise UserError(f"{path}: GLUE split file not found")
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read ({e})") from None
    numbered = [(number, row) for number, row in enumerate(rows, start=1) if row]
    if header is not None:
        return list(header), numbered
    if not numbered:
        raise UserError(f"{path}: empty file")
    return numbered[0][1], numbered[1:]


def read_split_tsv(task: Task, path: Path, labelled: bool, headerless: bool = False) -> list[Example]:
    """Examples of one TSV split; `labelled` = train/dev (labels required), else test (index column required).

    Raises:
        UserError: missing columns or files, labels outside the task's set.
    """
    columns, rows = read_tsv(path, task.headerless_columns if headerless else None)
    wanted = list(task.text_columns) + ([task.label_column] if labelled else [])
    missing = [c for c in wanted if c not in columns]
    if missing:
        raise UserError(f"{path}: no column {missing[0]!r} (columns: {columns}); is this the {task.name} file?")
    positions = [columns.index(c) for c in task.text_columns]
    label_at = columns.index(task.label_column) if labelled else None
    index_at = columns.index(task.test_index_column) if task.test_index_column in columns else None
    needed = max(positions + ([label_at] if label_at is not None else []))
    examples, skipped = [], 0
    for number, row in rows:
        if len(row) <= needed:  # a few lines of the QQP/MNLI downloads are truncated; the official loaders skip them
            skipped += 1
            continue
        label = parse_label(task, row[label_at], f"{path}:{number}") if label_at is not None else None
        index = row[index_at] if index_at is not None else str(len(examples))
        examples.append(Example(tuple(row[p] for p in positions), label, index))
    if skipped:
        logger.warning("%s: skipped %d malformed lines", path, skipped)
    return examples


def read_glue_dir(task: Task, glue_dir: str | Path) -> dict[str, list[Example]]:
    """train, dev splits and test splits (unlabelled) of a task from a GLUE directory; AX too when present."""
    base = Path(glue_dir) / task.directory
    if not base.is_dir():
        raise UserError(f"{base}: no {task.directory} directory in the GLUE directory {glue_dir}")
    headerless = task.headerless_columns is not None
    splits = {"train": read_split_tsv(task, base / "train.tsv", True, headerless)}
    for split in task.dev:
        splits[split.name] = read_split_tsv(task, base / split.file, True, headerless)
    for split in task.test:
        if (base / split.file).is_file():
            splits[split.name] = read_split_tsv(task, base / split.file, False)
        else:
            logger.warning("%s: not found, no %s predictions", base / split.file, split.submission)
    for split in task.extra_tests:
        if (base / split.file).is_file():
            splits[split.name] = read_split_tsv(task, base / split.file, False)
    return splits


def read_hub(task: Task, hub_name: str = "nyu-mll/glue") -> dict[str, list[Example]]:
    """The task's splits from the hub (test labels are -1 there: read as unlabelled)."""
    import datasets

    def load(config: str, split: str) -> list[Example]:
        try:
            table = datasets.load_dataset(hub_name, config, split=split)
        except Exception as e:  # offline, unknown names: many exception types
            raise UserError(f"cannot load {hub_name}/{config} split {split}: {str(e).splitlines()[0]}") from None
        labelled = not split.startswith("test")
        return [
            Example(
                tuple(row[c] for c in task.hub_text_columns),
                parse_label(task, row["label"], f"{hub_name}/{config}:{split}:{i}") if labelled else None,
                str(row.get("idx", i)),
            )
            for i, row in enumerate(table)
        ]

    splits = {"train": load(task.hub_config, "train")}
    for split in task.dev + task.test:
        splits[split.name] = load(task.hub_config, split.hub_split)
    for split in task.extra_tests:
        splits[split.name] = load("ax", split.hub_split)
    return splits


def read_files(
    task: Task,
    files: dict[str, str],
    text_columns: list[str] | None = None,
    label_column: str = "label",
) -> dict[str, list[Example]]:
    """Splits from local csv/tsv/json/jsonl files with named columns ({"train": path, "dev": path, "test": path}).

    Text columns default to the hub's names for the task (e.g. sentence1, sentence2); labels are names or ids.
    A test file needs no label column; a train or dev file without labels is an error.
    """
    columns = list(text_columns or task.hub_text_columns)
    splits = {}
    for split, path_str in files.items():
        path = Path(path_str)
        records = _read_records(path)
        labelled = not split.startswith("test")  # test, test_matched, test_mismatched: no labels
        out = []
        for number, record in enumerate(records, start=1):
            where = f"{path}:{number}"
            absent = [c for c in columns + ([label_column] if labelled else []) if c not in record]
            if absent:
                kind = "label" if absent[0] == label_column else "text"
                raise UserError(f"{where}: no {kind} column {absent[0]!r} (the {split} split needs it)")
            label = parse_label(task, _maybe_int(record[label_column]), where) if labelled else None
            out.append(Example(tuple(str(record[c]) for c in columns), label, str(record.get("idx", number - 1))))
        splits[split] = out
    return splits


def _maybe_int(value: Any) -> Any:
    if is_integer_text(value):
        return int(value)
    return value


def _read_records(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise UserError(f"{path}: data file not found")
    suffix = path.suffix.lower()
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            if suffix in (".jsonl", ".json"):
                text = f.read()
                if suffix == ".json" and text.lstrip().startswith("["):
                    return list(json.loads(text))
                return [json.loads(line) for line in text.split("\n") if line.strip()]  # not splitlines: U+2028
            delimiter = "\t" if suffix == ".tsv" else ","
            quoting = csv.QUOTE_NONE if suffix == ".tsv" else csv.QUOTE_MINIMAL
            return list(csv.DictReader(f, delimiter=delimiter, quoting=quoting))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: cannot read ({e})") from None
