"""MLM masking: 80/10/10 statistics within tolerance at several rates, specials never touched, fixed eval mask."""

from __future__ import annotations

import pytest
import torch

from roformer.masking import mask_tokens

SPECIALS = [0, 1, 2, 3, 4]  # pad, unk, cls, sep, mask
MASK, VOCAB = 4, 1000


def batch(n: int = 64, length: int = 512) -> torch.Tensor:
    ids = torch.randint(5, VOCAB, (n, length), generator=torch.Generator().manual_seed(0))
    ids[:, 0], ids[:, -1] = 2, 3
    ids[: n // 2, -50:] = 0  # padding
    return ids


@pytest.mark.parametrize("rate", [0.1, 0.15, 0.3, 0.5])
def test_masking_statistics(rate: float) -> None:
    ids = batch()
    corrupted, labels = mask_tokens(ids, MASK, VOCAB, SPECIALS, rate, torch.Generator().manual_seed(1))
    candidates = ~torch.isin(ids, torch.tensor(SPECIALS))
    selected = labels != -100
    n = int(selected.sum())
    assert abs(n / int(candidates.sum()) - rate) < 0.01
    assert torch.equal(labels[selected], ids[selected])  # labels are the originals
    to_mask = (corrupted == MASK) & selected
    unchanged = (corrupted == ids) & selected
    random = selected & ~to_mask & ~unchanged
    assert abs(int(to_mask.sum()) / n - 0.8) < 0.02
    assert abs(int(random.sum()) / n - 0.1) < 0.02
    # a random replacement can equal the original by chance (1 in ~1000), so "unchanged" is 0.1 + a little
    assert abs(int(unchanged.sum()) / n - 0.1) < 0.02
    assert torch.equal(corrupted[~selected], ids[~selected])  # nothing else changes


def test_specials_and_padding_never_masked_or_drawn() -> None:
    ids = batch()
    corrupted, labels = mask_tokens(ids, MASK, VOCAB, SPECIALS, 0.9, torch.Generator().manual_seed(2))
    special = torch.isin(ids, torch.tensor(SPECIALS))
    assert (labels[special] == -100).all()
    assert torch.equal(corrupted[special], ids[special])
    replaced = (labels != -100) & (corrupted != MASK) & (corrupted != ids)
    assert replaced.any() and not torch.isin(corrupted[replaced], torch.tensor(SPECIALS)).any()


def test_fixed_seed_gives_fixed_mask() -> None:
    ids = batch(8, 64)
    a = mask_tokens(ids, MASK, VOCAB, SPECIALS, generator=torch.Generator().manual_seed(7))
    b = mask_tokens(ids, MASK, VOCAB, SPECIALS, generator=torch.Generator().manual_seed(7))
    c = mask_tokens(ids, MASK, VOCAB, SPECIALS, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])
