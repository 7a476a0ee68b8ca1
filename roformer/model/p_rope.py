"""p-RoPE (Barbero et al. 2025): rotary positions whose lowest-frequency fraction of pairs is left unrotated.

Barbero et al. ("Round and Round We Go! What makes Rotary Positional Encodings useful?", ICLR 2025) find that
trained models use RoPE's lowest frequencies as almost position-free "semantic" channels, whose rotation over long
contexts only adds noise, and remove them: p-RoPE keeps the fraction p of the highest frequencies, theta_i =
base^(-2i/d) for the first int(p d / 2) pairs as in RoPE, and sets theta_i = 0 for the rest, which are then never
rotated (their best Gemma 2B model: p = 0.75). Here the setting is the fraction left unrotated, 1 - p
(`position_settings: {p_rope: {unrotated_fraction: 0.25}}`): at 0 it is RoPE exactly, at 1 no position at all.

Everything else is RoPE's (`roformer.model.rotary.RotaryEmbedding`): the interleaved or half layout, float32 tables
grown on demand, the fused rotation of q and k, the KV cache, linear attention's rotated numerator. Only the
frequencies differ. HF has no such model: `to_hf` refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from torch import Tensor

from roformer.config import check_types
from roformer.errors import ConfigError
from roformer.model.config import EncodingSpec, ModelConfig
from roformer.model.rotary import RotaryEmbedding


@dataclass
class PRopeSettings:
    """`position_settings.p_rope`: what p-RoPE leaves unrotated.

    Attributes:
        unrotated_fraction: The fraction of a head's d/2 pairs, lowest frequencies first, that is not rotated
            (Barbero et al.'s 1 - p): int((1 - fraction) d / 2) pairs keep RoPE's frequencies. 0.25 as their best
            model (p = 0.75); 0 is RoPE.
    """

    unrotated_fraction: float = 0.25

    def __post_init__(self) -> None:
        check_types(self)
        if not 0.0 <= self.unrotated_fraction <= 1.0:
            raise ConfigError(f"unrotated_fraction must be in [0, 1], got {self.unrotated_fraction}")


def rotated_pairs(dim: int, unrotated_fraction: float) -> int:
    """How many of the dim/2 pairs keep their frequency: int(p * dim / 2) with p = 1 - the unrotated fraction.

    As Barbero et al.'s code (`rope_angles = int(p * head_dim // 2)`), computed from the kept fraction p.
    """
    return int((1.0 - unrotated_fraction) * dim // 2)


class PartialRotary(RotaryEmbedding):
    """RoPE whose pairs past the first `rotated` keep angle 0 at every position: rotated by 1, i.e. not at all."""

    attribute: ClassVar[str] = "p_rope"

    def __init__(self, dim: int, base: float, layout: str, unrotated_fraction: float) -> None:
        self.rotated = rotated_pairs(dim, unrotated_fraction)  # set before the tables are first built
        super().__init__(dim, base, layout)

    def frequencies(self) -> Tensor:
        """RoPE's theta_i (dim // 2,), float64, with the lowest frequencies set to 0."""
        frequencies = super().frequencies()
        frequencies[self.rotated :] = 0.0  # theta_i = 0: every angle 0, cos 1, sin 0
        return frequencies


def check_p_rope(config: ModelConfig) -> None:
    """p-RoPE rotates pairs of a head: an even head size.

    Raises:
        ConfigError: an odd one.
    """
    if config.head_size % 2:
        raise ConfigError(f"p_rope needs an even head size, got hidden_size/num_heads = {config.head_size}")


def p_rope(config: ModelConfig) -> PartialRotary:
    """The p-RoPE module of `config`: its head size, rotary base and layout, and the fraction left unrotated."""
    settings: PRopeSettings = config.position_settings["p_rope"]
    return PartialRotary(config.head_size, config.rotary_base, config.rotary_layout, settings.unrotated_fraction)


ENCODINGS = (
    EncodingSpec(
        name="p_rope",
        summary="RoPE with its lowest-frequency fraction of pairs left unrotated (theta_i = 0 there)",
        acts="attention",
        relative=True,
        hf=None,
        kernel="sdpa",
        settings=PRopeSettings,
        rotates=True,
        build=p_rope,
        check=check_p_rope,
        real_positions=True,
        paper="Barbero et al. 2025",
    ),
)
