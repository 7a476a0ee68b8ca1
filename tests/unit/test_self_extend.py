"""SelfExtend (`rope_scaling: {type: self_extend}`, Jin et al. 2024) for a bidirectional encoder: its distances written
out, and the cases where it must equal plain RoPE."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from helpers import TINY_MODEL

from roformer.errors import ConfigError
from roformer.model.config import ModelConfig, RopeScaling
from roformer.model.model import Backbone
from roformer.model.rotary import GroupedRotation, RotaryEmbedding
from roformer.study.length_eval import parse_rope_scalings
from roformer.tasks.extensions import default_factor


def grouped(window: int, group: int, dim: int = 16) -> GroupedRotation:
    return GroupedRotation(RotaryEmbedding(dim), None, window, group)


def test_far_keys_are_seen_at_grouped_distances_that_continue_after_the_window() -> None:
    """One q and one k vector at every position: a rotary logit is a function of the distance alone, so each entry of
    SelfExtend's logits must equal the plain logit at the distance the method assigns (its eqs., bidirectional)."""
    torch.manual_seed(0)
    T, window, group = 40, 6, 3
    q = torch.randn(1, 1, 1, 16).expand(1, T, 1, 16)
    k = torch.randn(1, 1, 1, 16).expand(1, T, 1, 16)
    plain = grouped(T, 1).logits(q, k)[0, 0]  # a window over everything: true distances
    extended = grouped(window, group).logits(q, k)[0, 0]
    shift = window - window // group

    def at_distance(d: int) -> torch.Tensor:  # the plain logit of a query d positions after its key (d < 0: before)
        return plain[d, 0] if d >= 0 else plain[0, -d]

    for i in range(T):
        for j in range(T):
            if abs(i - j) <= window:
                d = i - j
            elif j < i:
                d = i // group + shift - j // group
            else:
                d = i // group - (j // group + shift)
            torch.testing.assert_close(extended[i, j], at_distance(d))
    farthest = window + (T - 1 - window) // group + 1
    assert max(abs(i // group - j // group) + shift for i in range(T) for j in range(T)) <= farthest


@pytest.mark.parametrize(("length", "window", "group"), [(12, 11, 4), (48, 8, 1)], ids=["within-window", "group-1"])
def test_self_extend_equals_plain_rope_where_it_changes_nothing(length: int, window: int, group: int) -> None:
    config = ModelConfig(**{**TINY_MODEL, "position_encoding": "rotary"})
    torch.manual_seed(0)
    plain = Backbone(config).eval()
    scaling = RopeScaling(type="self_extend", factor=group, window=window)
    torch.manual_seed(0)
    extended = Backbone(replace(config, rope_scaling=scaling)).eval()
    ids = torch.randint(5, 300, (2, length))
    mask = torch.ones_like(ids).index_fill(1, torch.tensor([length - 1]), 0)
    torch.testing.assert_close(extended.encode(ids, mask)[0], plain.encode(ids, mask)[0])


def test_self_extend_changes_a_long_input_and_is_refused_where_it_cannot_apply() -> None:
    config = ModelConfig(**{**TINY_MODEL, "position_encoding": "rotary"})
    torch.manual_seed(0)
    plain = Backbone(config).eval()
    with torch.no_grad():  # sharper attention than at initialisation, where every key weighs about the same
        for name, weight in plain.named_parameters():
            weight.mul_(10.0 if name.endswith("qkv.weight") else 1.0)
    extended = Backbone(replace(config, rope_scaling=RopeScaling(type="self_extend", factor=4, window=8))).eval()
    extended.load_state_dict(plain.state_dict())
    ids = torch.randint(5, 300, (1, 64))
    assert not torch.allclose(extended.encode(ids)[0], plain.encode(ids)[0], atol=1e-4)
    with pytest.raises(ConfigError, match="needs window or original_max_position"):
        RopeScaling(type="self_extend", factor=2)
    with pytest.raises(ConfigError, match="self_extend groups q.k distances"):
        replace(config, attention="linear", rope_scaling=RopeScaling(type="self_extend", factor=2, window=8))


def test_eval_mlm_takes_self_extend_with_the_group_that_keeps_distances_trained() -> None:
    assert parse_rope_scalings("none,self_extend,self_extend:4") == [
        ("none", None),
        ("self_extend", None),
        ("self_extend", 4.0),
    ]
    assert default_factor("self_extend", 128, 128) == 1.0
    group = default_factor("self_extend", 1024, 128)  # window 64: 64 + 959 / G <= 127
    assert group == 16.0 and 64 + (1023 - 64) / group <= 127 < 64 + (1023 - 64) / (group - 1)
    assert default_factor("yarn", 1024, 128) == 8.0
