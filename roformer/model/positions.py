"""The absolute position encodings, and the entry points that build the module of a config's encoding.

`sinusoidal` (Vaswani et al.) and `learned` (BERT's table) are added to the token embeddings (`layers.Embeddings`
registers the module `embedding_positions(config)` builds); `none` has no positions. The encodings that act inside
attention are modules of their own: `rotary` (RoFormer, `roformer.model.rotary`), `shaw`, `t5_bias` and `alibi`
(`roformer.model.relative`), and any module that declares `ENCODINGS`; `attention_positions(config)` builds the
one a config names, which is all the backbone knows of them. Every encoding is declared by its module
(`roformer.model.config.EncodingSpec`, the table in docs/baselines.md); a new one is a new module and no edit here
(docs/adding-a-position-encoding.md).

References:
    Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding", arXiv 2104.09864 ("paper").
    Vaswani et al. 2017, "Attention is all you need" (sinusoidal positions); Devlin et al. 2019 (BERT's learned
    table).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from roformer.errors import ConfigError
from roformer.model.config import EncodingSpec, ModelConfig
from roformer.model.relative import RelativeBias, ShawEmbeddings, alibi_slopes, relative_distances, t5_buckets
from roformer.model.rotary import (
    GroupedRotation,
    RotaryEmbedding,
    TablesFollowTheModule,
    apply_rotary,
    rotary_angles,
    rotary_frequencies,
    table_capacity,
)
from roformer.model.terms import AttentionPositions, PositionTerms, ShawTerms

# The encodings' public names, importable from here as from their own modules (one import for every encoding).
__all__ = [
    "AttentionPositions",
    "GroupedRotation",
    "LearnedPositions",
    "PositionTerms",
    "RelativeBias",
    "RotaryEmbedding",
    "ShawEmbeddings",
    "ShawTerms",
    "SinusoidalPositions",
    "alibi_slopes",
    "apply_rotary",
    "attention_positions",
    "embedding_positions",
    "relative_distances",
    "rotary_angles",
    "rotary_frequencies",
    "t5_buckets",
]


# ----------------------------------------------------------------------------------------------------------------
# Absolute sinusoidal positions, added to the token embeddings


class SinusoidalPositions(TablesFollowTheModule):
    """Absolute sinusoidal positions (Vaswani et al. sec. 3.5): PE[m, 2i] = sin(m theta_i), PE[m, 2i+1] = cos(...).

    The table is multiplied by `scale` before it is added to the token embeddings; see
    `ModelConfig.resolved_sinusoidal_scale` for why a raw table is an unfair baseline. With `learned=True` the scale
    is a trained scalar (as in Cramming, Geiping & Goldstein 2022).
    """

    attribute: ClassVar[str] = "sinusoidal"  # under `embeddings`: its learned scale's checkpoint key
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
            angles = rotary_angles(table_capacity(length), self.dim, self.base)
            self._cache = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2).float().to(device)
        return self._cache[:length]

    def forward(self, length: int, device: torch.device, dtype: torch.dtype, positions: Tensor | None = None) -> Tensor:
        """Scaled table (length, dim) in `dtype`, or the rows of `positions` (B, T) -> (B, T, dim).

        Real positions (random float positions, position interpolation as positions / factor) are computed from
        sin(m theta_i) and cos(m theta_i) in float64, as the table is, not looked up.
        """
        if positions is None:
            return (self.table(length, device) * self.scale).to(dtype)
        if positions.is_floating_point():
            inv_freq = rotary_frequencies(self.dim, self.base)[0].to(device)  # (dim/2,)
            angles = positions.to(device, torch.float64)[..., None] * inv_freq  # (B, T, dim/2)
            table = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2).float()  # (B, T, dim)
            return (table * self.scale).to(dtype)
        return (self.table(int(positions.max()) + 1, device)[positions] * self.scale).to(dtype)


class LearnedPositions(nn.Embedding):
    """BERT's learned absolute positions: a table of `max_position_embeddings` rows, one per position."""

    attribute: ClassVar[str] = "position"  # under `embeddings`: `embeddings.position.weight`, as always

    def forward(self, length: int, device: torch.device, dtype: torch.dtype, positions: Tensor | None = None) -> Tensor:
        """The rows of positions 0..length-1 (length, dim), or of `positions` (B, T) -> (B, T, dim).

        In the table's own dtype (`dtype` is the sinusoidal table's, which is computed).

        Raises:
            ValueError: a position beyond the table.
        """
        if length > self.num_embeddings:
            raise ValueError(
                f"sequence length {length} exceeds max_position_embeddings={self.num_embeddings} of the learned "
                "position table; rotary and sinusoidal positions have no length limit"
            )
        return self.weight[:length] if positions is None else super().forward(positions)


# ----------------------------------------------------------------------------------------------------------------
# The entry points


def attention_positions(config: ModelConfig) -> AttentionPositions | None:
    """The module of `config`'s encoding that acts inside attention (its declaration builds it), or None.

    None for the encodings that act on the token embeddings (`embedding_positions`) or on nothing.
    """
    spec = config.encoding
    return spec.build(config) if spec.acts == "attention" else None


def embedding_positions(config: ModelConfig) -> nn.Module | None:
    """The module of `config`'s encoding that `layers.Embeddings` adds to the token embeddings, or None.

    Called as module(length, device, dtype, positions) -> (length, E), or (B, T, E) at `positions` (B, T).
    """
    spec = config.encoding
    return spec.build(config) if spec.acts == "embeddings" else None


# ----------------------------------------------------------------------------------------------------------------
# The declarations


def check_sinusoidal(config: ModelConfig) -> None:
    """The table pairs sin and cos: an even embedding width.

    Raises:
        ConfigError: an odd one.
    """
    if config.embedding_dim % 2:
        raise ConfigError(f"sinusoidal positions need an even embedding size, got {config.embedding_dim}")


def sinusoidal_positions(config: ModelConfig) -> SinusoidalPositions:
    """The sinusoidal table of `config`, at its scale (`resolved_sinusoidal_scale`), learned or fixed."""
    return SinusoidalPositions(config.embedding_dim, config.resolved_sinusoidal_scale, config.sinusoidal_scale_learned)


def learned_positions(config: ModelConfig) -> LearnedPositions:
    """The learned table of `config`: `max_position_embeddings` rows of the embedding width."""
    return LearnedPositions(config.max_position_embeddings, config.embedding_dim)


ENCODINGS = (
    EncodingSpec(
        name="sinusoidal",
        summary="a fixed sin/cos table of the absolute position added to the token embeddings, scaled (BERT arm)",
        acts="embeddings",
        relative=False,
        hf="bert",
        build=sinusoidal_positions,
        check=check_sinusoidal,
        real_positions=True,
        paper="Vaswani et al. 2017",
    ),
    EncodingSpec(
        name="learned",
        summary="a learned table of absolute positions added to the token embeddings (BERT)",
        acts="embeddings",
        relative=False,
        hf="bert",
        limited=True,
        build=learned_positions,
        paper="Devlin et al. 2019",
    ),
    EncodingSpec(
        name="none",
        summary="no positions: a bag of tokens (an ablation)",
        acts="nothing",
        relative=False,
        hf="bert",
    ),
)
