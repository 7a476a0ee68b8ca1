"""Records of a task's data: rows of a local csv/tsv/json/jsonl/parquet file or a hub split, each with where it is.

Every fine-tuning reader but GLUE's official TSVs and the formats of their own (CoNLL columns, SQuAD JSON) reads its
rows here, so a bad row is reported the same way everywhere: `file:line: what is wrong` (a hub row: `name:split:i`).
A field may be named with dots into nested JSON objects (`target.span1_text`), and a text column may be a template
filled from the record (`"{target.span2_text}是{target.span1_text}"`).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roformer.data.text import json_lines
from roformer.errors import UserError

if TYPE_CHECKING:
    from roformer.tasks.config import FinetuneDataConfig

logger = logging.getLogger(__name__)

FORMATS = ("csv", "tsv", "json", "jsonl", "parquet")


@dataclass(frozen=True)
class Record:
    """One row: its fields and where it was read (`path:line`, for error messages)."""

    fields: dict[str, Any]
    where: str


def file_format(path: Path, format: str = "auto") -> str:
    """The format of `path`: `format` unless `auto`, else from the suffix (.txt and unknown suffixes: an error).

    Raises:
        UserError: a suffix that names no known format.
    """
    if format != "auto":
        return format
    suffix = path.suffix.lower().lstrip(".")
    if suffix in FORMATS:
        return suffix
    raise UserError(f"{path}: cannot tell the format from the suffix {path.suffix!r}: set data.format ({FORMATS})")


def read_text(path: Path, line_ends_as_written: bool = False) -> str:
    r"""The file's text (UTF-8, a byte-order mark dropped).

    Args:
        path: The file.
        line_ends_as_written: Keep `\r\n` and a lone `\r` as they are (default: read as `\n`, Python's universal
            newlines).

    Raises:
        UserError: a missing, unreadable or non-UTF-8 file, naming it.
    """
    if not path.is_file():
        raise UserError(f"{path}: data file not found")
    try:
        with path.open(encoding="utf-8-sig", newline="" if line_ends_as_written else None) as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror or e})") from None


def read_records(path: str | Path, format: str = "auto", column_names: list[str] | None = None) -> list[Record]:
    """Every row of a csv, tsv (no quoting: quotes are text), json (a list, or JSON lines), jsonl or parquet file.

    Args:
        path: The file.
        format: `csv`, `tsv`, `json`, `jsonl`, `parquet`, or `auto` (from the suffix).
        column_names: A csv or tsv file without a header line: its columns' names.

    Raises:
        UserError: a missing or unreadable file, a line that is not JSON or not an object, naming file and line.
    """
    path = Path(path)
    kind = file_format(path, format)
    if kind == "parquet":
        return _read_parquet(path)
    text = read_text(path)
    if kind in ("json", "jsonl"):
        return _read_json(path, text, whole_file=kind == "json")
    delimiter, quoting = ("\t", csv.QUOTE_NONE) if kind == "tsv" else (",", csv.QUOTE_MINIMAL)
    reader = csv.DictReader(io.StringIO(text, newline=""), column_names, delimiter=delimiter, quoting=quoting)
    records = []
    try:
        for row in reader:
            if None in row or None in row.values():  # more cells than names, or fewer
                cells = sum(v is not None for k, v in row.items() if k is not None) + len(row.get(None, []))
                names = len(row) - (None in row)
                raise UserError(f"{path}:{reader.line_num}: {cells} cells, expected {names} ({kind} columns)")
            records.append(Record({k: v.rstrip("\r") for k, v in row.items()}, f"{path}:{reader.line_num}"))
    except csv.Error as e:
        raise UserError(f"{path}:{reader.line_num}: {e}") from None
    return records


def _read_json(path: Path, text: str, whole_file: bool) -> list[Record]:
    if whole_file and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{e.lineno}: not JSON ({e.msg})") from None
        return [_record(path, row, f"{path}:[{i}]") for i, row in enumerate(rows)]
    return [_record(path, row, f"{path}:{number}") for number, row in json_lines(path, text)]


def _record(path: Path, row: Any, where: str) -> Record:
    if not isinstance(row, dict):
        raise UserError(f"{where}: expected a JSON object (a record), got {type(row).__name__}")
    return Record(row, where)


def _read_parquet(path: Path) -> list[Record]:
    if not path.is_file():
        raise UserError(f"{path}: data file not found")
    try:
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises several types for a bad file
        raise UserError(f"{path}: cannot read parquet ({str(e).splitlines()[0]})") from None
    return [Record(row, f"{path}:row {i + 1}") for i, row in enumerate(rows)]


def read_hub_split(name: str, config: str | None, split: str) -> list[Record]:
    """Every row of one split of a hub dataset (`datasets.load_dataset`).

    Raises:
        UserError: the dataset, configuration or split cannot be loaded (offline, unknown names).
    """
    import datasets

    try:
        table = datasets.load_dataset(name, config, split=split)
    except Exception as e:  # offline, unknown names: many exception types
        label = f"{name}/{config}" if config else name
        raise UserError(f"cannot load {label} split {split}: {str(e).splitlines()[0]}") from None
    return [Record(dict(row), f"{name}:{split}:{i}") for i, row in enumerate(table)]


_MISSING = object()
_TEMPLATE_FIELD = re.compile(r"\{([^{}]+)\}")


def field(record: Record, column: str) -> Any:
    """The value of `column` in `record`: a field, a dotted path into nested objects, or a `{field}` template.

    Raises:
        UserError: the field is absent, naming the record's file and line.
    """
    if "{" in column:  # not str.format: it would read `{a.b}` as attribute b of field a
        return _TEMPLATE_FIELD.sub(lambda match: _text(field(record, match.group(1))), column)
    value: Any = record.fields.get(column, _MISSING)
    if value is _MISSING and "." in column:
        value = record.fields
        for part in column.split("."):
            value = value.get(part, _MISSING) if isinstance(value, dict) else _MISSING
    if value is _MISSING:
        known = ", ".join(map(str, record.fields)) or "none"
        raise UserError(f"{record.where}: no field {column!r} (fields: {known})")
    return value


def text_field(record: Record, column: str) -> str:
    """`field` as text: a list (CSL's keywords) joined by spaces; a missing value (null) is an error.

    Raises:
        UserError: the field is absent or null.
    """
    value = field(record, column)
    if value is None:
        raise UserError(f"{record.where}: field {column!r} is empty (null)")
    return _text(value)


def _text(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return str(value)


def example_id(record: Record, column: str | None, number: int) -> str:
    """The record's id: `column`, else an `id` or `idx` field, else its position in the split."""
    if column:
        return str(field(record, column))
    for name in ("id", "idx"):
        if name in record.fields:
            return str(record.fields[name])
    return str(number)


HUB_SPLITS = {"train": "train", "dev": "validation", "test": "test"}  # our split names -> a hub dataset's


def read_split_records(data: FinetuneDataConfig) -> dict[str, list[Record]]:
    """The rows of every split of a data: section: train and dev, test when given (files) or on the hub.

    A hub dataset whose test split does not load (many have none) is used without it (logged).

    Raises:
        UserError: a missing, unreadable or empty file or split, a train or dev hub split that does not load.
    """
    if data.source == "hub":
        assert data.hub_name is not None  # FinetuneDataConfig checks it
        name, config = data.hub_name, data.hub_config
        splits = {split: read_hub_split(name, config, HUB_SPLITS[split]) for split in ("train", "dev")}
        try:
            splits["test"] = read_hub_split(name, config, HUB_SPLITS["test"])
        except UserError as e:
            logger.warning("no test split (%s)", e)
        where = dict.fromkeys(splits, name)
    else:
        where = {"train": data.train_file, "dev": data.validation_file, "test": data.test_file}
        splits = {split: read_records(path, data.format, data.column_names) for split, path in where.items() if path}
    for split, rows in splits.items():
        if not rows:
            raise UserError(f"{where[split]}: the {split} split is empty")
    return splits
