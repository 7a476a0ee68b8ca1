"""`attention_logits`: a layer's pre-softmax logits, checked against the layer itself.

softmax of the logits, times the layer's own values (plus Shaw's a^V terms), through its output projection, must be
what the layer returned in the model's forward, for every position encoding and attention pattern.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import ENCODINGS, padded_batch, short_range, tiny_config
from torch.testing import assert_close

import roformer
from roformer.model.attention import AttentionContext, SelfAttention, attention_logits, masked_softmax
from roformer.model.config import RopeScaling
from roformer.model.rotary import rotate_qkv

SELF_EXTEND = RopeScaling(type="self_extend", factor=2, window=4)
CASES = {encoding: {"position_encoding": encoding} for encoding in ENCODINGS} | {  # every declared one, and variants
    "rotary-value": {"rotary_value": True},
    "rotary-partial": {"rotary_dim": 4},
    "rotary-half": {"rotary_layout": "half"},
    "self-extend": {"rope_scaling": SELF_EXTEND},
    "shaw-values": {"position_encoding": "shaw", "shaw_values": True},
}
PATTERNS = ["bidirectional", "causal", "unilm"]


def layer_calls(model: roformer.Model, batch: dict[str, torch.Tensor]) -> list[tuple[Any, ...]]:
    """(attention module, input, context, output) of every layer in one forward of `model`."""
    calls: list[tuple[Any, ...]] = []

    def record(module: SelfAttention, args: tuple[Any, ...], output: torch.Tensor) -> None:
        calls.append((module, *args, output))

    hooks = [block.attn.register_forward_hook(record) for block in model.base_model.layers]
    with torch.no_grad():
        model(**batch)
    for hook in hooks:
        hook.remove()
    return calls


def through_the_value_path(module: SelfAttention, x: torch.Tensor, ctx: AttentionContext, logits: torch.Tensor):
    """softmax(logits) v (+ Shaw's value terms), projected: what the layer returns if the logits are its own."""
    qkv = ctx.to_attention(module.qkv(x), module.num_heads, module.head_size)
    _, _, v = rotate_qkv(qkv, ctx.rotary if ctx.kernel != "grouped" else None, module.rotary_value)
    probs = masked_softmax(logits)  # (B, H, T, T)
    y = probs @ v.transpose(1, 2).float()
    shaw = ctx.shaw_terms()
    if shaw is not None and shaw.values is not None:
        y = y + shaw.value_terms(probs)
    return module.proj(ctx.from_attention(y.transpose(1, 2)))


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
def test_softmax_of_the_logits_is_the_layers_own_attention(case: str, pattern: str, padded: bool) -> None:
    fields = dict(CASES[case])
    encoding = fields.pop("position_encoding", "rotary")
    torch.manual_seed(0)
    config = short_range(encoding, **{**fields, "attention_pattern": pattern, "type_vocab_size": 2})
    model = roformer.Backbone(config).eval()
    batch = padded_batch(length=12)
    if not padded:
        batch = {"input_ids": batch["input_ids"].clamp(min=1), "token_type_ids": batch["token_type_ids"]}
    calls = layer_calls(model, batch)
    assert len(calls) == config.num_layers
    for module, x, ctx, output in calls:
        logits = attention_logits(module, x, ctx)
        assert logits.shape == (3, config.num_heads, 12, 12) and logits.dtype == torch.float32
        with torch.no_grad():
            assert_close(through_the_value_path(module, x, ctx, logits), output, rtol=1e-5, atol=1e-5)


def test_a_causal_self_extend_layer_attends_as_its_logits_say() -> None:
    """The grouped kernel once dropped `ctx.causal`: a causal SelfExtend model attended ahead."""
    torch.manual_seed(0)
    model = roformer.Backbone(tiny_config(rope_scaling=SELF_EXTEND, attention_pattern="causal")).eval()
    ids = torch.randint(1, 100, (2, 12))
    for module, x, ctx, output in layer_calls(model, {"input_ids": ids}):
        with torch.no_grad():
            expected = through_the_value_path(module, x, ctx, attention_logits(module, x, ctx))
        assert_close(expected, output, rtol=1e-5, atol=1e-5)


def test_the_logits_are_q_k_over_sqrt_d_plus_what_the_encoding_adds() -> None:
    """ALiBi: the layer's q.k / sqrt(D) (no positions in q and k) minus slope x |m - n|; padding keys -inf."""
    torch.manual_seed(0)
    model = roformer.Backbone(tiny_config(position_encoding="alibi")).eval()
    batch = padded_batch(length=10)
    module, x, ctx, _ = layer_calls(model, batch)[1]
    logits = attention_logits(module, x, ctx)
    q, k, _ = module.qkv(x).view(3, 10, 3, 4, 8).unbind(2)  # (B, T, H, D): 4 heads of 8
    slopes = torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8])  # Press et al.: 2^(-8 i / n), n = 4
    distance = (torch.arange(10)[:, None] - torch.arange(10)[None, :]).abs()
    expected = torch.einsum("bmhd,bnhd->bhmn", q, k) / 8**0.5 - slopes[:, None, None] * distance
    keep = batch["attention_mask"].bool()[:, None, None, :]
    assert_close(logits, expected.masked_fill(~keep, float("-inf")))


def test_linear_attention_has_no_logits() -> None:
    model = roformer.Backbone(tiny_config(attention="linear")).eval()
    module, x, ctx, _ = layer_calls(model, {"input_ids": torch.randint(1, 100, (1, 8))})[0]
    with pytest.raises(ValueError, match="linear attention has no softmax logits"):
        attention_logits(module, x, ctx)
