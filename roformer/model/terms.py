"""What attention reads of a position encoding: the contract every encoding that acts inside attention keeps.

An encoding that acts inside attention (rotary, T5's bias, ALiBi, Shaw) is a module with an `attribute` (where the
backbone registers it), the `kernel` its attention needs, whether it `adds_to_logits`, and `terms(...)`: once per
forward, the `PositionTerms` every layer reads (Shaw's, per layer: `ShawTerms`). An encoding whose terms are one bias
of the logits for all layers subclasses `FoldedBias` and writes only its `bias(queries, keys)`. The encodings
themselves are one room up (`roformer.model.rotary`, `roformer.model.relative` and any module that declares
`ENCODINGS`), and `roformer.model.positions` builds the one a config names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
from torch import Tensor, nn

Rotation = Callable[[Tensor], Tensor]  # rotates (B, T, ..., D) by position: RotaryEmbedding, or it at position_ids


@dataclass
class PositionTerms:
    """What every layer's attention reads of the position encoding in one forward.

    Attributes:
        mask: The attention mask over the S keys: the one given (bool, True = attend), or for T5 and ALiBi their
            float32 bias (1 or B, H, T, S) with the mask folded in as -inf (cast to the autocast dtype), or None.
        rotary: Rotates (B, T, ..., D) by the new tokens' positions (RoPE), or None.
        shaw: Shaw's terms of a layer, by layer index, or None.
    """

    mask: Tensor | None
    rotary: Rotation | None = None
    shaw: Callable[[int], ShawTerms] | None = None


@dataclass
class ShawTerms:
    """One layer's relative embeddings (Shaw et al. 2018) and where each (query, key) pair reads them.

    Attributes:
        keys: (R, D) embeddings a^K of the R clipped distances this forward contains.
        values: (R, D) embeddings a^V, or None (keys only).
        index: (T, S) or (B, T, S) long: the row of `keys` / `values` of each pair.
    """

    keys: Tensor
    values: Tensor | None
    index: Tensor

    def logits(self, q: Tensor) -> Tensor:
        """q_i . a^K_ij for every pair: (B, H, T, D) -> (B, H, T, S) float32.

        q . a^K for the R distinct distances first, (B, H, T, R), then each pair picks its own: a (T, S, D) gather
        of the embeddings would cost S / R times the memory and as much more arithmetic (Shaw et al. sec. 3.3).
        """
        per_distance = q @ self.keys.to(q.dtype).T  # (B, H, T, R)
        return per_distance.float().gather(-1, self._index(q.shape))

    def value_terms(self, probs: Tensor) -> Tensor:
        """sum_j probs_ij a^V_ij: the probabilities summed per distance, then one (R, D) product. -> (B, H, T, D)."""
        per_distance = torch.zeros(*probs.shape[:-1], self.values.shape[0], dtype=probs.dtype, device=probs.device)
        per_distance.scatter_add_(-1, self._index(probs.shape), probs)  # (B, H, T, R), summed in probs' dtype
        return per_distance @ self.values.to(probs.dtype)

    def _index(self, shape: torch.Size) -> Tensor:
        B, H, T = shape[:3]
        index = self.index if self.index.dim() == 3 else self.index[None]
        return index[:, None].expand(B, H, T, index.shape[-1])  # (B, H, T, S), a view


class PositionRecord(Protocol):
    """What a relative encoding needs of a decoder's KV cache (`masks.KVCache`): every cached key's position."""

    def add_positions(self, positions: Tensor) -> Tensor:
        """Record the new tokens' positions (B, T); returns those of every key so far (B, S)."""
        ...


class AttentionPositions(Protocol):
    """An encoding that acts inside attention (rotary, T5's bias, ALiBi, Shaw), as `Backbone` uses it.

    Attributes:
        attribute: The backbone attribute it is registered under: its parameters' checkpoint keys start with it
            (`relative_bias.buckets.weight`, `shaw.keys.0.weight`), so it never changes.
        kernel: The attention kernel its terms need, a key of `roformer.model.attention.ATTENTION_KERNELS`:
            `sdpa` when they are a rotation or a bias folded into the mask, `biased` when each layer adds terms of
            its own queries to the logits (Shaw), `grouped` when the logits are made at grouped positions
            (SelfExtend). The forward plan reads it; no layer asks which encoding it has.
        adds_to_logits: It adds to the attention logits, so an unpadded causal mask must stay a tensor for the sum
            (SDPA's own causal path takes no mask), and a variable-length kernel, which takes no bias, cannot serve.
    """

    attribute: str
    kernel: str
    adds_to_logits: bool

    def terms(
        self,
        mask: Tensor | None,
        position_ids: Tensor | None,
        cache: PositionRecord | None,
        length: int,
        device: torch.device,
    ) -> PositionTerms:
        """The terms of one forward of `length` new tokens.

        Args:
            mask: The attention mask (B, 1, 1 or T, S) bool, True = attend, or None.
            position_ids: (B, T) positions of the new tokens, or None: 0..T-1 in every row.
            cache: The decoder's KV cache (it keeps every slot's position), or None.
            length: T, the number of new tokens.
            device: Where the hidden states are.
        """
        ...


def forward_positions(
    position_ids: Tensor | None, cache: PositionRecord | None, length: int, device: torch.device
) -> tuple[Tensor, Tensor]:
    """The positions of a forward's queries and of every key it attends.

    Without `position_ids` every row has positions 0..T-1: (T,) and the same (T,). With them, (B, T) and the keys'
    (B, S): the new tokens', or with a cache every slot's (the cache records the new tokens' positions here). Rows
    that share one tensor of positions (expanded: a batch stride of 0, or a single row) give (T,) as well, so that
    what depends on positions is computed once for the batch: position interpolation divides the same grid for
    every row, and FIRE's MLP over (B, T, S) pairs would take B times the memory.
    """
    if position_ids is None:
        positions = torch.arange(length, device=device)
        return positions, positions
    if cache is None and position_ids.dim() == 2 and (position_ids.shape[0] == 1 or position_ids.stride(0) == 0):
        return position_ids[0], position_ids[0]  # a check of strides, not of values: no host sync
    return position_ids, cache.add_positions(position_ids) if cache is not None else position_ids


def fold_into_mask(bias: Tensor, mask: Tensor | None) -> Tensor:
    """A float32 bias (1 or B, H, T, S) with the mask (True = attend) folded in as -inf, in the autocast dtype.

    Cast once here, not in every layer: SDPA takes a float mask in the query's dtype.
    """
    if mask is not None:
        bias = bias.masked_fill(~mask, float("-inf"))
    if torch.is_autocast_enabled(bias.device.type):
        bias = bias.to(torch.get_autocast_dtype(bias.device.type))
    return bias


class FoldedBias(nn.Module):
    """An encoding whose terms are one float bias of the logits for every layer, folded into the mask (T5, ALiBi).

    A subclass writes `bias(queries, keys)`; the bias is computed once per forward and SDPA adds it as its float
    mask (the `sdpa` kernel), so no layer knows of it.
    """

    kernel: ClassVar[str] = "sdpa"
    adds_to_logits: ClassVar[bool] = True

    def bias(self, queries: Tensor, keys: Tensor) -> Tensor:
        """The bias of every (query, key) pair.

        Args:
            queries: (T,) or (B, T) positions of the new tokens.
            keys: (S,) or (B, S) positions of every key (the cached ones included).

        Returns:
            float32 (1, H, T, S), or (B, H, T, S) for per-row positions.
        """
        raise NotImplementedError

    def terms(
        self,
        mask: Tensor | None,
        position_ids: Tensor | None,
        cache: PositionRecord | None,
        length: int,
        device: torch.device,
    ) -> PositionTerms:
        """The bias of this forward with the mask folded in: every layer adds it to its logits."""
        queries, keys = forward_positions(position_ids, cache, length, device)
        return PositionTerms(fold_into_mask(self.bias(queries, keys), mask))
