"""Decoding an encoder-decoder: greedy and beam search over the decoder, with its KV cache.

The encoder runs once; the decoder starts every target from `decoder_start_token_id` and reads one new token per
step, its self-attention keys and values and its projection of the encoder's states kept in a `KVCache`. The
settings are a `SearchConfig` (roformer.model.search); the semantics are HF `generate`'s for an
`EncoderDecoderModel` (tested token for token):

- greedy (`num_beams` 1): the most likely token; a row that produced `eos_token_id` gets `pad_token_id` from then on.
- beam search: at each step the 2K best continuations of a source's K beams by summed log-probability; those ending
  in eos (or at the length limit) among the K best become hypotheses scored sum logprob / length^length_penalty, the
  length counting the generated tokens, eos included (HF's `length_penalty`, fairseq's `--lenpen`); the K best
  others go on. `early_stopping`: True stops a source once it has K hypotheses; False (HF's default) also stops it
  once its best running beam, scored at the current length, cannot beat its worst hypothesis; "never" scores that
  beam at the length limit when the penalty favours length (the canonical beam search).
- the length limit is per row: int(max_len_a * source length + max_new_tokens) generated tokens (fairseq's
  `max_len_a` and `max_len_b`, with the source length counted in real tokens of that row, so that a translation does
  not depend on its batch; fairseq counts the padded batch). max_len_a 0 is HF's `max_new_tokens`.

Returns (B, 1 + N) ids: the start token, then each row's best target, `pad_token_id` after its end. Plain PyTorch,
no HF import.

References:
    Wiseman & Rush 2016 and HF's `GenerationMixin._beam_search` (the vectorised beam search), fairseq's
    `SequenceGenerator` (max_len_a / max_len_b, length penalty).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import Tensor

from roformer.model.masks import KVCache
from roformer.model.search import SearchConfig

NEG = -1.0e9  # the score of what may not be chosen (HF's constant, so that ties break as HF's do)


class Seq2SeqDecoder(Protocol):
    """What decoding needs of an encoder-decoder: the next-token logits of the decoder at its last position."""

    def next_token_logits(
        self, decoder_input_ids: Tensor, encoder_states: Tensor, encoder_mask: Tensor | None, cache: KVCache
    ) -> Tensor:
        """(B, T) new decoder tokens after the cached ones -> (B, V) logits of the token after the last one."""
        ...


@torch.no_grad()
def search(
    model: Seq2SeqDecoder,
    encoder_states: Tensor,
    encoder_mask: Tensor | None,
    settings: SearchConfig,
    start: int,
    eos: int | None,
    pad: int,
) -> Tensor:
    """The best target of every source: greedy when `settings.num_beams` is 1, else beam search.

    Args:
        model: The encoder-decoder (`next_token_logits`).
        encoder_states: (B, S, C) the encoder's last hidden states.
        encoder_mask: (B, S) 1 for real source tokens, or None (no padding).
        settings: Beams, length penalty, early stopping, length limits.
        start: The decoder's start token.
        eos: The token that ends a target, or None (every row runs to its limit).
        pad: Filler after a row's end.

    Returns:
        (B, 1 + N) ids: the start token and up to N generated tokens per row (N the longest row's).
    """
    B, S = encoder_states.shape[:2]
    lengths = encoder_mask.sum(dim=1) if encoder_mask is not None else torch.full((B,), S)
    limits = settings.limits(lengths.to(encoder_states.device))
    if settings.num_beams == 1:
        return greedy_search(model, encoder_states, encoder_mask, limits, start, eos, pad)
    return beam_search(
        model,
        encoder_states,
        encoder_mask,
        limits,
        start,
        eos,
        pad,
        settings.num_beams,
        settings.length_penalty,
        settings.early_stopping,
    )


@torch.no_grad()
def greedy_search(
    model: Seq2SeqDecoder,
    encoder_states: Tensor,
    encoder_mask: Tensor | None,
    limits: Tensor,
    start: int,
    eos: int | None,
    pad: int,
) -> Tensor:
    """The most likely token at every step, until each row's eos or limit (B,). -> (B, 1 + N) ids.

    A row that has ended leaves the batch (its cache rows with it): the steps after it compute the others alone.
    """
    B, device = encoder_states.shape[0], encoder_states.device
    steps = int(limits.max()) if B else 0
    cache = KVCache(capacity=steps + 1)
    out = torch.full((B, 1 + steps), pad, dtype=torch.long, device=device)
    out[:, 0] = start
    rows = torch.arange(B, device=device)  # the rows still decoded, in their order in the batch
    states, mask, tokens, used = encoder_states, encoder_mask, out[:, :1], 0
    for step in range(steps):
        logits = model.next_token_logits(tokens, states, mask, cache)  # (A, V)
        token = logits.float().argmax(dim=-1)  # (A,)
        out[rows, step + 1] = token
        used = step + 1
        ended = step + 1 >= limits[rows]
        if eos is not None:
            ended = ended | (token == eos)
        if bool(ended.all()):
            break
        if bool(ended.any()):
            keep = (~ended).nonzero().squeeze(1)
            rows, token, states = rows[keep], token[keep], states[keep]
            mask = None if mask is None else mask[keep]
            cache.reorder(keep, cross=keep)
        tokens = token[:, None]
    return out[:, : 1 + used]


@torch.no_grad()
def beam_search(
    model: Seq2SeqDecoder,
    encoder_states: Tensor,
    encoder_mask: Tensor | None,
    limits: Tensor,
    start: int,
    eos: int | None,
    pad: int,
    num_beams: int,
    length_penalty: float = 1.0,
    early_stopping: bool | Literal["never"] = False,
) -> Tensor:
    """Beam search with `num_beams` beams per source (see the module docstring), batched: -> (B, 1 + N) ids.

    Beams are rows a * K + k of the decoder's batch (the encoder's states repeated K times); a step's survivors are
    reordered in the cache (`KVCache.reorder`). A source whose best hypothesis can no longer change (no running beam
    can beat its worst hypothesis, its K places are full under early stopping, or all its candidates ended) leaves
    the batch with its beams and cache rows: later steps compute the other sources alone, and its result is the one
    it would have had (HF's search computes every source until the last has ended).
    """
    B, K, device = encoder_states.shape[0], num_beams, encoder_states.device
    steps = int(limits.max()) if B else 0
    states = encoder_states.repeat_interleave(K, dim=0)  # (B*K, S, C)
    mask = None if encoder_mask is None else encoder_mask.repeat_interleave(K, dim=0)
    cache = KVCache(capacity=steps + 1)
    width = 2 * K  # candidates kept per source: at least K that have not ended, even if K end at once
    among_best = torch.arange(width, device=device) < K  # (2K,): only the K best candidates may become hypotheses
    beams = Beams.start(B, K, steps, start, pad, device)
    done = Hypotheses.empty(B, K, steps, pad, device)
    result = Hypotheses.empty(B, 1, steps, pad, device)  # every source's best hypothesis, once its search ended
    sources = torch.arange(B, device=device)  # the sources still searched, in their order in the batch
    for step in range(steps):
        A = len(sources)
        limit = limits[sources]
        if step == 0:
            logits = first_step_logits(model, encoder_states, encoder_mask, cache, start, K)  # (B*K, V)
        else:
            tokens = beams.ids[:, :, step].reshape(-1, 1)  # (A*K, 1): each beam's last token
            logits = model.next_token_logits(tokens, states, mask, cache).float()  # (A*K, V)
        V = logits.shape[-1]
        scores = logits.log_softmax(dim=-1).view(A, K, V) + beams.scores[:, :, None]  # (A, K, V)
        top, flat = scores.view(A, K * V).topk(width, dim=-1)  # (A, 2K): summed log-probabilities
        parent, token = flat // V, flat % V  # (A, 2K)
        candidates = beams.ids.gather(1, parent[:, :, None].expand(-1, -1, beams.ids.shape[-1])).clone()
        candidates[:, :, step + 1] = token
        ended = step + 1 >= limit[:, None]  # (A, 1): the row's limit is reached
        ends = ended.expand(A, width) if eos is None else (token == eos) | ended  # (A, 2K)
        # the K best candidates that go on (an ended one scores NEG, so chosen only if K of them ended)
        going_on = top + ends.float() * NEG
        chosen = going_on.topk(K, dim=-1).indices  # (A, K)
        beams = Beams(candidates.gather(1, chosen[:, :, None].expand_as(beams.ids)), going_on.gather(1, chosen))
        # the candidates that ended among the K best become hypotheses, scored with the length penalty
        penalised = top / ((step + 1) ** length_penalty)
        if early_stopping is True:
            penalised = penalised + (done.finished.all(dim=-1, keepdim=True)).float() * NEG  # a full source
        penalised = penalised + (~done.improvable).float() * NEG
        new = ends & among_best  # (A, 2K)
        penalised = penalised + (~new).float() * NEG
        done = done.merged(candidates, penalised, new, step + 1)
        done.improvable = done.improvable & can_improve(
            beams.scores, done, step + 1, limit, length_penalty, early_stopping
        )
        searched = done.improvable[:, 0] & ~ends.all(dim=-1)  # (A,): whose best may still change
        if early_stopping is True:
            searched = searched & ~done.finished.all(dim=-1)
        if not bool(searched.all()):
            result.put(sources[~searched], done.first(~searched))
            if not bool(searched.any()):
                break
        parents = (torch.arange(A, device=device)[:, None] * K + parent.gather(1, chosen)).reshape(-1)
        if bool(searched.all()):
            cache.reorder(parents)  # each beam's parent's keys and values
        else:  # the ended sources leave: their beams' rows, and their encoder rows in the cache
            keep = searched.nonzero().squeeze(1)
            beam_rows = (keep[:, None] * K + torch.arange(K, device=device)).reshape(-1)
            cache.reorder(parents.view(A, K)[keep].reshape(-1), cross=beam_rows)
            sources, beams, done = sources[keep], beams.rows(keep), done.rows(keep)
            states = states[beam_rows]
            mask = None if mask is None else mask[beam_rows]
    else:
        result.put(sources, done.first(torch.ones(len(sources), dtype=torch.bool, device=device)))
    return result.best()


def first_step_logits(
    model: Seq2SeqDecoder, encoder_states: Tensor, encoder_mask: Tensor | None, cache: KVCache, start: int, K: int
) -> Tensor:
    """(B*K, V) the first step's logits of every beam, computed once per source and copied to its K beams.

    At the first step a source's K beams are the same start token over the same encoder states, so the decoder runs
    on one row per source, and its logits and cache rows (the encoder's projected keys and values among them, the
    largest part of the step) are copied to the K beams: the same values as K identical rows, at 1/K of the cost.
    """
    B = encoder_states.shape[0]
    tokens = torch.full((B, 1), start, dtype=torch.long, device=encoder_states.device)
    logits = model.next_token_logits(tokens, encoder_states, encoder_mask, cache).float()  # (B, V)
    rows = torch.arange(B, device=encoder_states.device).repeat_interleave(K)  # (B*K,): each source K times
    cache.reorder(rows, cross=rows)
    return logits.index_select(0, rows)


@dataclass
class Beams:
    """The running beams of every source.

    Attributes:
        ids: (B, K, 1 + steps) each beam's tokens so far (start token first), `pad` beyond.
        scores: (B, K) their summed log-probabilities (NEG for a place no beam could fill).
    """

    ids: Tensor
    scores: Tensor

    def rows(self, keep: Tensor) -> Beams:
        """The beams of sources `keep` (indices), in that order."""
        return Beams(self.ids[keep], self.scores[keep])

    @classmethod
    def start(cls, B: int, K: int, steps: int, start: int, pad: int, device: torch.device) -> Beams:
        """K beams of the start token per source.

        All but the first score NEG, so that the first step's K best continuations are K different tokens, not the
        same one K times.
        """
        ids = torch.full((B, K, 1 + steps), pad, dtype=torch.long, device=device)
        ids[:, :, 0] = start
        scores = torch.zeros(B, K, device=device)
        scores[:, 1:] = NEG
        return cls(ids, scores)


@dataclass
class Hypotheses:
    """The K best finished hypotheses of every source, best first.

    Attributes:
        ids: (B, K, 1 + steps) their tokens, `pad` after their end.
        scores: (B, K) sum logprob / length^length_penalty (NEG for an empty place).
        finished: (B, K) the place holds a hypothesis.
        lengths: (B, K) their generated tokens (eos included).
        improvable: (B, 1) a running beam may still beat the source's worst hypothesis (HF's early-stop heuristic).
    """

    ids: Tensor
    scores: Tensor
    finished: Tensor
    lengths: Tensor
    improvable: Tensor

    @classmethod
    def empty(cls, B: int, K: int, steps: int, pad: int, device: torch.device) -> Hypotheses:
        """No hypothesis yet."""
        return cls(
            torch.full((B, K, 1 + steps), pad, dtype=torch.long, device=device),
            torch.full((B, K), NEG, device=device),
            torch.zeros(B, K, dtype=torch.bool, device=device),
            torch.zeros(B, K, dtype=torch.long, device=device),
            torch.ones(B, 1, dtype=torch.bool, device=device),
        )

    def merged(self, candidates: Tensor, scores: Tensor, new: Tensor, length: int) -> Hypotheses:
        """The K best of these and the new ones (`new` (B, 2K) of `candidates` (B, 2K, 1 + steps), `scores`)."""
        ids = torch.cat((self.ids, candidates), dim=1)
        merged = torch.cat((self.scores, scores), dim=1)  # (B, 3K)
        finished = torch.cat((self.finished, new), dim=1)
        lengths = torch.cat((self.lengths, torch.full_like(new, length, dtype=torch.long)), dim=1)
        best = merged.topk(self.scores.shape[1], dim=-1).indices  # (B, K)
        return Hypotheses(
            ids.gather(1, best[:, :, None].expand(-1, -1, ids.shape[-1])),
            merged.gather(1, best),
            finished.gather(1, best),
            lengths.gather(1, best),
            self.improvable,
        )

    def rows(self, keep: Tensor) -> Hypotheses:
        """The hypotheses of sources `keep` (indices), in that order."""
        return Hypotheses(
            self.ids[keep], self.scores[keep], self.finished[keep], self.lengths[keep], self.improvable[keep]
        )

    def first(self, which: Tensor) -> Hypotheses:
        """The best hypothesis (place 0) of the sources `which` (a (B,) bool mask), as one place each."""
        return Hypotheses(
            self.ids[which, :1],
            self.scores[which, :1],
            self.finished[which, :1],
            self.lengths[which, :1],
            self.improvable[which],
        )

    def put(self, sources: Tensor, hypotheses: Hypotheses) -> None:
        """Write `hypotheses` (of as many sources) into the places of `sources` (indices)."""
        self.ids[sources] = hypotheses.ids
        self.scores[sources] = hypotheses.scores
        self.finished[sources] = hypotheses.finished
        self.lengths[sources] = hypotheses.lengths

    def best(self) -> Tensor:
        """(B, 1 + N) every source's best hypothesis, cut after the longest of them."""
        longest = int(self.lengths[:, 0].max()) if self.lengths.numel() else 0
        return self.ids[:, 0, : 1 + longest]


def can_improve(
    running: Tensor,
    done: Hypotheses,
    length: int,
    limits: Tensor,
    length_penalty: float,
    early_stopping: bool | Literal["never"],
) -> Tensor:
    """(B, 1) whether a source's best running beam may still beat its worst hypothesis (HF's early-stop heuristic).

    A source with an empty place always may. Otherwise its best beam is scored at the current `length`, or, with
    early_stopping "never" and a penalty that favours length, at the row's limit (the best it could reach).
    """
    if early_stopping == "never" and length_penalty > 0.0:
        best = running[:, :1] / (limits[:, None].double() ** length_penalty).float()  # (B, 1), as HF's Python power
    else:
        best = running[:, :1] / (length**length_penalty)
    worst = torch.where(done.finished, done.scores.min(dim=1, keepdim=True).values, NEG)  # (B, K)
    return (best > worst).any(dim=-1, keepdim=True)
