"""Streaming pretraining data (`data.streaming: true`): corpora larger than RAM, read as they are trained on.

The document stream (a hub dataset loaded with `streaming=True`, or local files read one at a time) is split into:
the first `stream_validation_documents` documents (packed once, the fixed validation set) and the rest (training).
The tokenizer is trained on the first `tokenizer_documents` training documents (or loaded). Each epoch the
training documents pass through a seeded shuffle buffer, are tokenized as they come, joined with [SEP] and cut into
`[CLS] ... [SEP]` blocks: the same packing as the in-memory path, with nothing lost but the epoch's last remainder.

The position in the stream (epoch, documents consumed, the tokens carried into the next block) is small and goes
into every checkpoint; resuming re-reads the consumed documents without tokenizing them and continues exactly. Every
process reads the whole stream and packs the whole global batch (the engine then gives each its rows), so the position
is one for all processes: a run resumed on another number of processes continues at the same document
(tests/e2e/test_elastic.py).
"""

from __future__ import annotations

import itertools
import json
import logging
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from roformer.data.cache import cache_root, data_fingerprint, same_vocabulary
from roformer.data.config import DataConfig
from roformer.data.corpus import open_document_stream
from roformer.data.packing import eval_subset, pack_blocks, tokenize_documents
from roformer.data.tokenizer import (
    Tokenizer,
    jieba_presegmenter,
    load_tokenizer,
    make_tokenizer,
    save_tokenizer,
    vocab_hash,
)
from roformer.errors import UserError
from roformer.files import staged_output_dir

logger = logging.getLogger(__name__)


@dataclass
class StreamingMLMData:
    """The validation blocks, the tokenizer, and a factory of each epoch's training documents."""

    validation: torch.Tensor  # (M, max_seq_len)
    tokenizer: Tokenizer
    documents: Callable[[int, int], Iterator[str]]  # (epoch, seed) -> shuffled training documents


def shuffled(documents: Iterator[str], buffer_size: int, seed: int) -> Iterator[str]:
    """A seeded buffer shuffle: fill a buffer, then emit a random element and replace it with the next document."""
    if buffer_size <= 1:
        yield from documents
        return
    rng = random.Random(seed)
    buffer = list(itertools.islice(documents, buffer_size))
    for document in documents:
        index = rng.randrange(len(buffer))
        yield buffer[index]
        buffer[index] = document
    rng.shuffle(buffer)
    yield from buffer


def split_stream(
    open_stream: Callable[[], Iterator[str]], validation_documents: int, shuffle_buffer: int
) -> tuple[list[str], Callable[[int, int], Iterator[str]]]:
    """(the validation documents, (epoch, seed) -> training documents): validation is the head of the raw stream."""
    validation = list(itertools.islice(open_stream(), validation_documents))

    def training(epoch: int, seed: int) -> Iterator[str]:
        rest = itertools.islice(open_stream(), validation_documents, None)
        return shuffled(rest, shuffle_buffer, seed * 1_000_003 + epoch)

    return validation, training


class StreamPacker:
    """Cuts a stream of documents into blocks, remembering where it is.

    Args:
        documents: (epoch, seed) -> training documents.
        seed: Seed of the per-epoch document shuffle.
        tokenizer: Fast tokenizer (no special tokens are added to documents).
        max_seq_len: Block length including [CLS] and [SEP].
        transform: Optional text transform before tokenization (jieba pre-segmentation).
    """

    def __init__(
        self,
        documents: Callable[[int, int], Iterator[str]],
        seed: int,
        tokenizer: Tokenizer,
        max_seq_len: int,
        transform: Callable[[str], str] | None = None,
    ) -> None:
        self.documents = documents
        self.seed = seed
        self.tokenizer = tokenizer
        self.body = max_seq_len - 2
        self.transform = transform
        self.epoch = 0
        self.consumed = 0  # documents of this epoch already tokenized into `carry` or emitted blocks
        self.carry: list[int] = []
        self.pending_sep = False  # a document ended: the next one starts after a [SEP]
        self.epoch_tokens = 0  # tokens this epoch has given so far (an epoch of none would repeat forever)
        self._iterator: Iterator[str] | None = None

    def state_dict(self) -> dict[str, Any]:
        """Position in the stream: JSON-serialisable."""
        return {
            "epoch": self.epoch,
            "consumed": self.consumed,
            "carry": list(self.carry),
            "sep": self.pending_sep,
            "epoch_tokens": self.epoch_tokens,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position (the consumed documents are skipped, not tokenized)."""
        self.epoch, self.consumed, self.carry = state["epoch"], state["consumed"], list(state["carry"])
        self.pending_sep = state["sep"]
        self.epoch_tokens = state.get("epoch_tokens", len(self.carry) + self.consumed)  # older checkpoints: > 0 if any
        self._iterator = None

    def _next_document(self) -> list[int]:
        while True:
            if self._iterator is None:
                self._iterator = itertools.islice(self.documents(self.epoch, self.seed), self.consumed, None)
            for text in self._iterator:
                self.consumed += 1
                if self.transform is not None:
                    text = self.transform(text)
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
                if ids:
                    self.epoch_tokens += len(ids)
                    return ids
            if self.consumed == 0:
                raise UserError("the streamed training corpus has no documents")
            if self.epoch_tokens == 0:  # another epoch would find nothing either
                raise UserError(f"the streamed training corpus has no tokens: its {self.consumed} documents are empty")
            # end of the epoch: its remainder (< one block) is dropped, as in the in-memory packing; its whole blocks
            # still wait in `carry` for the request that is being filled (the next epoch then starts a new block)
            whole = len(self.carry) // self.body * self.body
            self.carry, self.pending_sep = self.carry[:whole], False
            self.epoch, self.consumed, self._iterator = self.epoch + 1, 0, None
            self.epoch_tokens = 0

    def blocks(self, n: int) -> torch.Tensor:
        """The next `n` blocks (n, max_seq_len) of the stream.

        Raises:
            UserError: a whole epoch of the stream holds fewer tokens than `n` blocks.
        """
        need = n * self.body
        first_epoch = self.epoch
        while len(self.carry) < need:
            ids = self._next_document()
            if self.epoch > first_epoch + 1:  # a complete epoch went by without filling the request
                raise UserError(
                    f"the streamed training corpus holds fewer tokens than one global batch of {n} blocks needs "
                    f"({need}): use more text or a smaller batch"
                )
            self.carry += [self.tokenizer.sep_token_id, *ids] if self.pending_sep else ids
            self.pending_sep = True
        body = torch.tensor(self.carry[:need], dtype=torch.long).view(n, self.body)
        self.carry = self.carry[need:]
        cls = torch.full((n, 1), self.tokenizer.cls_token_id, dtype=torch.long)
        sep = torch.full((n, 1), self.tokenizer.sep_token_id, dtype=torch.long)
        return torch.cat([cls, body, sep], dim=1)


def pack_validation(
    documents: list[str], tokenizer: Tokenizer, max_seq_len: int, transform: Any = None
) -> torch.Tensor:
    """The validation blocks of the held-out head of the stream."""
    ids = tokenize_documents(documents, tokenizer, None, transform)
    try:
        return pack_blocks(ids, max_seq_len, tokenizer.cls_token_id, tokenizer.sep_token_id)
    except UserError as e:
        raise UserError(f"validation split of the stream (data.stream_validation_documents): {e}") from None


def build_streaming_mlm_data(
    config: DataConfig, base: Path | None = None, tokenizer: Tokenizer | None = None
) -> StreamingMLMData:
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
    cached = _read_cache(directory, tokenizer) if config.cache else None
    if cached is not None:
        tokenizer, validation = cached
    else:
        given = tokenizer
        start = len(validation_docs)
        head = itertools.islice(open_stream(), start, start + config.tokenizer_documents)
        tokenizer = make_tokenizer(config, base, head, transform, given)
        segment = jieba_presegmenter(tokenizer) if config.jieba else None  # the vocabulary's words whole
        validation = pack_validation(validation_docs, tokenizer, config.max_seq_len, segment)
        if config.cache and given is None:
            _write_cache(directory, tokenizer, validation)
    validation = eval_subset(validation, config)
    return StreamingMLMData(validation=validation, tokenizer=tokenizer, documents=training)


def _read_cache(directory: Path, tokenizer: Tokenizer) -> tuple[Any, torch.Tensor] | None:
    """(tokenizer, validation blocks) of a cache entry, or None.

    None when the entry is absent, damaged, or made with another vocabulary than `tokenizer` (the main process's,
    handed to the others).
    """
    if not _is_cache_entry(directory):
        return None
    try:
        cached = load_tokenizer(directory / "tokenizer")
        validation = torch.from_numpy(np.load(directory / "validation.npy").astype(np.int64))
    except (OSError, ValueError, UserError) as e:  # a damaged cache entry is rebuilt, not fatal
        logger.warning("ignoring damaged data cache %s: %s", directory, e)
        return None
    if tokenizer is not None and not same_vocabulary(vocab_hash(cached), tokenizer):
        return None
    return cached, validation


def _is_cache_entry(directory: Path) -> bool:
    """A complete cache entry is there (another process's, published first: it is kept)."""
    return (directory / "info.json").is_file()


def _write_cache(directory: Path, tokenizer: Tokenizer, validation: torch.Tensor) -> None:
    """Cache the tokenizer and the validation blocks (the entry's train.npy is empty: training streams)."""
    dtype = np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max else np.int32
    try:
        with staged_output_dir(directory, overwrite=True, keep_existing=_is_cache_entry) as staging:
            save_tokenizer(tokenizer, staging / "tokenizer")
            np.save(staging / "train.npy", np.zeros((0, validation.shape[1]), dtype=dtype))
            np.save(staging / "validation.npy", validation.numpy().astype(dtype))
            info = {"train_blocks": 0, "validation_blocks": len(validation)}
            (staging / "info.json").write_text(json.dumps(info))
    except OSError as e:  # a read-only or full disk costs the next run time, not this run
        logger.warning("could not write the data cache %s: %s", directory, e)
