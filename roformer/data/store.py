"""Turning the `data:` section into a tokenizer and a memory-mapped token store of train/validation blocks.

Sources (see roformer.data.corpus): `builtin`, `text` files, `hub`, streamed from disk. The tokenizer is trained on
(a seeded sample of) the training documents (vocab size and lower-casing from the config) unless `tokenizer` names
one to load. Validation is a fixed, seeded document-level split (or its own files), so eval blocks never share text
with training blocks. The store (roformer.data.token_store) is built once into the cache, keyed by every field and
input file it depends on, and read through a memory map; `roformer prepare-data` builds it ahead of training.
`data.streaming` keeps its own path (roformer.data.streaming): tokenizer and validation blocks cached, training
documents tokenized as they stream. `train_batches` wraps either in the masked batches of every step
(roformer.data.mlm).
"""

from __future__ import annotations

import atexit
import hashlib
import itertools
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from roformer.data.config import DataConfig
from roformer.data.corpus import open_document_stream, open_documents
from roformer.data.mlm import MLMBatches, PackedBlocks, StreamedBlocks
from roformer.data.packing import validation_mask
from roformer.data.streaming import StreamingMLMData, StreamPacker, pack_validation, split_stream
from roformer.data.text import expand_paths
from roformer.data.token_store import STORE_FILE, BlockView, TokenStore, write_token_store
from roformer.data.tokenizer import jieba_presegmenter, load_tokenizer, save_tokenizer, train_tokenizer, vocab_hash
from roformer.errors import UserError
from roformer.files import staged_output_dir
from roformer.version import __version__

logger = logging.getLogger(__name__)


@dataclass
class MLMData:
    """Training blocks, validation blocks and the tokenizer that made them."""

    train: Any  # (N, max_seq_len) token ids: a BlockView over the memory-mapped store (or a tensor)
    validation: torch.Tensor  # (M, max_seq_len), in memory (at most max_eval_blocks)
    tokenizer: Any


def _make_tokenizer(
    config: DataConfig, base: Path | None, texts: Iterable[str], transform: Any, given: Any = None
) -> Any:
    """The tokenizer `given` (another process's), else the configured one loaded, else one trained on `texts`."""
    if given is not None:
        return given
    if config.tokenizer:
        path = Path(config.tokenizer)
        path = path if path.is_absolute() or base is None else base / path
        return load_tokenizer(path, config.lowercase, split_cjk=not config.jieba)
    if transform is not None:
        texts = (transform(t) for t in texts)
    return train_tokenizer(texts, config.vocab_size, config.lowercase, split_cjk=not config.jieba)


def build_streaming_mlm_data(config: DataConfig, base: Path | None = None, tokenizer: Any = None) -> StreamingMLMData:
    """The streaming counterpart of build_mlm_data: validation blocks and tokenizer (cached), training stream.

    Raises:
        UserError: bad paths or hub names, an empty stream, an unusable tokenizer.
    """
    open_stream = open_document_stream(config, base)
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
    cached = _usable(_read_cache(directory), tokenizer) if config.cache else None
    if cached is not None:
        tokenizer, validation = cached.tokenizer, cached.validation
    else:
        given = tokenizer
        start = len(validation_docs)
        head = itertools.islice(open_stream(), start, start + config.tokenizer_documents)
        tokenizer = _make_tokenizer(config, base, head, transform, given)
        validation = pack_validation(validation_docs, tokenizer, config.max_seq_len, transform)
        if config.cache and given is None:
            no_train = torch.zeros(0, config.max_seq_len, dtype=torch.long)  # only tokenizer and validation cached
            _write_cache(directory, MLMData(no_train, validation, tokenizer))
    validation = eval_subset(validation, config)
    return StreamingMLMData(validation=validation, tokenizer=tokenizer, documents=training)


def build_mlm_data(config: DataConfig, base: Path | None = None, tokenizer: Any = None) -> MLMData:
    """The configured corpus as a token store (built once, then memory-mapped) and its tokenizer.

    The store is built when missing (`build_token_store`), in the cache directory keyed by everything it depends
    on; with `cache: false` in a temporary directory removed at exit. `tokenizer` (the main process's, in the other
    processes) replaces training or loading one; a cached store made with another vocabulary is then not used.

    Raises:
        UserError: bad paths, encodings, an empty or too small corpus, an unusable tokenizer, a damaged store.
    """
    directory = store_directory(config, base)
    if not store_usable(directory, tokenizer):
        if tokenizer is not None and directory.exists():  # the cache holds another vocabulary: leave it
            directory = _temporary_directory(config)
        build_token_store(config, directory, base, tokenizer)
    else:
        logger.info("token store from the cache: %s", directory)
    tokenizer = tokenizer or load_tokenizer(directory / TOKENIZER_SUBDIR, config.lowercase, split_cjk=not config.jieba)
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    splits = {}
    for split in ("train", "validation"):
        view = BlockView(TokenStore(directory / split), config.max_seq_len, cls, sep)
        if len(view) == 0:
            body = config.max_seq_len - 2
            raise UserError(f"{split} split: corpus too small: {view.store.num_tokens} tokens, a block of "
                            f"max_seq_len={config.max_seq_len} needs {body}")  # fmt: skip
        splits[split] = view
    validation = splits["validation"][eval_indices(len(splits["validation"]), config)]
    logger.info(
        "%d train blocks (memory-mapped), %d validation blocks of %d tokens, vocabulary %d",
        len(splits["train"]), len(validation), config.max_seq_len, len(tokenizer),
    )  # fmt: skip
    return MLMData(train=splits["train"], validation=validation, tokenizer=tokenizer)


TOKENIZER_SUBDIR = "tokenizer"


def build_token_store(config: DataConfig, directory: Path, base: Path | None = None, tokenizer: Any = None) -> Path:
    """Split, make the tokenizer and tokenize the corpus into `directory` (tokenizer/, train/, validation/).

    Memory stays bounded whatever the corpus size: documents stream from the source (read several times: to count
    them, to sample the tokenizer's training text, to write each split); the split needs only their number
    (`validation_mask`); the tokenizer learns from at most `tokenizer_documents` training documents, a seeded
    sample (all of them when there are fewer, in corpus order). Written into a hidden sibling and renamed when
    complete: a killed build leaves nothing that looks finished, and running again builds it.

    Raises:
        UserError: an empty corpus, bad paths, an unusable tokenizer.
    """
    corpus, held_out = open_documents(config, base)
    transform: Callable[[str], str] | None = jieba_presegmenter() if config.jieba else None
    if held_out is None:
        count = sum(1 for _ in corpus())
        if count == 0:
            raise UserError(f"the {config.source} corpus has no text (empty files?)")
        mask = validation_mask(count, config.validation_fraction, config.split_seed)

        def train_docs() -> Iterator[str]:
            return (d for d, held in zip(corpus(), mask) if not held)

        def val_docs() -> Iterator[str]:
            return (d for d, held in zip(corpus(), mask) if held)

        train_count = int(count - mask.sum())
    else:
        train_docs, val_docs = corpus, held_out
        train_count = None
    if tokenizer is None and config.tokenizer:
        tokenizer = _make_tokenizer(config, base, [], transform)
    elif tokenizer is None:
        if train_count is None:
            train_count = sum(1 for _ in corpus())
        sample = _sample(train_docs(), train_count, config.tokenizer_documents, config.split_seed)
        tokenizer = _make_tokenizer(config, base, sample, transform)
    digest = vocab_hash(tokenizer)
    with staged_output_dir(directory, overwrite=True) as staging:
        save_tokenizer(tokenizer, staging / TOKENIZER_SUBDIR)
        for split, documents in (("train", train_docs), ("validation", val_docs)):
            try:
                write_token_store(staging / split, documents(), tokenizer, digest, transform)
            except UserError as e:
                raise UserError(f"{split} split: {e}") from None
    logger.info("token store written: %s", directory)
    return directory


def _sample(documents: Iterator[str], count: int, size: int, seed: int) -> list[str]:
    """At most `size` of `count` documents: all in order when there are fewer, else a seeded sample in order."""
    if count <= size:
        return list(documents)
    chosen = np.zeros(count, dtype=bool)
    chosen[np.random.default_rng(seed).choice(count, size, replace=False)] = True
    return [d for d, keep in zip(documents, chosen) if keep]


def store_directory(config: DataConfig, base: Path | None = None) -> Path:
    """Where the token store of a data config lives.

    The cache, keyed by everything it depends on (not the block length: one store serves every max_seq_len); with
    `cache: false` a fresh temporary directory, removed when the process exits.
    """
    if not config.cache:
        return _temporary_directory(config)
    return cache_root(config) / "store" / data_fingerprint(config, base, ignore=("max_seq_len",))


def _temporary_directory(config: DataConfig) -> Path:
    root = cache_root(config) / "tmp"
    root.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="store-", dir=root))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory / "store"


def store_usable(directory: Path, tokenizer: Any = None) -> bool:
    """A complete store is there, made with `tokenizer`'s vocabulary when one is given."""
    if not all((directory / split / STORE_FILE).is_file() for split in ("train", "validation")):
        return False
    if tokenizer is None:
        return True
    return _same_vocabulary(json.loads((directory / "train" / STORE_FILE).read_text()).get("vocab_hash"), tokenizer)


def _same_vocabulary(cached_hash: str | None, tokenizer: Any) -> bool:
    """A cache entry serves a process handed `tokenizer` only if it was made with the same vocabulary."""
    if cached_hash == vocab_hash(tokenizer):
        return True
    logger.warning("the data cache was made with another tokenizer than the main process's: not used")
    return False


def eval_indices(count: int, config: DataConfig) -> torch.Tensor:
    """Ids of the validation blocks to evaluate: all, or `max_eval_blocks` drawn with `eval_mask_seed`, in order.

    Not the first N: validation blocks follow the documents, so those would all come from the first few books.
    """
    limit = config.max_eval_blocks
    if limit is None or limit >= count:
        return torch.arange(count)
    generator = torch.Generator().manual_seed(config.eval_mask_seed)
    return torch.randperm(count, generator=generator)[:limit].sort().values


def eval_subset(blocks: torch.Tensor, config: DataConfig) -> torch.Tensor:
    """The validation blocks `eval_indices` chooses (all of them, uncopied, when there is no cap to apply)."""
    indices = eval_indices(len(blocks), config)
    return blocks if len(indices) == len(blocks) else blocks[indices]


# Fields that do not change the tokenizer or the packed blocks, left out of the cache key.
_NOT_IN_KEY = (
    "vocab_hash", "mask_rate", "eval_mask_seed", "max_eval_blocks", "num_proc", "whole_word_mask", "cache", "cache_dir"
)  # fmt: skip
_CACHE_VERSION = 1  # bump when tokenization or packing changes what they produce


def cache_root(config: DataConfig) -> Path:
    """The cache directory of a data config."""
    if config.cache_dir:
        return Path(config.cache_dir).expanduser()
    return Path(os.environ.get("ROFORMER_CACHE", "~/.cache/roformer")).expanduser()


def data_fingerprint(config: DataConfig, base: Path | None = None, ignore: tuple[str, ...] = ()) -> str:
    """A hash of everything the packed blocks depend on: data fields, input files (path, size, mtime), versions."""
    fields = {k: v for k, v in vars(config).items() if k not in _NOT_IN_KEY + ignore}
    files = []
    if config.source == "hub" and config.hub_revision is None:
        logger.warning(
            "data.hub_revision is not pinned: the data cache cannot tell when %s changes upstream (pin a revision)",
            config.hub_name,
        )
    if config.source == "text":
        for pattern_list in (config.paths, config.validation_paths):
            files += [_file_stamp(p) for p in expand_paths(pattern_list, base)] if pattern_list else []
    if config.tokenizer:
        path = Path(config.tokenizer)
        path = path if path.is_absolute() or base is None else base / path
        files += [_file_stamp(p) for p in sorted(path.iterdir())] if path.is_dir() else [_file_stamp(path)]
    key = {"fields": fields, "files": files, "version": [_CACHE_VERSION, __version__]}
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


def _usable(cached: MLMData | None, tokenizer: Any) -> MLMData | None:
    """A cache entry, unless a given tokenizer has another vocabulary than the entry's."""
    if cached is None or tokenizer is None or _same_vocabulary(vocab_hash(cached.tokenizer), tokenizer):
        return cached
    return None


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


def train_batches(
    data: MLMData | StreamingMLMData,
    config: DataConfig,
    seed: int,
    batch_size: int,
    num_processes: int = 1,
    grad_accum: int = 1,
) -> MLMBatches:
    """The masked training batches of every step over the packed blocks, or over the stream."""
    global_batch = batch_size * num_processes * grad_accum
    if isinstance(data, StreamingMLMData):
        transform = jieba_presegmenter() if config.jieba else None
        packer = StreamPacker(data.documents, seed, data.tokenizer, config.max_seq_len, transform)
        source: Any = StreamedBlocks(packer, global_batch)
    else:
        source = PackedBlocks(data.train, global_batch, seed)
    return MLMBatches(source, data.tokenizer, config, seed, batch_size, num_processes, grad_accum)
