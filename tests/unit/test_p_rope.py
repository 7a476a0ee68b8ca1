"""p-RoPE (roformer/model/p_rope.py) against Barbero et al. 2025's definition written out as loops, RoPE exactly at
fraction 0, no positions at fraction 1, and its settings, refusals and export as its declaration says."""

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
from roformer.model.masks import KVCache
from roformer.model.p_rope import PRopeSettings


def p_rope_config(fraction: float | None = 0.25, **fields) -> roformer.ModelConfig:
    settings = {} if fraction is None else {"p_rope": {"unrotated_fraction": fraction}}
    return tiny_config(position_encoding="p_rope", position_settings=settings, **fields)


def rotated_by_the_definition(x: torch.Tensor, fraction: float, base: float = 10000.0) -> torch.Tensor:
    """Barbero et al.'s p-RoPE of x (T, D) at positions 0..T-1, pair by pair: the first int(p D / 2) pairs
    (x_2i, x_2i+1) rotated by m theta_i, theta_i = base^(-2i/D) (RoFormer eq. 15, interleaved), p = 1 - fraction; the
    others (the lowest frequencies) as they are. float64."""
    T, D = x.shape
    kept = int((1.0 - fraction) * D // 2)
    out = x.double().clone()
    for m in range(T):
        for i in range(kept):
            theta = base ** (-2 * i / D)
            c, s = math.cos(m * theta), math.sin(m * theta)
            a, b = x[m, 2 * i].item(), x[m, 2 * i + 1].item()
            out[m, 2 * i], out[m, 2 * i + 1] = a * c - b * s, a * s + b * c
    return out


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5, 1.0])
def test_the_rotation_is_the_papers_pair_by_pair(fraction: float) -> None:
    model = roformer.Backbone(p_rope_config(fraction, hidden_size=64, num_heads=2)).eval()  # heads of 32: 16 pairs
    x = torch.randn(1, 50, 2, 32, generator=torch.Generator().manual_seed(0))  # (B, T, H, D)
    rotated = model.positions(x)
    for head in range(2):
        assert_close(rotated[0, :, head], rotated_by_the_definition(x[0, :, head], fraction).float())  # float32's
    kept = int((1.0 - fraction) * 32 // 2)
    assert torch.equal(rotated[..., 2 * kept :], x[..., 2 * kept :])  # the unrotated pairs: bit for bit


def test_a_layers_logits_are_the_rotated_q_k_over_sqrt_d() -> None:
    """Through the model: the pre-softmax logits of a layer are q_m . k_n / sqrt(d) with q and k rotated as above."""
    torch.manual_seed(0)
    model = roformer.Backbone(p_rope_config(0.25)).eval()
    ids = torch.randint(1, 100, (1, 12))
    seen = []
    module = model.layers[1].attn
    hook = module.register_forward_hook(lambda _, args, output: seen.append(args))  # (x, ctx) of the second layer
    with torch.no_grad():
        model(ids)
    hook.remove()
    ((x, ctx),) = seen
    with torch.no_grad():
        q, k, _ = module.qkv(x).view(1, 12, 3, 4, 8).unbind(2)  # (B, T, H, D): 4 heads of 8, 3 of 4 pairs rotated
        logits = attention_logits(module, x, ctx)
    for head in range(4):
        rq = rotated_by_the_definition(q[0, :, head], 0.25)
        rk = rotated_by_the_definition(k[0, :, head], 0.25)
        assert_close(logits[0, head], (rq @ rk.T / math.sqrt(8)).float())


@pytest.mark.parametrize(
    "fields", [{}, {"rotary_layout": "half"}, {"attention": "linear"}, {"attention_pattern": "causal"}], ids=str
)
def test_at_fraction_zero_it_is_rotary_exactly(fields: dict) -> None:
    batch = padded_batch()
    positions = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    logits = {}
    for name, config in {"rotary": tiny_config(**fields), "p_rope": p_rope_config(0.0, **fields)}.items():
        torch.manual_seed(0)
        model = roformer.MaskedLM(config).eval()
        with torch.no_grad():
            logits[name] = (model(**batch).logits, model(**batch, position_ids=positions).logits)
    assert all(torch.equal(a, b) for a, b in zip(logits["rotary"], logits["p_rope"], strict=True))


def test_at_fraction_zero_a_cached_decode_is_rotary_exactly() -> None:
    ids = torch.randint(1, 101, (2, 9), generator=torch.Generator().manual_seed(1))
    pieces = {}
    for name, config in {"rotary": tiny_config(), "p_rope": p_rope_config(0.0)}.items():
        torch.manual_seed(0)
        model = roformer.CausalLM(config).eval()
        cache = KVCache()
        with torch.no_grad():
            pieces[name] = torch.cat([model(ids[:, i : i + 3], cache=cache).logits for i in range(0, 9, 3)], dim=1)
    assert torch.equal(pieces["rotary"], pieces["p_rope"])


def test_at_fraction_one_there_are_no_positions() -> None:
    """Every pair unrotated: the outputs of a model without positions (the same weights), shuffled with the input."""
    torch.manual_seed(0)
    none = roformer.MaskedLM(tiny_config(position_encoding="none")).eval()
    torch.manual_seed(0)
    model = roformer.MaskedLM(p_rope_config(1.0)).eval()
    ids = torch.randint(1, 101, (1, 10))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, none(ids).logits)


def test_the_settings_default_to_a_quarter_unrotated_and_belong_to_p_rope() -> None:
    config = p_rope_config(None)
    assert config.position_settings == {"p_rope": PRopeSettings(unrotated_fraction=0.25)}
    assert roformer.MaskedLM(config).backbone.positions.rotated == 3  # of the 4 pairs of a head of 8
    assert config.to_dict()["position_settings"] == {"p_rope": {"unrotated_fraction": 0.25}}
    for fields, message in [
        ({"position_settings": {"p_rope": {"unrotated_fraction": 1.5}}}, r"unrotated_fraction must be in \[0, 1\]"),
        ({"position_settings": {"p_rope": {"fraction": 0.5}}}, "unknown key 'position_settings.p_rope.fraction'"),
        ({"rotary_value": True}, "rotary_value is only meaningful with position_encoding: rotary"),
        ({"rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_scaling is only meaningful"),
        ({"hidden_size": 36}, "p_rope needs an even head size"),
    ]:
        with pytest.raises(roformer.ConfigError, match=message):
            tiny_config(position_encoding="p_rope", **fields)
    with pytest.raises(roformer.ConfigError, match="position_settings.p_rope is only meaningful with position_enc"):
        tiny_config(position_settings={"p_rope": {"unrotated_fraction": 0.5}})  # rotary


def test_a_saved_model_loads_with_its_fraction_and_the_hf_export_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    model = roformer.MaskedLM(p_rope_config(0.5))
    model.save(tmp_path / "m")
    loaded = roformer.load(tmp_path / "m")
    assert loaded.config.position_settings["p_rope"].unrotated_fraction == 0.5
    batch = padded_batch()
    with torch.no_grad():
        assert torch.equal(loaded(**batch).logits, model.eval()(**batch).logits)
    assert main(["convert", "--to-hf", str(tmp_path / "m"), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "have no p_rope positions" in err and not (tmp_path / "hf").exists()


def test_the_half_layout_is_the_interleaved_one_after_the_permutation() -> None:
    """A layout change permutes q/k rows (the declaration says it rotates): the outputs stay the same."""
    torch.manual_seed(0)
    model = roformer.MaskedLM(p_rope_config(0.25)).eval()
    half = roformer.convert_rotary_layout(model, "half")
    batch = padded_batch()
    with torch.no_grad():
        assert_close(half(**batch).logits, model(**batch).logits)
