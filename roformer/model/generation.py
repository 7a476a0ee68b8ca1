"""Decoding for `CausalLM.generate`: the loop over new tokens with a KV cache, and how each token is chosen.

Greedy decoding takes the most likely token; sampling draws from the softmax of the logits divided by `temperature`,
restricted to the `top_k` most likely tokens and to the smallest set whose probability reaches `top_p` (nucleus
sampling, Holtzman et al. 2020), in that order, as HF's logits warpers do.

Batched prompts are left-padded: every row ends at the last column, so each step appends one column. Each row's
positions count its own tokens (the first real token is at 0), so a padded row is the same computation as the
row alone, for every position encoding (tested).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from roformer.model.config import ModelConfig
from roformer.model.masks import KVCache


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen.

    Attributes:
        do_sample: Draw from the distribution; False = greedy (argmax; the other fields are then unused).
        temperature: Logits are divided by it before the softmax (< 1 sharper, > 1 flatter).
        top_k: Keep only the k most likely tokens; None = all.
        top_p: Keep the smallest set of most likely tokens whose probability is at least top_p; None = all.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def choose_next(logits: Tensor, sampling: Sampling, generator: torch.Generator | None = None) -> Tensor:
    """(B, V) logits of the next token -> (B,) chosen ids."""
    if not sampling.do_sample:
        return logits.argmax(dim=-1)
    scores = logits.float() / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < scores.shape[-1]:
        kth = torch.topk(scores, sampling.top_k, dim=-1).values[:, -1:]  # (B, 1)
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p is not None and sampling.top_p < 1.0:
        ordered, order = scores.sort(dim=-1, descending=True)
        probs = ordered.softmax(dim=-1)
        # drop a token when the more likely ones already reach top_p (the most likely one is always kept)
        drop = (probs.cumsum(dim=-1) - probs) >= sampling.top_p
        scores = scores.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
    probs = scores.softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class Decoder(Protocol):
    """What `generate` needs of a model: its config and the next-token logits at the last position."""

    config: ModelConfig

    def next_token_logits(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        token_type_ids: Tensor | None,
        position_ids: Tensor,
        cache: KVCache,
    ) -> Tensor: ...


def left_padded_positions(keep: Tensor) -> Tensor:
    """(B, T) positions of a left-padded batch: each row's first real token is at 0 (padding at 0 too).

    Raises:
        ValueError: a row has padding after a real token (right padding would put pads between prompt and output).
    """
    if bool((keep[:, 1:] < keep[:, :-1]).any()):
        raise ValueError("generate needs left-padded prompts (padding before the tokens, e.g. padding_side='left')")
    return (keep.long().cumsum(dim=1) - 1).clamp(min=0)


@torch.no_grad()
def generate(
    model: Decoder,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    token_type_ids: Tensor | None = None,
    max_new_tokens: int = 20,
    sampling: Sampling = Sampling(),
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Continue each prompt by up to `max_new_tokens` tokens, reading it once and then one token per step.

    Args:
        model: A `CausalLM` (causal or UniLM attention).
        input_ids: (B, T) left-padded prompts.
        attention_mask: (B, T) 1 for tokens, 0 for padding; None = no padding.
        token_type_ids: (B, T) segments of the prompts. New tokens are segment B (type 1) under the UniLM pattern,
            as RoFormer-Sim generates; under causal attention they repeat each row's last type, as HF does.
        max_new_tokens: The most tokens added to each row.
        sampling: Greedy, or sampling with temperature / top-k / top-p.
        eos_token_id: A row that produced it is finished: it gets `pad_token_id` from then on; generation stops
            when every row has finished.
        pad_token_id: Filler after a row's end (default: eos_token_id, else the model's pad id).
        generator: Random numbers for sampling (reproducible draws).

    Returns:
        (B, T + N) ids: the prompts, then N <= max_new_tokens new columns.
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    B, T = input_ids.shape
    keep = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    positions = left_padded_positions(keep)
    cache = KVCache(capacity=T + max_new_tokens)
    if model.config.attention_pattern == "unilm":
        new_types = torch.ones((B, 1), dtype=torch.long, device=input_ids.device)
    else:
        new_types = None if token_type_ids is None else token_type_ids[:, -1:]
    pad = pad_token_id if pad_token_id is not None else eos_token_id
    pad = model.config.pad_token_id if pad is None else pad
    finished = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
    columns = [input_ids]
    logits = model.next_token_logits(input_ids, keep, token_type_ids, positions, cache)  # (B, V)
    position = positions[:, -1:] + 1  # (B, 1)
    for step in range(max_new_tokens):
        token = choose_next(logits, sampling, generator)  # (B,)
        if eos_token_id is not None:
            token = token.masked_fill(finished, pad)
            finished |= token == eos_token_id
        columns.append(token[:, None])
        if step == max_new_tokens - 1 or (eos_token_id is not None and bool(finished.all())):  # a sync: only with eos
            break
        real = torch.ones((B, 1), dtype=torch.bool, device=input_ids.device)
        logits = model.next_token_logits(token[:, None], real, new_types, position, cache)
        position = position + 1
    return torch.cat(columns, dim=1)
