"""Where pretraining documents come from: the built-in generated corpus, local text files, or a hub dataset.

`load_documents` returns the training and validation documents of a data config (a fixed, seeded document-level
split, or separate validation files); `open_document_stream` opens the corpus as a stream for `data.streaming`.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from roformer.data.builtin import generate_documents
from roformer.data.config import DataConfig
from roformer.data.packing import split_documents
from roformer.data.text import expand_paths, read_documents
from roformer.errors import UserError


def load_documents(config: DataConfig, base: Path | None = None) -> tuple[list[str], list[str]]:
    """Training and validation documents of the configured source, in memory (for small corpora and evaluation).

    Raises:
        UserError: an empty corpus, bad paths or hub names.
    """
    corpus, held_out = open_documents(config, base)
    documents = list(corpus())
    if not documents:
        raise UserError(f"the {config.source} corpus has no text (empty files?)")
    if held_out is not None:
        return documents, list(held_out())
    return split_documents(documents, config.validation_fraction, config.split_seed)


def _iterate_hub(config: DataConfig) -> Iterator[str]:
    """The non-empty texts of a downloaded hub split, batch by batch from its memory-mapped Arrow table."""
    table = _load_hub(config, streaming=False)
    if config.text_column not in table.column_names:
        raise UserError(f"hub dataset {config.hub_name!r} has no column '{config.text_column}'")
    for batch in table.select_columns([config.text_column]).iter(batch_size=1000):
        yield from (t for t in batch[config.text_column] if t and t.strip())


def _load_hub(config: DataConfig, streaming: bool) -> Any:
    import datasets

    try:
        name, subset, revision = config.hub_name, config.hub_config, config.hub_revision
        return datasets.load_dataset(name, subset, split=config.hub_split, streaming=streaming, revision=revision)
    except Exception as e:  # offline, unknown name, bad split: datasets raises many types
        raise UserError(f"cannot load hub dataset {config.hub_name!r}: {str(e).splitlines()[0]}") from None


def _stream_hub(config: DataConfig) -> Iterator[str]:
    for number, row in enumerate(_load_hub(config, streaming=True)):
        if config.text_column not in row:
            raise UserError(f"hub dataset {config.hub_name!r} row {number} has no column '{config.text_column}'")
        text = row[config.text_column]
        if text and text.strip():
            yield text


def open_document_stream(config: DataConfig, base: Path | None) -> Callable[[], Iterator[str]]:
    """A function that opens the configured corpus as a fresh document stream (paths are checked now)."""
    if config.source == "hub":
        return functools.partial(_stream_hub, config)
    return _file_stream(config.paths, config, base, "data.paths")


def open_documents(
    config: DataConfig, base: Path | None = None
) -> tuple[Callable[[], Iterator[str]], Callable[[], Iterator[str]] | None]:
    """(a function that streams the corpus from its start, the same for `validation_paths`, or None).

    Nothing is held in memory: every call reads the source again (generated, file by file, or from the hub's
    memory-mapped table). Paths are checked now.

    Raises:
        UserError: missing files, an unloadable hub dataset.
    """
    if config.source == "builtin":
        corpus = functools.partial(generate_documents, config.builtin_documents, config.builtin_seed)
    elif config.source == "text":
        corpus = _file_stream(config.paths, config, base, "data.paths")
    else:
        _load_hub(config, streaming=False)  # fail now on a bad name or split
        corpus = functools.partial(_iterate_hub, config)
    held_out = None
    if config.validation_paths:
        _check_apart(config, base)
        held_out = _file_stream(config.validation_paths, config, base, "data.validation_paths")
    return corpus, held_out


def _check_apart(config: DataConfig, base: Path | None) -> None:
    """Validation files must not also be training files (evaluation on trained text measures memory).

    Raises:
        UserError: naming the first file both lists match.
    """
    if config.source != "text":
        return
    training = {p.resolve() for p in expand_paths(config.paths, base, "data.paths")}
    both = [p for p in expand_paths(config.validation_paths, base, "data.validation_paths") if p.resolve() in training]
    if both:
        raise UserError(f"data.validation_paths: {both[0]} is also in data.paths (evaluation on training text)")


def _file_stream(patterns: list[str], config: DataConfig, base: Path | None, key: str) -> Callable[[], Iterator[str]]:
    """A function that reads the documents of the files matching `patterns` (at config `key`), one file at a time."""
    files = expand_paths(patterns, base, key)

    def stream() -> Iterator[str]:
        return (d for f in files for d in read_documents(f, config.text_column, config.decode_errors))

    return stream


def validation_documents(config: DataConfig, base: Path | None = None) -> list[str]:
    """The validation documents of a data config, as training holds them out (streaming: the head of the stream)."""
    if config.streaming:
        return list(itertools.islice(open_document_stream(config, base)(), config.stream_validation_documents))
    return load_documents(config, base)[1]
