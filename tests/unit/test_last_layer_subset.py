"""The masked-only last layer (`MaskedLM.set_last_layer_subset`): the masked positions' logits and loss equal the
full model's for every encoding, padded or not, with packed documents; the FLOPs saved are the predicted share."""

from __future__ import annotations

import pytest
import torch
from helpers import ENCODINGS, TINY_MODEL
from torch.utils.flop_counter import FlopCounterMode

from roformer.data.masking import masked_positions
from roformer.model.config import ModelConfig
from roformer.model.model import MaskedLM


def batch(seed: int = 0, pad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 300, (3, 40), generator=g)
    mask = None
    if pad:
        mask = torch.ones_like(ids)
        mask[1, 30:], mask[2, 12:] = 0, 0
    chosen = (torch.rand(ids.shape, generator=g) < 0.15) & (mask.bool() if pad else True)
    chosen[0, 0] = False
    return ids, mask, torch.where(chosen, ids, -100)


def pair(encoding: str, **config) -> tuple[MaskedLM, MaskedLM]:
    model_config = ModelConfig(**{**TINY_MODEL, "position_encoding": encoding, **config})
    torch.manual_seed(0)
    full = MaskedLM(model_config).eval()
    subset = MaskedLM(model_config).eval()
    subset.load_state_dict(full.state_dict())
    subset.set_last_layer_subset(True)
    return full, subset


@pytest.mark.parametrize("pad", [False, True], ids=["full", "padded"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_masked_logits_equal_the_full_models(encoding: str, pad: bool) -> None:
    full, subset = pair(encoding)
    ids, mask, labels = batch(1, pad)
    positions = masked_positions(labels, multiple=16)  # padded with position 0, repeated
    with torch.no_grad():
        a = full(ids, mask, labels=labels, masked_only=True, masked_positions=positions)
        b = subset(ids, mask, labels=labels, masked_only=True, masked_positions=positions)
    torch.testing.assert_close(b.logits, a.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b.loss, a.loss, rtol=1e-5, atol=1e-5)


def test_with_unpadding_packed_documents_and_gradients() -> None:
    full, subset = pair("alibi")
    for model in (full, subset):
        model.set_unpadding(True)
        model.train()
    ids, mask, labels = batch(2, pad=True)
    documents = (torch.arange(40) >= 17).long().expand(3, 40)
    positions = masked_positions(labels, multiple=8)
    losses = []
    for model in (full, subset):
        torch.manual_seed(0)
        out = model(ids, mask, labels=labels, masked_only=True, masked_positions=positions, document_ids=documents)
        out.loss.backward()
        losses.append(out.loss)
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)  # dropout is 0 in the tiny model
    for (name, a), (_, b) in zip(full.named_parameters(), subset.named_parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_flops_saved_are_the_last_blocks_unmasked_share() -> None:
    """A 4-layer model at 15% masking: the last block's output projection and FFN at the unmasked rows, forward and
    backward (torch's counter does not see CPU attention kernels, whose share is saved on top)."""
    config = {"hidden_size": 64, "num_layers": 4, "num_heads": 2, "intermediate_size": 256, "vocab_size": 300}
    full, subset = pair("rotary", **config)
    ids = torch.randint(5, 300, (8, 128), generator=torch.Generator().manual_seed(0))
    chosen = torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) < 0.15
    labels = torch.where(chosen, ids, -100)
    positions = masked_positions(labels, multiple=1)
    counted = []
    for model in (full, subset):
        with FlopCounterMode(display=False) as counter:
            model(ids, labels=labels, masked_only=True, masked_positions=positions).loss.backward()
        counted.append(counter.get_total_flops())
    C, F = 64, 256
    unmasked = ids.numel() - len(positions)
    predicted = 3 * unmasked * 2 * (C * C + 2 * C * F)  # (proj + FFN) multiply-adds x 2, forward + 2x backward
    assert counted[0] - counted[1] == pytest.approx(predicted, rel=0.01)


def test_paths_without_a_subset_still_give_the_masked_positions() -> None:
    full, subset = pair("shaw")
    ids, mask, labels = batch(3)
    positions = masked_positions(labels, multiple=8)
    with torch.no_grad():
        a = full(ids, labels=labels, masked_only=True, masked_positions=positions).logits
        b = subset(ids, labels=labels, masked_only=True, masked_positions=positions).logits
    torch.testing.assert_close(a, b)
    linear_full, linear_subset = pair("rotary", attention="linear")
    with torch.no_grad():
        a = linear_full(ids, labels=labels, masked_only=True, masked_positions=positions).logits
        b = linear_subset(ids, labels=labels, masked_only=True, masked_positions=positions).logits
    torch.testing.assert_close(a, b)
