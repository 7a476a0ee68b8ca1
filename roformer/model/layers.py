"""The layers of the encoder, read top to bottom.

Activations, position encodings, norms, embeddings, attention (softmax, linear) and the post-LN block. Of the
position encodings, `rotary` rotates q and k, `sinusoidal` and `learned` (a table in `Embeddings`) are added to the
token embeddings, `shaw` adds learned embeddings of the distance to the keys (and values), `t5_bias` and `alibi` add
a bias to the attention logits, and `none` has none. The models that stack them are in `roformer.model.model`.

References:
    Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding", arXiv 2104.09864 ("paper").
    Devlin et al. 2019, BERT; Vaswani et al. 2017, "Attention is all you need" (sinusoidal positions).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from roformer.model.config import ModelConfig, RopeScaling

# ----------------------------------------------------------------------------------------------------------------
# Activations: every parameter-free name HF BERT/RoFormer configs use (config.ACTIVATION_NAMES), written out here.

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu_tanh(x: Tensor) -> Tensor:
    # "gelu_new": Google BERT / OpenAI GPT tanh approximation.
    return 0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * torch.pow(x, 3.0))))


def _laplace(x: Tensor, mu: float = 0.707107, sigma: float = 0.282095) -> Tensor:
    return 0.5 * (1.0 + torch.erf((x - mu) / (sigma * math.sqrt(2.0))))


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,
    "gelu_python": lambda x: x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0))),
    "gelu_new": _gelu_tanh,
    "gelu_accurate": _gelu_tanh,
    "gelu_fast": lambda x: 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x))),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_python_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_10": lambda x: torch.clamp(F.gelu(x), -10.0, 10.0),
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "relu": F.relu,
    "relu2": lambda x: torch.square(F.relu(x)),
    "relu6": F.relu6,
    "leaky_relu": F.leaky_relu,
    "silu": F.silu,
    "swish": F.silu,
    "mish": F.mish,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "hardswish": F.hardswish,
    "laplace": _laplace,
    "sqrtsoftplus": lambda x: torch.sqrt(F.softplus(x)),
    "linear": lambda x: x,
}


# ----------------------------------------------------------------------------------------------------------------
# Position encodings


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
    if scaling is None:
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


def _capacity(length: int) -> int:
    """Cache size for a request of `length` positions: the next power of two, so growth happens rarely."""
    return max(64, 1 << (length - 1).bit_length())


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoPE, paper sec. 3.2-3.4): rotates pairs of a head vector by position.

    Pair i of the vector at position m is rotated by angle m * theta_i. In the `interleaved` layout (paper, HF
    RoFormer) pair i is (x_2i, x_2i+1); in the `half` layout (GPT-NeoX, LLaMA) it is (x_i, x_i+d/2). With `dim`
    smaller than the head, only the first `dim` features are rotated (partial rotary) and the rest pass through.
    The table e^{i m theta_i} (times yarn's magnitude) is kept in complex64 (float32 cos/sin, never the model
    dtype), grown on demand, so there is no length limit.
    """

    def __init__(
        self, dim: int, base: float = 10000.0, layout: str = "interleaved", scaling: RopeScaling | None = None
    ) -> None:
        super().__init__()
        self.dim = dim
        self.base = base
        self.layout = layout
        self.scaling = scaling
        self.magnitude = rotary_frequencies(dim, base, scaling)[1]
        # Plain attributes, not buffers: `model.to(bfloat16)` must not cast the tables. The real tables start filled
        # (512 positions, grown on demand): torch.compile guards on them, and a first call that created them would
        # recompile the model once more.
        self._cache: Tensor | None = None
        self._real_cache: tuple[Tensor, Tensor] | None = None
        self.cos_sin(512, torch.device("cpu"))

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
        table = self.rotations(length, x.device)
        return apply_rotary(x, table if positions is None else table[positions], self.layout)


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
    if xf.stride(-1) != 1:
        xf = xf.contiguous()
    rotated = torch.view_as_real(torch.view_as_complex(xf.unflatten(-1, (-1, 2))) * rotations)
    return rotated.flatten(-2).to(x.dtype)


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
    """The shape of a (T, D/2) or (B, T, D/2) table that broadcasts over the batch and head dims of x (B, T, *, D).

    A table already shaped to broadcast (e.g. (1, T, 1, D/2)) keeps its shape.
    """
    if table.dim() == 2 or (table.dim() == 3 and tuple(table.shape[:2]) == tuple(x.shape[:2])):
        return tuple(table.shape[:-1]) + (1,) * (x.dim() - 3) + (table.shape[-1],)  # (T, 1.., D/2) / (B, T, 1.., D/2)
    return tuple(table.shape)


class SinusoidalPositions(nn.Module):
    """Absolute sinusoidal positions (Vaswani et al. sec. 3.5): PE[m, 2i] = sin(m theta_i), PE[m, 2i+1] = cos(...).

    The table is multiplied by `scale` before it is added to the token embeddings; see
    `ModelConfig.resolved_sinusoidal_scale` for why a raw table is an unfair baseline. With `learned=True` the scale
    is a trained scalar (as in Cramming, Geiping & Goldstein 2022).
    """

    def __init__(self, dim: int, scale: float, learned: bool = False, base: float = 10000.0) -> None:
        super().__init__()
        self.dim = dim
        self.base = base
        if learned:
            self.scale = nn.Parameter(torch.tensor(float(scale)))
        else:
            self.scale = float(scale)
        self._cache: Tensor | None = None

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


# ----------------------------------------------------------------------------------------------------------------
# Encoder


class LayerNorm(nn.LayerNorm):
    """LayerNorm computed in float32 under autocast on every device.

    CUDA autocast runs layer_norm in float32 and returns float32; CPU autocast would run it in bfloat16 when its
    input is bfloat16 (the residual stream after a bf16 matmul), losing the precision the mean and variance need.
    Outside autocast a bf16 model (`model.to(torch.bfloat16)`) keeps its dtype.
    """

    def forward(self, x: Tensor) -> Tensor:
        if not torch.is_autocast_enabled(x.device.type):
            return super().forward(x)
        with torch.autocast(x.device.type, enabled=False):
            return F.layer_norm(x.float(), self.normalized_shape, self.weight.float(), self.bias.float(), self.eps)


class RMSNorm(nn.Module):
    """RoFormerV2's parameter-free norm, x / sqrt(mean(x^2) + eps) over the last dim: no scale, no shift, no mean.

    Computed in float32 like `LayerNorm`: under autocast it returns float32, outside it the input dtype.
    """

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        y = F.rms_norm(x.float(), (self.dim,), eps=self.eps)
        return y if torch.is_autocast_enabled(x.device.type) else y.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


def make_norm(config: ModelConfig, dim: int) -> nn.Module:
    """The model's norm over `dim` features: LayerNorm (BERT, RoFormer) or the parameter-free RMSNorm (V2)."""
    if config.norm_type == "rms_norm":
        return RMSNorm(dim, config.layer_norm_eps)
    return LayerNorm(dim, eps=config.layer_norm_eps)


class Embeddings(nn.Module):
    """Token + token-type (+ absolute position) embeddings, LayerNorm, dropout, optional projection to hidden."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        dim = config.embedding_dim
        self.config = config
        self.word = nn.Embedding(config.vocab_size, dim, padding_idx=config.pad_token_id)
        self.token_type = nn.Embedding(config.type_vocab_size, dim)
        self.position = (
            nn.Embedding(config.max_position_embeddings, dim) if config.position_encoding == "learned" else None
        )
        self.sinusoidal = (
            SinusoidalPositions(dim, config.resolved_sinusoidal_scale, config.sinusoidal_scale_learned)
            if config.position_encoding == "sinusoidal"
            else None
        )
        self.norm = make_norm(config, dim)
        self.dropout = nn.Dropout(config.hidden_dropout)
        self.project = nn.Linear(dim, config.hidden_size) if dim != config.hidden_size else None

    def forward(
        self, input_ids: Tensor, token_type_ids: Tensor | None = None, position_ids: Tensor | None = None
    ) -> Tensor:
        """(B, T) ids -> (B, T, hidden_size); absolute positions 0..T-1, or `position_ids` (B, T)."""
        T = input_ids.shape[1] if position_ids is None else int(position_ids.max()) + 1
        x = self.word(input_ids)  # (B, T, E)
        if token_type_ids is None:
            x = x + self.token_type.weight[0]  # same value and gradient as looking up type 0 everywhere
        else:
            x = x + self.token_type(token_type_ids)
        if self.position is not None:
            if T > self.position.num_embeddings:
                raise ValueError(
                    f"sequence length {T} exceeds max_position_embeddings={self.position.num_embeddings} of the "
                    "learned position table; rotary and sinusoidal positions have no length limit"
                )
            x = x + (self.position.weight[:T] if position_ids is None else self.position(position_ids))
        elif self.sinusoidal is not None:
            x = x + self.sinusoidal(T, x.device, x.dtype, position_ids)
        x = self.dropout(self.norm(x))
        if self.project is not None:
            x = self.project(x)  # (B, T, C)
        return x


Rotation = Callable[[Tensor], Tensor]  # rotates (B, T, ..., D) by position: RotaryEmbedding, or it at position_ids

LINEAR_ATTENTION_EPS = 1e-6  # as Katharopoulos et al.'s reference implementation: a denominator that underflows


def linear_attention(q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, rotary: Rotation | None) -> Tensor:
    """Bidirectional linear attention with RoPE (paper sec. 3.3, eq. 19), O(T) memory: no T x T matrix.

        out_m = sum_n (R_m phi(q_m))^T (R_n phi(k_n)) v_n / sum_n phi(q_m)^T phi(k_n),   phi = elu + 1

    phi is the non-negative feature map of Katharopoulos et al. 2020 (the paper's reference). The rotation enters the
    numerator only: rotated features can have negative inner products, and a denominator that may cross zero would
    make the weights unbounded (paper, below eq. 19), so it keeps the unrotated, positive ones. Sums run in float32.

    Args:
        q: (B, T, H, D) queries.
        k: (B, T, H, D) keys.
        v: (B, T, H, D) values.
        keep: (B, T) bool, True for real tokens (padded keys enter neither sum), or None.
        rotary: The rotation, or None for the other position encodings (plain linear attention).

    Returns:
        (B, T, H, D) in the input dtype.
    """
    with torch.autocast(q.device.type, enabled=False):
        phi_q, phi_k = F.elu(q.float()) + 1.0, F.elu(k.float()) + 1.0  # (B, T, H, D), > 0
        if keep is not None:
            phi_k = phi_k * keep[:, :, None, None]
        rot_q, rot_k = rotary(torch.stack((phi_q, phi_k), dim=2)).unbind(2) if rotary is not None else (phi_q, phi_k)
        kv = torch.einsum("bnhd,bnhe->bhde", rot_k, v.float())  # (B, H, D, D): sum_n R_n phi(k_n) v_n^T
        numerator = torch.einsum("bmhd,bhde->bmhe", rot_q, kv)  # (B, T, H, D)
        denominator = torch.einsum("bmhd,bhd->bmh", phi_q, phi_k.sum(dim=1))  # (B, T, H)
        return (numerator / (denominator[..., None] + LINEAR_ATTENTION_EPS)).to(q.dtype)


KVUpdate = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]  # (B, H, T, D) new k, v -> all k, v (B, H, S, D)


class KVCache:
    """A decoder's memory: the keys and values of every position seen so far, in every layer.

    Generation then computes q, k and v for the new tokens only. Keys are stored rotated (a key's rotation depends on
    its own position alone), so nothing is recomputed. Each layer's tensors are (B, H, capacity, D), allocated at
    the first write and doubled when full; `length` slots are filled. Beside them, per slot: whether it is a real
    token (the padding mask) and its attention rank (see `attention_ranks`), which later queries are masked by.
    """

    def __init__(self, capacity: int = 0) -> None:
        self.capacity = capacity
        self.length = 0
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []
        self.keep: Tensor | None = None  # (B, capacity) bool: a real token
        self.ranks: Tensor | None = None  # (B, capacity) long: attention rank
        self.positions: Tensor | None = None  # (B, capacity) long: position (relative encodings read it)

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
        """Write layer `layer`'s k, v (B, H, T, D) of the slots just added; returns those of all slots (B, H, S, D)."""
        B, H, T, D = k.shape
        if layer == len(self.keys):
            self.keys.append(torch.empty(0, device=k.device, dtype=k.dtype))
            self.values.append(torch.empty(0, device=k.device, dtype=k.dtype))
        if self.keys[layer].shape[-2:-1] != (self.capacity,):
            self.keys[layer] = _grown(self.keys[layer], (B, H, self.capacity, D), k.dtype, k.device, dim=2)
            self.values[layer] = _grown(self.values[layer], (B, H, self.capacity, D), v.dtype, v.device, dim=2)
        start = self.length - T
        self.keys[layer][:, :, start : self.length] = k
        self.values[layer][:, :, start : self.length] = v
        return self.keys[layer][:, :, : self.length], self.values[layer][:, :, : self.length]


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


class SelfAttention(nn.Module):
    """Multi-head self-attention with RoPE on q and k (and v if asked): softmax through SDPA, or linear (eq. 19)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.linear = config.attention == "linear"
        self.num_heads = config.num_heads
        self.head_size = config.head_size
        self.rotary_value = config.rotary_value
        self.dropout = config.attention_dropout
        # One fused projection: a single GEMM, and rotating q and k together is one kernel.
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.use_bias)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size, bias=config.use_bias)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None,
        rotary: Rotation | None,
        kv: KVUpdate | None = None,
        causal: bool = False,
        shaw: ShawTerms | None = None,
    ) -> Tensor:
        """(B, T, C) -> (B, T, C).

        Args:
            x: The new tokens' hidden states.
            mask: Over the S keys (cached ones first): (B, 1, 1 or T, S) bool, True = attend; or a float bias
                (1 or B, H, T, S) added to the logits, -inf where not attended (T5 bias, ALiBi); or None.
            rotary: Rotates (B, T, ..., D) by the new tokens' positions, or None.
            kv: Stores the new keys and values in a `KVCache` and returns all of them, or None (no cache).
            causal: Attend to earlier positions only, by SDPA's own causal path (no cache, no mask).
            shaw: This layer's relative embeddings (Shaw et al.), or None.
        """
        B, T, C = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.num_heads, self.head_size)  # (B, T, 3, H, D)
        if self.linear:  # RoPE goes on the feature-mapped q and k, inside
            keep = None if mask is None else mask[:, 0, 0, :]  # (B, T)
            y = linear_attention(*qkv.unbind(2), keep, rotary)  # (B, T, H, D)
            return self.proj(y.reshape(B, T, C))
        if rotary is None:
            q, k, v = qkv.unbind(2)
        elif self.rotary_value:
            q, k, v = rotary(qkv).unbind(2)
        else:
            q, k = rotary(qkv[:, :, :2]).unbind(2)  # positions enter only through q.k (paper eq. 16)
            v = qkv[:, :, 2]
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        if kv is not None:
            k, v = kv(k, v)  # (B, H, S, D)
        dropout = self.dropout if self.training else 0.0
        if shaw is not None:
            y = shaw_attention(q, k, v, mask, shaw, dropout)
        else:
            if mask is not None and mask.is_floating_point() and mask.dtype != q.dtype:
                mask = mask.to(q.dtype)  # SDPA takes a float mask in the query's dtype (autocast)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))  # y: (B, H, T, D)


def shaw_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, shaw: ShawTerms, dropout: float) -> Tensor:
    """Softmax attention with Shaw et al.'s relative terms (eq. 3-5). (B, H, T, D) q, (B, H, S, D) k and v.

    Keys only: q . a^K enters as an additive float mask, so SDPA still does the rest (its flash kernel cannot take
    one; the memory-efficient one can). With values the probabilities themselves are needed, so it is written out.
    """
    bias = shaw.logits(q) / math.sqrt(q.shape[-1])  # (B, H, T, S) float32, scaled like q . k
    if mask is not None:
        bias = bias.masked_fill(~mask, float("-inf"))
    if shaw.values is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), dropout_p=dropout)
    logits = (q @ k.transpose(-1, -2)).float() / math.sqrt(q.shape[-1]) + bias  # (B, H, T, S)
    # a query with no key at all (a row of padding only) gets 0, as SDPA gives it, not NaN (nor NaN gradients)
    empty = logits.amax(dim=-1, keepdim=True) == float("-inf")  # (B, H, T, 1)
    probs = logits.masked_fill(empty, 0.0).softmax(dim=-1).masked_fill(empty, 0.0)  # float32
    probs = F.dropout(probs, dropout, training=dropout > 0)
    # summed per distance in float32: in bf16 a clipped distance's total over 512 keys is off by ~3%
    return probs.to(q.dtype) @ v + shaw.value_terms(probs).to(q.dtype)


class Block(nn.Module):
    """Post-LN transformer block (BERT): x = LN(x + Attn(x)); x = LN(x + FFN(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attn = SelfAttention(config)
        self.attn_norm = make_norm(config, config.hidden_size)
        self.ffn_in = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.use_bias)
        self.ffn_out = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.use_bias)
        self.ffn_norm = make_norm(config, config.hidden_size)
        self.act = ACTIVATIONS[config.hidden_act]
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None,
        rotary: Rotation | None,
        kv: KVUpdate | None = None,
        causal: bool = False,
        shaw: ShawTerms | None = None,
    ) -> Tensor:
        x = self.attn_norm(x + self.dropout(self.attn(x, mask, rotary, kv, causal, shaw)))
        return self.ffn_norm(x + self.dropout(self.ffn_out(self.act(self.ffn_in(x)))))
