"""Building the token store: the `data:` section into a tokenizer and memory-mapped train/validation blocks.

Sources (see roformer.data.corpus): `builtin`, `text` files, `hub`. The tokenizer is trained on (a seeded sample of)
the training documents (vocab size and lower-casing from the config) unless `tokenizer` names one to load.
Validation is a fixed, seeded document-level split (or its own files), so eval blocks never share text with
training blocks. The store (roformer.data.token_store) is built once into the cache (roformer.data.cache: keyed by
every field and input file it depends on) and read through a memory map; `roformer prepare-data` builds it ahead of
training (`prepare_token_store`, which also says what the store holds). `data.streaming` has its own build
(roformer.data.streaming); roformer.data.mlm.train_batches turns either into the masked batches of every step.
"""

from __future__ import annotations

import atexit
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from roformer.data.cache import cache_root, data_fingerprint, same_vocabulary
from roformer.data.config import DataConfig
from roformer.data.corpus import open_documents
from roformer.data.packing import eval_indices, validation_mask
from roformer.data.token_store import STORE_FILE, BlockView, TokenStore, rebuild_hint, write_token_store
from roformer.data.tokenizer import (
    Tokenizer,
    jieba_presegmenter,
    load_tokenizer,
    make_tokenizer,
    save_tokenizer,
    vocab_hash,
)
from roformer.errors import UserError, WriteFailed
from roformer.files import read_json, staged_output_dir

logger = logging.getLogger(__name__)


@dataclass
class MLMData:
    """Training blocks, validation blocks and the tokenizer that made them."""

    train: Any  # (N, max_seq_len) token ids: a BlockView over the memory-mapped store (or a tensor)
    validation: torch.Tensor  # (M, max_seq_len), in memory (at most max_eval_blocks)
    tokenizer: Tokenizer


def build_mlm_data(config: DataConfig, base: Path | None = None, tokenizer: Tokenizer | None = None) -> MLMData:
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
            raise UserError(
                f"{split} split: corpus too small: {view.store.num_tokens} tokens, a block of "
                f"max_seq_len={config.max_seq_len} needs {body}"
            )
        splits[split] = view
    validation = splits["validation"][eval_indices(len(splits["validation"]), config)]
    logger.info(
        "%d train blocks (memory-mapped), %d validation blocks of %d tokens, vocabulary %d",
        len(splits["train"]),
        len(validation),
        config.max_seq_len,
        len(tokenizer),
    )
    return MLMData(train=splits["train"], validation=validation, tokenizer=tokenizer)


TOKENIZER_SUBDIR = "tokenizer"


def build_token_store(
    config: DataConfig,
    directory: Path,
    base: Path | None = None,
    tokenizer: Tokenizer | None = None,
    replace: bool = False,
) -> Path:
    """Split, make the tokenizer and tokenize the corpus into `directory` (tokenizer/, train/, validation/).

    Memory stays bounded whatever the corpus size: documents stream from the source (read several times: to count
    them, to sample the tokenizer's training text, to write each split); the split needs only their number
    (`validation_mask`); the tokenizer learns from at most `tokenizer_documents` training documents, a seeded
    sample (all of them when there are fewer, in corpus order). Written into a hidden sibling and renamed when
    complete: a killed build leaves nothing that looks finished, and running again builds it. A complete store that
    another process published meanwhile (several nodes filling one shared cache) is kept unless `replace`.

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
        tokenizer = make_tokenizer(config, base, [], transform)
    elif tokenizer is None:
        if train_count is None:
            train_count = sum(1 for _ in corpus())
        sample = _sample(train_docs(), train_count, config.tokenizer_documents, config.split_seed)
        tokenizer = make_tokenizer(config, base, sample, transform)
    digest = vocab_hash(tokenizer)
    transform = jieba_presegmenter(tokenizer) if config.jieba else None  # now the vocabulary's words stay whole
    keep = None if replace else (lambda existing: store_usable(existing, tokenizer))
    with staged_output_dir(directory, overwrite=True, keep_existing=keep) as staging:
        save_tokenizer(tokenizer, staging / TOKENIZER_SUBDIR)
        for split, documents in (("train", train_docs), ("validation", val_docs)):
            try:
                write_token_store(staging / split, documents(), tokenizer, digest, transform)
            except WriteFailed:
                raise  # names its path; the store's staging turns it into the store's own
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


def store_usable(directory: Path, tokenizer: Tokenizer | None = None) -> bool:
    """A complete store is there, made with `tokenizer`'s vocabulary when one is given."""
    if not all((directory / split / STORE_FILE).is_file() for split in ("train", "validation")):
        return False
    if tokenizer is None:
        return True
    info = read_json(directory / "train" / STORE_FILE, rebuild_hint(directory))
    return same_vocabulary(info.get("vocab_hash"), tokenizer)


def prepare_token_store(config: DataConfig, replace: bool = False) -> str:
    """`roformer prepare-data`: build the token store of `config` ahead of training, unless a complete one is there.

    The store is where pretraining finds it (`store_directory`; the config's paths already resolved by the loader).

    Args:
        config: The data section of a pretraining config.
        replace: Rebuild the store even if it is complete (`--overwrite`).

    Returns:
        What was done and what the store holds (`store_summary`), for the console.

    Raises:
        UserError: a config that keeps no store (streaming, no cache), or what building it raises.
    """
    if config.streaming:
        raise UserError("data.streaming: true tokenizes while training and keeps no token store to prepare")
    if not config.cache:
        raise UserError("data.cache: false keeps no store between runs; prepare-data writes into the cache")
    directory = store_directory(config)
    started = time.perf_counter()
    if store_usable(directory) and not replace:
        status = "up to date"
    else:
        build_token_store(config, directory, replace=replace)
        status = f"built in {time.perf_counter() - started:.1f} s"
    return f"token store {status}: {directory}\n" + store_summary(directory, config.max_seq_len)


def store_summary(directory: Path, max_seq_len: int) -> str:
    """What a token store holds: tokens per split, documents and blocks of the training split, vocabulary."""
    train, validation = TokenStore(directory / "train"), TokenStore(directory / "validation")
    size, tokens = train.nbytes + validation.nbytes, train.num_tokens + validation.num_tokens
    return (
        f"  train {train.num_tokens:,} tokens ({train.info['documents']:,} documents, "
        f"{train.num_blocks(max_seq_len):,} blocks of {max_seq_len}), validation {validation.num_tokens:,} "
        f"tokens; {size / tokens:.2f} bytes per token ({train.dtype.name}); vocabulary {train.info['vocab_size']:,}"
        + _per_character(train.text_statistics())
    )


def _per_character(statistics: dict[str, Any] | None) -> str:
    return "" if statistics is None else f"; {statistics['tokens_per_character']:.3f} tokens per character"
