"""The position encodings, one room below the layers: `layers` imports this module, never the reverse.

`rotary` (RoFormer) rotates q and k by position, optionally scaled beyond the trained length; `sinusoidal` and
`learned` (a plain table in `layers.Embeddings`) are added to the token embeddings; `shaw` adds learned embeddings of
the distance to the keys (and values); `t5_bias` and `alibi` add a bias to the attention logits; `none` has none.

The encodings that act inside attention share one entry point, which is all the backbone knows of them:
`attention_positions(config)` builds the module (registered on the backbone under its `attribute`), and once per
forward its `terms(...)` returns the `PositionTerms` that every layer's attention reads. Adding such an encoding
(xPos, FIRE, ...) is a config value, a class here with `attribute`, `adds_to_logits` and `terms`, and a line in
`attention_positions`.

References:
    Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding", arXiv 2104.09864 ("paper").
    Vaswani et al. 2017, "Attention is all you need" (sinusoidal positions); Shaw et al. 2018; Raffel et al. 2020
    (T5); Press et al. 2022 (ALiBi).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
from torch import Tensor, nn

from roformer.model.config import ModelConfig, RopeScaling

Rotation = Callable[[Tensor], Tensor]  # rotates (B, T, ..., D) by position: RotaryEmbedding, or it at position_ids

# ----------------------------------------------------------------------------------------------------------------
# What attention reads of a position encoding


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


class PositionRecord(Protocol):
    """What a relative encoding needs of a decoder's KV cache (`layers.KVCache`): every cached key's position."""

    def add_positions(self, positions: Tensor) -> Tensor:
        """Record the new tokens' positions (B, T); returns those of every key so far (B, S)."""
        ...


class AttentionPositions(Protocol):
    """An encoding that acts inside attention (rotary, T5's bias, ALiBi, Shaw), as `Backbone` uses it.

    Attributes:
        attribute: The backbone attribute it is registered under: its parameters' checkpoint keys start with it
            (`relative_bias.buckets.weight`, `shaw.keys.0.weight`), so it never changes.
        adds_to_logits: It adds to the attention logits, so an unpadded causal mask must stay a tensor for the sum
            (SDPA's own causal path takes no mask).
    """

    attribute: str
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


# ----------------------------------------------------------------------------------------------------------------
# Rotary position embedding (RoPE) and its context scaling


def rotary_angles(num_positions: int, dim: int, base: float = 10000.0, scaling: RopeScaling | None = None) -> Tensor:
    """Angles m * theta_i for positions m < num_positions, theta_i = base^(-2i/dim) (paper eq. 15), or as scaled.

    Computed in float64: in float32, m * theta_i at m = 1e5 is off by ~1e-2 rad, a known bug class (GPT-NeoX,
    Megatron). Callers cast the cos/sin tables to float32 and cast at use.

    Returns:
        (num_positions, dim // 2) float64 tensor on the CPU.
    """
    inv_freq, _ = rotary_frequencies(dim, base, scaling)  # (dim/2,)
    return torch.outer(torch.arange(num_positions, dtype=torch.float64), inv_freq)  # (T, dim/2)


def rotary_frequencies(dim: int, base: float, scaling: RopeScaling | None = None) -> tuple[Tensor, float]:
    """float64 inverse frequencies theta_i (dim/2,) and the magnitude of the rotation table (1 but for yarn).

    linear (position interpolation, Chen et al. 2023): theta_i / factor. ntk (NTK-aware, bloc97 2023): the base
    becomes base * factor^(dim / (dim - 2)), so the lowest frequency is interpolated by `factor` and the highest kept.
    yarn (Peng et al. 2023, sec. 3.2-3.4): frequency i makes r_i = L / (2 pi / theta_i) rotations over the trained
    length L; it is kept where r_i > beta_fast, interpolated (/ factor) where r_i < beta_slow, and mixed on a linear
    ramp over the dimensions between; the table's magnitude 0.1 ln(factor) + 1 scales q.k by its square.
    """
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim  # 2i/d
    if scaling is None or scaling.type == "self_extend":  # SelfExtend changes positions, not frequencies
        return base**-exponents, 1.0
    factor = scaling.factor
    if scaling.type == "linear":
        return base**-exponents / factor, 1.0
    if scaling.type == "ntk":
        return (base * factor ** (dim / (dim - 2))) ** -exponents, 1.0
    original = base**-exponents
    low, high = _yarn_ramp_bounds(dim, base, scaling)
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0.0, 1.0)  # 0: keep, 1: interp.
    inv_freq = original * (1.0 - ramp) + original / factor * ramp
    magnitude = scaling.attention_factor
    if magnitude is None:
        magnitude = 0.1 * math.log(factor) + 1.0 if factor > 1.0 else 1.0
    return inv_freq, magnitude


def _yarn_ramp_bounds(dim: int, base: float, scaling: RopeScaling) -> tuple[float, float]:
    """Pair indices where frequencies make beta_fast / beta_slow rotations over the trained length (floor / ceil)."""

    def pair_index(rotations: float) -> float:  # YaRN eq. 17 solved for the dimension
        return dim * math.log(scaling.original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(pair_index(scaling.beta_fast)), 0)
    high = min(math.ceil(pair_index(scaling.beta_slow)), dim - 1)
    return low, high if high > low else low + 0.001  # one pair: a step, not a division by zero


class TablesFollowTheModule(nn.Module):
    """Position tables that follow the module's device moves (`.to(device)`, `.cuda()`) but not its dtype casts.

    The tables (the attributes named in `tables`) are plain tensors, not buffers, so `model.to(bfloat16)` leaves
    them float32. A compiled forward guards on the tables: one still on the CPU after the model went to the GPU
    would be rebuilt inside the first compiled call, and the model compiled a second time.
    """

    tables: ClassVar[tuple[str, ...]] = ()

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> TablesFollowTheModule:
        super()._apply(fn, recurse)
        for name in self.tables:
            value = getattr(self, name)
            if value is None:
                continue
            tensors = value if isinstance(value, tuple) else (value,)
            device = fn(torch.empty(0, device=tensors[0].device)).device  # where the parameters went; no dtype cast
            if tensors[0].is_meta and device.type != "meta":  # `to_empty`: no values to move, built again when read
                setattr(self, name, None)
                continue
            moved = tuple(t.to(device) for t in tensors)
            setattr(self, name, moved if isinstance(value, tuple) else moved[0])
        return self


def _capacity(length: int) -> int:
    """Cache size for a request of `length` positions: the next power of two, so growth happens rarely."""
    return max(64, 1 << (length - 1).bit_length())


class RotaryEmbedding(TablesFollowTheModule):
    """Rotary position embedding (RoPE, paper sec. 3.2-3.4): rotates pairs of a head vector by position.

    Pair i of the vector at position m is rotated by angle m * theta_i. In the `interleaved` layout (paper, HF
    RoFormer) pair i is (x_2i, x_2i+1); in the `half` layout (GPT-NeoX, LLaMA) it is (x_i, x_i+d/2). With `dim`
    smaller than the head, only the first `dim` features are rotated (partial rotary) and the rest pass through.
    The table e^{i m theta_i} (times yarn's magnitude) is kept in complex64 (float32 cos/sin, never the model
    dtype), grown on demand, so there is no length limit.
    """

    attribute: ClassVar[str] = "rotary"
    adds_to_logits: ClassVar[bool] = False
    tables: ClassVar[tuple[str, ...]] = ("_cache", "_real_cache")

    def __init__(
        self, dim: int, base: float = 10000.0, layout: str = "interleaved", scaling: RopeScaling | None = None
    ) -> None:
        super().__init__()
        self.dim = dim
        self.layout = layout
        self.set_frequencies(base, scaling)

    def set_frequencies(self, base: float, scaling: RopeScaling | None, device: torch.device | None = None) -> None:
        """Rotate by `base` and `scaling` from now on; the tables are rebuilt (on `device`, default the CPU).

        Plain attributes, not buffers: `model.to(bfloat16)` must not cast the tables. The real tables start filled
        (512 positions, grown on demand): torch.compile guards on them, and a first call that created them would
        recompile the model once more.
        """
        self.base = base
        self.scaling = scaling
        self.magnitude = rotary_frequencies(self.dim, base, scaling)[1]
        self._cache: Tensor | None = None
        self._real_cache: tuple[Tensor, Tensor] | None = None
        self.cos_sin(512, device or torch.device("cpu"))

    @property
    def groups_positions(self) -> bool:
        """Whether attention reads grouped positions (SelfExtend), not one rotation per token."""
        return self.scaling is not None and self.scaling.type == "self_extend"

    def rotations(self, length: int, device: torch.device) -> Tensor:
        """complex64 table magnitude * e^{i m theta_i} of shape (length, dim // 2) on `device`."""
        if self._cache is None or self._cache.shape[0] < length or self._cache.device != device:
            angles = rotary_angles(_capacity(length), self.dim, self.base, self.scaling)
            table = torch.polar(torch.full_like(angles, self.magnitude), angles)
            self._cache = table.to(torch.complex64).to(device)
        return self._cache[:length]

    def cos_sin(self, length: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """float32 cos and sin tables (times the magnitude), each (length, dim // 2) (real copies, no complex views)."""
        cached = self._real_cache
        if cached is None or cached[0].shape[0] < length or cached[0].device != device:
            angles = rotary_angles(_capacity(length), self.dim, self.base, self.scaling)  # float64
            cos, sin = angles.cos() * self.magnitude, angles.sin() * self.magnitude
            self._real_cache = cached = (cos.float().to(device), sin.float().to(device))
        return cached[0][:length], cached[1][:length]

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """Rotate `x` of shape (B, T, ..., D) by position; returns the input dtype.

        The position of x[b, t] is `positions[b, t]` (B, T) when given (left padding, packed documents), else t.
        """
        if self.dim < x.shape[-1]:  # partial rotary: the remaining features carry no position
            return torch.cat((self(x[..., : self.dim], positions), x[..., self.dim :]), dim=-1)
        length = x.shape[1] if positions is None else int(positions.max()) + 1
        if torch.compiler.is_compiling():
            cos, sin = self.cos_sin(length, x.device)
            if positions is not None:
                cos, sin = cos[positions], sin[positions]  # (B, T, D/2)
            return apply_rotary_real(x, cos, sin, self.layout)
        return apply_rotary(x, self.rotations_of(x, positions), self.layout)

    def rotations_of(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """The complex64 rotations of x's (B, T, ...) tokens: (T, dim // 2), or (B, T, dim // 2) at `positions`."""
        return self.rotations(x.shape[1], x.device) if positions is None else self.rotations_at(positions)

    def rotations_at(self, positions: Tensor) -> Tensor:
        """The complex64 rotations at `positions` (B, T): (B, T, dim // 2), on their device.

        Reads the longest position back from the device (a host sync): once per forward when `AtPositions` keeps it.
        """
        if positions.numel() == 0:
            return torch.empty(*positions.shape, self.dim // 2, dtype=torch.complex64, device=positions.device)
        return self.rotations(int(positions.max()) + 1, positions.device)[positions]

    def rotate_leading(
        self,
        x: Tensor,
        count: int,
        positions: Tensor | None = None,
        fused: bool = True,
        table: Tensor | None = None,
    ) -> tuple[Tensor, ...]:
        """The slices of `x` (B, T, n, H, D) along dim 2, the first `count` of them rotated by position.

        Rotating q and k of a fused (B, T, 3, H, D) projection: in eager mode one `RotateLeading` call, whose
        backward writes the projection's gradient once (see there), with `table` (`rotations_at(positions)`) when
        the caller has it; compiled, in another layout, with partial rotary or with `fused` False (benchmarks,
        tests), the rotation of the slice, which inductor fuses or autograd assembles.
        """
        if not fused or torch.compiler.is_compiling() or self.layout != "interleaved" or self.dim < x.shape[-1]:
            rotated = self(x[:, :, :count], positions).unbind(2)
            return (*rotated, *x[:, :, count:].unbind(2))
        table = self.rotations_of(x, positions) if table is None else table
        return RotateLeading.apply(x, table.view(_broadcastable(table, x)), count)

    def terms(
        self,
        mask: Tensor | None,
        position_ids: Tensor | None,
        cache: PositionRecord | None,
        length: int,
        device: torch.device,
    ) -> PositionTerms:
        """The rotation of this forward's tokens, at `position_ids` when given (see `AttentionPositions.terms`)."""
        if self.groups_positions:
            if cache is not None:
                raise ValueError("rope_scaling self_extend is for encoding whole sequences, not a cached decode")
            return PositionTerms(mask, rotary=GroupedRotation(self, position_ids, *self_extend_sizes(self.scaling)))
        return PositionTerms(mask, rotary=self if position_ids is None else AtPositions.of(self, position_ids))


@dataclass
class AtPositions:
    """A `RotaryEmbedding` at given positions (B, T): left padding, packed documents, a cached decode's new tokens.

    In eager mode the rotations at the positions are gathered once per forward (`table`), not in every layer: one
    host sync for the longest position instead of one a layer. Compiled, the rotary module's real path reads them.
    """

    rotary: RotaryEmbedding
    positions: Tensor
    table: Tensor | None = None  # (B, T, dim // 2) complex64, or None

    @classmethod
    def of(cls, rotary: RotaryEmbedding, positions: Tensor) -> AtPositions:
        """`rotary` at `positions`, its table gathered now where the eager complex path will read it."""
        eager = not torch.compiler.is_compiling() and rotary.layout == "interleaved"
        return cls(rotary, positions, rotary.rotations_at(positions) if eager else None)

    def __call__(self, x: Tensor) -> Tensor:
        if self.table is not None and self.rotary.dim == x.shape[-1]:
            return apply_rotary(x, self.table, self.rotary.layout)
        return self.rotary(x, self.positions)

    def rotate_leading(self, x: Tensor, count: int) -> tuple[Tensor, ...]:
        """`RotaryEmbedding.rotate_leading` at these positions."""
        return self.rotary.rotate_leading(x, count, self.positions, table=self.table)


class RotateLeading(torch.autograd.Function):
    """Eager RoPE on a fused projection: slices of x (B, T, n, H, D) along dim 2, the first `count` rotated.

    Through autograd, rotating the slice `qkv[:, :, :2]` and reading v as `qkv[:, :, 2]` costs in the backward a
    zero-filled gradient for each of the two (slice and select backward), their sum, the stack of q's and k's
    gradients and, in bf16, two casts: about five passes over the projection's gradient besides the rotation
    (rotary cost 14.5% of sinusoidal's tokens/s eager on an H200, 4.4% compiled, docs/speed.md). Here the forward is
    the complex product of the slice (paper eq. 34) and the backward writes each gradient once into one buffer:
    q's and k's rotated back (times the conjugate table: the rotation is orthogonal, times yarn's magnitude), v's
    copied. The outputs equal the unfused rotation exactly; used once per layer, never differentiated twice.
    """

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: Tensor, table: Tensor, count: int) -> tuple[Tensor, ...]:
        """Rotate x (B, T, n, H, D) by `table`: complex64, broadcastable to (B, T, count, H, D/2)."""
        ctx.save_for_backward(table)
        ctx.shape, ctx.dtype, ctx.count = x.shape, x.dtype, count
        ctx.set_materialize_grads(False)  # an unused slice's gradient stays None: zero-filled once, in place
        rotated = apply_rotary(x[:, :, :count], table)  # (B, T, count, H, D)
        return (*rotated.unbind(2), *x[:, :, count:].unbind(2))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: torch.autograd.function.FunctionCtx, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        (table,) = ctx.saved_tensors
        grad = torch.empty(ctx.shape, dtype=ctx.dtype, device=table.device)  # (B, T, n, H, D)
        back = table.conj().resolve_conj()
        for index, slice_grad in enumerate(grads):
            into = grad[:, :, index]
            if slice_grad is None:
                into.zero_()
            elif index >= ctx.count:
                into.copy_(slice_grad)
            elif into.element_size() >= 4 and _pairs_viewable(into):  # float32/64 straight into its slot
                torch.mul(_as_complex(slice_grad), back[:, :, 0], out=_as_complex(into))
            else:  # rotated in float32 (apply_rotary), cast into its slot
                into.copy_(apply_rotary(slice_grad, back[:, :, 0]))
        return grad, None, None


def _pairs_viewable(x: Tensor) -> bool:
    """Whether the pairs of x's last dim can be viewed as complex numbers in place (strides and offset even)."""
    return x.stride(-1) == 1 and all(s % 2 == 0 for s in x.stride()[:-1]) and x.storage_offset() % 2 == 0


def _as_complex(x: Tensor) -> Tensor:
    """The pairs of x (..., D) float32/64 as a complex (..., D/2) view; copied first if its strides do not allow one."""
    return torch.view_as_complex((x if _pairs_viewable(x) else x.contiguous()).unflatten(-1, (-1, 2)))


def rotate_qkv(qkv: Tensor, rotary: Rotation | None, rotate_values: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """q, k and v (B, T, H, D) of a fused projection (B, T, 3, H, D): q and k rotated by position, v if asked.

    Positions enter only through q.k (paper eq. 16); `rotate_values` also rotates v (an ablation). A rotation
    with `rotate_leading` (RoPE, at positions or not) does it in one fused call.
    """
    if rotary is None:
        return qkv.unbind(2)
    count = 3 if rotate_values else 2
    fused = getattr(rotary, "rotate_leading", None)
    if fused is not None:
        return fused(qkv, count)
    rotated = rotary(qkv[:, :, :count]).unbind(2)
    return (*rotated, *qkv[:, :, count:].unbind(2))


def self_extend_sizes(scaling: RopeScaling) -> tuple[int, int]:
    """(window, group) of a self_extend scaling: the neighbour window and the group size (its factor, rounded up)."""
    window = scaling.window if scaling.window is not None else max(1, scaling.original_max_position // 2)
    return window, max(1, math.ceil(scaling.factor))


@dataclass
class GroupedRotation:
    """SelfExtend's positions (Jin et al. 2024, "LLM Maybe LongLM"), for a bidirectional encoder.

    A query at position i sees a key at j at the true distance i - j while |i - j| <= window (neighbour attention);
    beyond, at the grouped distance floor(i/G) - floor(j/G), moved away from 0 by window - window // G so that it
    continues where the window ends: on the left (j < i) the query is rotated at floor(i/G) + shift, on the right the
    key at floor(j/G) + shift (no negative position). Distances then stay below window + (T - window) / G, within
    the trained length for T up to about G times it. Training-free: the weights are untouched.

    Called as a Rotation it rotates at the true positions (what a cache would store); attention reads `logits`.
    """

    rotary: RotaryEmbedding
    positions: Tensor | None  # (B, T), or None for 0..T-1
    window: int
    group: int

    def __call__(self, x: Tensor) -> Tensor:
        return self.rotary(x, self.positions)

    def logits(self, q: Tensor, k: Tensor) -> Tensor:
        """(B, T, H, D) unrotated q and k -> (B, H, T, T) q.k logits (unscaled) under SelfExtend's positions."""
        B, T = q.shape[:2]
        m = self.positions if self.positions is not None else torch.arange(T, device=q.device).expand(B, T)
        grouped, shift = m // self.group, self.window - self.window // self.group

        def product(qm: Tensor, km: Tensor) -> Tensor:  # (B, H, T, T) of q rotated at qm and k at km
            return self.rotary(q, qm).transpose(1, 2) @ self.rotary(k, km).transpose(1, 2).transpose(-1, -2)

        distance = m[:, :, None] - m[:, None, :]  # (B, T, T): query - key
        near, left = distance.abs() <= self.window, distance > 0
        grouped_left = product(grouped + shift, grouped)  # far keys before the query
        grouped_right = product(grouped, grouped + shift)  # far keys after it
        far = torch.where(left[:, None], grouped_left, grouped_right)
        return torch.where(near[:, None], product(m, m), far)


def apply_rotary(x: Tensor, rotations: Tensor, layout: str = "interleaved") -> Tensor:
    """Rotate pairs of the last dim of `x` (B, T, *, D) by `rotations` (T, D/2) or (B, T, D/2) complex; in float32.

    Paper eq. 34 computes x * cos + rotate(x) * sin. For the interleaved layout that is exactly the complex product
    (x_2i + i x_2i+1) * e^{i m theta_i}: one kernel forward and one backward, where the stack-and-flatten form
    used by HF costs about twice as much (measured in scripts/bench_model.py).
    """
    if layout != "interleaved":
        return apply_rotary_real(x, rotations.real, rotations.imag, layout)
    rotations = rotations.view(_broadcastable(rotations, x))
    xf = x.float() if x.element_size() < 4 else x  # bf16/fp16 are rotated in float32 and cast back
    return torch.view_as_real(_as_complex(xf) * rotations).flatten(-2).to(x.dtype)


def apply_rotary_real(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "interleaved") -> Tensor:
    """The rotation of `apply_rotary` in real arithmetic: `cos`, `sin` float32, (T, D/2) or (B, T, D/2).

    Used for the `half` layout and under torch.compile, whose Inductor backend generates no code for complex ops
    (it would fall back to eager kernels); in real form the rotation fuses with its neighbours.
    """
    shape = _broadcastable(cos, x)
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    xf = x.float() if x.element_size() < 4 else x
    if layout == "interleaved":
        x1, x2 = xf.unflatten(-1, (-1, 2)).unbind(-1)
        return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2).to(x.dtype)
    x1, x2 = xf.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def _broadcastable(table: Tensor, x: Tensor) -> tuple[int, ...]:
    """The shape of a (T, D/2) or (B or 1, T, D/2) table that broadcasts over the batch and head dims of x (B, T, *, D).

    A table already shaped to broadcast (e.g. (1, T, 1, D/2)) keeps its shape.
    """
    if table.dim() == 2 or (table.dim() == 3 and table.shape[1] == x.shape[1] and table.shape[0] in (1, x.shape[0])):
        return tuple(table.shape[:-1]) + (1,) * (x.dim() - 3) + (table.shape[-1],)  # (T, 1.., D/2) / (B, T, 1.., D/2)
    return tuple(table.shape)


# ----------------------------------------------------------------------------------------------------------------
# Absolute sinusoidal positions, added to the token embeddings


class SinusoidalPositions(TablesFollowTheModule):
    """Absolute sinusoidal positions (Vaswani et al. sec. 3.5): PE[m, 2i] = sin(m theta_i), PE[m, 2i+1] = cos(...).

    The table is multiplied by `scale` before it is added to the token embeddings; see
    `ModelConfig.resolved_sinusoidal_scale` for why a raw table is an unfair baseline. With `learned=True` the scale
    is a trained scalar (as in Cramming, Geiping & Goldstein 2022).
    """

    tables: ClassVar[tuple[str, ...]] = ("_cache",)

    def __init__(self, dim: int, scale: float, learned: bool = False, base: float = 10000.0) -> None:
        super().__init__()
        self.dim = dim
        self.base = base
        if learned:
            self.scale = nn.Parameter(torch.tensor(float(scale)))
        else:
            self.scale = float(scale)
        self._cache: Tensor | None = None
        self.table(512, torch.device("cpu"))  # filled from the start, as rotary's (a compiled model guards on it)

    def table(self, length: int, device: torch.device) -> Tensor:
        """Unscaled float32 table of shape (length, dim) on `device`."""
        if self._cache is None or self._cache.shape[0] < length or self._cache.device != device:
            angles = rotary_angles(_capacity(length), self.dim, self.base)
            self._cache = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2).float().to(device)
        return self._cache[:length]

    def forward(self, length: int, device: torch.device, dtype: torch.dtype, positions: Tensor | None = None) -> Tensor:
        """Scaled table (length, dim) in `dtype`, or the rows of `positions` (B, T) -> (B, T, dim)."""
        if positions is None:
            return (self.table(length, device) * self.scale).to(dtype)
        return (self.table(int(positions.max()) + 1, device)[positions] * self.scale).to(dtype)


# ----------------------------------------------------------------------------------------------------------------
# Relative position encodings: the paper's other baselines (sec. 2.3) and ALiBi. Each is a function of the distance
# key position - query position, (T, S) when every row has positions 0..T-1, else (B, T, S).


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
    if position_ids is None:
        positions = torch.arange(length, device=device)
        distance, lowest, highest = relative_distances(positions, positions), 1 - length, length - 1  # (T, T)
        if torch.compiler.is_compiling():  # the whole table: a row range that depends on T would guard on T
            lowest, highest = -max_distance, max_distance
        return distance, lowest, highest
    keys = cache.add_positions(position_ids) if cache is not None else position_ids
    return relative_distances(position_ids, keys), -max_distance, max_distance  # (B, T, S)


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


class RelativeBias(nn.Module):
    """A bias of the attention logits that depends on distance only, computed once per forward for every layer.

    `t5_bias`: one learned scalar per bucket (`t5_buckets`) and head, shared by all layers as in T5. `alibi`: the fixed
    -slope_h |key - query| (no parameters), symmetric for an encoder: a token's own position is not special.
    """

    attribute: ClassVar[str] = "relative_bias"
    adds_to_logits: ClassVar[bool] = True

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
        return -self._slopes[device][None, :, None, None] * distance.abs()[:, None].float()  # (1, H, 1, 1) slopes

    def terms(
        self,
        mask: Tensor | None,
        position_ids: Tensor | None,
        cache: PositionRecord | None,
        length: int,
        device: torch.device,
    ) -> PositionTerms:
        """The bias of this forward with the mask folded in: every layer adds it to its logits."""
        distance, _, _ = forward_distances(position_ids, cache, length, device, self.max_distance)
        bias = self(distance)  # (1 or B, H, T, S) float32
        if mask is not None:
            bias = bias.masked_fill(~mask, float("-inf"))
        if torch.is_autocast_enabled(bias.device.type):  # once here, not in every layer: SDPA takes the query's dtype
            bias = bias.to(torch.get_autocast_dtype(bias.device.type))
        return PositionTerms(bias)


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


class ShawEmbeddings(nn.Module):
    """Shaw et al.'s relative position representations: learned embeddings of the clipped distance.

        e_ij = q_i . (k_j + a^K_ij) / sqrt(d),   z_i = sum_j softmax(e)_ij (v_j + a^V_ij)    (Shaw et al. eq. 3-5)

    a_ij = w_clip(j - i, k): 2k + 1 embeddings of the head width, shared by the heads, one set per layer (or one for
    all layers with `shaw_shared_layers`).
    """

    attribute: ClassVar[str] = "shaw"
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
# The entry point


def attention_positions(config: ModelConfig) -> AttentionPositions | None:
    """The module of `config`'s encoding that acts inside attention, or None.

    None for the absolute encodings (`sinusoidal`, `learned`), which `layers.Embeddings` adds to the token
    embeddings, and for `none`.
    """
    if config.position_encoding == "rotary":
        return RotaryEmbedding(config.rotary_size, config.rotary_base, config.rotary_layout, config.rope_scaling)
    if config.position_encoding in ("t5_bias", "alibi"):
        return RelativeBias(config)
    if config.position_encoding == "shaw":
        return ShawEmbeddings(config)
    return None
