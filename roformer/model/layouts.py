"""Where a forward's tokens sit while the blocks compute them: token layouts and packed documents.

The default layout is the (B, T) grid. `RealTokens` are a padded batch's real tokens alone, (N, C), for everything
in a block but the attention scores; `Segments` are the runs of real tokens a variable-length kernel attends within
(each padded row's, or each packed document's); `QuerySubset` is the positions a last block computes as queries
alone (the masked tokens under MLM). `document_index` and `document_positions` read packed rows' document ids. Which
layout a forward uses is the forward plan's decision (`roformer.model.plan`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass
class RealTokens:
    """Where a padded batch's real tokens sit in its (B, T) grid, to compute on them alone.

    Everything in a block but the attention scores acts on each token by itself (the projections, the FFN, the norms,
    dropout), so it can run on the N real tokens of a batch as one (N, C) matrix: with a fine-tuning batch of mixed
    lengths (CoNLL-2003 sentences: 62% of a batch's positions are padding) most of the work goes. Only attention needs
    the grid, so its q, k, v are put back into it and its output taken out again (ModernBERT and MosaicBERT unpad the
    same way; they keep attention unpadded too, with a variable-length flash kernel that CPUs lack). The real tokens'
    values are those of the padded computation; the padding's outputs are zeros instead of unread values.
    """

    index: Tensor  # (N,) the real tokens' flat positions in the B * T grid, in row-major order
    shape: tuple[int, int]  # (B, T)

    @classmethod
    def of(cls, keep: Tensor) -> RealTokens:
        """The real tokens of a (B, T) attention mask (1 or True = real)."""
        return cls(keep.reshape(-1).nonzero().squeeze(1), (keep.shape[0], keep.shape[1]))

    def take(self, x: Tensor) -> Tensor:
        """(B, T, ...) -> (N, ...): the real tokens' rows."""
        return x.reshape(-1, *x.shape[2:]).index_select(0, self.index)

    def grid(self, x: Tensor) -> Tensor:
        """(N, ...) -> (B, T, ...): the rows back in their places, zeros at padding."""
        B, T = self.shape
        placed = x.new_zeros(B * T, *x.shape[1:]).index_copy(0, self.index, x)
        return placed.view(B, T, *x.shape[1:])


@dataclass
class Segments:
    """The runs of real tokens that attend only among themselves, for a variable-length attention kernel.

    A padded row's real tokens are one segment; with packed documents each document of a row is one. The real
    tokens (N) are laid out one segment after another, as `RealTokens` takes them (row-major), so a kernel reads q,
    k and v as (N, H, D) with no grid, no padding and no (B, T, T) mask.

    Attributes:
        starts: (S + 1,) int32 where each segment starts in the N tokens, and N last (flash attention's cu_seqlens).
        longest: The longest segment's length.
        tokens: The real tokens.
    """

    starts: Tensor
    longest: int
    tokens: RealTokens

    @classmethod
    def of(cls, keep: Tensor, document_ids: Tensor | None) -> Segments | None:
        """The segments of a (B, T) bool mask of real tokens and its documents, or None if a document is split.

        A document's tokens must be one run within their row: a kernel attends within runs, and a document id that
        comes back after another would be one document to the mask but two runs here.
        """
        tokens = RealTokens.of(keep)
        row = tokens.index // keep.shape[1]  # (N,)
        if document_ids is None:
            run = row
        else:
            index = document_index(document_ids)  # ids of any values -> 0..n-1
            run = row * (int(index.max()) + 1) + index.reshape(-1)[tokens.index]
        new = torch.ones_like(run, dtype=torch.bool)
        new[1:] = run[1:] != run[:-1]
        first = new.nonzero().squeeze(1)
        if document_ids is not None and len(first) != len(torch.unique(run)):
            return None
        starts = torch.cat((first, first.new_tensor([len(run)]))).to(torch.int32)
        return cls(starts, int((starts[1:] - starts[:-1]).max()) if len(run) else 0, tokens)


def document_index(document_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """(B, T) document ids of any values -> 0..n-1 over the batch (equal ids, equal index); -1 at padding."""
    index = torch.unique(document_ids, return_inverse=True)[1]
    return index if attention_mask is None else index.masked_fill(~attention_mask.bool(), -1)


def document_positions(document_ids: Tensor) -> Tensor:
    """(B, T) positions that restart at 0 in every document: a token's count of earlier tokens of its document."""
    index = document_index(document_ids)
    seen = F.one_hot(index, int(index.max()) + 1).cumsum(dim=1)  # (B, T, n): tokens of each document so far
    return seen.gather(2, index[..., None]).squeeze(-1) - 1


@dataclass(frozen=True)
class QuerySubset:
    """Distinct positions of a (B, T) grid that alone are queries, laid out per row for one attention call.

    Every token stays a key and value; only these go through attention as queries and through the FFN (a model's
    last block under MLM, where only the masked positions are read: flash-attention's `last_layer_subset`).

    Attributes:
        row: (N,) each query's row.
        position: (N,) its position in the row.
        slot: (N,) its place among its row's queries.
        width: The most queries of any row (M).
        order: (Q,) where each of the positions asked for is among the N distinct ones (a position may be asked for
            more than once: the padding of a bucketed list).
        shape: (B, T) of the grid.
    """

    row: Tensor
    position: Tensor
    slot: Tensor
    width: int
    order: Tensor
    shape: tuple[int, int]

    @classmethod
    def of(cls, queries: Tensor, shape: tuple[int, int]) -> QuerySubset:
        """The queries at flat positions `queries` (Q,) into a grid of `shape` (B, T), repeats allowed."""
        flat, order = torch.unique(queries, return_inverse=True)  # sorted, distinct
        row, position = flat // shape[1], flat % shape[1]
        first = torch.searchsorted(row, row, right=False)  # where each row's queries start in the sorted list
        slot = torch.arange(len(flat), device=flat.device) - first
        return cls(row, position, slot, int(slot.max()) + 1 if len(flat) else 1, order, shape)

    def take(self, x: Tensor) -> Tensor:
        """(B, T, ...) -> (N, ...): the queries' rows of the grid."""
        return x[self.row, self.position]

    def grid(self, q: Tensor) -> Tensor:
        """(B, T, ...) -> (B, M, ...): each row's queries first, zeros after, so that one attention call serves all."""
        grid = q.new_zeros(self.shape[0], self.width, *q.shape[2:])
        grid[self.row, self.slot] = q[self.row, self.position]
        return grid

    def of_grid(self, y: Tensor) -> Tensor:
        """(B, M, ...) -> (N, ...): the queries' results out of their grid."""
        return y[self.row, self.slot]

    def mask_rows(self, mask: Tensor | None) -> Tensor | None:
        """The queries' rows of a mask or bias over the (B, T) grid's keys: (1 or B, 1 or H, T, S) -> (B, 1 or H, M, S).

        A mask that is the same for every query (B, 1, 1, S) is kept as it is.
        """
        if mask is None or mask.shape[-2] == 1:
            return mask
        (B, T), M = self.shape, self.width
        rows = torch.zeros(B, M, dtype=torch.long, device=mask.device)
        rows[self.row, self.slot] = self.position
        mask = mask.expand(B, mask.shape[1], T, mask.shape[-1])
        return mask.gather(2, rows[:, None, :, None].expand(B, mask.shape[1], M, mask.shape[-1]))
