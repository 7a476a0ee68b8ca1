"""Which keys each new token attends to: the decoder's KV cache and the boolean mask of every pattern.

`self_attention_mask` builds the one mask a forward's attention over the (B, T) grid reads (padding, the attention
pattern: bidirectional, causal or UniLM, and packed documents' block diagonal); `KVCache` is a decoder's memory of
every earlier position's keys and values, with the per-slot padding, ranks and positions the mask and the relative
encodings read, and, for an encoder-decoder's decoder, each layer's keys and values of the encoder's states.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


class KVCache:
    """A decoder's memory: the keys and values of every position seen so far, in every layer.

    Generation then computes q, k and v for the new tokens only. Keys are stored rotated (a key's rotation depends on
    its own position alone), so nothing is recomputed. Each layer's keys and values are one contiguous (B, H,
    length, D) tensor, the new slots concatenated at every step: attention reads them without a copy, where a slice
    of a larger buffer, (B, H, capacity, D)[:, :, :length], is strided and made single-query attention on a CPU
    1.5-2x slower; the concatenation costs what moving a buffer's filled slots in place cost beam search's
    reordering, which now selects whole tensors. Beside them, per slot (in buffers of `capacity` slots, doubled when
    full): whether it is a real token (the padding mask) and its attention rank (see `attention_ranks`), which later
    queries are masked by.

    A decoder with cross-attention also keeps each layer's keys and values of the encoder's states (B, S, H, D):
    projected at the first step, read at every later one (`cross_keys_values`).
    """

    def __init__(self, capacity: int = 0) -> None:
        self.capacity = capacity
        self.length = 0
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []
        self.keep: Tensor | None = None  # (B, capacity) bool: a real token
        self.ranks: Tensor | None = None  # (B, capacity) long: attention rank
        self.positions: Tensor | None = None  # (B, capacity) long: position (relative encodings read it)
        self.cross_keys: list[Tensor] = []  # per layer (B, S, H, D): the encoder's states projected, once
        self.cross_values: list[Tensor] = []

    def last_rank(self) -> Tensor | int:
        """(B, 1) rank of the last filled slot (0 when empty)."""
        return 0 if self.length == 0 or self.ranks is None else self.ranks[:, self.length - 1 : self.length]

    def add_tokens(self, keep: Tensor, ranks: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Record T new slots ((B, T) padding mask and ranks); returns both for all slots so far, (B, S)."""
        B, T = keep.shape
        start, self.length = self.length, self.length + T
        if self.keep is None or self.keep.shape[1] < self.length:
            self.capacity = max(self.capacity, self.length, 2 * (0 if self.keep is None else self.keep.shape[1]))
            self.keep = _grown(self.keep, (B, self.capacity), torch.bool, keep.device, dim=1)
            self.ranks = _grown(self.ranks, (B, self.capacity), torch.long, keep.device, dim=1)
        self.keep[:, start : self.length] = keep
        if ranks is not None:
            self.ranks[:, start : self.length] = ranks
        return self.keep[:, : self.length], None if ranks is None else self.ranks[:, : self.length]

    def add_positions(self, positions: Tensor) -> Tensor:
        """Record the positions (B, T) of the slots just added (by `add_tokens`); returns those of all slots (B, S)."""
        B, T = positions.shape
        if self.positions is None or self.positions.shape[1] != self.capacity:
            self.positions = _grown(self.positions, (B, self.capacity), torch.long, positions.device, dim=1)
        self.positions[:, self.length - T : self.length] = positions
        return self.positions[:, : self.length]

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append layer `layer`'s k, v (B, H, T, D) of the slots just added; returns those of all slots (B, H, S, D).

        Both are contiguous (see the class docstring).
        """
        if layer == len(self.keys):
            self.keys.append(k.contiguous())
            self.values.append(v.contiguous())
        else:
            self.keys[layer] = torch.cat((self.keys[layer], k), dim=2)
            self.values[layer] = torch.cat((self.values[layer], v), dim=2)
        return self.keys[layer], self.values[layer]

    def cross_keys_values(self, layer: int, project: Callable[[], tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
        """Layer `layer`'s cross-attention keys and values (B, S, H, D): `project()`ed at its first call, then kept.

        The encoder's states do not change while a target is decoded, so neither do their keys and values. They are
        kept contiguous in the layout attention reads them in, (B, H, S, D) (the returned tensors are its transposed
        views): every later step reads them without a copy (the projection's own layout halves the speed of
        cross-attention in beam search on a CPU).
        """
        if layer == len(self.cross_keys):
            k, v = project()
            self.cross_keys.append(k.transpose(1, 2).contiguous().transpose(1, 2))
            self.cross_values.append(v.transpose(1, 2).contiguous().transpose(1, 2))
        return self.cross_keys[layer], self.cross_values[layer]

    def reorder(self, rows: Tensor, cross: Tensor | None = None) -> None:
        """Keep the self-attention slots of rows `rows` in that order: beam search's beams, each from its parent.

        The keys and values are selected into new contiguous tensors. The encoder's keys and values are left as they
        are (beam search moves a beam only among the beams of its own source, which share them), unless `cross`
        gives the rows they keep: rows leave the batch (sources whose search has ended).
        """
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        for name in ("keep", "ranks", "positions"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.index_select(0, rows))
        if cross is not None:  # selected in their (B, H, S, D) layout, which stays contiguous
            self.cross_keys = [k.transpose(1, 2).index_select(0, cross).transpose(1, 2) for k in self.cross_keys]
            self.cross_values = [v.transpose(1, 2).index_select(0, cross).transpose(1, 2) for v in self.cross_values]


def _grown(old: Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, dim: int) -> Tensor:
    """A zero tensor of `shape` holding `old` at the start of dimension `dim`."""
    new = torch.zeros(shape, dtype=dtype, device=device)
    if old is not None and old.numel():
        new.narrow(dim, 0, old.shape[dim]).copy_(old)
    return new


def attention_ranks(
    pattern: str, token_type_ids: Tensor | None, shape: tuple[int, int], device: torch.device
) -> Tensor:
    """Ranks (B, T) for a causal or UniLM pattern: a query attends to exactly the keys of lower or equal rank.

    UniLM's mask (Dong et al. 2019, as in bert4keras) is the cumulative sum of the segment ids: segment A (type 0)
    shares rank 0, so it sees itself and none of B; each B token (type 1) ranks one above the token before it, so
    it sees A and the B tokens up to itself. A causal decoder is the same with every token in segment B.
    """
    if pattern == "causal":
        return torch.arange(1, shape[1] + 1, device=device).expand(shape)
    if token_type_ids is None:  # all of it segment A (token type 0, the default everywhere)
        return torch.zeros(shape, dtype=torch.long, device=device)
    return token_type_ids.long().cumsum(dim=1)


def self_attention_mask(
    pattern: str,
    attention_mask: Tensor | None,
    token_type_ids: Tensor | None,
    cache: KVCache | None,
    shape: tuple[int, int],
    device: torch.device,
    causal_shortcut: bool = True,
    document_ids: Tensor | None = None,
) -> tuple[Tensor | None, bool]:
    """The boolean mask every layer's attention uses, and whether SDPA's causal path replaces it.

    Every query sees at least one key: a row of padding only attends to all of its tokens (bidirectional) or a padding
    query to itself (causal, UniLM), so that no softmax, SDPA's or an exported graph's, has a row of -inf.

    Args:
        pattern: `bidirectional`, `causal` or `unilm` (ModelConfig.attention_pattern).
        attention_mask: (B, T) 1 for real tokens, 0 for padding, or None; with a cache it may also cover the
            cached slots (B, S), as in HF, which the cache already knows.
        token_type_ids: (B, T) segments (the UniLM pattern reads them), or None.
        cache: The decoder's KVCache (the new slots are recorded in it), or None.
        shape: (B, T) of the new tokens.
        device: Where the mask lives.
        causal_shortcut: Leave an unpadded causal mask to SDPA (False when a position bias will be added to it).
        document_ids: (B, T) the document of every token (packed rows): a token attends to its own document's
            tokens only (a block-diagonal mask); no cache.

    Returns:
        (B, 1, 1, S) or (B, 1, T, S) bool (True = attend) or None, and True when no mask is needed but causality.
    """
    B, T = shape
    keep = None if attention_mask is None else attention_mask.bool()  # (B, T), or (B, S) covering a cache
    if keep is not None and keep.shape[1] != T:  # not sliced when equal: torch 2.11's export cannot size x[:, -T:]
        cached = 0 if cache is None else cache.length
        if keep.shape[1] != cached + T:  # ids and mask out of step would mask the wrong tokens
            raise ValueError(
                f"attention_mask covers {keep.shape[1]} positions; expected the {T} new tokens"
                + (f" or them and the {cached} cached ones" if cached else "")
            )
        keep = keep[:, -T:]
    ranks = None if pattern == "bidirectional" else attention_ranks(pattern, token_type_ids, shape, device)
    if document_ids is not None:
        if cache is not None:
            raise ValueError("document_ids cannot be combined with a cache (documents are packed rows, not a decode)")
        allowed = document_ids[:, :, None] == document_ids[:, None, :]  # (B, T, T): within a document only
        if ranks is not None:
            allowed = allowed & (ranks[:, None, :] <= ranks[:, :, None])
        if keep is not None:
            allowed = allowed & keep[:, None, :]
        # every query sees itself (a padding query too): no row without a key, in any runtime
        allowed = allowed | torch.eye(T, dtype=torch.bool, device=device)
        return allowed[:, None], False  # (B, 1, T, T)
    ranks_all = ranks
    if cache is not None:
        if ranks is not None:
            ranks = ranks + cache.last_rank()  # continue after the cached tokens
        keep, ranks_all = cache.add_tokens(
            keep if keep is not None else torch.ones(shape, dtype=torch.bool, device=device), ranks
        )
    if ranks is None:
        if keep is None:
            return None, False
        # A row of padding only (a static batch's filler row, a padded choice) has no key to attend. SDPA gives it 0,
        # but an exported graph's softmax gives NaN where a bias made the row all -inf (T5, ALiBi, Shaw), or a mean
        # over every key where the mask is boolean. Such a row attends to all of its tokens instead, as if unpadded:
        # the same finite output in every runtime, and nothing changes for a row with a real token.
        keep = keep | ~keep.any(dim=1, keepdim=True)  # (B, S)
        return keep[:, None, None, :], False  # (B, 1, 1, S)
    if keep is None and pattern == "causal" and causal_shortcut:
        return None, True  # SDPA's own causal path (no cache here: with one, keep is set)
    allowed = ranks_all[:, None, :] <= ranks[:, :, None]  # (B, T, S)
    if keep is None and pattern == "causal":
        allowed = allowed[:1]  # every row alike: a (1, 1, T, S) mask, so that a bias added to it is not B times larger
    if keep is not None:
        allowed = allowed & keep[:, None, :]
        S = allowed.shape[-1]
        # A padding query may see no key at all, and a row with no key is NaN in SDPA; it sees itself instead
        # (its output is never read, and no real token attends to it).
        allowed[:, torch.arange(T, device=device), torch.arange(S - T, S, device=device)] = True
    return allowed[:, None], False  # (B, 1, T, S)
