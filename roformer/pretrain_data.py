"""The `data:` section of a pretraining config, and turning it into packed train/validation blocks.

Sources: `builtin` (the generated corpus, no file), `text` (local files, folders, globs) and `hub` (a `datasets`
name/config/split). The tokenizer is trained on the training documents (vocab size and lower-casing from the
config) unless `tokenizer` names one to load. Validation is a fixed, seeded document-level split (or its own files),
so eval blocks never share text with training blocks.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

import roformer
from roformer.builtin_corpus import generate_documents
from roformer.config import check_types
from roformer.errors import ConfigError, UserError
from roformer.packing import pack_blocks, split_documents, tokenize_documents
from roformer.streaming import StreamingMLMData, pack_validation, split_stream
from roformer.text_data import expand_paths, read_documents
from roformer.tokenizer import jieba_presegmenter, load_tokenizer, save_tokenizer, train_tokenizer
from roformer.utils import staged_output_dir

logger = logging.getLogger(__name__)


@dataclass
class DataConfig:
    """Where the text comes from and how it becomes MLM blocks.

    Attributes:
        source: `builtin` (generated, see roformer.builtin_corpus), `text` (local files) or `hub` (datasets).
        paths: Files, folders or globs for `text` (relative paths are resolved against the config file's folder).
        validation_paths: Files for validation instead of a fraction of `paths`.
        validation_fraction: Fraction of documents held out for evaluation (fixed by `split_seed`).
        split_seed: Seed of the document-level train/validation split.
        text_column: Field holding the text in .jsonl/.csv/.parquet files and hub datasets.
        decode_errors: `strict` (a non-UTF-8 file is an error naming it) or `replace` (U+FFFD, counted in the log).
        hub_name: `datasets` name for `hub`, e.g. `wikitext`.
        hub_config: Its configuration, e.g. `wikitext-103-raw-v1`.
        hub_split: Its split.
        builtin_documents: Number of generated documents for `builtin` (~85 words each).
        builtin_seed: Seed of the generated corpus.
        tokenizer: A tokenizer to load (a directory, tokenizer.json or vocab.txt); null = train one.
        vocab_size: Size of a trained tokenizer.
        lowercase: Lower-case (and strip accents) in a trained tokenizer.
        jieba: Pre-segment Chinese text into words with jieba (WoBERT-style) before WordPiece.
        max_seq_len: Block length including [CLS] and [SEP].
        mask_rate: Fraction of tokens selected for MLM (80% [MASK], 10% random, 10% kept).
        eval_mask_seed: Seed of the one fixed evaluation mask.
        max_eval_blocks: Cap on validation blocks (null = all).
        num_proc: Processes for tokenization (`datasets.map`); null = 1.
        whole_word_mask: Mask whole words (all WordPiece pieces of a word together) instead of single tokens.
        cache: Keep the tokenizer and packed blocks on disk, keyed by everything they depend on (the config's data
            fields and the size and modification time of every input file), so a second run starts at once.
        cache_dir: Where; null = `$ROFORMER_CACHE` or `~/.cache/roformer`.
        streaming: Read the corpus as it is trained on instead of packing it in memory first (corpora larger than
            RAM; `hub` with `datasets` streaming, or `text` files read one at a time). See roformer.streaming.
        stream_validation_documents: With streaming, the first N documents of the stream are the validation set.
        stream_tokenizer_documents: With streaming, a trained tokenizer learns from the first N training documents.
        shuffle_buffer: With streaming, documents pass through a seeded shuffle buffer of this size each epoch.
    """

    source: Literal["builtin", "text", "hub"] = "builtin"
    paths: list[str] = field(default_factory=list)
    validation_paths: list[str] = field(default_factory=list)
    validation_fraction: float = 0.05
    split_seed: int = 0
    text_column: str = "text"
    decode_errors: Literal["strict", "replace"] = "strict"
    hub_name: str | None = None
    hub_config: str | None = None
    hub_split: str = "train"
    builtin_documents: int = 20000
    builtin_seed: int = 0
    tokenizer: str | None = None
    vocab_size: int = 8000
    lowercase: bool = True
    jieba: bool = False
    max_seq_len: int = 128
    mask_rate: float = 0.15
    eval_mask_seed: int = 1234
    max_eval_blocks: int | None = None
    num_proc: int | None = None
    whole_word_mask: bool = False
    cache: bool = True
    cache_dir: str | None = None
    streaming: bool = False
    stream_validation_documents: int = 1000
    stream_tokenizer_documents: int = 100_000
    shuffle_buffer: int = 10_000

    def __post_init__(self) -> None:
        check_types(self)
        if self.source == "text" and not self.paths:
            raise ConfigError("source: text needs paths (files, folders or globs)")
        if self.source == "hub" and not self.hub_name:
            raise ConfigError("source: hub needs hub_name")
        if not 0.0 < self.mask_rate < 1.0:
            raise ConfigError(f"mask_rate must be in (0, 1), got {self.mask_rate}")
        if self.max_seq_len < 8:
            raise ConfigError(f"max_seq_len must be >= 8, got {self.max_seq_len}")
        if self.streaming and self.source == "builtin":
            raise ConfigError("streaming is for text and hub sources (the builtin corpus is generated in memory)")
        if self.streaming and self.validation_paths:
            raise ConfigError("streaming holds out the head of the stream: use stream_validation_documents")
        if self.builtin_documents <= 0 or self.vocab_size < 10:
            raise ConfigError("builtin_documents must be > 0 and vocab_size >= 10")


@dataclass
class MLMData:
    """Packed blocks and the tokenizer that made them."""

    train: torch.Tensor  # (N, max_seq_len) token ids
    validation: torch.Tensor  # (M, max_seq_len)
    tokenizer: Any


def load_documents(config: DataConfig, base: Path | None = None) -> tuple[list[str], list[str]]:
    """Training and validation documents of the configured source."""
    if config.source == "builtin":
        documents = list(generate_documents(config.builtin_documents, config.builtin_seed))
    elif config.source == "text":
        documents = list(_read_files(config.paths, config, base))
    else:
        documents = _read_hub(config)
    if not documents:
        raise UserError(f"the {config.source} corpus has no text (empty files?)")
    if config.validation_paths:
        return documents, list(_read_files(config.validation_paths, config, base))
    return split_documents(documents, config.validation_fraction, config.split_seed)


def _read_files(patterns: list[str], config: DataConfig, base: Path | None) -> Iterator[str]:
    for path in expand_paths(patterns, base):
        yield from read_documents(path, config.text_column, config.decode_errors)


def _read_hub(config: DataConfig) -> list[str]:
    table = _load_hub(config, streaming=False)
    if config.text_column not in table.column_names:
        raise UserError(f"hub dataset {config.hub_name!r} has no column '{config.text_column}'")
    return [t for t in table[config.text_column] if t and t.strip()]


def _load_hub(config: DataConfig, streaming: bool) -> Any:
    import datasets

    try:
        return datasets.load_dataset(config.hub_name, config.hub_config, split=config.hub_split, streaming=streaming)
    except Exception as e:  # offline, unknown name, bad split: datasets raises many types
        raise UserError(f"cannot load hub dataset {config.hub_name!r}: {str(e).splitlines()[0]}") from None


def _stream_hub(config: DataConfig) -> Iterator[str]:
    for number, row in enumerate(_load_hub(config, streaming=True)):
        if config.text_column not in row:
            raise UserError(f"hub dataset {config.hub_name!r} row {number} has no column '{config.text_column}'")
        text = row[config.text_column]
        if text and text.strip():
            yield text


def _make_tokenizer(config: DataConfig, base: Path | None, texts: Iterable[str], transform: Any) -> Any:
    """Load the configured tokenizer, or train one on `texts`."""
    if config.tokenizer:
        path = Path(config.tokenizer)
        return load_tokenizer(path if path.is_absolute() or base is None else base / path, config.lowercase)
    if transform is not None:
        texts = (transform(t) for t in texts)
    return train_tokenizer(texts, config.vocab_size, config.lowercase)


def _stream_opener(config: DataConfig, base: Path | None) -> Callable[[], Iterator[str]]:
    """A function that opens the configured corpus as a fresh document stream (paths are checked now)."""
    files = expand_paths(config.paths, base) if config.source == "text" else []

    def open_stream() -> Iterator[str]:
        if config.source == "hub":
            return _stream_hub(config)
        return (d for f in files for d in read_documents(f, config.text_column, config.decode_errors))

    return open_stream


def validation_documents(config: DataConfig, base: Path | None = None) -> list[str]:
    """The validation documents of a data config, as training holds them out (streaming: the head of the stream)."""
    if config.streaming:
        return list(itertools.islice(_stream_opener(config, base)(), config.stream_validation_documents))
    return load_documents(config, base)[1]


def build_streaming_mlm_data(config: DataConfig, base: Path | None = None) -> StreamingMLMData:
    """The streaming counterpart of build_mlm_data: validation blocks and tokenizer (cached), training stream.

    Raises:
        UserError: bad paths or hub names, an empty stream, an unusable tokenizer.
    """
    open_stream = _stream_opener(config, base)
    validation_docs, training = split_stream(open_stream, config.stream_validation_documents, config.shuffle_buffer)
    if not validation_docs:
        raise UserError(f"the streamed {config.source} corpus has no documents")
    if next(itertools.islice(open_stream(), len(validation_docs), None), None) is None:
        raise UserError(
            f"the streamed corpus has only {len(validation_docs)} documents, all taken for validation "
            "(lower data.stream_validation_documents)"
        )
    transform = jieba_presegmenter() if config.jieba else None
    directory = cache_root(config) / "mlm" / data_fingerprint(config, base)
    cached = _read_cache(directory) if config.cache else None
    if cached is not None:
        tokenizer, validation = cached.tokenizer, cached.validation
    else:
        start = len(validation_docs)
        head = itertools.islice(open_stream(), start, start + config.stream_tokenizer_documents)
        tokenizer = _make_tokenizer(config, base, head, transform)
        validation = pack_validation(validation_docs, tokenizer, config.max_seq_len, transform)
        if config.cache:
            no_train = torch.zeros(0, config.max_seq_len, dtype=torch.long)  # only tokenizer and validation cached
            _write_cache(directory, MLMData(no_train, validation, tokenizer))
    if config.max_eval_blocks is not None:
        validation = validation[: config.max_eval_blocks]
    return StreamingMLMData(validation=validation, tokenizer=tokenizer, documents=training)


def build_mlm_data(config: DataConfig, base: Path | None = None) -> MLMData:
    """Read, split, tokenize (training or loading the tokenizer) and pack the configured corpus, through the cache.

    Raises:
        UserError: bad paths, encodings, an empty or too small corpus, an unusable tokenizer.
    """
    if not config.cache:
        data = _build(config, base)
    else:
        directory = cache_root(config) / "mlm" / data_fingerprint(config, base)
        data = _read_cache(directory)
        if data is None:
            data = _build(config, base)
            _write_cache(directory, data)
        else:
            logger.info("packed data from the cache: %s", directory)
    if config.max_eval_blocks is not None:
        data.validation = data.validation[: config.max_eval_blocks]
    logger.info(
        "%d train blocks, %d validation blocks of %d tokens, vocabulary %d",
        len(data.train),
        len(data.validation),
        config.max_seq_len,
        len(data.tokenizer),
    )
    return data


# Fields that do not change the tokenizer or the packed blocks, left out of the cache key.
_NOT_IN_KEY = ("mask_rate", "eval_mask_seed", "max_eval_blocks", "num_proc", "whole_word_mask", "cache", "cache_dir")
_CACHE_VERSION = 1  # bump when tokenization or packing changes what they produce


def cache_root(config: DataConfig) -> Path:
    """The cache directory of a data config."""
    if config.cache_dir:
        return Path(config.cache_dir).expanduser()
    return Path(os.environ.get("ROFORMER_CACHE", "~/.cache/roformer")).expanduser()


def data_fingerprint(config: DataConfig, base: Path | None = None) -> str:
    """A hash of everything the packed blocks depend on: data fields, input files (path, size, mtime), versions."""
    fields = {k: v for k, v in vars(config).items() if k not in _NOT_IN_KEY}
    files = []
    if config.source == "text":
        for pattern_list in (config.paths, config.validation_paths):
            files += [_file_stamp(p) for p in expand_paths(pattern_list, base)] if pattern_list else []
    if config.tokenizer:
        path = Path(config.tokenizer)
        path = path if path.is_absolute() or base is None else base / path
        files += [_file_stamp(p) for p in sorted(path.iterdir())] if path.is_dir() else [_file_stamp(path)]
    key = {"fields": fields, "files": files, "version": [_CACHE_VERSION, roformer.__version__]}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _file_stamp(path: Path) -> list[Any]:
    stat = path.stat() if path.exists() else None
    return [str(path.resolve()), stat.st_size if stat else None, stat.st_mtime_ns if stat else None]


def _read_cache(directory: Path) -> MLMData | None:
    if not (directory / "info.json").is_file():
        return None
    try:
        tokenizer = load_tokenizer(directory / "tokenizer")
        train = torch.from_numpy(np.load(directory / "train.npy").astype(np.int64))
        validation = torch.from_numpy(np.load(directory / "validation.npy").astype(np.int64))
    except (OSError, ValueError, UserError) as e:  # a damaged cache entry is rebuilt, not fatal
        logger.warning("ignoring damaged data cache %s: %s", directory, e)
        return None
    return MLMData(train=train, validation=validation, tokenizer=tokenizer)


def _write_cache(directory: Path, data: MLMData) -> None:
    dtype = np.uint16 if len(data.tokenizer) <= np.iinfo(np.uint16).max else np.int32
    try:
        with staged_output_dir(directory, overwrite=True) as staging:
            save_tokenizer(data.tokenizer, staging / "tokenizer")
            np.save(staging / "train.npy", data.train.numpy().astype(dtype))
            np.save(staging / "validation.npy", data.validation.numpy().astype(dtype))
            info = {"train_blocks": len(data.train), "validation_blocks": len(data.validation)}
            (staging / "info.json").write_text(json.dumps(info))
    except OSError as e:  # a read-only or full disk costs the next run time, not this run
        logger.warning("could not write the data cache %s: %s", directory, e)


def _build(config: DataConfig, base: Path | None = None) -> MLMData:
    """Read, split, tokenize and pack, without the cache."""
    train_docs, val_docs = load_documents(config, base)
    transform: Callable[[str], str] | None = jieba_presegmenter() if config.jieba else None
    tokenizer = _make_tokenizer(config, base, train_docs, transform)

    def pack(documents: list[str], split: str) -> torch.Tensor:
        ids = tokenize_documents(documents, tokenizer, config.num_proc, transform)
        try:
            return pack_blocks(ids, config.max_seq_len, tokenizer.cls_token_id, tokenizer.sep_token_id)
        except UserError as e:
            raise UserError(f"{split} split: {e}") from None

    train, validation = pack(train_docs, "train"), pack(val_docs, "validation")
    return MLMData(train=train, validation=validation, tokenizer=tokenizer)
