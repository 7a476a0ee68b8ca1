"""Shared fixtures: tiny model configs and the location of the real data in ../shared (optional)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never download; fail fast instead of hanging
import tempfile

# The packed-data cache of the tests lives in a fresh directory, never in the user's ~/.cache/roformer.
os.environ["ROFORMER_CACHE"] = tempfile.mkdtemp(prefix="roformer-test-cache-")
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import roformer

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("ROFORMER_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture
def shared_data() -> Path:
    """../shared/data, or skip: a fresh clone does not have it."""
    if not SHARED_DATA.is_dir():
        pytest.skip(
            f"real data not found at {SHARED_DATA} (set ROFORMER_SHARED_DATA or place ../shared beside the repo)"
        )
    return SHARED_DATA


def tiny_config(**overrides) -> roformer.ModelConfig:
    """A 2-layer model that runs in milliseconds."""
    fields = dict(
        vocab_size=101,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        intermediate_size=48,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        max_position_embeddings=64,
    )
    fields.update(overrides)
    return roformer.ModelConfig(**fields)


def assert_checkpointing_changes_nothing(build: Callable[[], roformer.Model], batch: dict) -> roformer.Model:
    """Activation checkpointing off and on from the same weights and dropout masks: the same loss, exactly, and the
    same gradients. Returns the second model."""
    results = []
    for on in (False, True):
        torch.manual_seed(0)
        model = build().train()
        model.set_gradient_checkpointing(on)
        torch.manual_seed(1)  # the same dropout masks
        loss = model(**batch).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (loss_off, grads_off), (loss_on, grads_on) = results
    assert torch.equal(loss_off, loss_on)
    for name, grad in grads_off.items():
        torch.testing.assert_close(grads_on[name], grad, msg=name)
    return model


def padded_batch(vocab_size: int = 101, batch: int = 3, length: int = 19, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random ids with right padding of different lengths and two token types."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab_size, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row, keep in enumerate(range(length, 0, -max(1, length // batch))):
        if row < batch:
            mask[row, keep:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    types = torch.zeros_like(ids)
    types[:, length // 2 :] = 1
    types = types * mask
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
