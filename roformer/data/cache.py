"""The data cache: where it lives and the key of an entry (every field and input file the entry depends on).

Two kinds of entries share it: token stores (roformer.data.store, `store/<key>`) and the streaming path's tokenizer
and validation blocks (roformer.data.streaming, `mlm/<key>`). An entry made with another vocabulary than the one a
process was handed (`same_vocabulary`) is not used.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from roformer.data.config import DataConfig
from roformer.data.text import expand_paths
from roformer.data.tokenizer import Tokenizer, vocab_hash
from roformer.version import __version__

logger = logging.getLogger(__name__)

# Fields that do not change the tokenizer or the packed blocks, left out of the cache key.
_NOT_IN_KEY = (
    "vocab_hash",
    "mask_rate",
    "mask_split",
    "eval_mask_rate",
    "eval_mask_seed",
    "max_eval_blocks",
    "num_proc",
    "whole_word_mask",
    "packing",
    "mixture",
    "cache",
    "cache_dir",
)
# Bump when tokenization or packing changes what they produce (2: words spelled out; 3: stores count characters).
_CACHE_VERSION = 3


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
    # every local file read: the corpus of a text source, and validation_paths whatever the source
    for key, pattern_list in (
        ("data.paths", config.paths if config.source == "text" else []),
        ("data.validation_paths", config.validation_paths),
    ):
        files += [file_stamp(p) for p in expand_paths(pattern_list, base, key)] if pattern_list else []
    if config.tokenizer:
        path = Path(config.tokenizer)
        path = path if path.is_absolute() or base is None else base / path
        files += [file_stamp(p) for p in sorted(path.iterdir())] if path.is_dir() else [file_stamp(path)]
    key = {"fields": fields, "files": files, "version": [_CACHE_VERSION, __version__]}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]


def file_stamp(path: Path) -> list[Any]:
    stat = path.stat() if path.exists() else None
    return [str(path.resolve()), stat.st_size if stat else None, stat.st_mtime_ns if stat else None]


def same_vocabulary(cached_hash: str | None, tokenizer: Tokenizer) -> bool:
    """A cache entry serves a process handed `tokenizer` only if it was made with the same vocabulary."""
    if cached_hash == vocab_hash(tokenizer):
        return True
    logger.warning("the data cache was made with another tokenizer than the main process's: not used")
    return False
