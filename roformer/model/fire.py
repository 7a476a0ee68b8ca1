"""FIRE (Li et al. 2023): a learned function of the log distance, normalised by the query's position, on the logits.

Li et al. ("Functional Interpolation for Relative Positions Improves Long Context Transformers", ICLR 2024) add to
the logit of query i and key j, per head,

    b(i, j) = f_theta( psi(i - j) / psi(max(L, i)) ),    psi(x) = log(c x + 1),

with f_theta a small MLP (one hidden layer of width 32, ReLU, one output per head), and c and the threshold L
learned. Dividing by psi of the query's position is their progressive interpolation: a query's distances always map
into [0, 1], so a longer input gives f_theta inputs it has seen in training; L keeps the normaliser from being small
at the first positions, where short inputs would otherwise see a coarse function.

The paper's models are decoders (j <= i). An encoder has keys on both sides of a query, so the form here is

    b(i, j) = f_theta( psi(|i - j|) / psi(max(L, i)),  sign(j - i) ),

one MLP of two inputs: the normalised distance and a sign feature (-1 for a key left of the query, 0 for itself,
+1 right of it), so that a token's left and right can differ; a causal decoder only ever gives it -1 and 0.

Beside the paper's equation (our choices): c enters as |c|, initialised at 0.1, and L as |s| L0 with L0 = 512 and a
learned scale s initialised at 1 (the paper's initial values; through the scale L moves in steps of the size of
c's), both settable (`position_settings: {fire: {...}}`); the normaliser has a floor of 1e-6 (psi(max(L, 0)) is 0 if
L reaches 0); one f_theta serves every layer, computed once per forward and folded into the mask as T5's bias
(`FoldedBias`); its weights start LeCun-normal (std 1 / sqrt(fan_in), Flax's Dense default), not BERT's 0.02, which
would give biases of order 1e-4: a model blind to positions at its start. The bias depends on the query's own position
through the normaliser: shift-invariant (relative) only while every query is below L. HF has no such model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from roformer.config import check_types
from roformer.errors import ConfigError
from roformer.model.config import EncodingSpec, ModelConfig
from roformer.model.terms import FoldedBias

FLOOR = 1e-6  # the normaliser psi(max(L, i)) never below it


@dataclass
class FireSettings:
    """`position_settings.fire`: f_theta's width and the initial c and L.

    Attributes:
        width: The hidden width of f_theta (32 in the paper).
        init_c: The initial c of psi(x) = log(c x + 1) (0.1).
        init_threshold: The initial L of the normaliser psi(max(L, i)) (512).
    """

    width: int = 32
    init_c: float = 0.1
    init_threshold: float = 512.0

    def __post_init__(self) -> None:
        check_types(self)
        if self.width < 1:
            raise ConfigError(f"width must be >= 1, got {self.width}")
        if self.init_c <= 0 or self.init_threshold <= 0:
            raise ConfigError(f"init_c and init_threshold must be > 0, got {self.init_c} and {self.init_threshold}")


class FireBias(FoldedBias):
    """FIRE's bias of every (query, key) pair and head, one for all layers (see the module's docstring)."""

    attribute: ClassVar[str] = "fire"  # its checkpoint keys: backbone.fire.*

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        settings: FireSettings = config.position_settings["fire"]
        self.hidden = nn.Linear(2, settings.width)  # (normalised distance, sign) -> width
        self.out = nn.Linear(settings.width, config.num_heads)  # -> one bias per head
        for layer in (self.hidden, self.out):  # LeCun normal, 1 / sqrt(fan_in): biases of order 1, as the paper's
            layer.init_std = layer.in_features**-0.5  # Flax Dense layers start (BERT's 0.02 makes them ~1e-4)
        self.c = nn.Parameter(torch.tensor(settings.init_c))
        self.threshold_scale = nn.Parameter(torch.tensor(1.0))
        self.init_threshold = settings.init_threshold

    def psi(self, x: Tensor) -> Tensor:
        """The log transform of a distance or a position x: log(|c| x + 1), float32."""
        return torch.log1p(self.c.float().abs() * x)

    def threshold(self) -> Tensor:
        """L = |s| L0, float32."""
        return (self.threshold_scale.float() * self.init_threshold).abs()

    def features(self, queries: Tensor, keys: Tensor) -> Tensor:
        """f_theta's inputs: psi(|i - j|) / psi(max(L, i)) and sign(j - i), (T, S, 2) or (B, T, S, 2) float32."""
        queries, keys = queries.float(), keys.float()
        distance = keys.unsqueeze(-2) - queries.unsqueeze(-1)  # (T, S) or (B, T, S): j - i
        normaliser = self.psi(torch.maximum(queries, self.threshold())).clamp(min=FLOOR)  # (T,) or (B, T)
        return torch.stack((self.psi(distance.abs()) / normaliser.unsqueeze(-1), distance.sign()), dim=-1)

    def bias(self, queries: Tensor, keys: Tensor) -> Tensor:
        """(T,) or (B, T) query and (S,) or (B, S) key positions -> float32 bias (1 or B, H, T, S)."""
        x = self.features(queries, keys)
        with torch.autocast(x.device.type, enabled=False):  # f_theta in float32, whatever the model computes in
            h = F.relu(F.linear(x, self.hidden.weight.float(), self.hidden.bias.float()))  # (.., T, S, width)
            bias = F.linear(h, self.out.weight.float(), self.out.bias.float())  # (.., T, S, H)
        bias = bias if bias.dim() == 4 else bias[None]  # (1 or B, T, S, H)
        return bias.permute(0, 3, 1, 2).contiguous()  # SDPA's kernels want the keys' dim contiguous


ENCODINGS = (
    EncodingSpec(
        name="fire",
        summary="a learned MLP of the log distance over the log of the query's position (progressive interpolation)",
        acts="attention",
        relative=False,  # the normaliser reads the query's own position: relative only below L
        hf=None,
        kernel="sdpa",
        folds_bias=True,
        refuses=("linear",),
        settings=FireSettings,
        build=FireBias,
        real_positions=True,
        paper="Li et al. 2023",
    ),
)
