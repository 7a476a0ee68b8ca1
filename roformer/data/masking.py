"""BERT masked-language-model corruption: choose positions, then 80% [MASK], 10% random token, 10% unchanged."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from roformer.labels import IGNORE_INDEX

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


def mask_tokens(
    input_ids: Tensor,
    mask_token_id: int,
    vocab_size: int,
    special_ids: Tensor | list[int],
    rate: float = 0.15,
    generator: torch.Generator | None = None,
    continuation: Tensor | None = None,
    split: tuple[float, float, float] = (0.8, 0.1, 0.1),
) -> tuple[Tensor, Tensor]:
    """Corrupt a batch for MLM as in BERT (Devlin et al. 2019, sec. 3.1).

    Each non-special position is selected with probability `rate`; a selected position becomes [MASK] with
    probability 0.8, a uniformly random non-special token with 0.1, and stays unchanged with 0.1 (`split`). Special
    tokens ([CLS], [SEP], [PAD], ...) are never selected. The random draws are the same for every split, so a split
    changes what selected positions become, never which are selected.

    Args:
        input_ids: (B, T) token ids; not modified.
        mask_token_id: Id of [MASK].
        vocab_size: Size of the vocabulary for random replacements.
        special_ids: Ids that are never selected (and never drawn as random replacements).
        rate: Selection probability.
        generator: Random generator; a fixed seed gives a fixed mask (used for evaluation).
        continuation: Optional (V,) bool table, True for word-continuation tokens (WordPiece `##...`). When given,
            whole words are selected (whole-word masking, as in the later BERT release and Chinese BERT-wwm):
            a word's tokens are all selected or all left alone; the 80/10/10 split stays per token.
        split: Fractions of the selected positions that become [MASK], a random token, and stay (summing to 1).

    Returns:
        (corrupted ids, labels) where labels hold the original id at selected positions and -100 elsewhere.
    """
    device = input_ids.device
    # a (V,) lookup table: a gather is ~10x faster than torch.isin over the batch
    size = max(vocab_size, int(input_ids.max()) + 1) if input_ids.numel() else vocab_size  # ids past the vocab too
    is_special = torch.zeros(size, dtype=torch.bool, device=device)
    special = torch.as_tensor(special_ids, dtype=torch.long, device=device)
    is_special[special[special < size]] = True
    candidates = ~is_special[input_ids]
    probs = torch.rand(input_ids.shape, generator=generator, device=device)
    if continuation is not None:
        probs = probs.gather(1, word_start_index(input_ids, continuation.to(device), candidates))
    selected = (probs < rate) & candidates
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    action = torch.rand(input_ids.shape, generator=generator, device=device)
    to_mask = selected & (action < split[0])
    to_random = selected & (action >= split[0]) & (action < split[0] + split[1])
    allowed = torch.nonzero(~is_special[:vocab_size]).squeeze(1)  # random replacements are never special tokens
    random_ids = allowed[torch.randint(len(allowed), input_ids.shape, generator=generator, device=device)]
    corrupted = torch.where(to_mask, torch.full_like(input_ids, mask_token_id), input_ids)
    corrupted = torch.where(to_random, random_ids, corrupted)
    return corrupted, labels


def masked_positions(labels: Tensor, multiple: int = 64) -> Tensor:
    """Flat indices of the labelled positions of (B, T) `labels`, padded to a multiple of `multiple` with index 0.

    Position 0 is a block's [CLS], never labelled, so padded rows carry label -100 and add nothing to the loss. The
    bucketed length lets a compiled model see few distinct shapes (see MaskedLM.forward).
    """
    flat = torch.nonzero(labels.flatten() != IGNORE_INDEX).squeeze(1)
    padded = -(-max(len(flat), 1) // multiple) * multiple
    return torch.cat([flat, flat.new_zeros(padded - len(flat))])


def word_start_index(input_ids: Tensor, continuation: Tensor, candidates: Tensor) -> Tensor:
    """(B, T) index of the first token of the word each position belongs to.

    A word starts at every non-continuation token and at a continuation token that follows a special token (a block
    may begin in the middle of a word: its first piece then stands alone).
    """
    is_cont = continuation[input_ids] & candidates  # (B, T)
    previous_candidate = torch.ones_like(candidates)
    previous_candidate[:, 1:] = candidates[:, :-1]
    starts = ~(is_cont & previous_candidate)
    positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    return torch.where(starts, positions, torch.zeros_like(positions)).cummax(dim=1).values


def continuation_table(tokenizer: Tokenizer) -> Tensor:
    """(V,) bool: True for WordPiece continuation tokens (`##` prefix) of a tokenizer's vocabulary.

    Whole-word masking groups a word's pieces by that prefix. A tokenizer without it (BPE, SentencePiece, Unigram)
    marks words differently: every token would count as a word, so masking is then per token, with a warning.
    """
    table = torch.zeros(len(tokenizer), dtype=torch.bool)
    for token, index in tokenizer.get_vocab().items():
        if token.startswith("##") and index < len(table):
            table[index] = True
    if not table.any():
        logger.warning(
            "data.whole_word_mask: the tokenizer has no WordPiece '##' continuation tokens, so words cannot be "
            "found and masking is per token"
        )
    return table
