"""Reading raw text for MLM pretraining: local files, folders and globs, with clear errors for bad files.

A `.txt` file is split into documents at blank lines (lines inside a paragraph are joined), so that a book becomes a
sequence of paragraphs; `.jsonl`, `.csv` and `.parquet` files give one document per record from `text_column`.
Bytes that are not UTF-8 are an error naming the file and the offset (`decode_errors: strict`, the default), or are
replaced by U+FFFD and counted (`decode_errors: replace`).
"""

from __future__ import annotations

import glob
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from roformer.catalogue import missing_data_hint
from roformer.errors import UserError

logger = logging.getLogger(__name__)

TEXT_SUFFIXES = (".txt", ".jsonl", ".json", ".csv", ".parquet")


def expand_paths(patterns: list[str], base: Path | None = None, key: str | None = None) -> list[Path]:
    """Files named by paths, folders and glob patterns, sorted and de-duplicated.

    A folder is read recursively: files with a known suffix (any case), hidden files and folders skipped.

    Args:
        patterns: The paths, folders and globs.
        base: The folder relative paths that do not exist as given are read from.
        key: The config key that holds them (`data.paths`), named with the data root in a missing path's error.

    Raises:
        UserError: a path or pattern that matches nothing, or no file at all.
    """
    files: list[Path] = []
    for pattern in patterns:
        path = Path(pattern).expanduser()
        if base is not None and not path.is_absolute() and not path.exists():
            path = base / path
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and _is_corpus_file(p.relative_to(path)))
            if not found:
                raise UserError(f"{path}: folder has no {'/'.join(TEXT_SUFFIXES)} files")
            files += found
        elif path.is_file():
            files.append(path)
        elif any(c in pattern for c in "*?["):
            found = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
            if not found:
                raise UserError(f"{pattern}: glob matches no file")
            files += found
        else:
            hint = f"; {missing_data_hint(path, key, value='[PATH]')}" if key else ""
            raise UserError(f"{key + ': ' if key else ''}{path}: no such file or folder{hint}")
    unique = list(dict.fromkeys(p.resolve() for p in files))
    if not unique:
        raise UserError("no text files given (data.paths is empty)")
    return unique


def _is_corpus_file(relative: Path) -> bool:
    """A file of a corpus folder: a known suffix (any case, as `read_documents` reads it), nothing hidden on the way.

    Hidden folders hold copies (`.ipynb_checkpoints`, editors' backups, `.git`): read as documents they would be
    counted twice and could land on both sides of the train/validation split.
    """
    return relative.suffix.lower() in TEXT_SUFFIXES and not any(part.startswith(".") for part in relative.parts)


def decode(path: Path, raw: bytes, errors: str) -> tuple[str, int]:
    """Decode UTF-8 (a BOM is dropped); returns the text and the number of replaced bytes.

    Raises:
        UserError: with errors='strict', naming the file and the first bad byte.
    """
    try:
        return raw.decode("utf-8-sig"), 0
    except UnicodeDecodeError as e:
        if errors == "strict":
            raise UserError(
                f"{path}: not UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}); re-encode the file or set "
                "data.decode_errors: replace"
            ) from None
    text = raw.decode("utf-8-sig", errors="replace")
    return text, text.count("\ufffd")


def paragraphs(text: str) -> Iterator[str]:
    """Documents of a plain-text file: blocks separated by blank lines, inner line breaks joined by spaces."""
    block: list[str] = []
    for line in text.splitlines():  # handles \\r\\n
        stripped = line.strip()
        if stripped:
            block.append(stripped)
        elif block:
            yield " ".join(block)
            block = []
    if block:
        yield " ".join(block)


_REPORTED: set[Path] = set()


def json_lines(path: Path, text: str) -> Iterator[tuple[int, object]]:
    """(line number, value) of every non-blank line of JSON Lines `text`, read from `path`.

    JSON Lines break at a newline only: `str.splitlines` would also break inside strings at U+2028, form feed, ...

    Raises:
        UserError: a line that is not JSON, naming the file and line.
    """
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{number}: not a JSON line ({e.msg})") from None


def read_documents(path: Path, text_column: str = "text", decode_errors: str = "strict") -> Iterator[str]:
    """Yield the documents of one file (see the module docstring).

    Raises:
        UserError: unreadable file, bad encoding (strict), missing text column, malformed JSON line.
    """
    suffix = path.suffix.lower()
    if suffix in (".csv", ".parquet"):
        yield from _read_table(path, text_column)
        return
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    text, replaced = decode(path, raw, decode_errors)
    if replaced and path not in _REPORTED:  # a corpus is read several times (count, sample, write): say it once
        _REPORTED.add(path)
        logger.warning("%s: %d undecodable bytes replaced with U+FFFD", path, replaced)
    if suffix in (".jsonl", ".json"):
        for number, record in json_lines(path, text):
            if not isinstance(record, dict) or text_column not in record:
                raise UserError(f"{path}:{number}: no '{text_column}' field (set data.text_column)")
            value = record[text_column]
            if value is not None and str(value).strip():  # null: no text (not the document "None")
                yield str(value)
        return
    yield from paragraphs(text)


def _read_table(path: Path, text_column: str) -> Iterator[str]:
    import datasets

    try:
        table = (
            datasets.Dataset.from_csv(str(path)) if path.suffix == ".csv" else datasets.Dataset.from_parquet(str(path))
        )
    except Exception as e:  # pyarrow raises many types for malformed files
        raise UserError(f"{path}: cannot read as {path.suffix[1:]} ({str(e).splitlines()[0]})") from None
    if text_column not in table.column_names:
        raise UserError(f"{path}: no column '{text_column}' (columns: {', '.join(table.column_names)})")
    for value in table[text_column]:
        if value is not None and str(value).strip():
            yield str(value)


INTEGER = re.compile(r"\s*-?[0-9]+\s*")  # ASCII digits: str.isdigit also takes "²", which int() refuses


def is_integer_text(value: Any) -> bool:
    """Whether `value` is a string that int() reads: an optional minus and ASCII digits (spaces around allowed)."""
    return isinstance(value, str) and INTEGER.fullmatch(value) is not None
