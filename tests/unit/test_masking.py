"""MLM masking: 80/10/10 statistics within tolerance at several rates, specials never touched, fixed eval mask."""

from __future__ import annotations

import pytest
import torch

from roformer.data.masking import mask_tokens

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


def test_whole_word_masking_selects_all_pieces_of_a_word() -> None:
    from roformer.data.masking import continuation_table
    from roformer.data.tokenizer import train_tokenizer

    words = ["unbelievable", "transformers", "rotation", "positional", "embedding", "a", "the"]
    tokenizer = train_tokenizer([" ".join(words)] * 3, vocab_size=60, min_frequency=1)  # small: words split
    text = " ".join(words * 40)
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    table = continuation_table(tokenizer)
    assert table[ids].any(), "the test needs words split into pieces"
    specials = sorted(set(tokenizer.all_special_ids))
    corrupted, labels = mask_tokens(
        ids,
        tokenizer.mask_token_id,
        len(tokenizer),
        specials,
        0.3,
        torch.Generator().manual_seed(0),
        continuation=table,
    )
    selected = (labels != -100)[0].tolist()
    cont = table[ids][0].tolist()
    for position in range(2, len(selected) - 1):
        if cont[position]:  # a continuation piece is selected exactly when the piece before it is
            assert selected[position] == selected[position - 1]
    rate = sum(selected) / (len(selected) - 2)
    assert 0.2 < rate < 0.4
    # token-level masking splits words
    _, token_labels = mask_tokens(
        ids, tokenizer.mask_token_id, len(tokenizer), specials, 0.3, torch.Generator().manual_seed(0)
    )
    split = [
        (token_labels[0, p] != -100) != (token_labels[0, p - 1] != -100) for p in range(2, ids.shape[1] - 1) if cont[p]
    ]
    assert any(split)


@pytest.mark.parametrize("split", [(1.0, 0.0, 0.0), (0.5, 0.25, 0.25)])
def test_a_split_changes_what_selected_tokens_become_never_which(split: tuple[float, float, float]) -> None:
    ids = batch()
    bert = mask_tokens(ids, MASK, VOCAB, SPECIALS, 0.3, torch.Generator().manual_seed(3))
    corrupted, labels = mask_tokens(ids, MASK, VOCAB, SPECIALS, 0.3, torch.Generator().manual_seed(3), split=split)
    assert torch.equal(labels, bert[1])  # the same positions, the same draws
    selected = labels != -100
    n = int(selected.sum())
    masked = (corrupted == MASK) & selected
    kept = (corrupted == ids) & selected
    assert abs(int(masked.sum()) / n - split[0]) < 0.02 and abs(int(kept.sum()) / n - split[2]) < 0.02
    default = mask_tokens(ids, MASK, VOCAB, SPECIALS, 0.3, torch.Generator().manual_seed(3), split=(0.8, 0.1, 0.1))
    assert torch.equal(default[0], bert[0])  # BERT's split written out is the default, draw for draw
