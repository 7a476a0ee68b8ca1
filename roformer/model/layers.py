"""The layers of the encoder, read top to bottom.

Activations, norms, embeddings, attention (softmax with a KV cache, linear) and the post-LN block. The position
encodings are one room below, in `roformer.model.positions`: the absolute ones (`sinusoidal`, `learned`) enter here
through `Embeddings`, the others (`rotary`, `shaw`, `t5_bias`, `alibi`) through the `AttentionContext` every attention
layer reads, and `none` has none. The models that stack the layers are in `roformer.model.model`.

References:
    Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding", arXiv 2104.09864 ("paper").
    Devlin et al. 2019, BERT.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from roformer.model.config import ModelConfig
from roformer.model.positions import GroupedRotation, Rotation, ShawTerms, SinusoidalPositions, rotate_qkv

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


# ----------------------------------------------------------------------------------------------------------------
# Dropout (Srivastava et al. 2014): inverted, as torch's, with a cheaper mask on CPU.


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Zero each element with probability `p` and scale the rest by 1 / (1 - p), in training; else `x` as it is.

    On CPU torch draws one Mersenne-Twister number per element, one at a time, and that single-threaded draw was 29%
    of a fine-tuning step of a small model (2 x 64, batch 32 x 128, attention dropout included). Here one 64-bit
    draw gives two elements 32 random bits each, compared with a threshold in one vectorised pass: about 3x less
    time for the mask, at a finer resolution than torch.rand's 24-bit floats. The drop probability is
    round(p * 2^32) / 2^32, and the scale the inverse of its complement, so the expectation is kept exactly. Other
    devices use torch's dropout (its Philox generator is already parallel). Both draw from the global generator, so
    seeding, checkpointed recomputation and resumed runs replay the same masks.

    Raises:
        ValueError: `p` is not in [0, 1] (NaN included), with F.dropout's message, whether training or not.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return x
    if not cheaper_mask_applies(x) or p >= 1.0:
        return F.dropout(x, p, training=True)
    drop, scale = dropout_mask(x, p)
    return torch.where(drop, 0.0, x * scale)


def cheaper_mask_applies(x: Tensor) -> bool:
    """Whether `dropout` draws its own mask for `x`: on CPU in eager mode.

    A compiled graph keeps torch's dropout, which inductor generates as a fused, parallel draw (the in-place draw
    here would split the graph in two).
    """
    return x.device.type == "cpu" and not torch.compiler.is_compiling()


def dropout_mask(x: Tensor, p: float) -> tuple[Tensor, float]:
    """For `dropout` on CPU: which elements of `x` to zero (a bool tensor of its shape) and the scale of the rest."""
    dropped = min(round(p * 2**32), 2**32 - 1)  # of the 2^32 values of a uniform int32
    # uniform over all 64 bits (random_() alone leaves the top one 0), so each int32 half is uniform too
    draws = torch.empty((x.numel() + 1) // 2, dtype=torch.int64, device=x.device).random_(-(2**63), 2**63 - 1)
    drop = draws.view(torch.int32)[: x.numel()] < dropped - 2**31  # the `dropped` lowest of [-2^31, 2^31)
    return drop.view(x.shape), 2**32 / (2**32 - dropped)


class Dropout(nn.Dropout):
    """`nn.Dropout` through `dropout` (the cheaper CPU mask); the same module otherwise (`p`, repr, no weights)."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)


@dataclass
class RealTokens:
    """Where a padded batch's real tokens sit in its (B, T) grid, to compute on them alone.

    Everything in a block but the attention scores acts on each token by itself (the projections, the FFN, the norms,
    dropout), so it can run on the N real tokens of a batch as one (N, C) matrix: with a fine-tuning batch of mixed
    lengths (CoNLL-2003 sentences: 62% of a batch's positions are padding) most of the work goes. Only attention needs
    the grid, so its q, k, v are put back into it and its output taken out again (ModernBERT and MosaicBERT unpad the
    same way; they keep attention unpadded too, with a variable-length flash kernel that CPUs lack). The real tokens'
    values are those of the padded computation; the padding's outputs are zeros instead of unread values.
    """

    index: Tensor  # (N,) the real tokens' flat positions in the B * T grid, in row-major order
    shape: tuple[int, int]  # (B, T)

    @classmethod
    def of(cls, keep: Tensor) -> RealTokens:
        """The real tokens of a (B, T) attention mask (1 or True = real)."""
        return cls(keep.reshape(-1).nonzero().squeeze(1), (keep.shape[0], keep.shape[1]))

    def take(self, x: Tensor) -> Tensor:
        """(B, T, ...) -> (N, ...): the real tokens' rows."""
        return x.reshape(-1, *x.shape[2:]).index_select(0, self.index)

    def grid(self, x: Tensor) -> Tensor:
        """(N, ...) -> (B, T, ...): the rows back in their places, zeros at padding."""
        B, T = self.shape
        placed = x.new_zeros(B * T, *x.shape[1:]).index_copy(0, self.index, x)
        return placed.view(B, T, *x.shape[1:])


@dataclass
class Segments:
    """The runs of real tokens that attend only among themselves, for a variable-length attention kernel.

    A padded row's real tokens are one segment; with packed documents each document of a row is one. The real
    tokens (N) are laid out one segment after another, as `RealTokens` takes them (row-major), so a kernel reads q,
    k and v as (N, H, D) with no grid, no padding and no (B, T, T) mask.

    Attributes:
        starts: (S + 1,) int32 where each segment starts in the N tokens, and N last (flash attention's cu_seqlens).
        longest: The longest segment's length.
        tokens: The real tokens.
    """

    starts: Tensor
    longest: int
    tokens: RealTokens

    @classmethod
    def of(cls, keep: Tensor, document_ids: Tensor | None) -> Segments | None:
        """The segments of a (B, T) bool mask of real tokens and its documents, or None if a document is split.

        A document's tokens must be one run within their row: a kernel attends within runs, and a document id that
        comes back after another would be one document to the mask but two runs here.
        """
        tokens = RealTokens.of(keep)
        row = tokens.index // keep.shape[1]  # (N,)
        if document_ids is None:
            run = row
        else:
            index = document_index(document_ids)  # ids of any values -> 0..n-1
            run = row * (int(index.max()) + 1) + index.reshape(-1)[tokens.index]
        new = torch.ones_like(run, dtype=torch.bool)
        new[1:] = run[1:] != run[:-1]
        first = new.nonzero().squeeze(1)
        if document_ids is not None and len(first) != len(torch.unique(run)):
            return None
        starts = torch.cat((first, first.new_tensor([len(run)]))).to(torch.int32)
        return cls(starts, int((starts[1:] - starts[:-1]).max()) if len(run) else 0, tokens)


def varlen_kernel_available(device: torch.device, dtype: torch.dtype, head_size: int) -> bool:
    """Whether torch's variable-length flash attention runs here.

    CUDA on an Ampere or newer card, fp16 or bf16, a head size that is a multiple of 8 up to 256 (flash attention's
    limits: SDPA would pad the head or take another kernel; the variable-length kernel raises instead), torch >= 2.9.
    """
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16) or head_size % 8 or head_size > 256:
        return False
    if torch.cuda.get_device_capability(device) < (8, 0):
        return False
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def varlen_kernel(q: Tensor, k: Tensor, v: Tensor, segments: Segments) -> Tensor:
    """softmax(q k^T / sqrt(D)) v within each segment: (N, H, D) each -> (N, H, D), by flash attention."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn(q, k, v, segments.starts, segments.starts, segments.longest, segments.longest)


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
        self.dropout = Dropout(config.hidden_dropout)
        self.project = nn.Linear(dim, config.hidden_size) if dim != config.hidden_size else None

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
        if self.position is not None:
            if T > self.position.num_embeddings:
                raise ValueError(
                    f"sequence length {T} exceeds max_position_embeddings={self.position.num_embeddings} of the "
                    "learned position table; rotary and sinusoidal positions have no length limit"
                )
            x = x + (self.position.weight[:T] if position_ids is None else self.position(position_ids))
        elif self.sinusoidal is not None:
            x = x + self.sinusoidal(T, x.device, x.dtype, position_ids)
        if tokens is not None:
            x = tokens.take(x)  # (N, E)
        x = self.dropout(self.norm(x))
        if self.project is not None:
            x = self.project(x)  # (B, T, C)
        return x


LINEAR_ATTENTION_EPS = 1e-6  # as Katharopoulos et al.'s reference implementation: a denominator that underflows


def linear_attention(
    q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, rotary: Rotation | None, documents: Tensor | None = None
) -> Tensor:
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
        documents: (B, T) each token's document as 0..n-1 (`document_index`; -1 for padding) in packed rows: the
            sums run over a query's own document, or None.

    Returns:
        (B, T, H, D) in the input dtype.
    """
    with torch.autocast(q.device.type, enabled=False):
        phi_q, phi_k = F.elu(q.float()) + 1.0, F.elu(k.float()) + 1.0  # (B, T, H, D), > 0
        if keep is not None:
            phi_k = phi_k * keep[:, :, None, None]
        rot_q, rot_k = rotary(torch.stack((phi_q, phi_k), dim=2)).unbind(2) if rotary is not None else (phi_q, phi_k)
        if documents is None:
            return _linear_sums(phi_q, phi_k, rot_q, rot_k, v.float()).to(q.dtype)
        out = torch.zeros_like(v, dtype=torch.float32)
        for d in range(int(documents.max()) + 1):  # each document's own sums: no query sees another's keys
            mine = (documents == d)[:, :, None, None]  # (B, T, 1, 1)
            sums = _linear_sums(phi_q, phi_k * mine, rot_q, rot_k * mine, v.float())
            out = torch.where(mine, sums, out)
        return out.to(q.dtype)


def _linear_sums(phi_q: Tensor, phi_k: Tensor, rot_q: Tensor, rot_k: Tensor, v: Tensor) -> Tensor:
    """Eq. 19 over the keys given (zeros elsewhere): (B, T, H, D) features and values -> (B, T, H, D) float32."""
    kv = torch.einsum("bnhd,bnhe->bhde", rot_k, v)  # (B, H, D, D): sum_n R_n phi(k_n) v_n^T
    numerator = torch.einsum("bmhd,bhde->bmhe", rot_q, kv)  # (B, T, H, D)
    denominator = torch.einsum("bmhd,bhd->bmh", phi_q, phi_k.sum(dim=1))  # (B, T, H)
    return numerator / (denominator[..., None] + LINEAR_ATTENTION_EPS)


def document_index(document_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """(B, T) document ids of any values -> 0..n-1 over the batch (equal ids, equal index); -1 at padding."""
    index = torch.unique(document_ids, return_inverse=True)[1]
    return index if attention_mask is None else index.masked_fill(~attention_mask.bool(), -1)


def document_positions(document_ids: Tensor) -> Tensor:
    """(B, T) positions that restart at 0 in every document: a token's count of earlier tokens of its document."""
    index = document_index(document_ids)
    seen = F.one_hot(index, int(index.max()) + 1).cumsum(dim=1)  # (B, T, n): tokens of each document so far
    return seen.gather(2, index[..., None]).squeeze(-1) - 1


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


@dataclass
class AttentionContext:
    """What every layer's attention reads besides its input: built once per forward by `Backbone.encode`.

    One object, not six arguments threaded by hand through `Block.forward`, `SelfAttention.forward` and the
    checkpoint call: a new per-forward input is a field here and nowhere else. The cache is a field too, not a
    buffer on each attention module as in litgpt: one `KVCache` holds every layer's keys and values along with the
    per-slot padding, ranks and positions that the mask and the relative encodings read, so the layers keep no state
    between calls and the same model serves a cached decode and a plain forward. `layer(i)` names the layer whose
    cache and Shaw tables its attention uses.

    Attributes:
        mask: Over the S keys (cached ones first): (B, 1, 1 or T, S) bool, True = attend; or a float bias
            (1 or B, H, T, S) added to the logits, -inf where not attended (T5 bias, ALiBi); or None.
        causal: Attend to earlier positions only, by SDPA's own causal path (no cache, no mask).
        rotary: Rotates (B, T, ..., D) by the new tokens' positions, or None.
        cache: The decoder's `KVCache` (the new keys and values are stored, all of them attended), or None.
        shaw: Shaw et al.'s relative embeddings of a layer, by layer index, or None.
        index: The layer this context is for.
        tokens: The real tokens when the layers compute on them alone (`RealTokens`): inputs are (N, C), not
            (B, T, C); or None.
        documents: (B, T) each token's document in packed rows (`document_index`), which linear attention sums
            over (softmax attention reads the block-diagonal `mask`); or None.
        segments: The segments a variable-length kernel attends within (`Segments`): inputs are then the real
            tokens (N, C) with `tokens` set, `rotary` rotates them at their positions (1, N), no mask; or None.
    """

    mask: Tensor | None = None
    causal: bool = False
    rotary: Rotation | None = None
    cache: KVCache | None = None
    shaw: Callable[[int], ShawTerms] | None = None
    index: int = 0
    tokens: RealTokens | None = None
    documents: Tensor | None = None
    segments: Segments | None = None

    def layer(self, index: int) -> AttentionContext:
        """This context for layer `index`."""
        return replace(self, index=index)

    def keys_values(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """This layer's keys and values (B, H, S, D): the new ones (B, H, T, D) after the cached ones, if any."""
        return (k, v) if self.cache is None else self.cache.update(self.index, k, v)

    def shaw_terms(self) -> ShawTerms | None:
        """This layer's Shaw terms, or None."""
        return None if self.shaw is None else self.shaw(self.index)


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

    def forward(self, x: Tensor, ctx: AttentionContext) -> Tensor:
        """The new tokens' hidden states (B, T, C) -> (B, T, C), attending as `ctx` says (mask, positions, cache).

        With `ctx.tokens`, the real tokens alone: (N, C) -> (N, C), through the (B, T) grid for the scores.
        """
        qkv = self.qkv(x)  # (B, T, 3C), or (N, 3C)
        if ctx.segments is not None:  # the real tokens, attending within their segments: no grid
            N, C = x.shape
            q, k, v = rotate_qkv(qkv.view(1, N, 3, self.num_heads, self.head_size), ctx.rotary, self.rotary_value)
            return self.proj(varlen_kernel(q[0], k[0], v[0], ctx.segments).reshape(N, C))  # q[0]: (N, H, D)
        if ctx.tokens is not None:
            qkv = ctx.tokens.grid(qkv)  # (B, T, 3C)
        B, T, C3 = qkv.shape
        C = C3 // 3
        mask, rotary = ctx.mask, ctx.rotary
        qkv = qkv.view(B, T, 3, self.num_heads, self.head_size)  # (B, T, 3, H, D)
        if self.linear:  # RoPE goes on the feature-mapped q and k, inside
            documents = ctx.documents  # (B, T) with -1 at padding, or None
            keep = (documents >= 0) if documents is not None else None if mask is None else mask[:, 0, 0, :]  # (B, T)
            y = linear_attention(*qkv.unbind(2), keep, rotary, documents)  # (B, T, H, D)
            return self.proj(self.tokens_of(y.reshape(B, T, C), ctx))
        if isinstance(rotary, GroupedRotation):  # SelfExtend: its q.k products, then softmax as usual
            q, k, v = qkv.unbind(2)  # (B, T, H, D), unrotated
            dropout_p = self.dropout if self.training else 0.0
            y = grouped_attention(rotary.logits(q, k), v.transpose(1, 2), mask, dropout_p)  # (B, H, T, D)
            return self.proj(self.tokens_of(y.transpose(1, 2).reshape(B, T, C), ctx))
        q, k, v = rotate_qkv(qkv, rotary, self.rotary_value)  # (B, T, H, D) each
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        k, v = ctx.keys_values(k, v)  # (B, H, S, D)
        dropout_p = self.dropout if self.training else 0.0
        shaw = ctx.shaw_terms()
        if shaw is not None:
            y = shaw_attention(q, k, v, mask, shaw, dropout_p)
        else:
            y = softmax_attention(q, k, v, mask, dropout_p, ctx.causal)
        return self.proj(self.tokens_of(y.transpose(1, 2).reshape(B, T, C), ctx))  # y: (B, H, T, D)

    def forward_queries(self, x: Tensor, ctx: AttentionContext, queries: QuerySubset) -> Tensor:
        """The attention outputs (N, C) of the queries in `queries` alone; keys and values from every token of x.

        x is the (B, T, C) grid. The queries of each row are laid out in a (B, M, H, D) grid (M: the most of any
        row), so one SDPA call serves every row; a mask over queries keeps its selected rows. Softmax attention with
        a mask or a bias (T5, ALiBi) and any rotation but SelfExtend's (`model.query_subset_applies`).
        """
        B, T, C = x.shape
        qkv = self.qkv(x).view(B, T, 3, self.num_heads, self.head_size)  # (B, T, 3, H, D)
        q, k, v = rotate_qkv(qkv, ctx.rotary, self.rotary_value)  # (B, T, H, D) each
        b, t, slot, width = queries.row, queries.position, queries.slot, queries.width
        grid = q.new_zeros(B, width, self.num_heads, self.head_size)
        grid[b, slot] = q[b, t]  # (B, M, H, D): each row's queries first, zeros after
        mask = ctx.mask
        if mask is not None and mask.shape[-2] > 1:  # a mask or bias per query: its selected rows
            rows = torch.zeros(B, width, dtype=torch.long, device=x.device)
            rows[b, slot] = t
            mask = mask.expand(B, mask.shape[1], T, mask.shape[-1])
            mask = mask.gather(2, rows[:, None, :, None].expand(B, mask.shape[1], width, mask.shape[-1]))
        dropout_p = self.dropout if self.training else 0.0
        y = softmax_attention(grid.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, dropout_p, False)
        return self.proj(y.transpose(1, 2)[b, slot].reshape(len(b), C))  # (N, C)

    @staticmethod
    def tokens_of(y: Tensor, ctx: AttentionContext) -> Tensor:
        """The attention output (B, T, C) in the layout of the layer's input: as it is, or the real tokens (N, C)."""
        return y if ctx.tokens is None else ctx.tokens.take(y)


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, causal: bool) -> Tensor:
    """softmax(q k^T / sqrt(D) + mask) v: (B, H, T, D) q, (B, H, S, D) k and v -> (B, H, T, D).

    Through SDPA, but for dropout on CPU: SDPA's CPU kernel then takes its math path anyway (logits, softmax, a
    dropout mask from torch's slow per-element draw, then v), so the same math is written out here with `dropout`'s
    cheaper mask.
    """
    if mask is not None and mask.is_floating_point() and mask.dtype != q.dtype:
        mask = mask.to(q.dtype)  # SDPA takes a float mask in the query's dtype (autocast)
    if dropout_p == 0.0 or not cheaper_mask_applies(q):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal)
    logits = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-1, -2)  # (B, H, T, S)
    if causal:  # SDPA's is_causal: query i sees keys 0..i (no cache here, so T == S)
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    if mask is not None:  # added in place: the product's backward needs q and k, not its output
        logits.add_(
            mask if mask.is_floating_point() else torch.zeros_like(mask, dtype=q.dtype).masked_fill(~mask, -math.inf)
        )
    # Every row has a key to see (a padding query sees itself: `self_attention_mask`), so no row is all -inf.
    probs = logits.float().softmax(dim=-1).to(q.dtype)
    drop, scale = dropout_mask(probs, dropout_p)
    return (torch.where(drop, 0.0, probs) @ v) * scale  # scaled after the product: (B, H, T, D), not (B, H, T, S)


def masked_softmax(logits: Tensor) -> Tensor:
    """Softmax over the last dimension; a row with no key at all (every logit -inf) gets 0, not NaN.

    As SDPA gives it, and without NaN gradients.
    """
    empty = logits.amax(dim=-1, keepdim=True) == float("-inf")  # (..., 1)
    return logits.masked_fill(empty, 0.0).softmax(dim=-1).masked_fill(empty, 0.0)


def grouped_attention(logits: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float) -> Tensor:
    """softmax(logits / sqrt(D) + mask) v for q.k `logits` (B, H, T, S) made elsewhere (SelfExtend): (B, H, T, D)."""
    logits = logits.float() / math.sqrt(v.shape[-1])
    if mask is not None:
        logits = logits + mask if mask.is_floating_point() else logits.masked_fill(~mask, float("-inf"))
    probs = dropout(masked_softmax(logits), dropout_p)  # float32
    return (probs.to(v.dtype) @ v).to(v.dtype)


def shaw_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, shaw: ShawTerms, dropout_p: float) -> Tensor:
    """Softmax attention with Shaw et al.'s relative terms (eq. 3-5). (B, H, T, D) q, (B, H, S, D) k and v.

    Keys only: q . a^K enters as an additive float mask, so SDPA still does the rest (its flash kernel cannot take
    one; the memory-efficient one can). With values the probabilities themselves are needed, so it is written out.
    """
    bias = shaw.logits(q) / math.sqrt(q.shape[-1])  # (B, H, T, S) float32, scaled like q . k
    if mask is not None:
        bias = bias.masked_fill(~mask, float("-inf"))
    if shaw.values is None:
        return softmax_attention(q, k, v, bias, dropout_p, causal=False)
    logits = (q @ k.transpose(-1, -2)).float() / math.sqrt(q.shape[-1]) + bias  # (B, H, T, S)
    probs = dropout(masked_softmax(logits), dropout_p)  # float32
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
        self.dropout = Dropout(config.hidden_dropout)

    def forward(self, x: Tensor, ctx: AttentionContext) -> Tensor:
        """(B, T, C) -> (B, T, C), or the real tokens (N, C) -> (N, C); `ctx` is this layer's."""
        x = self.attn_norm(x + self.dropout(self.attn(x, ctx)))
        return self.feed_forward(x)

    def feed_forward(self, x: Tensor) -> Tensor:
        """The block's second half: x = LN(x + FFN(x)), on (..., C)."""
        return self.ffn_norm(x + self.dropout(self.ffn_out(self.act(self.ffn_in(x)))))

    def forward_queries(self, x: Tensor, ctx: AttentionContext, queries: QuerySubset) -> Tensor:
        """The block's output (N, C) at the positions of `queries` alone, from the (B, T, C) grid x.

        Every token is still a key and value; only the selected ones are queries and go through the FFN (a model's
        last block under MLM, where only the masked positions are read: flash-attention's `last_layer_subset`).
        """
        h = x[queries.row, queries.position]  # (N, C)
        h = self.attn_norm(h + self.dropout(self.attn.forward_queries(x, ctx, queries)))
        return self.feed_forward(h)


@dataclass(frozen=True)
class QuerySubset:
    """Distinct positions of a (B, T) grid that alone are queries, laid out per row for one attention call.

    Attributes:
        row: (N,) each query's row.
        position: (N,) its position in the row.
        slot: (N,) its place among its row's queries.
        width: The most queries of any row (M).
    """

    row: Tensor
    position: Tensor
    slot: Tensor
    width: int

    @classmethod
    def of(cls, flat: Tensor, length: int) -> QuerySubset:
        """The queries at distinct flat positions `flat` (sorted) of a grid with rows of `length`."""
        row, position = flat // length, flat % length
        first = torch.searchsorted(row, row, right=False)  # where each row's queries start in the sorted list
        slot = torch.arange(len(flat), device=flat.device) - first
        return cls(row, position, slot, int(slot.max()) + 1 if len(flat) else 1)
