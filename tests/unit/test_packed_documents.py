"""Documents packed into rows (`document_ids`): every document's outputs equal the document run alone, for every
position encoding and linear attention, with and without padding, unpadded or not."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import ENCODINGS, TINY_MODEL

from roformer.model.config import ModelConfig
from roformer.model.layouts import document_positions
from roformer.model.model import Backbone, MaskedLM, MultipleChoice

VARIANTS = [(e, "softmax") for e in ENCODINGS] + [("rotary", "linear"), ("none", "linear")]
LENGTHS = [[5, 7, 4], [9, 3, 2, 2]]  # two rows of documents, 16 tokens each


def packed(pad: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[list[torch.Tensor]]]:
    """(ids, attention_mask, document_ids) of the packed rows (each padded by `pad`) and every row's documents."""
    g = torch.Generator().manual_seed(seed)
    docs = [[torch.randint(5, 300, (n,), generator=g) for n in row] for row in LENGTHS]
    ids = torch.stack([torch.cat([*row, torch.zeros(pad, dtype=torch.long)]) for row in docs])
    mask = (torch.arange(ids.shape[1]) < 16).long().expand_as(ids)
    document_ids = torch.stack(
        [torch.cat([torch.full((n,), 10 * r + d) for d, n in enumerate(row)] + [torch.full((pad,), 99)])
         for r, row in enumerate(LENGTHS)]
    )  # fmt: skip
    return ids, mask, document_ids, docs


def model_of(encoding: str, attention: str, head: type = Backbone) -> torch.nn.Module:
    config = ModelConfig(**{**TINY_MODEL, "position_encoding": encoding, "attention": attention})
    torch.manual_seed(0)
    return head(config).eval()


@pytest.mark.parametrize("unpadding", [False, True], ids=["padded", "unpadded"])
@pytest.mark.parametrize("pad", [0, 4], ids=["full-rows", "padding"])
@pytest.mark.parametrize(("encoding", "attention"), VARIANTS, ids=[f"{e}-{a}" for e, a in VARIANTS])
def test_a_packed_document_computes_as_the_document_alone(
    encoding: str, attention: str, pad: int, unpadding: bool
) -> None:
    model = model_of(encoding, attention)
    model.set_unpadding(unpadding)
    ids, mask, document_ids, docs = packed(pad)
    with torch.no_grad():
        x, _ = model.encode(ids, mask if pad else None, document_ids=document_ids)
        for r, row in enumerate(docs):
            start = 0
            for doc in row:
                alone, _ = model.encode(doc[None])
                torch.testing.assert_close(x[r, start : start + len(doc)], alone[0], rtol=1e-5, atol=1e-5)
                start += len(doc)
        crossing, _ = model.encode(ids, mask if pad else None)  # without document_ids the documents see each other
    assert not torch.allclose(crossing[0, 5:12], x[0, 5:12], atol=1e-4)


def test_every_head_takes_document_ids() -> None:
    """A masked LM's logits and a multiple-choice head's (B, K, T) inputs, packed or alone."""
    ids, _, document_ids, docs = packed(0)
    lm = model_of("rotary", "softmax", MaskedLM)
    with torch.no_grad():
        logits = lm(ids, document_ids=document_ids).logits
        torch.testing.assert_close(logits[1, 9:12], lm(docs[1][1][None]).logits[0], rtol=1e-5, atol=1e-5)
    choice_config = replace(lm.config, num_labels=1)
    torch.manual_seed(0)
    choices = MultipleChoice(choice_config).eval()
    with torch.no_grad():
        out = choices(ids[None], document_ids=document_ids[None]).logits
    assert out.shape == (1, 2)


def test_positions_restart_in_every_document_and_a_cache_is_refused() -> None:
    document_ids = torch.tensor([[7, 7, 7, 3, 3, 9, 9, 9, 9], [1, 1, 1, 1, 1, 1, 1, 1, 1]])
    expected = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3], list(range(9))])
    assert torch.equal(document_positions(document_ids), expected)
    from roformer.model.masks import KVCache

    model = model_of("rotary", "softmax")
    with pytest.raises(ValueError, match="document_ids cannot be combined with a cache"):
        model.encode(torch.ones(1, 9, dtype=torch.long), document_ids=document_ids[:1], cache=KVCache())
