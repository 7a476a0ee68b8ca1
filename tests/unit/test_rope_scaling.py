"""RoPE context scaling (linear / NTK / YaRN) against transformers' own `modeling_rope_utils`, and partial rotary."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import tiny_config
from torch.testing import assert_close
from transformers import LlamaConfig
from transformers.modeling_rope_utils import (
    _compute_dynamic_ntk_parameters,
    _compute_linear_scaling_rope_parameters,
    _compute_yarn_parameters,
)

import roformer
from roformer.errors import CheckpointError, ConfigError
from roformer.model.config import ModelConfig, RopeScaling
from roformer.model.rotary import RotaryEmbedding, rotary_frequencies

HEAD = 64


def hf_config(rope: dict, partial: float = 1.0, max_positions: int = 512) -> LlamaConfig:
    parameters = {"rope_theta": 10000.0, **rope}
    if partial != 1.0:
        parameters["partial_rotary_factor"] = partial
    return LlamaConfig(
        hidden_size=HEAD * 4, num_attention_heads=4, max_position_embeddings=max_positions, rope_parameters=parameters
    )


def ours(dim: int, scaling: RopeScaling) -> tuple[torch.Tensor, float]:
    inv_freq, magnitude = rotary_frequencies(dim, 10000.0, scaling)
    return inv_freq.float(), magnitude


@pytest.mark.parametrize("factor", [1.0, 2.0, 4.0, 16.0])
@pytest.mark.parametrize("partial", [1.0, 0.25])
def test_linear_equals_transformers(factor: float, partial: float) -> None:
    expected, attention = _compute_linear_scaling_rope_parameters(
        hf_config({"rope_type": "linear", "factor": factor}, partial), "cpu"
    )
    got, magnitude = ours(int(HEAD * partial), RopeScaling(type="linear", factor=factor))
    assert_close(got, expected)
    assert magnitude == attention == 1.0


@pytest.mark.parametrize("factor", [2.0, 4.0, 16.0])
@pytest.mark.parametrize("partial", [1.0, 0.25])
def test_ntk_equals_transformers_dynamic_ntk_at_the_scaled_length(factor: float, partial: float) -> None:
    """Static NTK-aware scaling is HF's dynamic NTK (alpha 1) evaluated at factor x the trained length."""
    trained = 128
    config = hf_config({"rope_type": "dynamic", "factor": 1.0}, partial, max_positions=trained)
    expected, _ = _compute_dynamic_ntk_parameters(config, "cpu", seq_len=int(factor * trained))
    got, magnitude = ours(int(HEAD * partial), RopeScaling(type="ntk", factor=factor))
    assert_close(got, expected)
    assert magnitude == 1.0
    assert_close(got[0], torch.tensor(1.0))  # the highest frequency is kept...
    assert got[-1].item() == pytest.approx(10000.0 ** (-(HEAD * partial - 2) / (HEAD * partial)) / factor, rel=1e-5)


@pytest.mark.parametrize("factor", [2.0, 4.0, 16.0])
@pytest.mark.parametrize("original", [128, 512])
@pytest.mark.parametrize("betas", [(32.0, 1.0), (16.0, 2.0)])
@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_yarn_equals_transformers(factor: float, original: int, betas: tuple[float, float], partial: float) -> None:
    rope = {
        "rope_type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": original,
        "beta_fast": betas[0],
        "beta_slow": betas[1],
    }
    expected, attention = _compute_yarn_parameters(hf_config(rope, partial), "cpu")
    scaling = RopeScaling(
        type="yarn", factor=factor, original_max_position=original, beta_fast=betas[0], beta_slow=betas[1]
    )
    got, magnitude = ours(int(HEAD * partial), scaling)
    assert_close(got, expected)
    assert magnitude == pytest.approx(attention) and magnitude == pytest.approx(0.1 * math.log(factor) + 1)


def test_yarn_magnitude_scales_scores_by_its_square() -> None:
    scaling = RopeScaling(type="yarn", factor=4.0, original_max_position=128, attention_factor=1.5)
    plain = RotaryEmbedding(
        16, scaling=RopeScaling(type="yarn", factor=4.0, original_max_position=128, attention_factor=1.0)
    )
    scaled = RotaryEmbedding(16, scaling=scaling)
    q = torch.randn(1, 50, 2, 16)
    qp, qs = plain(q), scaled(q)
    assert_close(qs, qp * 1.5)
    assert_close((qs[0, 3] * qs[0, 40]).sum(-1), (qp[0, 3] * qp[0, 40]).sum(-1) * 2.25)


def test_partial_rotary_rotates_only_the_first_features() -> None:
    rope = RotaryEmbedding(16)  # 16 of 64 features rotated
    x = torch.randn(2, 30, 3, HEAD)
    y = rope(x)
    assert torch.equal(y[..., 16:], x[..., 16:])
    assert_close(y[..., :16], RotaryEmbedding(16)(x[..., :16].contiguous()))
    assert not torch.allclose(y[:, 1:, :, :16], x[:, 1:, :, :16])


def wide_config(**overrides) -> ModelConfig:
    """The tiny model with 2 heads of 32 features (room for a partial rotary_dim), 1 layer, vocabulary 100."""
    return tiny_config(
        **{"vocab_size": 100, "hidden_size": 64, "num_layers": 1, "num_heads": 2, "intermediate_size": 64, **overrides}
    )


def test_partial_rotary_model_scores_stay_relative() -> None:
    """Shift every position by s (left-pad with a prefix that nothing attends to is not possible; rotate directly)."""
    config = wide_config(rotary_dim=8)
    model = roformer.MaskedLM(config).eval()
    assert model.backbone.rotary.dim == 8
    q, k = torch.randn(2, 32), torch.randn(2, 32)
    seq = torch.zeros(1, 60, 2, 32)
    rope = model.backbone.rotary
    for m, n, s in [(3, 10, 0), (3, 10, 25), (40, 7, 12)]:
        seq.zero_()
        seq[0, m + s, 0], seq[0, n + s, 1] = q[0], k[0]
        rotated = rope(seq)
        score = (rotated[0, m + s, 0] * rotated[0, n + s, 1]).sum()
        seq.zero_()
        seq[0, m, 0], seq[0, n, 1] = q[0], k[0]
        rotated = rope(seq)
        assert_close(score, (rotated[0, m, 0] * rotated[0, n, 1]).sum(), rtol=1e-5, atol=1e-5)


def test_new_fields_are_validated_saved_and_loaded(tmp_path) -> None:
    with pytest.raises(ConfigError, match="rotary_dim"):
        ModelConfig(hidden_size=64, num_heads=2, rotary_dim=7)
    with pytest.raises(ConfigError, match="rotary_dim"):
        ModelConfig(hidden_size=64, num_heads=2, rotary_dim=64)
    with pytest.raises(ConfigError, match="rotary_dim is only meaningful"):
        ModelConfig(position_encoding="sinusoidal", rotary_dim=16)
    with pytest.raises(ConfigError, match="rope_scaling.factor"):
        ModelConfig(rope_scaling={"type": "linear", "factor": 0.5})
    with pytest.raises(ConfigError, match="original_max_position"):
        ModelConfig(rope_scaling={"type": "yarn", "factor": 4})
    with pytest.raises(ConfigError, match="unknown key 'model.rope_scaling.fator'"):
        roformer.config.from_dict(
            roformer.model.config.ModelConfig, {"rope_scaling": {"fator": 2}}, "m.yaml", prefix="model."
        )
    with pytest.raises(ConfigError, match="attention"):
        ModelConfig(attention="performer")
    yarn = {"type": "yarn", "factor": 4, "original_max_position": 128}
    with pytest.raises(ConfigError, match="yarn cannot be used with attention: linear"):  # its magnitude is in the
        ModelConfig(hidden_size=64, num_heads=2, attention="linear", rope_scaling=yarn)  # tables: eq. 19 scaled by m^2
    for attention, scaling in (("softmax", yarn), ("linear", {"type": "ntk", "factor": 4})):
        config = wide_config(rotary_dim=16, attention=attention, rope_scaling=scaling)
        model = roformer.MaskedLM(config)
        model.save(tmp_path / attention)
        loaded = roformer.load(tmp_path / attention)
        assert loaded.config == config and loaded.config.rope_scaling.type == scaling["type"]
        ids = torch.randint(5, 100, (2, 20))
        assert_close(loaded.eval()(ids).logits, model.eval()(ids).logits)


@pytest.mark.parametrize(
    "fields, reason",
    [
        ({"rotary_dim": 16}, "rotary_dim"),
        ({"rope_scaling": {"type": "linear", "factor": 2}}, "rope_scaling"),
        ({"attention": "linear"}, "linear attention"),
    ],
)
def test_hf_export_refuses_what_hf_roformer_cannot_express(fields: dict, reason: str) -> None:
    config = wide_config(**fields)
    with pytest.raises(CheckpointError, match=reason):
        roformer.to_hf(roformer.MaskedLM(config))


def test_eval_variants_share_weights_and_differ_only_beyond_the_trained_length() -> None:
    from roformer.study.length_eval import scaled

    config = wide_config(num_layers=2, initializer_range=0.3)
    model = roformer.MaskedLM(config).eval()
    ids = torch.randint(5, 100, (1, 128))
    logits = {}
    for method in ("none", "linear", "ntk", "yarn"):
        at_trained, _ = scaled(model, method, None, 32, trained=32)
        assert_close(at_trained(ids[:, :32]).logits, model(ids[:, :32]).logits)  # factor 1: the paper's tables
        variant, label = scaled(model, method, None, 128, trained=32)
        assert label == ("none" if method == "none" else f"{method} x4")
        assert all(torch.equal(a, b) for a, b in zip(variant.parameters(), model.parameters(), strict=True))
        logits[method] = variant(ids).logits
    for a in logits:
        for b in logits:
            if a < b:
                assert not torch.allclose(logits[a], logits[b], atol=1e-3), (a, b)
