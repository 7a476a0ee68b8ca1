"""`intermediate_size: 0`: blocks of attention alone (Zoology's models), x = LN(x + Attn(x)), and nothing else."""

from __future__ import annotations

import pytest
import torch
from helpers import padded_batch, tiny_config
from torch.testing import assert_close

import roformer
from roformer.errors import CheckpointError, ConfigError
from roformer.model.flops import encoder_parameters


def test_a_block_without_feed_forward_is_its_attention_sublayer_written_out() -> None:
    model = roformer.MaskedLM(tiny_config(intermediate_size=0)).eval()
    seen: dict[str, torch.Tensor] = {}
    layer = model.backbone.layers[1]
    layer.register_forward_hook(lambda _m, args, out: seen.update(x=args[0], out=out))
    layer.attn.register_forward_hook(lambda _m, _args, out: seen.update(attn=out))
    batch = padded_batch()
    with torch.no_grad():
        model(batch["input_ids"], attention_mask=batch["attention_mask"])
        written_out = layer.attn_norm(seen["x"] + seen["attn"])  # LN(x + Attn(x)), and no second sublayer
    assert_close(seen["out"], written_out)


def test_no_feed_forward_tensor_exists_and_the_parameter_count_says_so() -> None:
    for width in (0, 48):
        config = tiny_config(intermediate_size=width)
        model = roformer.MaskedLM(config)
        names = [name for name, _ in model.named_parameters()]
        assert any("ffn" in name for name in names) == (width > 0)
        assert encoder_parameters(config) == sum(p.numel() for n, p in model.named_parameters() if ".layers." in n)


def test_attention_only_blocks_learn_and_are_refused_by_hf_export() -> None:
    torch.manual_seed(0)
    model = roformer.MaskedLM(tiny_config(intermediate_size=0))
    batch = padded_batch()
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        loss = model(batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss
        optim.zero_grad()
        loss.backward()
        optim.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    with pytest.raises(CheckpointError, match="intermediate_size 0 cannot export"):
        roformer.to_hf(model)


def test_a_negative_width_is_refused() -> None:
    with pytest.raises(ConfigError, match="intermediate_size must be > 0, or 0 for no feed-forward layer, got -1"):
        tiny_config(intermediate_size=-1)
