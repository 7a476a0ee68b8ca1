"""A memory-mapped token store: a tokenized corpus on disk as flat shards of token ids, read block by block.

Layout of a store directory (written into a hidden sibling and renamed when complete, so a killed build leaves
nothing that looks finished):

    store.json          format version, dtype, token and document counts, shard sizes, vocabulary hash
    tokens-00000.bin    token ids (uint16 when the vocabulary fits, else uint32): documents joined by [SEP],
    tokens-00001.bin    exactly the stream that `packing.pack_blocks` cuts, split into shards of `shard_tokens`
    documents.bin       int64 offset of every document's first token in the stream

Writing streams documents through the tokenizer in batches: memory stays bounded by one batch and one write buffer,
whatever the corpus size. Reading memory-maps the shards: block `b` of length T is `[CLS] + stream[b*(T-2):
(b+1)*(T-2)] + [SEP]`, so one store serves every block length, and the training process holds no corpus in RAM.
(Megatron's indexed datasets and nanoGPT's .bin files work the same way.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from roformer.errors import UserError
from roformer.files import read_json, staged_output_dir

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer

STORE_FILE = "store.json"
DOCUMENTS_FILE = "documents.bin"
STORE_VERSION = 1
_WRITE_BUFFER = 1 << 20  # tokens buffered before a write


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (2 bytes per token), else uint32."""
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.uint32)


def _batches(items: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class _ShardWriter:
    """Appends token ids to numbered shard files of at most `shard_tokens` tokens each."""

    def __init__(self, directory: Path, dtype: np.dtype, shard_tokens: int) -> None:
        self.directory, self.dtype, self.shard_tokens = directory, dtype, shard_tokens
        self.shards: list[int] = []  # tokens per shard
        self.buffer: list[np.ndarray] = []
        self.buffered = 0
        self._file: Any = None

    def add(self, ids: np.ndarray) -> None:
        self.buffer.append(ids)
        self.buffered += len(ids)
        if self.buffered >= _WRITE_BUFFER:
            self.flush()

    def flush(self) -> None:
        data = np.concatenate(self.buffer).astype(self.dtype, copy=False) if self.buffer else np.zeros(0, self.dtype)
        self.buffer, self.buffered = [], 0
        while len(data):
            if self._file is None or self.shards[-1] == self.shard_tokens:
                self._open_next()
            room = self.shard_tokens - self.shards[-1]
            self._file.write(data[:room].tobytes())
            self.shards[-1] += min(room, len(data))
            data = data[room:]

    def _open_next(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = (self.directory / shard_name(len(self.shards))).open("wb")
        self.shards.append(0)

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()


def rebuild_hint(store_root: Path) -> str:
    """What to do about a damaged store: the end of every error that names one."""
    return f"rebuild it with roformer prepare-data --overwrite (or delete {store_root})"


def shard_name(index: int) -> str:
    """File name of shard `index`."""
    return f"tokens-{index:05d}.bin"


def write_token_store(
    directory: str | Path,
    documents: Iterable[str],
    tokenizer: Tokenizer,
    vocab_hash: str,
    transform: Callable[[str], str] | None = None,
    batch_size: int = 1000,
    shard_tokens: int = 1 << 30,
    overwrite: bool = False,
) -> TokenStore:
    """Tokenize `documents` (streamed, `batch_size` at a time) into a store at `directory`; returns it opened.

    Documents that tokenize to nothing are skipped, as `pack_blocks` does. The fast tokenizer encodes each batch on
    all cores (its Rust thread pool).

    Raises:
        UserError: no document has any token.
    """
    sep = tokenizer.sep_token_id
    dtype = token_dtype(len(tokenizer))
    with staged_output_dir(directory, overwrite=overwrite) as staging:
        shards = _ShardWriter(staging, dtype, shard_tokens)
        offsets = (staging / DOCUMENTS_FILE).open("wb")
        position = documents_kept = characters = 0
        for raw in _batches(documents, batch_size):
            texts = raw if transform is None else [transform(t) for t in raw]
            encoded = tokenizer(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"]
            starts = []
            for text, ids in zip(raw, encoded):
                if not ids:
                    continue
                characters += len(text)  # of the text as given: tokens per character compares tokenizers
                if documents_kept:  # [SEP] between documents, none after the last
                    shards.add(np.array([sep], dtype=dtype))
                    position += 1
                starts.append(position)
                shards.add(np.asarray(ids, dtype=dtype))
                position += len(ids)
                documents_kept += 1
            offsets.write(np.asarray(starts, dtype=np.int64).tobytes())
        shards.close()
        offsets.close()
        if position == 0:
            raise UserError("the corpus has no tokens: every document is empty")
        info = {
            "version": STORE_VERSION,
            "dtype": dtype.name,
            "tokens": position,
            "documents": documents_kept,
            "characters": characters,
            "shards": shards.shards,
            "vocab_size": len(tokenizer),
            "vocab_hash": vocab_hash,
        }
        (staging / STORE_FILE).write_text(json.dumps(info, indent=2))
    return TokenStore(directory)


class TokenStore:
    """A token store opened for reading: its shards memory-mapped, checked against store.json.

    Raises:
        UserError: no store, another format version, or a shard whose size does not match (truncated), naming the
            file and how to rebuild.
    """

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        info_path = self.directory / STORE_FILE
        if not info_path.is_file():
            raise UserError(f"{self.directory}: not a token store (no {STORE_FILE})")
        self.info = read_json(info_path, rebuild_hint(self.directory.parent))
        if self.info.get("version") != STORE_VERSION:
            raise UserError(f"{info_path}: store format {self.info.get('version')}, this version reads {STORE_VERSION}")
        self.dtype = np.dtype(self.info["dtype"])
        self.shards: list[np.memmap] = []
        for index, count in enumerate(self.info["shards"]):
            path = self.directory / shard_name(index)
            expected = count * self.dtype.itemsize
            if not path.is_file() or path.stat().st_size != expected:
                found = path.stat().st_size if path.is_file() else "no file"
                raise UserError(
                    f"{path}: damaged token store shard ({found} bytes, {expected} expected); "
                    + rebuild_hint(self.directory.parent)
                )
            self.shards.append(np.memmap(path, dtype=self.dtype, mode="r", shape=(count,)))
        self.starts = np.cumsum([0] + self.info["shards"])  # first stream position of every shard

    @property
    def num_tokens(self) -> int:
        """Tokens in the stream (documents and the [SEP]s between them)."""
        return int(self.info["tokens"])

    def text_statistics(self) -> dict[str, Any] | None:
        """Documents, characters (of the text as given) and their tokens (no [SEP]s); None for stores without counts.

        Tokens per character tells tokenizers apart: word-level Chinese (jieba words) against one token a character.
        """
        characters = self.info.get("characters")
        if not characters:  # written before stores counted characters
            return None
        documents = int(self.info["documents"])
        tokens = self.num_tokens - (documents - 1)
        return {
            "documents": documents,
            "characters": int(characters),
            "tokens": tokens,
            "tokens_per_character": tokens / characters,
            "vocab_size": int(self.info["vocab_size"]),
        }

    @property
    def nbytes(self) -> int:
        """Bytes of its token shards on disk (checked against the files when it was opened)."""
        return sum(self.info["shards"]) * self.dtype.itemsize

    @property
    def vocab_hash(self) -> str:
        """Hash of the vocabulary the store was tokenized with."""
        return str(self.info["vocab_hash"])

    def num_blocks(self, max_seq_len: int) -> int:
        """Complete blocks of `max_seq_len` (the final remainder of the stream is not a block)."""
        return self.num_tokens // (max_seq_len - 2)

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """stream[start:stop] (a copy, int64), across shard boundaries."""
        parts = []
        for index, shard in enumerate(self.shards):
            lo, hi = max(start, self.starts[index]), min(stop, self.starts[index + 1])
            if lo < hi:
                parts.append(shard[lo - self.starts[index] : hi - self.starts[index]])
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

    def blocks(self, indices: torch.Tensor, max_seq_len: int, cls_id: int, sep_id: int) -> torch.Tensor:
        """(len(indices), max_seq_len) blocks `[CLS] ... [SEP]`, read from the memory map.

        Blocks inside one shard (all but a few) are gathered with one fancy-indexing read per shard; a block that
        crosses a shard boundary is read in pieces.
        """
        body = max_seq_len - 2
        starts = indices.numpy().astype(np.int64) * body
        out = np.empty((len(starts), max_seq_len), dtype=np.int64)
        out[:, 0], out[:, -1] = cls_id, sep_id
        shard_of = np.searchsorted(self.starts, starts, side="right") - 1
        whole = starts + body <= self.starts[shard_of + 1]
        offsets = np.arange(body)
        for index in np.unique(shard_of[whole]):
            rows = np.flatnonzero(whole & (shard_of == index))
            out[rows, 1:-1] = self.shards[index][(starts[rows] - self.starts[index])[:, None] + offsets]
        for row in np.flatnonzero(~whole):
            out[row, 1:-1] = self.tokens(int(starts[row]), int(starts[row]) + body)
        return torch.from_numpy(out)


class BlockView:
    """The blocks of a token store as an (N, max_seq_len) array indexed by block ids, read from the memory map.

    Block `b` equals row `b` of `pack_blocks` over the same documents, so `PackedBlocks` (the seeded per-epoch
    order, sharding, exact resume) serves it unchanged; only the blocks of one step are ever in memory.
    """

    def __init__(self, store: TokenStore, max_seq_len: int, cls_id: int, sep_id: int) -> None:
        self.store, self.max_seq_len, self.cls_id, self.sep_id = store, max_seq_len, cls_id, sep_id

    def __len__(self) -> int:
        return self.store.num_blocks(self.max_seq_len)

    @property
    def shape(self) -> tuple[int, int]:
        return len(self), self.max_seq_len

    def __getitem__(self, index: torch.Tensor | int | slice) -> torch.Tensor:
        """Blocks by id: a tensor of ids gives (k, T), an int one (T,) block, a slice the range."""
        if isinstance(index, int):
            return self[torch.tensor([index])][0]
        if isinstance(index, slice):
            index = torch.arange(len(self))[index]
        return self.store.blocks(index, self.max_seq_len, self.cls_id, self.sep_id)
