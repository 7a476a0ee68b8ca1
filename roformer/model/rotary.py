"""Rotary position embedding (RoPE), the paper's encoding: its angles and context scaling, the rotation, the module.

`rotary_angles` / `rotary_frequencies` give the angles (paper eq. 15), scaled beyond the trained length by position
interpolation, NTK-aware scaling or YaRN; `apply_rotary` rotates (eq. 34, as a complex product) and `RotateLeading`
rotates q and k of the fused projection with a backward that writes its gradient once. `RotaryEmbedding` is the
module the backbone registers (`roformer.model.terms.AttentionPositions`); SelfExtend (`rope_scaling: self_extend`)
is its `GroupedRotation`, which needs the `grouped` kernel.

References:
    Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding", arXiv 2104.09864 ("paper").
    Chen et al. 2023 (position interpolation); bloc97 2023 (NTK-aware scaling); Peng et al. 2023 (YaRN); Jin et al.
    2024 (SelfExtend).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from roformer.errors import ConfigError
from roformer.model.config import EncodingSpec, ModelConfig, RopeScaling
from roformer.model.terms import PositionRecord, PositionTerms, Rotation

# ----------------------------------------------------------------------------------------------------------------
# Angles and their context scaling


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


# ----------------------------------------------------------------------------------------------------------------
# The rotation


def apply_rotary(x: Tensor, rotations: Tensor, layout: str = "interleaved") -> Tensor:
    """Rotate pairs of the last dim of `x` (B, T, *, D) by `rotations` (T, D/2) or (B, T, D/2) complex; in float32.

    Paper eq. 34 computes x * cos + rotate(x) * sin. For the interleaved layout that is exactly the complex product
    (x_2i + i x_2i+1) * e^{i m theta_i}: one kernel forward and one backward, where the stack-and-flatten form
    used by HF costs about twice as much (measured in scripts/bench/bench_model.py).
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


# ----------------------------------------------------------------------------------------------------------------
# The module


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


def table_capacity(length: int) -> int:
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

    @property
    def kernel(self) -> str:
        """`sdpa` (q and k rotated, then any softmax kernel), or `grouped` for SelfExtend's logits."""
        return "grouped" if self.groups_positions else "sdpa"

    def frequencies(self) -> Tensor:
        """float64 theta_i (dim // 2,) on the CPU: the paper's, or as scaled.

        A variant of RoPE that rotates by other frequencies (p-RoPE) overrides this alone.
        """
        return rotary_frequencies(self.dim, self.base, self.scaling)[0]

    def angles(self, num_positions: int) -> Tensor:
        """float64 angles m * theta_i, (num_positions, dim // 2) on the CPU (as `rotary_angles`)."""
        return torch.outer(torch.arange(num_positions, dtype=torch.float64), self.frequencies())  # (T, dim/2)

    def rotations(self, length: int, device: torch.device) -> Tensor:
        """complex64 table magnitude * e^{i m theta_i} of shape (length, dim // 2) on `device`."""
        if self._cache is None or self._cache.shape[0] < length or self._cache.device != device:
            angles = self.angles(table_capacity(length))
            table = torch.polar(torch.full_like(angles, self.magnitude), angles)
            self._cache = table.to(torch.complex64).to(device)
        return self._cache[:length]

    def cos_sin(self, length: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """float32 cos and sin tables (times the magnitude), each (length, dim // 2) (real copies, no complex views)."""
        cached = self._real_cache
        if cached is None or cached[0].shape[0] < length or cached[0].device != device:
            angles = self.angles(table_capacity(length))  # float64
            cos, sin = angles.cos() * self.magnitude, angles.sin() * self.magnitude
            self._real_cache = cached = (cos.float().to(device), sin.float().to(device))
        return cached[0][:length], cached[1][:length]

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """Rotate `x` of shape (B, T, ..., D) by position; returns the input dtype.

        The position of x[b, t] is `positions[b, t]` (B, T) when given (left padding, packed documents), else t.
        """
        if self.dim < x.shape[-1]:  # partial rotary: the remaining features carry no position
            return torch.cat((self(x[..., : self.dim], positions), x[..., self.dim :]), dim=-1)
        if positions is not None and positions.is_floating_point():  # real positions: computed, not looked up
            if torch.compiler.is_compiling():  # real arithmetic, which Inductor fuses (see apply_rotary_real)
                angles = self.angles_at(positions)  # (B, T, D/2) float64
                cos, sin = (angles.cos() * self.magnitude).float(), (angles.sin() * self.magnitude).float()
                return apply_rotary_real(x, cos, sin, self.layout)
            return apply_rotary(x, self.rotations_at(positions), self.layout)
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

        Integer positions are rows of the table, which reads the longest position back from the device (a host
        sync): once per forward when `AtPositions` keeps it. Real positions (random float positions, position
        interpolation as positions / factor) are rotated by m * theta_i computed in float64, as the table is.
        """
        if positions.numel() == 0:
            return torch.empty(*positions.shape, self.dim // 2, dtype=torch.complex64, device=positions.device)
        if positions.is_floating_point():
            angles = self.angles_at(positions)  # (B, T, dim/2)
            return torch.polar(torch.full_like(angles, self.magnitude), angles).to(torch.complex64)
        return self.rotations(int(positions.max()) + 1, positions.device)[positions]

    def angles_at(self, positions: Tensor) -> Tensor:
        """float64 angles m * theta_i at real `positions` (B, T): (B, T, dim // 2), on their device."""
        return positions.double()[..., None] * self.frequencies().to(positions.device)

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


# ----------------------------------------------------------------------------------------------------------------
# SelfExtend: grouped positions beyond a neighbour window


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


# ----------------------------------------------------------------------------------------------------------------
# The declaration


def check_rotary(config: ModelConfig) -> None:
    """What RoPE cannot compute: an odd head, partial rotary out of range, the context scalings that do not apply.

    Raises:
        ConfigError: naming the field.
    """
    if config.head_size % 2:
        raise ConfigError(f"rotary needs an even head size, got hidden_size/num_heads = {config.head_size}")
    size, scaling = config.rotary_dim, config.rope_scaling
    if size is not None and not (2 <= size <= config.head_size and size % 2 == 0):
        raise ConfigError(f"rotary_dim must be even and in [2, head size {config.head_size}], got {size}")
    if config.attention == "linear" and config.rotary_value:
        raise ConfigError("attention: linear rotates the feature-mapped q and k (eq. 19): rotary_value must be off")
    if scaling is None:
        return
    if scaling.type == "ntk" and config.rotary_size <= 2:
        raise ConfigError("rope_scaling ntk needs more than 2 rotated features (base * factor^(d / (d - 2)))")
    if scaling.type == "yarn" and config.attention == "linear":
        # YaRN's magnitude lives in the rotation tables, which eq. 19's numerator uses and its denominator does
        # not: the output would be scaled by attention_factor^2 (+63% at factor 16)
        raise ConfigError("rope_scaling yarn cannot be used with attention: linear (use linear or ntk scaling)")
    if scaling.type == "self_extend" and (config.attention == "linear" or config.rotary_value):
        raise ConfigError("rope_scaling self_extend groups q.k distances: softmax attention, no rotary_value")
    if scaling.type == "yarn" and config.rotary_value:
        raise ConfigError("rope_scaling yarn scales the rotated vectors: with rotary_value it would scale v too")


def rotary_embedding(config: ModelConfig) -> RotaryEmbedding:
    """The rotary module of `config`: its rotated features, base, layout and context scaling."""
    return RotaryEmbedding(config.rotary_size, config.rotary_base, config.rotary_layout, config.rope_scaling)


ENCODINGS = (
    EncodingSpec(
        name="rotary",
        summary="RoPE: q and k rotated by position, pair i of a head by m theta_i (the paper's eq. 34)",
        acts="attention",
        relative=True,
        hf="roformer",
        kernel="sdpa",
        fields=("rotary_value", "rotary_dim", "rope_scaling"),
        rotates=True,
        build=rotary_embedding,
        check=check_rotary,
        real_positions=True,
        paper="Su et al. 2021",
    ),
)
