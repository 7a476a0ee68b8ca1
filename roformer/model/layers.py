"""The layers of the encoder, read top to bottom: activations, norms, embeddings and the post-LN block.

The position encodings (the table in docs/baselines.md) enter in one of two places: those declared to act on the
embeddings (BERT's `sinusoidal` and `learned`) through `Embeddings`, which adds the module
`positions.embedding_positions` builds, and those that act inside attention (`rotary` among them) through the
`AttentionContext` every attention layer reads (`roformer.model.attention`). The models that stack the blocks are
in `roformer.model.backbone` and `roformer.model.heads`.

References:
    Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding", arXiv 2104.09864 ("paper").
    Devlin et al. 2019, BERT.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from roformer.model.attention import AttentionContext, CrossAttention, SelfAttention
from roformer.model.config import ModelConfig
from roformer.model.dropout import Dropout
from roformer.model.layouts import RealTokens
from roformer.model.positions import embedding_positions

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
        # The absolute encoding, if any: registered under its own name (`position`, `sinusoidal`), which its
        # checkpoint keys carry, and reached as `self.positions` whatever the name.
        positions = embedding_positions(config)
        self.positions_attribute = None if positions is None else positions.attribute
        if positions is not None:
            self.add_module(positions.attribute, positions)
        self.norm = make_norm(config, dim)
        self.dropout = Dropout(config.hidden_dropout)
        self.project = nn.Linear(dim, config.hidden_size) if dim != config.hidden_size else None

    @property
    def positions(self) -> nn.Module | None:
        """The absolute position encoding added to the token embeddings, or None."""
        return None if self.positions_attribute is None else getattr(self, self.positions_attribute)

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        tokens: RealTokens | None = None,
    ) -> Tensor:
        """(B, T) ids -> (B, T, hidden_size); absolute positions 0..T-1, or `position_ids` (B, T).

        With `tokens`, the real tokens' embeddings alone, (N, hidden_size): normalised, dropped out and projected
        without the padding.
        """
        T = input_ids.shape[1] if position_ids is None else int(position_ids.max()) + 1
        x = self.word(input_ids)  # (B, T, E)
        if token_type_ids is None:
            x = x + self.token_type.weight[0]  # same value and gradient as looking up type 0 everywhere
        else:
            x = x + self.token_type(token_type_ids)
        if self.positions is not None:
            x = x + self.positions(T, x.device, x.dtype, position_ids)  # (T, E) or (B, T, E)
        if tokens is not None:
            x = tokens.take(x)  # (N, E)
        x = self.dropout(self.norm(x))
        if self.project is not None:
            x = self.project(x)  # (B, T, C)
        return x


class Block(nn.Module):
    """Post-LN transformer block (BERT): x = LN(x + Attn(x)); x = LN(x + FFN(x)).

    With `norm_position: pre` each sublayer reads its input normalised and adds to the residual stream unnormalised
    (x = x + Attn(LN(x)); x = x + FFN(LN(x))), the backbone's `final_norm` closing the last block (GPT-2, Cramming).

    With `intermediate_size` 0 the block is its attention sublayer alone, x = LN(x + Attn(x)): Zoology's attention
    models (Arora et al. 2023) have no feed-forward layer, so a recall task is solved by attention, not memorised.
    With `cross_attention` (a decoder of an encoder-decoder), x = LN(x + CrossAttn(x, encoder states)) between the
    two, as HF's decoder layer (`add_cross_attention`) and the Transformer's decoder (Vaswani et al. fig. 1).
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.attn = SelfAttention(config)
        self.attn_norm = make_norm(config, config.hidden_size)
        self.cross = CrossAttention(config) if config.cross_attention else None
        self.cross_norm = make_norm(config, config.hidden_size) if config.cross_attention else None
        ffn = config.intermediate_size > 0
        self.ffn_in = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.use_bias) if ffn else None
        self.ffn_out = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.use_bias) if ffn else None
        self.ffn_norm = make_norm(config, config.hidden_size) if ffn else None
        self.act = ACTIVATIONS[config.hidden_act]
        self.dropout = Dropout(config.hidden_dropout)
        self.pre_norm = config.norm_position == "pre"

    def forward(self, x: Tensor, ctx: AttentionContext) -> Tensor:
        """(B, T, C) -> (B, T, C), or the real tokens (N, C) -> (N, C); `ctx` is this layer's.

        With a query subset (`ctx.queries`) the grid (B, T, C) -> the queries' (N, C): every token is still a key and
        value, and only the queries go through the rest of the block.
        """
        h = x if ctx.queries is None else ctx.queries.take(x)  # the residual stream of the tokens computed
        if self.pre_norm:
            return self.pre_norm_forward(x, h, ctx)
        h = self.attn_norm(h + self.dropout(self.attn(x, ctx)))
        if self.cross is not None:
            h = self.cross_norm(h + self.dropout(self.cross(h, ctx)))
        if self.ffn_in is None:
            return h
        return self.ffn_norm(h + self.dropout(self.ffn_out(self.act(self.ffn_in(h)))))

    def pre_norm_forward(self, x: Tensor, h: Tensor, ctx: AttentionContext) -> Tensor:
        """The pre-LN sublayers, each x = x + f(LN(x)); `h` is the residual stream of the tokens computed."""
        h = h + self.dropout(self.attn(self.attn_norm(x), ctx))  # every token's normalised state a key and value
        if self.cross is not None:
            h = h + self.dropout(self.cross(self.cross_norm(h), ctx))
        if self.ffn_in is None:
            return h
        return h + self.dropout(self.ffn_out(self.act(self.ffn_in(self.ffn_norm(h)))))
