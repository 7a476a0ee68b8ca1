"""Attention: what a forward gives every layer (ForwardInputs, AttentionContext), the kernels, and the layer.

`SelfAttention.forward` is the projection, the rotation, the kernel the forward plan chose and the output
projection; it asks nothing about the model or the position encoding. The kernels are the entries of one table,
`ATTENTION_KERNELS`, by name:

    sdpa      softmax over the (B, T) grid with the context's mask (bool, or T5's / ALiBi's bias folded into it)
              and the decoder's KV cache: torch's SDPA, written out for dropout on CPU
    biased    softmax with terms of each layer's own queries added to the logits (Shaw: q . a^K, and a^V)
    grouped   softmax of SelfExtend's logits: q and k rotated at grouped positions beyond the neighbour window
    linear    the paper's linear attention with RoPE in the numerator (eq. 19), O(T) memory
    varlen    softmax within segments of real tokens (packed documents, unpadded rows) by torch's variable-length
              flash kernel: no grid, no mask, no padding
    cross     a decoder's cross-attention: softmax over the encoder's states with their padding mask, no position
              terms (`CrossAttention`)

Which one runs, and on which layout of the tokens, is decided once per forward (`roformer.model.plan`).
`attention_logits` gives the pre-softmax logits a layer's softmax kernel reads, for studies of a model.

References:
    Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding", arXiv 2104.09864 ("paper").
    Katharopoulos et al. 2020 (linear attention); Shaw et al. 2018; Jin et al. 2024 (SelfExtend).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TypedDict

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from roformer.model.config import ModelConfig
from roformer.model.dropout import cheaper_mask_applies, dropout, dropout_mask
from roformer.model.layouts import QuerySubset, RealTokens, Segments
from roformer.model.masks import KVCache
from roformer.model.rotary import rotate_qkv
from roformer.model.terms import Rotation, ShawTerms

# ----------------------------------------------------------------------------------------------------------------
# What a forward gives every layer


class ForwardInputs(TypedDict, total=False):
    """The optional inputs of one forward beside the ids, the attention mask, the token types and the labels.

    Every head takes them as `**inputs: Unpack[ForwardInputs]` and hands them to the backbone unread; the forward
    plan resolves them once (`roformer.model.plan`), and every layer's attention context carries them
    (`AttentionContext.inputs`). A new per-forward input (a decoder's encoder states for cross-attention) is a key
    here, not a parameter of every head.

    Attributes:
        position_ids: (B, T) every token's position; default 0..T-1, after the cached ones with a cache, from 0 in
            every document with `document_ids`. A left-padded row then equals itself unpadded (HF RoFormer cannot
            take them).
        document_ids: (B, T) documents packed into rows: a token attends to its own document's tokens only (a
            block-diagonal mask; linear attention sums per document) and positions restart at 0 in each, so that
            every document's outputs are those of the document alone, for every position encoding. Not with a cache.
        output_hidden_states: Also return the embedding output and every block's output, each (B, T, C).
        cache: A decoder's `KVCache`: the new tokens' keys and values are added to it and the cached ones attended
            (and with cross-attention, the encoder's projected once).
        encoder_states: (B, S, C) an encoder's last hidden states, which every block of a model with
            `cross_attention` attends to (an encoder-decoder's decoder); refused by a model without it.
        encoder_mask: (B, S) 1 for the encoder's real tokens, 0 for its padding (never attended); None: no padding.

    A new field that is one per row of the batch is named in `PER_ROW_INPUTS` too.
    """

    position_ids: Tensor | None
    document_ids: Tensor | None
    output_hidden_states: bool
    cache: KVCache | None
    encoder_states: Tensor | None
    encoder_mask: Tensor | None


# The ForwardInputs whose first dimension is the batch's row (a head that makes rows of its own, multiple choice's K
# choices of each, reshapes these and hands every other input on as given: a flag, a cache, a value of the batch)
PER_ROW_INPUTS = frozenset({"position_ids", "document_ids", "encoder_states", "encoder_mask"})


@dataclass
class CrossContext:
    """What a decoder's cross-attention reads in one forward: the encoder's states and which of them are real.

    No position encoding enters cross-attention: neither q nor k is rotated and no bias or relative embedding is
    added, whichever encoding the decoder's self-attention uses. HF RoFormer's decoder rotates in self-attention only
    (`RoFormerSelfAttention`: not for `encoder_hidden_states`), as OpenNMT and x-transformers do: the encoder's
    states carry their source positions already, and the distance between a target and a source position means
    nothing across two sequences.

    Attributes:
        states: (B, S, C) the encoder's last hidden states, in the decoder's width.
        mask: (B, 1, 1, S) bool, True = a real source token; or None (no padding).
        kernel: The attention kernel, a key of `ATTENTION_KERNELS` (`cross`).
    """

    states: Tensor
    mask: Tensor | None = None
    kernel: str = "cross"


@dataclass
class AttentionContext:
    """What every layer's attention reads besides its input: built once per forward by the forward plan.

    One object, not arguments threaded by hand through `Block.forward`, `SelfAttention.forward` and the checkpoint
    call: a new per-forward input is a field here (or a key of `inputs`) and nowhere else. The cache is in it too,
    not a buffer on each attention module as in litgpt: one `KVCache` holds every layer's keys and values along with
    the per-slot padding, ranks and positions that the mask and the relative encodings read, so the layers keep no
    state between calls and the same model serves a cached decode and a plain forward. `layer(i)` names the layer
    whose cache and Shaw tables its attention uses.

    Attributes:
        mask: Over the S keys (cached ones first): (B, 1, 1 or T, S) bool, True = attend; or a float bias
            (1 or B, H, T, S) added to the logits, -inf where not attended (T5 bias, ALiBi); or None. For a query
            subset, its queries' rows (B, 1 or H, M, S).
        causal: Attend to earlier positions only, by SDPA's own causal path (no cache, no mask).
        rotary: Rotates (B, T, ..., D) by the new tokens' positions, or None. The kernels that place positions
            themselves read it too (linear attention, SelfExtend's `GroupedRotation`).
        shaw: Shaw et al.'s relative embeddings of a layer, by layer index, or None.
        kernel: The attention kernel, a key of `ATTENTION_KERNELS`.
        index: The layer this context is for.
        tokens: The real tokens when the layers compute on them alone (`RealTokens`): inputs are (N, C), not
            (B, T, C); or None.
        segments: The segments the `varlen` kernel attends within (`Segments`): inputs are then the real tokens
            (N, C) with `tokens` set, `rotary` rotates them at their positions (1, N), no mask; or None.
        queries: The positions that alone are queries (`QuerySubset`): the input is the (B, T, C) grid, the output
            theirs (N, C); or None.
        documents: (B, T) each token's document in packed rows (`document_index`), which linear attention sums
            over (softmax attention reads the block-diagonal `mask`); or None.
        inputs: The forward's `ForwardInputs`, as the plan resolved them (the cache is read from here).
        query_scale: (B, T, 1, 1) what each token's query is multiplied by (the log-length attention scale,
            `ModelConfig.attention_log_scale`), or None.
        cross: What cross-attention reads (the encoder's states and mask, its kernel), for a model with
            `cross_attention`; or None.
    """

    mask: Tensor | None = None
    causal: bool = False
    rotary: Rotation | None = None
    shaw: Callable[[int], ShawTerms] | None = None
    kernel: str = "sdpa"
    index: int = 0
    tokens: RealTokens | None = None
    segments: Segments | None = None
    queries: QuerySubset | None = None
    documents: Tensor | None = None
    inputs: ForwardInputs = field(default_factory=ForwardInputs)
    query_scale: Tensor | None = None
    cross: CrossContext | None = None

    @property
    def cache(self) -> KVCache | None:
        """The decoder's KV cache (the new keys and values are stored, all of them attended), or None."""
        return self.inputs.get("cache")

    def layer(self, index: int) -> AttentionContext:
        """This context for layer `index`."""
        return replace(self, index=index)

    def keys_values(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """This layer's keys and values (B, H, S, D): the new ones (B, H, T, D) after the cached ones, if any."""
        return (k, v) if self.cache is None else self.cache.update(self.index, k, v)

    def cross_keys_values(self, project: Callable[[Tensor], tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
        """This layer's cross-attention keys and values (B, S, H, D): `project`ed from the encoder's states (B, S, C).

        With a cache, projected at the first decoding step only and read from the cache at every later one.
        """
        if self.cache is None:
            return project(self.cross.states)
        return self.cache.cross_keys_values(self.index, lambda: project(self.cross.states))

    def shaw_terms(self) -> ShawTerms | None:
        """This layer's Shaw terms, or None."""
        return None if self.shaw is None else self.shaw(self.index)

    def to_attention(self, qkv: Tensor, num_heads: int, head_size: int) -> Tensor:
        """A layer's fused projection (B, T, 3C) or (N, 3C) in the layout attention reads: (B, T, 3, H, D).

        Within segments the real tokens are one row, (1, N, 3, H, D); on the real tokens alone they are put back
        into the grid first.
        """
        if self.segments is not None:
            return qkv.view(1, qkv.shape[0], 3, num_heads, head_size)
        if self.tokens is not None:
            qkv = self.tokens.grid(qkv)  # (B, T, 3C)
        return qkv.view(*qkv.shape[:2], 3, num_heads, head_size)

    def queries_of(self, q: Tensor) -> Tensor:
        """The queries a kernel attends with: q (B, T, H, D) itself, or the query subset's (B, M, H, D)."""
        return q if self.queries is None else self.queries.grid(q)

    def from_attention(self, y: Tensor) -> Tensor:
        """A kernel's output (B, T, H, D) in the layout of the layer's input.

        (B, T, C) over the grid; (N, C) for the real tokens, the segments' tokens or the query subset.
        """
        y = y.reshape(*y.shape[:2], -1)  # (B, T, C)
        if self.queries is not None:
            return self.queries.of_grid(y)
        if self.segments is not None:
            return y[0]
        return y if self.tokens is None else self.tokens.take(y)


# ----------------------------------------------------------------------------------------------------------------
# The kernels


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, causal: bool) -> Tensor:
    """softmax(q k^T / sqrt(D) + mask) v: (B, H, T, D) q, (B, H, S, D) k and v -> (B, H, T, D).

    Through SDPA, but for dropout on CPU: SDPA's CPU kernel then takes its math path anyway (logits, softmax, a
    dropout mask from torch's slow per-element draw, then v), so the same math is written out here with `dropout`'s
    cheaper mask.
    """
    if mask is not None and mask.is_floating_point() and mask.dtype != q.dtype:
        mask = mask.to(q.dtype)  # SDPA takes a float mask in the query's dtype (autocast)
    if dropout_p == 0.0 and not causal and decoding_on_cpu(q):
        return single_query_attention(q, k, v, mask)
    if dropout_p == 0.0 or not cheaper_mask_applies(q):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal)
    if causal:  # SDPA's is_causal: query i sees keys 0..i (no cache here, so T == S)
        mask = causal_grid(q.shape[-2], k.shape[-2], q.device)
    probs = attention_probs(q, k, mask)
    drop, scale = dropout_mask(probs, dropout_p)
    return (torch.where(drop, 0.0, probs) @ v) * scale  # scaled after the product: (B, H, T, D), not (B, H, T, S)


def attention_probs(q: Tensor, k: Tensor, mask: Tensor | None) -> Tensor:
    """softmax(q k^T / sqrt(D) + mask), (B, H, T, S), the softmax in float32: the written-out kernels' first half.

    Every row has a key to see (a padding query sees itself: `self_attention_mask`), so no row is all -inf.
    """
    logits = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-1, -2)  # (B, H, T, S)
    if mask is not None:  # added in place: the product's backward needs q and k, not its output
        logits.add_(
            mask if mask.is_floating_point() else torch.zeros_like(mask, dtype=q.dtype).masked_fill(~mask, -math.inf)
        )
    return logits.float().softmax(dim=-1).to(q.dtype)


def decoding_on_cpu(q: Tensor) -> bool:
    """One query a row on a CPU without gradients: a decoding step, which SDPA's CPU kernel computes slowly."""
    return q.shape[-2] == 1 and q.device.type == "cpu" and not (q.requires_grad and torch.is_grad_enabled())


def single_query_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """softmax(q k^T / sqrt(D) + mask) v for one query a row, (B, H, 1, D) q: two batched products.

    SDPA's CPU kernel (flash attention in blocks of queries) spends most of a decoding step's attention on its
    blocking when there is one query: 1.7-1.9x the time of these two products over a contiguous cache in a
    micro-benchmark here (256 rows, 4 heads, 40 keys of 48).
    """
    return attention_probs(q, k, mask) @ v  # (B, H, 1, D)


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


@dataclass(frozen=True)
class AttentionKernel:
    """An entry of `ATTENTION_KERNELS`.

    Attributes:
        attend: (q, k, v, ctx, dropout_p) -> the output. q (B, T, H, D), or (B, M, H, D) for a query subset; k and v
            (B, T, H, D), or all three (1, N, H, D) within segments; the output has q's shape.
        rotated: q and k (and v with `rotary_value`) reach it rotated by position. False: it places the positions
            itself, from `ctx.rotary` (linear attention on the feature maps of the numerator; SelfExtend's grouped
            positions).
    """

    attend: Callable[[Tensor, Tensor, Tensor, AttentionContext, float], Tensor]
    rotated: bool = True


def _sdpa(q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, dropout_p: float) -> Tensor:
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
    k, v = ctx.keys_values(k, v)  # (B, H, S, D)
    return softmax_attention(q, k, v, ctx.mask, dropout_p, ctx.causal).transpose(1, 2)


def _biased(q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, dropout_p: float) -> Tensor:
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
    k, v = ctx.keys_values(k, v)  # (B, H, S, D)
    return shaw_attention(q, k, v, ctx.mask, ctx.shaw_terms(), dropout_p).transpose(1, 2)


def _grouped(q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, dropout_p: float) -> Tensor:
    # q and k unrotated: `GroupedRotation.logits` rotates them at the positions of each (query, key) pair
    logits = ctx.rotary.logits(q, k)  # (B, H, T, S)
    mask = causal_grid(*logits.shape[-2:], logits.device) if ctx.causal else ctx.mask  # causal: SDPA's flag, no mask
    return grouped_attention(logits, v.transpose(1, 2), mask, dropout_p).transpose(1, 2)


def causal_grid(queries: int, keys: int, device: torch.device) -> Tensor:
    """(T, S) bool: query i attends keys 0..i (what SDPA's `is_causal` does, for the kernels that build a mask)."""
    return torch.ones(queries, keys, dtype=torch.bool, device=device).tril()


def _linear(q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, dropout_p: float) -> Tensor:
    # No attention dropout: there are no probabilities to drop (config: attention_dropout does not apply).
    documents, mask = ctx.documents, ctx.mask  # (B, T) with -1 at padding, or None
    keep = (documents >= 0) if documents is not None else None if mask is None else mask[:, 0, 0, :]  # (B, T)
    return linear_attention(q, k, v, keep, ctx.rotary, documents)  # RoPE goes on the feature-mapped q and k


def _cross(q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, dropout_p: float) -> Tensor:
    # keys and values are the encoder's (B, S, H, D); no position terms, no causality, no self-attention cache
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D), (B, H, S, D)
    return softmax_attention(q, k, v, ctx.cross.mask, dropout_p, causal=False).transpose(1, 2)


def _varlen(q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext, dropout_p: float) -> Tensor:
    # The plan takes this kernel only without attention dropout (in training): the flash kernel's own is not ours.
    return varlen_kernel(q[0], k[0], v[0], ctx.segments)[None]  # q[0]: (N, H, D)


ATTENTION_KERNELS: dict[str, AttentionKernel] = {
    "sdpa": AttentionKernel(_sdpa),
    "biased": AttentionKernel(_biased),
    "grouped": AttentionKernel(_grouped, rotated=False),
    "linear": AttentionKernel(_linear, rotated=False),
    "varlen": AttentionKernel(_varlen),
    "cross": AttentionKernel(_cross),
}


# ----------------------------------------------------------------------------------------------------------------
# A layer's logits, for studying a model


def attention_logits(attention: SelfAttention, x: Tensor, ctx: AttentionContext) -> Tensor:
    """The pre-softmax logits a layer's softmax kernel reads, over the (B, T) grid: (B, H, T, T) float32.

    q.k / sqrt(D) of the rotated q and k (RoPE), plus what the encoding adds: T5's or ALiBi's bias (the context's
    float mask), Shaw's q.a^K / sqrt(D); SelfExtend's q.k at grouped positions. -inf where a key is not attended (the
    mask, causality). softmax of them, times v, is the layer's attention before its output projection (Shaw's a^V
    terms aside). The kernels themselves never build this tensor where they need not (SDPA); this is for studies of a
    model (`roformer.study.decay`), called with a layer's input and context (a forward pre-hook on the layer sees both).

    Args:
        attention: The layer.
        x: Its input (B, T, C).
        ctx: Its context, as the forward plan made it.

    Raises:
        ValueError: linear attention, which has no softmax and so no logits (paper eq. 19), or a context over another
            layout than the grid (the real tokens alone, segments, a query subset) or with a KV cache.
    """
    if ctx.kernel == "linear":
        raise ValueError("linear attention has no softmax logits (paper eq. 19): softmax attention only")
    if ctx.tokens is not None or ctx.segments is not None or ctx.queries is not None or ctx.cache is not None:
        raise ValueError("attention logits are of attention over the (B, T) grid, without a KV cache")
    q, k, _ = attention.queries_keys_values(x, ctx, ATTENTION_KERNELS[ctx.kernel])  # (B, T, H, D)
    scale = 1.0 / math.sqrt(attention.head_size)
    if ctx.kernel == "grouped":  # q and k unrotated: SelfExtend rotates each pair at its grouped positions
        return _masked_logits(ctx.rotary.logits(q, k).float() * scale, ctx.mask, ctx.causal)
    q, k = q.transpose(1, 2), k.transpose(1, 2)  # (B, H, T, D)
    logits = (q @ k.transpose(-1, -2)).float() * scale
    shaw = ctx.shaw_terms()
    if shaw is not None:
        logits = logits + shaw.logits(q) * scale
    return _masked_logits(logits, ctx.mask, ctx.causal)


def _masked_logits(logits: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
    """(B, H, T, S) logits with the context's mask: a float mask (a bias, -inf included) added, a bool one as -inf."""
    if causal:
        mask = causal_grid(*logits.shape[-2:], logits.device)
    if mask is None:
        return logits
    if mask.is_floating_point():
        return logits + mask.float()
    return logits.masked_fill(~mask, float("-inf"))


# ----------------------------------------------------------------------------------------------------------------
# The layer


class SelfAttention(nn.Module):
    """Multi-head self-attention with RoPE on q and k (and v if asked), by the kernel the forward plan chose."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.head_size = config.head_size
        self.rotary_value = config.rotary_value
        self.dropout = config.attention_dropout
        # One fused projection: a single GEMM, and rotating q and k together is one kernel.
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.use_bias)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size, bias=config.use_bias)

    def queries_keys_values(self, x: Tensor, ctx: AttentionContext, kernel: AttentionKernel) -> tuple[Tensor, ...]:
        """q, k, v (B, T, H, D) of the input as `kernel` reads them: rotated where it wants them so, q scaled."""
        qkv = ctx.to_attention(self.qkv(x), self.num_heads, self.head_size)  # (B, T, 3, H, D)
        q, k, v = rotate_qkv(qkv, ctx.rotary if kernel.rotated else None, self.rotary_value)  # (B, T, H, D) each
        if ctx.query_scale is not None:
            q = q * ctx.query_scale.to(q.dtype)  # (B, T, 1, 1): the logits of longer rows sharpened
        return q, k, v

    def forward(self, x: Tensor, ctx: AttentionContext) -> Tensor:
        """The new tokens' hidden states (B, T, C) -> (B, T, C), attending as `ctx` says (kernel, mask, positions).

        On the real tokens alone (`ctx.tokens`), (N, C) -> (N, C); for a query subset, the grid (B, T, C) -> the
        queries' (N, C).
        """
        kernel = ATTENTION_KERNELS[ctx.kernel]
        q, k, v = self.queries_keys_values(x, ctx, kernel)  # (B, T, H, D) each
        dropout_p = self.dropout if self.training else 0.0
        y = kernel.attend(ctx.queries_of(q), k, v, ctx, dropout_p)  # (B, T, H, D)
        return self.proj(ctx.from_attention(y))


class CrossAttention(nn.Module):
    """A decoder's attention to the encoder's states: queries from the decoder, keys and values from the encoder.

    No position encoding (see `CrossContext`); the kernel is the one the plan put in `ctx.cross`. The keys and values
    of the encoder's states are computed once per decode when there is a cache.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.head_size = config.head_size
        self.dropout = config.attention_dropout
        self.q = nn.Linear(config.hidden_size, config.hidden_size, bias=config.use_bias)
        # keys and values read the same states: one fused projection
        self.kv = nn.Linear(config.hidden_size, 2 * config.hidden_size, bias=config.use_bias)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size, bias=config.use_bias)

    def keys_values(self, states: Tensor) -> tuple[Tensor, Tensor]:
        """The encoder's states (B, S, C) -> keys and values (B, S, H, D) each."""
        kv = self.kv(states).view(*states.shape[:2], 2, self.num_heads, self.head_size)  # (B, S, 2, H, D)
        return kv[:, :, 0], kv[:, :, 1]

    def forward(self, x: Tensor, ctx: AttentionContext) -> Tensor:
        """The decoder's hidden states (B, T, C), or its real tokens (N, C) -> the same shape, attending as `ctx.cross`.

        Raises:
            ValueError: the forward was given no `encoder_states`.
        """
        if ctx.cross is None:
            raise ValueError("a model with cross_attention needs the forward input encoder_states")
        tokens = ctx.tokens  # the real tokens alone (N, C) (unpadded, or in segments), else None: the grid
        q = self.q(x) if tokens is None else tokens.grid(self.q(x))  # (B, T, C)
        B, T, C = q.shape
        k, v = ctx.cross_keys_values(self.keys_values)  # (B, S, H, D) each
        dropout_p = self.dropout if self.training else 0.0
        q = q.view(B, T, self.num_heads, self.head_size)
        y = ATTENTION_KERNELS[ctx.cross.kernel].attend(q, k, v, ctx, dropout_p).reshape(B, T, C)
        return self.proj(y if tokens is None else tokens.take(y))
