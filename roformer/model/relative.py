"""The relative position baselines the paper names (sec. 2.3), and ALiBi: each a function of key - query distance.

`t5_bias` (Raffel et al. 2020: one learned scalar per log-spaced bucket and head, shared by all layers) and `alibi`
(Press et al. 2022: a fixed slope per head times |distance|) add a bias to the logits, computed once per forward and
folded into the mask, so softmax attention over the grid (`sdpa`) adds it. `shaw` (Shaw et al. 2018) adds learned
embeddings of the clipped distance to the keys (and values): each layer's logits take terms of its own queries, the
`biased` kernel. Distances are (T, S) when every row has positions 0..T-1, else (B, T, S).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import ClassVar

import torch
from torch import Tensor, nn

from roformer.errors import ConfigError
from roformer.model.config import EncodingSpec, ModelConfig
from roformer.model.terms import FoldedBias, PositionRecord, PositionTerms, ShawTerms, forward_positions


def relative_distances(query_positions: Tensor, key_positions: Tensor) -> Tensor:
    """Key position - query position: (T,) and (S,) -> (T, S), or (B, T) and (B, S) -> (B, T, S)."""
    return key_positions.unsqueeze(-2) - query_positions.unsqueeze(-1)


def forward_distances(
    position_ids: Tensor | None, cache: PositionRecord | None, length: int, device: torch.device, max_distance: int
) -> tuple[Tensor, int, int]:
    """A forward's distances, once for every layer, and the range [lowest, highest] they lie in once clipped.

    Without `position_ids` every row has positions 0..T-1: the (T, T) distances (and the (1, H, T, T) bias) are
    shared by the batch. With them (or a cache, which keeps every slot's position) they are per row, (B, T, S), and
    the range is the whole [-max_distance, max_distance]: its bounds would need a host sync.
    """
    queries, keys = forward_positions(position_ids, cache, length, device)
    distance = relative_distances(queries, keys)  # (T, T), or (B, T, S)
    if position_ids is None and not torch.compiler.is_compiling():  # compiled, the whole table: a row range that
        return distance, 1 - length, length - 1  # depends on T would guard on T
    return distance, -max_distance, max_distance


def t5_buckets(distance: Tensor, num_buckets: int, max_distance: int, bidirectional: bool = True) -> Tensor:
    """T5's buckets of a distance (key - query) (Raffel et al. 2020, sec. 2.1; mesh-tensorflow).

    Bidirectional (T5's encoder): half the buckets are for keys after the query, half for the rest. Otherwise (T5's
    decoder, whose keys are never after the query) all of them are for keys at or before it, and a later key shares
    distance 0's bucket (its score is masked). Within a direction, distances below half its buckets each have their
    own bucket; larger ones share log-spaced buckets up to max_distance, and everything further shares the last one.
    """
    span = num_buckets // 2 if bidirectional else num_buckets  # buckets per direction
    exact = span // 2
    if bidirectional:
        bucket = (distance > 0).long() * span
        n = distance.abs()
    else:
        bucket = torch.zeros_like(distance)
        n = (-distance).clamp(min=0)
    # n = 0 gives log(0) = -inf here; those entries take the exact branch below
    log_spaced = exact + (torch.log(n.float() / exact) / math.log(max_distance / exact) * (span - exact)).long()
    return bucket + torch.where(n < exact, n, log_spaced.clamp(max=span - 1))


def alibi_slopes(num_heads: int) -> Tensor:
    """ALiBi's head slopes (Press et al. 2022, sec. 3): 2^(-8/n), 2^(-16/n), ... for n heads, n a power of two.

    Otherwise the slopes of the largest power of two p below n, then every other slope of 2p for the remaining
    heads (the paper's interpolation, as its reference code). float32 (H,).
    """

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    power = 2 ** int(math.log2(num_heads))
    slopes = geometric(power) + geometric(2 * power)[0::2][: num_heads - power]
    return torch.tensor(slopes, dtype=torch.float32)


class RelativeBias(FoldedBias):
    """A bias of the attention logits that depends on distance only, computed once per forward for every layer.

    `t5_bias`: one learned scalar per bucket (`t5_buckets`) and head, shared by all layers as in T5. `alibi`: the fixed
    -slope_h |key - query| (no parameters), symmetric for an encoder by default (`alibi_form`; Ruoss et al.'s
    asymmetric form puts keys on the left half a step closer: -slope_h (|key - query| - 0.5) before the query).
    """

    attribute: ClassVar[str] = "relative_bias"  # the bias is folded into the mask: SDPA adds it (FoldedBias)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.kind = config.position_encoding
        self.num_buckets = config.relative_num_buckets
        self.max_distance = config.relative_max_distance
        # a causal decoder never looks ahead: all buckets for the past, as T5's decoder (UniLM's prompt does look ahead)
        self.bidirectional = config.attention_pattern != "causal"
        self.buckets = nn.Embedding(config.relative_num_buckets, config.num_heads) if self.kind == "t5_bias" else None
        # A plain attribute, copied once per device: model.to(bfloat16) must not round it, and a copy to the GPU in
        # every forward would wait for the stream.
        self._slopes = {"cpu": alibi_slopes(config.num_heads)}
        # Ruoss et al. 2023 (their code, for a bidirectional encoder): keys before the query are half a step closer,
        # so that left and right differ
        self.left_offset = 0.5 if config.alibi_form == "asymmetric" else 0.0

    def forward(self, distance: Tensor) -> Tensor:
        """(T, S) or (B, T, S) distances -> float32 bias (1, H, T, S) or (B, H, T, S)."""
        distance = distance if distance.dim() == 3 else distance[None]
        if self.buckets is not None:
            buckets = t5_buckets(distance, self.num_buckets, self.max_distance, self.bidirectional)  # (B, T, S)
            bias = self.buckets(buckets)  # (B, T, S, H)
            return bias.float().permute(0, 3, 1, 2).contiguous()  # SDPA's kernels want the keys' dim contiguous
        device = str(distance.device)
        if device not in self._slopes:
            self._slopes[device] = self._slopes["cpu"].to(device)
        reach = distance.abs().float()
        if self.left_offset:
            reach = reach - self.left_offset * (distance < 0)  # distance = key - query: < 0 for keys on the left
        return -self._slopes[device][None, :, None, None] * reach[:, None]  # (1, H, 1, 1) slopes

    def bias(self, queries: Tensor, keys: Tensor) -> Tensor:
        """(T,) or (B, T) query and (S,) or (B, S) key positions -> float32 bias (1 or B, H, T, S)."""
        return self(relative_distances(queries, keys))


class ShawEmbeddings(nn.Module):
    """Shaw et al.'s relative position representations: learned embeddings of the clipped distance.

        e_ij = q_i . (k_j + a^K_ij) / sqrt(d),   z_i = sum_j softmax(e)_ij (v_j + a^V_ij)    (Shaw et al. eq. 3-5)

    a_ij = w_clip(j - i, k): 2k + 1 embeddings of the head width, shared by the heads, one set per layer (or one for
    all layers with `shaw_shared_layers`).
    """

    attribute: ClassVar[str] = "shaw"
    kernel: ClassVar[str] = "biased"  # q . a^K of each layer's own queries (and a^V on the values)
    adds_to_logits: ClassVar[bool] = True

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.max_distance = config.relative_max_distance
        tables = 1 if config.shaw_shared_layers else config.num_layers
        rows, dim = 2 * self.max_distance + 1, config.head_size
        self.keys = nn.ModuleList(nn.Embedding(rows, dim) for _ in range(tables))
        self.values = nn.ModuleList(nn.Embedding(rows, dim) for _ in range(tables)) if config.shaw_values else None

    def for_layers(self, distance: Tensor, lowest: int, highest: int) -> Callable[[int], ShawTerms]:
        """The terms of each layer for these distances, which lie in [lowest, highest] once clipped.

        Only those rows are used: at T = 128 with k = 128 that is 255 of 257, at T = 16 it is 31.
        """
        k = self.max_distance
        lowest, highest = max(lowest, -k), min(highest, k)
        index = distance.clamp(-k, k) - lowest
        rows = slice(lowest + k, highest + k + 1)

        def terms(layer: int) -> ShawTerms:
            table = layer % len(self.keys)
            values = None if self.values is None else self.values[table].weight[rows]
            return ShawTerms(self.keys[table].weight[rows], values, index)

        return terms

    def terms(
        self,
        mask: Tensor | None,
        position_ids: Tensor | None,
        cache: PositionRecord | None,
        length: int,
        device: torch.device,
    ) -> PositionTerms:
        """Each layer's embeddings of this forward's distances; the mask is kept (the layers add q . a^K to it)."""
        distance, lowest, highest = forward_distances(position_ids, cache, length, device, self.max_distance)
        return PositionTerms(mask, shaw=self.for_layers(distance, lowest, highest))


# ----------------------------------------------------------------------------------------------------------------
# The declarations


def check_t5_buckets(config: ModelConfig) -> None:
    """T5's buckets: an even number, at least 4, whose log-spaced part starts below `relative_max_distance`.

    Raises:
        ConfigError: naming the field.
    """
    if config.relative_num_buckets < 4 or config.relative_num_buckets % 2:
        raise ConfigError(f"relative_num_buckets must be even and >= 4, got {config.relative_num_buckets}")
    # T5's log-spaced buckets start at num_buckets / 4 (half per direction, half of those exact); a causal decoder
    # has one direction, so at num_buckets / 2
    directions = 1 if config.attention_pattern == "causal" else 2
    exact = config.relative_num_buckets // (2 * directions)
    if config.relative_max_distance <= exact:
        raise ConfigError(
            f"relative_max_distance ({config.relative_max_distance}) must exceed relative_num_buckets / "
            f"{2 * directions} ({exact}), where T5's log-spaced buckets start"
        )


ENCODINGS = (
    EncodingSpec(
        name="shaw",
        summary="learned embeddings of the clipped distance clip(j - i, k) added to the keys (and values)",
        acts="attention",
        relative=True,
        hf=None,
        kernel="biased",
        refuses=("linear",),
        fields=("shaw_values", "shaw_shared_layers"),
        build=ShawEmbeddings,
        paper="Shaw et al. 2018",
    ),
    EncodingSpec(
        name="t5_bias",
        summary="one learned scalar per log-spaced distance bucket and head, shared by all layers",
        acts="attention",
        relative=True,
        hf=None,
        kernel="sdpa",
        folds_bias=True,
        refuses=("linear",),
        build=RelativeBias,
        check=check_t5_buckets,
        paper="Raffel et al. 2020",
    ),
    EncodingSpec(
        name="alibi",
        summary="the fixed bias -slope_h \\|i - j\\| (symmetric for an encoder, or Ruoss et al.'s asymmetric form)",
        acts="attention",
        relative=True,
        hf=None,
        kernel="sdpa",
        folds_bias=True,
        refuses=("linear",),
        fields=("alibi_form",),
        build=RelativeBias,
        real_positions=True,
        paper="Press et al. 2022",
    ),
)
