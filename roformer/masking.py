"""BERT masked-language-model corruption: choose positions, then 80% [MASK], 10% random token, 10% unchanged."""

from __future__ import annotations

import torch
from torch import Tensor

IGNORE_INDEX = -100


def mask_tokens(
    input_ids: Tensor,
    mask_token_id: int,
    vocab_size: int,
    special_ids: Tensor | list[int],
    rate: float = 0.15,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Corrupt a batch for MLM as in BERT (Devlin et al. 2019, sec. 3.1).

    Each non-special position is selected with probability `rate`; a selected position becomes [MASK] with
    probability 0.8, a uniformly random non-special token with 0.1, and stays unchanged with 0.1. Special tokens
    ([CLS], [SEP], [PAD], ...) are never selected.

    Args:
        input_ids: (B, T) token ids; not modified.
        mask_token_id: Id of [MASK].
        vocab_size: Size of the vocabulary for random replacements.
        special_ids: Ids that are never selected (and never drawn as random replacements).
        rate: Selection probability.
        generator: Random generator; a fixed seed gives a fixed mask (used for evaluation).

    Returns:
        (corrupted ids, labels) where labels hold the original id at selected positions and -100 elsewhere.
    """
    device = input_ids.device
    special = torch.as_tensor(special_ids, device=device)
    candidates = ~torch.isin(input_ids, special)
    probs = torch.rand(input_ids.shape, generator=generator, device=device)
    selected = (probs < rate) & candidates
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    action = torch.rand(input_ids.shape, generator=generator, device=device)
    to_mask = selected & (action < 0.8)
    to_random = selected & (action >= 0.8) & (action < 0.9)
    vocab = torch.arange(vocab_size, device=device)
    allowed = vocab[~torch.isin(vocab, special)]  # random replacements are never special tokens
    random_ids = allowed[torch.randint(len(allowed), input_ids.shape, generator=generator, device=device)]
    corrupted = torch.where(to_mask, torch.full_like(input_ids, mask_token_id), input_ids)
    corrupted = torch.where(to_random, random_ids, corrupted)
    return corrupted, labels
