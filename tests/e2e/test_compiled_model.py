"""torch.compile on the model: dynamo traces each relative position encoding in one graph, equal to eager.

Here, not in unit/, for the time a first compilation takes (seconds; the model maths are in unit/test_relative.py).
"""

from __future__ import annotations

import pytest
import torch
from helpers import RELATIVE, padded_batch, short_range
from torch.testing import assert_close

import roformer


@pytest.mark.parametrize("encoding", RELATIVE)
def test_compiles_without_graph_breaks(encoding: str) -> None:
    """fullgraph: dynamo traces the bias and Shaw's terms in one graph (aot_eager: the trace, not Inductor)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = roformer.MaskedLM(short_range(encoding, shaw_values=encoding == "shaw")).train()
    batch = padded_batch()
    batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    eager = model(**batch).loss
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)(**batch).loss
    assert_close(compiled, eager)
