"""Every position encoding, by name: the entry point the backbone uses, and the absolute sinusoidal table.

`rotary` (RoFormer, `roformer.model.rotary`) rotates q and k by position, optionally scaled beyond the trained length
(SelfExtend among the scalings); `sinusoidal` (here) and `learned` (a plain table in `layers.Embeddings`) are added to
the token embeddings; `shaw`, `t5_bias` and `alibi` (`roformer.model.relative`) act on the attention logits; `none`
has none.

The encodings that act inside attention share one entry point, which is all the backbone knows of them:
`attention_positions(config)` builds the module (registered on the backbone under its `attribute`), and once per
forward its `terms(...)` returns the `PositionTerms` every layer's attention reads; its `kernel` names the attention
kernel those terms need, which the forward plan reads (`roformer.model.terms.AttentionPositions`). Adding such an
encoding (xPos, FIRE, ...) is a config value, a class with `attribute`, `kernel`, `adds_to_logits` and `terms` (in
its own module beside `rotary` and `relative`, or there), and a line in `attention_positions`; a kernel of its own,
if none of the table's fits, is one entry of `roformer.model.attention.ATTENTION_KERNELS`.

References:
    Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding", arXiv 2104.09864 ("paper").
    Vaswani et al. 2017, "Attention is all you need" (sinusoidal positions); Shaw et al. 2018; Raffel et al. 2020
    (T5); Press et al. 2022 (ALiBi).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from roformer.model.config import ModelConfig
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
    "PositionTerms",
    "RelativeBias",
    "RotaryEmbedding",
    "ShawEmbeddings",
    "ShawTerms",
    "SinusoidalPositions",
    "alibi_slopes",
    "apply_rotary",
    "attention_positions",
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
        """Scaled table (length, dim) in `dtype`, or the rows of `positions` (B, T) -> (B, T, dim)."""
        if positions is None:
            return (self.table(length, device) * self.scale).to(dtype)
        return (self.table(int(positions.max()) + 1, device)[positions] * self.scale).to(dtype)


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
