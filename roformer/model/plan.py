"""The forward plan: what one forward computes, decided once before its first block.

`Backbone.plan` reads the batch (ids, attention mask, token types, `ForwardInputs`) and the model (config, position
encoding, the unpadding and variable-length switches, device, dtype, training) and decides, for every block:

- the token layout: the (B, T) grid, the real tokens alone (`RealTokens`, with unpadding), the segments a
  variable-length kernel attends within (`Segments`), and the masked-only last block's queries (`QuerySubset`);
- the attention kernel, a key of `roformer.model.attention.ATTENTION_KERNELS`.

The layers read the decision from their `AttentionContext`; none of them looks at the config or the encoding again.
The blocks' kernel is the first of these whose condition holds:

    linear    attention: linear (paper eq. 19)
    biased    an encoding that adds terms of each layer's queries to the logits (shaw)
    grouped   rotary with rope_scaling self_extend (SelfExtend's grouped positions)
    varlen    nothing added to the logits (rotary, sinusoidal, learned, none), attention_pattern bidirectional, on
              CUDA in fp16 or bf16 where torch's variable-length flash kernel runs (`varlen_kernel_available`),
              eager, no cache, no attention dropout in training, `varlen_attention` on (the default); and a batch
              with segments: packed documents (`document_ids`, each one run in its row) or a padded batch with
              unpadding on
    sdpa      otherwise: softmax over the grid with the mask (T5's and ALiBi's bias folded into it)

`blocks_kernel` decides what the model, device and dtype decide (every row above but the batch's segments), so it can
be asked about a GPU on a CPU. The masked-only last block computes its queries alone where attention over the grid is
`sdpa`, bidirectional and without a cache or cross-attention; elsewhere the whole grid is computed and the positions
taken from it.

A model with `cross_attention` (an encoder-decoder's decoder) also attends, in every block, to the forward input
`encoder_states` with the kernel

    cross     softmax over the encoder's states, their padding (`encoder_mask`) never attended, no position terms

and the plan puts what it reads (`CrossContext`) into every block's context, whatever the blocks' own layout.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from roformer.model.attention import AttentionContext, CrossContext, ForwardInputs, varlen_kernel_available
from roformer.model.config import ModelConfig
from roformer.model.layouts import QuerySubset, RealTokens, Segments, document_index, document_positions
from roformer.model.masks import self_attention_mask
from roformer.model.terms import AttentionPositions, PositionTerms

# ----------------------------------------------------------------------------------------------------------------
# The kernel


def grid_kernel(config: ModelConfig, positions: AttentionPositions | None) -> str:
    """The kernel of attention over the (B, T) grid: `linear` by the config, else the one the encoding declares."""
    if config.attention == "linear":
        return "linear"
    return "sdpa" if positions is None else positions.kernel


def blocks_kernel(
    config: ModelConfig,
    positions: AttentionPositions | None,
    device: torch.device,
    dtype: torch.dtype,
    *,
    training: bool = False,
    cached: bool = False,
    varlen: bool = True,
) -> str:
    """The kernel the blocks attend with, as far as the model, the device and the dtype decide it.

    `varlen` where torch's variable-length kernel runs and computes what the mask computes: softmax with nothing
    added to the logits, bidirectional, no cache, eager, no attention dropout in training (the kernel has none of
    ours), on a device and dtype with the kernel. Whether the batch has segments for it is the plan's to see
    (`batch_segments`); without them the blocks attend with `grid_kernel`.

    Args:
        config: The model's config.
        positions: The encoding that acts inside attention, or None.
        device: Where the forward runs.
        dtype: The dtype attention computes in (autocast's, else the weights').
        training: The model is in training mode.
        cached: The forward reads and extends a KV cache.
        varlen: The model's `varlen_attention` switch.
    """
    kernel = grid_kernel(config, positions)
    if (
        not varlen
        or cached
        or torch.compiler.is_compiling()
        or kernel != "sdpa"
        or (positions is not None and positions.adds_to_logits)
        or config.attention_pattern != "bidirectional"
        or config.attention_log_scale is not None
        or (training and config.attention_dropout > 0)
        or not varlen_kernel_available(device, dtype, config.head_size)
    ):
        return kernel
    return "varlen"


# ----------------------------------------------------------------------------------------------------------------
# The plan


@dataclass
class ForwardPlan:
    """What one forward computes, decided before its first block (`Backbone.plan`).

    Attributes:
        inputs: The forward's `ForwardInputs`, `position_ids` filled in where a cache or packed documents give them.
        blocks: What every block's attention reads (`AttentionContext`; `layer(i)` gives block i's): its kernel, its
            token layout (`tokens`, `segments`), the mask and position terms.
        last: What the last block reads when it computes a query subset alone (its `queries`), else None.
        queries: (Q,) flat positions into the (B * T) grid whose last hidden states alone are returned, or None.
    """

    inputs: ForwardInputs
    blocks: AttentionContext
    last: AttentionContext | None = None
    queries: Tensor | None = None

    @property
    def kernel(self) -> str:
        """The blocks' attention kernel."""
        return self.blocks.kernel

    @property
    def tokens(self) -> RealTokens | None:
        """The real tokens when the blocks compute on them alone ((N, C), not (B, T, C)), else None."""
        return self.blocks.tokens

    def context(self, index: int, num_layers: int) -> AttentionContext:
        """Block `index`'s context (of `num_layers`): the last block's own when it computes the queries alone."""
        if self.last is not None and index == num_layers - 1:
            return self.last.layer(index)
        return self.blocks.layer(index)

    def grid(self, x: Tensor) -> Tensor:
        """Hidden states in the blocks' layout -> the (B, T, C) grid (zeros at padding on the real tokens alone)."""
        return x if self.tokens is None else self.tokens.grid(x)

    def output(self, x: Tensor) -> Tensor:
        """The last block's output -> the last hidden states: (B, T, C), or (Q, C) at the queries."""
        if self.last is not None:
            return x[self.last.queries.order]  # the N distinct queries -> the Q asked for
        x = self.grid(x)
        return x if self.queries is None else x.flatten(0, 1)[self.queries]


def plan_forward(
    config: ModelConfig,
    positions: AttentionPositions | None,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    token_type_ids: Tensor | None,
    inputs: ForwardInputs,
    *,
    queries: Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    training: bool = False,
    unpadding: bool = False,
    varlen: bool = True,
) -> ForwardPlan:
    """The plan of one forward (see the module docstring); `Backbone.plan` passes the backbone's state.

    Args:
        config: The model's config.
        positions: The encoding that acts inside attention, or None.
        input_ids: (B, T) ids.
        attention_mask: (B, T) 1 for real tokens, 0 for padding (with a cache (B, S) may cover the cached slots too),
            or None.
        token_type_ids: (B, T) segments, or None.
        inputs: The forward's `ForwardInputs`.
        queries: (Q,) flat positions into (B * T) whose last hidden states alone are wanted, or None.
        dtype: The dtype attention computes in.
        training: The model is in training mode.
        unpadding: The blocks compute a padded batch's real tokens alone (`Model.set_unpadding`).
        varlen: A variable-length kernel where one applies (`Model.set_varlen_attention`).

    Raises:
        TypeError: a key that is not one of `ForwardInputs`.
        ValueError: `queries` with `output_hidden_states`; `document_ids` with a cache or encoder states; encoder
            states for a model without cross-attention, or none for one with it.
    """
    inputs = resolved_inputs(input_ids, inputs)
    check_real_positions(config, inputs.get("position_ids"))
    cross = cross_context(config, inputs)
    if queries is not None and inputs.get("output_hidden_states"):
        raise ValueError("queries gives the last hidden states at some positions: not with output_hidden_states")
    cache, document_ids = inputs.get("cache"), inputs.get("document_ids")
    kernel = blocks_kernel(
        config, positions, input_ids.device, dtype, training=training, cached=cache is not None, varlen=varlen
    )
    segments = batch_segments(input_ids, attention_mask, document_ids, unpadding) if kernel == "varlen" else None
    tokens = real_tokens(attention_mask, unpadding, cache is not None) if segments is None else segments.tokens
    blocks = None if segments is None else segments_context(positions, segments, inputs, input_ids.shape, cross)
    grid = None  # attention over the grid: every block's, or the masked-only last one's
    over_grid = grid_kernel(config, positions)
    if blocks is None or queries is not None:
        grid = grid_context(
            config, positions, input_ids, attention_mask, token_type_ids, inputs, tokens, over_grid, cross
        )
    last = None
    alone = over_grid == "sdpa" and config.attention_pattern == "bidirectional" and cache is None and cross is None
    if queries is not None and alone:  # the last block computes the queries alone
        subset = QuerySubset.of(queries, input_ids.shape)
        last = replace(grid, tokens=None, queries=subset, mask=subset.mask_rows(grid.mask))  # every token a key
    return ForwardPlan(inputs, blocks if blocks is not None else grid, last, queries)


def cross_context(config: ModelConfig, inputs: ForwardInputs) -> CrossContext | None:
    """What cross-attention reads (the encoder's states, their padding mask), or None for a model without it.

    A source of padding only attends to all of its tokens (as `self_attention_mask` treats such a row): no softmax
    row of -inf.

    Raises:
        ValueError: encoder inputs for a model without `cross_attention`, no `encoder_states` for one with it, a
            mask that does not fit the states, or `document_ids` (packed documents would share one row's source).
    """
    states, mask = inputs.get("encoder_states"), inputs.get("encoder_mask")
    if not config.cross_attention:
        if states is not None or mask is not None:
            raise ValueError("encoder_states / encoder_mask are for a model with cross_attention; this one has none")
        return None
    if states is None:
        raise ValueError("a model with cross_attention needs the forward input encoder_states (B, S, C)")
    if inputs.get("document_ids") is not None:
        raise ValueError("document_ids cannot be combined with encoder_states (each row has one source)")
    if mask is None:
        return CrossContext(states)
    if mask.shape != states.shape[:2]:
        raise ValueError(f"encoder_mask {tuple(mask.shape)} does not fit encoder_states {tuple(states.shape)}")
    keep = mask.bool()
    keep = keep | ~keep.any(dim=1, keepdim=True)  # (B, S)
    return CrossContext(states, keep[:, None, None, :])


def check_real_positions(config: ModelConfig, position_ids: Tensor | None) -> None:
    """Float `position_ids` go to an encoding that computes from real positions (EncodingSpec.real_positions).

    Raises:
        ValueError: real positions for a table's rows or buckets (learned, Shaw, T5), which would be cut to integers.
    """
    if position_ids is None or not position_ids.is_floating_point() or torch.compiler.is_compiling():
        return  # the declarations are looked up eagerly alone: a compiled forward does not trace the lookup
    spec = config.encoding
    if spec.acts != "nothing" and not spec.real_positions:
        raise ValueError(
            f"position_encoding {spec.name} reads positions as table rows or buckets: integer position_ids, "
            f"not {position_ids.dtype}"
        )


def resolved_inputs(input_ids: Tensor, inputs: ForwardInputs) -> ForwardInputs:
    """`inputs` checked, with `position_ids` filled in: after the cached tokens, or from 0 in every document.

    Raises:
        TypeError: a key that is not one of `ForwardInputs` (heads take them as `**inputs`, so a misspelt argument
            reaches this point).
    """
    unknown = sorted(set(inputs) - ForwardInputs.__optional_keys__)
    if unknown:
        raise TypeError(f"unexpected forward inputs {unknown}: expected {sorted(ForwardInputs.__optional_keys__)}")
    B, T = input_ids.shape
    cache, document_ids, position_ids = inputs.get("cache"), inputs.get("document_ids"), inputs.get("position_ids")
    if cache is not None and position_ids is None:
        position_ids = torch.arange(cache.length, cache.length + T, device=input_ids.device).expand(B, T)
    if document_ids is not None and position_ids is None:
        position_ids = document_positions(document_ids)  # (B, T): every document from 0
    return {**inputs, "position_ids": position_ids}


def batch_segments(
    input_ids: Tensor, attention_mask: Tensor | None, document_ids: Tensor | None, unpadding: bool
) -> Segments | None:
    """The segments a variable-length kernel attends within, where the batch has them, else None.

    Packed documents (each one run in its row), or a padded batch with unpadding on: the padding's outputs otherwise
    stay as HF computes them, and a batch of full rows is SDPA's flash path already. None without a real token.
    """
    padded = attention_mask is not None and not bool(attention_mask.all())
    if (padded and not unpadding) or (document_ids is None and not padded):
        return None
    keep = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
    if not bool(keep.any()):
        return None  # no real token: no segment to attend within
    return Segments.of(keep, document_ids)


def real_tokens(attention_mask: Tensor | None, unpadding: bool, cached: bool) -> RealTokens | None:
    """The batch's real tokens when the blocks are to compute on them alone, else None.

    With unpadding on, for a padded batch without a cache (a cached decode's new tokens are few, and its mask also
    covers the cached slots).
    """
    if not unpadding or attention_mask is None or cached or bool(attention_mask.all()):
        return None
    return RealTokens.of(attention_mask)


def grid_context(
    config: ModelConfig,
    positions: AttentionPositions | None,
    input_ids: Tensor,
    attention_mask: Tensor | None,
    token_type_ids: Tensor | None,
    inputs: ForwardInputs,
    tokens: RealTokens | None,
    kernel: str,
    cross: CrossContext | None = None,
) -> AttentionContext:
    """What attention over the (B, T) grid reads: the mask (padding, pattern, documents) and the position terms."""
    B, T = input_ids.shape
    device, cache, document_ids = input_ids.device, inputs.get("cache"), inputs.get("document_ids")
    mask, causal = self_attention_mask(
        config.attention_pattern,
        attention_mask,
        token_type_ids,
        cache,
        (B, T),
        device,
        causal_shortcut=positions is None or not positions.adds_to_logits,
        document_ids=document_ids,
    )
    position_ids = inputs.get("position_ids")
    terms = PositionTerms(mask) if positions is None else positions.terms(mask, position_ids, cache, T, device)
    # linear attention sums per document; softmax attention reads the block-diagonal mask alone
    documents = (
        document_index(document_ids, attention_mask) if kernel == "linear" and document_ids is not None else None
    )
    scale = None
    if config.attention_log_scale is not None:
        scale = log_length_scale(config.attention_log_scale, attention_mask, document_ids, (B, T), device)
    return AttentionContext(
        terms.mask,
        causal,
        terms.rotary,
        terms.shaw,
        kernel,
        tokens=tokens,
        documents=documents,
        inputs=inputs,
        query_scale=scale,
        cross=cross,
    )


def log_length_scale(
    trained: int,
    attention_mask: Tensor | None,
    document_ids: Tensor | None,
    shape: tuple[int, int],
    device: torch.device,
) -> Tensor:
    """(B, T, 1, 1) max(1, log n / log `trained`), n the real tokens of each token's row (or document).

    Su 2021 ("entropy-invariant attention"): the entropy of softmax attention grows like log n, so scaling the logits
    by log n / log n0 keeps a longer row's attention as peaked as at the trained length n0. Never below 1: the
    trained lengths attend as they were trained. With a cache the mask covers the cached slots, which count.
    """
    B, T = shape
    keep = torch.ones(B, T, device=device) if attention_mask is None else attention_mask.float()  # (B, S)
    if document_ids is None:
        n = keep.sum(dim=-1, keepdim=True).expand(B, T)  # (B, T): the row's real tokens
    else:  # packed documents: the tokens of each one's own document
        n = ((document_ids[:, :, None] == document_ids[:, None, :]) * keep[:, None, -T:]).sum(dim=-1).float()
    scale = (n.clamp(min=1).log() / torch.tensor(float(trained)).log()).clamp(min=1.0)
    return scale[:, :, None, None]  # (B, T, 1, 1)


def segments_context(
    positions: AttentionPositions | None,
    segments: Segments,
    inputs: ForwardInputs,
    shape: tuple[int, int],
    cross: CrossContext | None = None,
) -> AttentionContext:
    """What the blocks read under the variable-length kernel: the real tokens, rotated at their positions (1, N).

    No mask: the segments say which keys each token sees.
    """
    tokens, rotary = segments.tokens, None
    if positions is not None:
        B, T = shape
        position_ids = inputs.get("position_ids")
        if position_ids is None:
            position_ids = torch.arange(T, device=segments.starts.device).expand(B, T)
        rotary = positions.terms(None, tokens.take(position_ids)[None], None, T, position_ids.device).rotary
    return AttentionContext(
        rotary=rotary, kernel="varlen", tokens=tokens, segments=segments, inputs=inputs, cross=cross
    )
