"""Tagged sentences in and out (`type: token_classification`): files and hub splits read, CoNLL predictions written.

The type's settings section `data.tagging` (`TaggingConfig`) is here, since most of it says how files are read;
roformer.tasks.tagging is the task that trains on the sentences.

Sources:
- CoNLL column files (`tagging.format: conll`, or `auto` for any suffix but .json/.jsonl): one word per line, its
  columns separated by spaces or tabs (other whitespace, e.g. U+3000, stays inside a word), the word first and the
  tag in `tagging.tag_column` (-1 = the last); a blank line ends a sentence; `-DOCSTART-` lines are skipped; CRLF line
  ends are read as LF. Every word line has the column count of the file's first one. A file of one column holds
  words only: an unlabelled test split.
- JSON lines (`jsonl`, or `auto` for .json/.jsonl; a JSON list of records is read too): a record per sentence with a
  list of words (`tagging.tokens_column`) and a list of tags (`tagging.tags_column`), as names or as ids into
  `data.labels`. A split whose records have no tags field is unlabelled (a test split).
- Hub datasets (`data.source: hub`): splits train, validation and test (when the dataset has it), fields as for
  JSON lines. Tags stored as ids (conll2003's `ner_tags`) are named by `data.labels`, else by the dataset's own
  names (`features[tags_column].feature.names`, a `ClassLabel` sequence). That path needs the network (or the
  datasets cache) and is not run by the offline tests.
Sentences without words (JSON lines, hub) are skipped, and counted in the log.

Predictions are written per split as `<split>.conll`: each word's line with the predicted tag appended as the last
column (space-separated: conlleval reads `word ... gold predicted`); JSON-lines and hub words as `word gold predicted`
(or `word predicted` when unlabelled), whitespace inside a word written as `_`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from roformer.config import check_types
from roformer.errors import UserError
from roformer.tasks.config import FinetuneDataConfig
from roformer.tasks.records import Record, example_id, field, read_hub_split, read_records, read_text

logger = logging.getLogger(__name__)

DOCSTART = "-DOCSTART-"  # CoNLL-2003's document separator line: not a sentence
_COLUMN_SEPARATOR = re.compile(r"[ \t]+")


@dataclass
class TaggingConfig:
    """`data.tagging:` of `type: token_classification` (NER, POS).

    Attributes:
        format: `conll` (whitespace-separated columns, one token per line, blank lines between sentences,
            `-DOCSTART-` lines skipped) or `jsonl` (one sentence per line: a list of tokens and a list of tags);
            `auto` = `jsonl` for .json/.jsonl files, `conll` otherwise.
        tag_column: `conll`: the column holding the tag (0-based; -1 = the last).
        tokens_column: `jsonl` and hub datasets: the field holding the tokens.
        tags_column: `jsonl` and hub datasets: the field holding the tags (names, or ids into `labels`).
        scheme: How the tags mark entities: `IOB1`, `IOB2` or `IOBES` (conlleval and seqeval's definitions; the
            entity-level F1 selects), `none` (plain tags, one per word with no entities: POS tags, or IO tags such as
            `PER`; token accuracy selects and is reported per tag), or `auto`: an entity scheme when a tag other than
            `O` has a `B-`, `I-`, `E-` or `S-` prefix, else `none`.
        label_all_tokens: Train on every WordPiece piece of a word (its word's tag; `B-` becomes `I-` after the
            first piece) instead of the first piece only. Predictions always read the first piece.
    """

    format: Literal["auto", "conll", "jsonl"] = "auto"
    tag_column: int = -1
    tokens_column: str = "tokens"
    tags_column: str = "tags"
    scheme: Literal["auto", "IOB1", "IOB2", "IOBES", "none"] = "auto"
    label_all_tokens: bool = False

    def __post_init__(self) -> None:
        check_types(self)


@dataclass(frozen=True)
class Sentence:
    """One sentence of a split.

    Attributes:
        tokens: Its words.
        tags: Their tags (names), or None in an unlabelled split.
        where: Where it was read (`file:line` of its first word; a hub row `name:split:i`), for messages.
        index: Its id: the JSON/hub id field (data.id_column, `id` or `idx`), else its number in the split.
        columns: CoNLL input: every word's columns, written back with the prediction; None for other sources.
    """

    tokens: list[str]
    tags: list[str] | None
    where: str
    index: str
    columns: list[list[str]] | None = None


@dataclass(frozen=True)
class TagNames:
    """How tags read from data become names.

    Attributes:
        names: Names of tag ids, in id order (data.labels or the hub's); None: ids are an error.
        closed: Tag names outside `names` are an error (data.labels was given).
    """

    names: list[str] | None = None
    closed: bool = False

    def name(self, value: Any, where: str) -> str:
        """The tag name of a value read at `where`: a name, or an id into `names`.

        Raises:
            UserError: an id without names or out of range, a name outside a closed set, another type.
        """
        if isinstance(value, int) and not isinstance(value, bool):
            if self.names is None:
                raise UserError(f"{where}: tag {value} is an id: set data.labels (the tag names in id order)")
            if not 0 <= value < len(self.names):
                raise UserError(f"{where}: tag id {value} is outside the {len(self.names)} labels")
            return self.names[value]
        if not isinstance(value, str):
            raise UserError(f"{where}: a tag must be a name or an id, got {type(value).__name__} {value!r}")
        if self.closed and self.names is not None and value not in self.names:
            raise UserError(f"{where}: tag {value!r} is not in data.labels ({', '.join(self.names)})")
        return value


# ----------------------------------------------------------------------------------------------------------------
# Readers


def read_conll(path: str | Path, tag_column: int = -1, tags: TagNames | None = None) -> list[Sentence]:
    """The sentences of a CoNLL column file (see the module's docstring for the format).

    Raises:
        UserError: a missing or unreadable file, a line with another column count than the first word line's, a
            tag column the file does not have, a tag outside a closed label set (each naming file and line), or
            a file without sentences.
    """
    path, tags = Path(path), tags or TagNames()
    sentences: list[Sentence] = []
    block: list[list[str]] = []  # the current sentence's lines, split into columns
    first_line, expected, tag_index = 0, 0, None
    for number, line in enumerate(read_text(path).split("\n"), start=1):
        cells = _COLUMN_SEPARATOR.split(line.strip(" \t\r"))
        if cells == [""] or cells[0] == DOCSTART:  # a blank line or a document start ends a sentence
            if block:
                sentences.append(_conll_sentence(block, tag_index, tags, path, first_line, len(sentences)))
            block = []
            continue
        if not expected:
            expected, tag_index = len(cells), _tag_index(tag_column, len(cells), f"{path}:{number}")
        elif len(cells) != expected:
            raise UserError(f"{path}:{number}: {len(cells)} columns, expected {expected}")
        if not block:
            first_line = number
        block.append(cells)
    if block:
        sentences.append(_conll_sentence(block, tag_index, tags, path, first_line, len(sentences)))
    if not sentences:
        raise UserError(f"{path}: no sentences (an empty file, or only -DOCSTART- lines)")
    return sentences


def _tag_index(tag_column: int, columns: int, where: str) -> int | None:
    """The column holding the tag (None: one column, words only); the word is column 0.

    Raises:
        UserError: `tag_column` names no column of the file but the word's.
    """
    if columns == 1:
        return None
    index = tag_column if tag_column >= 0 else columns + tag_column
    if not 0 < index < columns:
        raise UserError(f"{where}: data.tagging.tag_column {tag_column} is not a tag column of {columns} columns")
    return index


def _conll_sentence(
    block: list[list[str]], tag_index: int | None, tags: TagNames, path: Path, first_line: int, number: int
) -> Sentence:
    """A sentence of consecutive lines `block`, the first of them line `first_line`."""
    names = None
    if tag_index is not None:
        names = [tags.name(cells[tag_index], f"{path}:{first_line + i}") for i, cells in enumerate(block)]
    return Sentence([cells[0] for cells in block], names, f"{path}:{first_line}", str(number), block)


def read_json_sentences(
    path: str | Path, tagging: TaggingConfig, tags: TagNames | None = None, id_column: str | None = None
) -> list[Sentence]:
    """The sentences of a JSON-lines file (or a JSON list) of {tokens, tags} records.

    Raises:
        UserError: a missing or unreadable file, a bad record (naming file and line), no sentences.
    """
    records = read_records(path, "json")  # JSON lines, or one JSON list
    sentences = records_to_sentences(records, tagging, tags or TagNames(), id_column)
    if not sentences:
        raise UserError(f"{path}: no sentences (an empty file?)")
    return sentences


def records_to_sentences(
    records: list[Record], tagging: TaggingConfig, tags: TagNames, id_column: str | None = None
) -> list[Sentence]:
    """Sentences of JSON or hub records; records without words are skipped (counted in the log).

    Raises:
        UserError: words or tags that are not lists, a word that is not text, unequal lengths, a bad tag, a split
            with tags in some records only (each naming its record).
    """
    sentences, empty = [], 0
    for number, record in enumerate(records):
        tokens = _list_field(record, tagging.tokens_column)
        if any(not isinstance(t, str) for t in tokens):
            raise UserError(f"{record.where}: {tagging.tokens_column!r} must be a list of strings")
        values = _list_field(record, tagging.tags_column) if _has_field(record, tagging.tags_column) else None
        if values is not None and len(values) != len(tokens):
            raise UserError(f"{record.where}: {len(tokens)} tokens but {len(values)} tags")
        if not tokens:
            empty += 1
            continue
        names = None if values is None else [tags.name(v, record.where) for v in values]
        sentences.append(Sentence(tokens, names, record.where, example_id(record, id_column, number)))
    if empty:
        logger.info("%s: %d sentences without words skipped", records[0].where.rsplit(":", 1)[0], empty)
    _check_labelled(sentences)
    return sentences


def _has_field(record: Record, column: str) -> bool:
    try:
        field(record, column)
    except UserError:
        return False
    return True


def _list_field(record: Record, column: str) -> list[Any]:
    value = field(record, column)
    if not isinstance(value, list):
        raise UserError(f"{record.where}: {column!r} must be a list, got {type(value).__name__}")
    return value


def _check_labelled(sentences: list[Sentence]) -> None:
    """A split is labelled throughout or not at all.

    Raises:
        UserError: some sentences have tags and others not, naming the first without.
    """
    labelled = [s.tags is not None for s in sentences]
    if any(labelled) and not all(labelled):
        raise UserError(f"{sentences[labelled.index(False)].where}: no tags, where other sentences have them")


def hub_tag_names(name: str, config: str | None, column: str) -> list[str] | None:
    """The names of a hub dataset's tag ids (a `Sequence(ClassLabel)` feature), or None when it has none.

    Reads the dataset's metadata (`datasets.load_dataset_builder`): the network or the datasets cache. Not run by
    the offline tests.
    """
    import datasets

    try:
        features = datasets.load_dataset_builder(name, config).info.features
    except Exception:  # offline, unknown names: the split reads will report it
        return None
    feature = getattr(features.get(column) if features else None, "feature", None)
    names = getattr(feature, "names", None)
    return list(names) if names else None


def read_split(data: FinetuneDataConfig, split: str, tags: TagNames) -> list[Sentence]:
    """The sentences of one split (`train`, `dev` or `test`) of a files or hub source.

    Raises:
        UserError: what the readers raise.
    """
    tagging = data.tagging or TaggingConfig()
    if data.source == "hub":
        hub_split = {"dev": "validation"}.get(split, split)
        sentences = records_to_sentences(
            read_hub_split(data.hub_name, data.hub_config, hub_split), tagging, tags, data.id_column
        )
        if not sentences:
            raise UserError(f"{data.hub_name}: split {hub_split} has no sentences")
        return sentences
    path = Path({"train": data.train_file, "dev": data.validation_file, "test": data.test_file}[split])
    if tagging_format(path, tagging.format) == "jsonl":
        return read_json_sentences(path, tagging, tags, data.id_column)
    return read_conll(path, tagging.tag_column, tags)


def tagging_format(path: Path, format: str) -> str:
    """`format`, or for `auto`: `jsonl` for .json/.jsonl files, `conll` for any other."""
    if format != "auto":
        return format
    return "jsonl" if path.suffix.lower() in (".json", ".jsonl") else "conll"


def read_splits(data: FinetuneDataConfig, tags: TagNames) -> dict[str, list[Sentence]]:
    """The sentences of every split present: train, dev, and test when given (a hub dataset's when it has one).

    Raises:
        UserError: what the readers raise; a training or dev split without tags.
    """
    splits = {split: read_split(data, split, tags) for split in ("train", "dev")}
    if data.source == "hub":
        splits.update(hub_test_split(data, tags))
    elif data.test_file:
        splits["test"] = read_split(data, "test", tags)
    for split in ("train", "dev"):
        if splits[split][0].tags is None:
            raise UserError(f"{splits[split][0].where}: the {split} split has no tags")
    return splits


def hub_test_split(data: FinetuneDataConfig, tags: TagNames) -> dict[str, list[Sentence]]:
    """The hub dataset's test split as {"test": sentences}, or {} when it cannot be read (it may have none)."""
    try:
        return {"test": read_split(data, "test", tags)}
    except UserError as e:
        logger.info("%s: no test split read (%s)", data.hub_name, e)
        return {}


# ----------------------------------------------------------------------------------------------------------------
# Predictions files


def _cell(token: str) -> str:
    """A word as one column: whitespace inside it becomes `_` (an empty word too)."""
    return re.sub(r"\s+", "_", token) or "_"


def conll_lines(sentence: Sentence, predicted: list[str]) -> list[str]:
    """The lines of a sentence with its predicted tags.

    CoNLL input: its columns plus the prediction; other input: `word gold predicted` (`word predicted` unlabelled).
    """
    if sentence.columns is not None:
        return [" ".join([*cells, tag]) for cells, tag in zip(sentence.columns, predicted)]
    gold = sentence.tags if sentence.tags is not None else [None] * len(predicted)
    return [" ".join(c for c in (_cell(w), g, p) if c is not None) for w, g, p in zip(sentence.tokens, gold, predicted)]


def conll_text(sentences: list[Sentence], predicted: list[list[str]]) -> str:
    """A CoNLL file of the sentences with their predicted tags, a blank line after each sentence."""
    return "".join("\n".join(conll_lines(s, tags)) + "\n\n" for s, tags in zip(sentences, predicted))
