"""Tokenize documents and pack them into fixed-length MLM blocks `[CLS] tokens ... [SEP]`.

Documents are tokenized with `datasets.map(batched=True, num_proc=...)` (cached on disk by `datasets`, so a second
run with the same files and tokenizer starts at once), joined into one stream with `[SEP]` between documents, and
cut into blocks of `max_seq_len - 2` tokens framed by `[CLS]` and `[SEP]`. Every token lands in a block except the
final remainder of the stream (fewer than `max_seq_len - 2` tokens), and blocks need no padding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from roformer.data.config import DataConfig
from roformer.errors import UserError


def tokenize_documents(
    documents: Sequence[str],
    tokenizer,
    num_proc: int | None = None,
    transform: Callable[[str], str] | None = None,
) -> list[np.ndarray]:
    """Token ids (no special tokens) of each document, through `datasets.map` and its cache."""
    import datasets

    def encode(batch: dict[str, list[str]]) -> dict[str, list[list[int]]]:
        texts = batch["text"] if transform is None else [transform(t) for t in batch["text"]]
        return {"ids": tokenizer(texts, add_special_tokens=False)["input_ids"]}

    table = datasets.Dataset.from_dict({"text": list(documents)})
    encoded = table.map(
        encode,
        batched=True,
        batch_size=1000,
        num_proc=num_proc if num_proc and num_proc > 1 else None,
        remove_columns=["text"],
        desc="tokenizing",
    )
    encoded.set_format("numpy")
    return [np.asarray(ids, dtype=np.int64) for ids in encoded["ids"]]


def pack_blocks(token_lists: Sequence[np.ndarray], max_seq_len: int, cls_id: int, sep_id: int) -> torch.Tensor:
    """Join documents with [SEP] and cut the stream into (N, max_seq_len) blocks `[CLS] ... [SEP]`.

    Raises:
        UserError: the corpus is too small for a single block.
    """
    if max_seq_len < 3:
        raise UserError(f"data.max_seq_len must be >= 3, got {max_seq_len}")
    body = max_seq_len - 2
    pieces = []
    for ids in token_lists:
        if len(ids):
            pieces += [ids, np.array([sep_id], dtype=np.int64)]
    stream = np.concatenate(pieces[:-1]) if pieces else np.zeros(0, dtype=np.int64)  # no [SEP] after the last
    n = len(stream) // body
    if n == 0:
        raise UserError(f"corpus too small: {len(stream)} tokens, a block of max_seq_len={max_seq_len} needs {body}")
    blocks = torch.from_numpy(stream[: n * body].copy()).view(n, body)
    cls = torch.full((n, 1), cls_id, dtype=torch.long)
    sep = torch.full((n, 1), sep_id, dtype=torch.long)
    return torch.cat([cls, blocks, sep], dim=1)


def validation_mask(count: int, fraction: float, seed: int) -> np.ndarray:
    """(count,) bool, True for the documents held out for validation: a fixed, seeded document-level split.

    Needs only the number of documents, not the documents (a corpus is split while it streams past). At least one
    validation document if fraction > 0.

    Raises:
        UserError: fraction outside [0, 1) or nothing left to train on.
    """
    if not 0.0 <= fraction < 1.0:
        raise UserError(f"data.validation_fraction must be in [0, 1), got {fraction}")
    order = np.random.default_rng(seed).permutation(count)
    n_val = int(round(fraction * count))
    if fraction > 0:
        n_val = max(1, n_val)
    if n_val >= count:
        raise UserError(f"only {count} documents: too few for a validation fraction of {fraction}")
    mask = np.zeros(count, dtype=bool)
    mask[order[:n_val]] = True
    return mask


def split_documents(documents: Sequence[str], fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """`validation_mask` applied to a list: (train, validation), each in corpus order.

    Raises:
        UserError: fraction outside [0, 1) or nothing left to train on.
    """
    mask = validation_mask(len(documents), fraction, seed)
    return [d for d, v in zip(documents, mask) if not v], [d for d, v in zip(documents, mask) if v]


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


def block_documents(blocks: torch.Tensor, sep_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The documents of packed blocks (`data.packing: isolated`): (document_ids, position_ids), each (B, T).

    A block is `[CLS] a [SEP] b [SEP] ... [SEP]`: a document runs up to and including its [SEP] (the first one also
    holds the [CLS]), so every token belongs to exactly one document and none is lost or repeated. Positions restart
    at 0 in every document.
    """
    is_sep = blocks == sep_id
    document_ids = is_sep.cumsum(dim=1) - is_sep.long()  # the [SEP]s before a token: its document in the block
    index = torch.arange(blocks.shape[1], device=blocks.device).expand_as(blocks)
    starts = torch.zeros_like(index)
    starts[:, 1:] = torch.where(is_sep[:, :-1], index[:, 1:], 0)  # a document starts after every [SEP]
    return document_ids, index - starts.cummax(dim=1).values
