"""FIRE (roformer/model/fire.py) against Li et al. 2023's equation written out as loops, in the bidirectional form the
module documents, and its progressive interpolation, settings, refusals and export as its declaration says."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from helpers import padded_batch, tiny_config
from torch.testing import assert_close

import roformer
from roformer.cli import main
from roformer.model.attention import attention_logits
from roformer.model.fire import FLOOR, FireBias, FireSettings


def fire_config(**settings) -> roformer.ModelConfig:
    return tiny_config(position_encoding="fire", position_settings={"fire": settings})


def randomised(fire: FireBias, seed: int = 0) -> FireBias:
    """The module with weights of a trained size (the BERT init's are 0.02), c and L moved off their initial values."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (fire.hidden.weight, fire.hidden.bias, fire.out.weight, fire.out.bias):
            p.copy_(torch.randn(p.shape, generator=g))
        fire.c.fill_(-0.3)  # enters as |c|
        fire.threshold_scale.fill_(0.02)  # L = 0.02 x 512 = 10.24: queries beyond it are interpolated
    return fire


def bias_by_the_equation(fire: FireBias, queries: list[int], keys: list[int]) -> torch.Tensor:
    """b_h(i, j) = f( psi(|i - j|) / psi(max(L, i)), sign(j - i) )_h, psi(x) = log(|c| x + 1), f = W2 relu(W1 u + b1)
    + b2, pair by pair and head by head in float64 (the normaliser floored at FLOOR). -> (H, T, S)."""
    c, L = abs(fire.c.item()), abs(fire.threshold_scale.item() * fire.init_threshold)
    W1, b1 = fire.hidden.weight.double(), fire.hidden.bias.double()
    W2, b2 = fire.out.weight.double(), fire.out.bias.double()

    def psi(x: float) -> float:
        return math.log(c * x + 1)

    H = W2.shape[0]
    out = torch.zeros(H, len(queries), len(keys), dtype=torch.float64)
    for a, i in enumerate(queries):
        for b, j in enumerate(keys):
            u = torch.tensor(
                [psi(abs(i - j)) / max(psi(max(L, i)), FLOOR), float((j > i) - (j < i))], dtype=torch.float64
            )
            hidden = torch.relu(W1 @ u + b1)
            for h in range(H):
                out[h, a, b] = W2[h] @ hidden + b2[h]
    return out


def test_the_bias_is_the_papers_equation_pair_by_pair() -> None:
    fire = randomised(roformer.Backbone(fire_config()).fire)
    positions = torch.arange(30)
    with torch.no_grad():
        got = fire.bias(positions, positions)  # (1, H, T, S)
    assert got.shape == (1, 4, 30, 30) and got.dtype == torch.float32
    assert_close(got[0], bias_by_the_equation(fire, list(range(30)), list(range(30))).float())


def test_per_row_positions_and_a_cache_s_keys_are_the_equation_too() -> None:
    """Given positions (B, T) and keys (B, S) (left padding, packed documents, a cached decode): per row."""
    fire = randomised(roformer.Backbone(fire_config()).fire, seed=1)
    queries = torch.tensor([[5, 6, 7], [40, 41, 42]])
    keys = torch.tensor([[0, 3, 5, 6, 7], [38, 39, 40, 41, 42]])
    with torch.no_grad():
        got = fire.bias(queries, keys)  # (B, H, T, S)
    for row in range(2):
        expected = bias_by_the_equation(fire, queries[row].tolist(), keys[row].tolist())
        assert_close(got[row], expected.float())


def test_a_layers_logits_are_q_k_over_sqrt_d_plus_the_bias() -> None:
    torch.manual_seed(0)
    model = roformer.Backbone(fire_config()).eval()
    randomised(model.fire)
    batch = padded_batch(length=10)
    seen = []
    module = model.layers[1].attn
    hook = module.register_forward_hook(lambda _, args, output: seen.append(args))
    with torch.no_grad():
        model(**batch)
        hook.remove()
        ((x, ctx),) = seen
        logits = attention_logits(module, x, ctx)
        q, k, _ = module.qkv(x).view(3, 10, 3, 4, 8).unbind(2)  # (B, T, H, D): no rotation
    expected = torch.einsum("bmhd,bnhd->bhmn", q, k) / math.sqrt(8)
    expected = expected + bias_by_the_equation(model.fire, list(range(10)), list(range(10))).float()
    keep = batch["attention_mask"].bool()[:, None, None, :]
    assert_close(logits, expected.masked_fill(~keep, float("-inf")))


def test_progressive_interpolation_maps_a_querys_distances_into_the_unit_interval() -> None:
    """Beyond L the normaliser is the query's own position: a causal query's distances lie in [0, 1] at any length,
    and the bias is shift-invariant only while the queries stay below L."""
    fire = roformer.Backbone(fire_config(init_threshold=16.0)).fire
    positions = torch.arange(4096)
    with torch.no_grad():
        u = fire.features(positions[-8:], positions)[..., 0]  # the last 8 queries of 4096
        near = fire.bias(torch.arange(10), torch.arange(10))
        shifted = fire.bias(torch.arange(10) + 5, torch.arange(10) + 5)  # still below L = 16
        beyond = fire.bias(torch.arange(10) + 100, torch.arange(10) + 100)
    assert 0.0 <= u.min() and u.max() <= 1.0 and u[:, 0].max() > 0.99  # the first key: the whole range
    assert torch.equal(near, shifted) and not torch.allclose(near, beyond)


def test_the_settings_belong_to_fire_and_linear_attention_is_refused() -> None:
    config = tiny_config(position_encoding="fire")
    assert config.position_settings == {"fire": FireSettings()} and FireSettings() == FireSettings(32, 0.1, 512.0)
    fire = roformer.Backbone(fire_config(width=8, init_c=0.5, init_threshold=64.0)).fire
    assert fire.hidden.out_features == 8 and fire.c.item() == 0.5 and fire.threshold().item() == 64.0
    for fields, message in [
        ({"attention": "linear"}, "attention: linear has no attention logits to bias: fire needs softmax"),
        ({"position_settings": {"fire": {"width": 0}}}, "width must be >= 1"),
        ({"position_settings": {"fire": {"unrotated_fraction": 0.5}}}, "unknown key 'position_settings.fire.unrot"),
        ({"position_settings": {"p_rope": {}}}, "position_settings.p_rope is only meaningful with position_encoding"),
        ({"alibi_form": "asymmetric"}, "alibi_form is only meaningful with position_encoding: alibi"),
    ]:
        with pytest.raises(roformer.ConfigError, match=message):
            tiny_config(position_encoding="fire", **fields)


def test_its_weights_are_saved_and_the_hf_export_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    model = roformer.MaskedLM(fire_config(width=8))
    randomised(model.backbone.fire)
    model.save(tmp_path / "m")
    loaded = roformer.load(tmp_path / "m")
    assert {k for k in loaded.state_dict() if ".fire." in k} == {
        f"backbone.fire.{name}"
        for name in ("c", "threshold_scale", "hidden.weight", "hidden.bias", "out.weight", "out.bias")
    }
    batch = padded_batch()
    with torch.no_grad():
        assert torch.equal(loaded(**batch).logits, model.eval()(**batch).logits)
    assert main(["convert", "--to-hf", str(tmp_path / "m"), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "have no fire positions" in err and not (tmp_path / "hf").exists()


def test_a_bf16_model_computes_the_bias_in_float32() -> None:
    model = roformer.MaskedLM(fire_config()).eval()
    with torch.no_grad():
        full = model(**padded_batch()).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = model(**padded_batch()).logits
        bias = model.to(torch.bfloat16).backbone.fire.bias(torch.arange(5), torch.arange(5))
    assert bias.dtype == torch.float32 and half.dtype == torch.bfloat16
    assert_close(half.float(), full, atol=0.05, rtol=0.05)
