"""torch.compile on the model: dynamo traces each relative position encoding in one graph, equal to eager.

Here, not in unit/, for the time a first compilation takes (seconds; the model maths are in unit/test_relative.py).
"""

from __future__ import annotations

import pytest
import torch
from helpers import BIASED, padded_batch, short_range
from torch.testing import assert_close

import roformer


@pytest.mark.parametrize("encoding", BIASED)
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


@pytest.mark.parametrize("encoding", ["rotary", "sinusoidal"])
def test_a_training_model_with_dropout_compiles_once_in_one_graph(encoding: str) -> None:
    """CPU dropout draws its own mask in eager mode only (an in-place draw would break the graph), and the position
    tables exist before the first call (one created inside it changed the module: a second compilation)."""
    torch._dynamo.reset()
    config = roformer.ModelConfig(vocab_size=100, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                                  position_encoding=encoding, hidden_dropout=0.1, attention_dropout=0.1)  # fmt: skip
    model = roformer.MaskedLM(config).train()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    ids = torch.randint(5, 100, (2, 16))
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(2):
            compiled(ids, labels=ids).loss.backward()
