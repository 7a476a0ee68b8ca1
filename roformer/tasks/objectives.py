"""Training objectives of the task types, one function each: a type composes the one it trains with.

As sentence-transformers keeps its losses apart from what reads the data.

- `cosent_loss`: CoSENT (Su 2022), scored pairs ranked by their cosines (roformer.tasks.similarity).
- `in_batch_negatives_loss`: InfoNCE over a batch's pairs, the other partners (and hard negatives) as negatives
  (SimCSE, sentence-transformers' MultipleNegativesRankingLoss).
- `pair_bce_loss`: binary cross-entropy of one logit per text pair against 0/1 targets (the RoFormer authors'
  CAIL2019-SCM sigmoid unit: roformer.tasks.triplet).

A head's own loss (cross-entropy of classes, tags or spans, MSE of scores) stays in the model's heads
(roformer.model.model): the tasks that train a head take it from there.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cosent_loss(cosines: torch.Tensor, scores: torch.Tensor, scale: float) -> torch.Tensor:
    """CoSENT: log(1 + sum over pairs of pairs (i, j) with score_i > score_j of exp(scale (cos_j - cos_i))).

    Only the order of the gold scores matters: the loss asks each more similar pair's cosine to exceed each less
    similar pair's, which is what Spearman's correlation then measures.
    """
    differences = scale * (cosines[None, :] - cosines[:, None])  # [i, j] = scale (cos_j - cos_i)
    ordered = scores[:, None] > scores[None, :]  # pair i is more similar than pair j
    terms = differences[ordered]
    return torch.logsumexp(torch.cat([terms.new_zeros(1), terms]), dim=0)


def in_batch_negatives_loss(
    first: torch.Tensor, second: torch.Tensor, scale: float, negatives: torch.Tensor | None = None
) -> torch.Tensor:
    """InfoNCE over a batch of positive pairs (B, C) x (B, C): text i's partner is second[i], the rest negatives.

    With `negatives` (B, C), every anchor is also scored against all of them (its own hard negative and the others').
    """
    candidates = second if negatives is None else torch.cat([second, negatives])  # (B or 2B, C)
    logits = scale * F.normalize(first, dim=-1) @ F.normalize(candidates, dim=-1).T  # scaled cosines
    return F.cross_entropy(logits, torch.arange(len(first), device=logits.device))


def pair_bce_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of each pair's logit (N,) against its 0/1 target (N,), averaged over the pairs."""
    return F.binary_cross_entropy_with_logits(logits, targets)
