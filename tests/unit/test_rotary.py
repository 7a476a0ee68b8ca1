"""RoPE against the paper's explicit rotation matrix and its defining properties."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import paper_rotation_matrix
from torch.testing import assert_close

import roformer
from roformer.model.model import rotary_permutation
from roformer.model.positions import SinusoidalPositions
from roformer.model.rotary import RotaryEmbedding, apply_rotary


def rotate_at(x: torch.Tensor, positions: list[int], layout: str = "interleaved") -> torch.Tensor:
    """Rotate each row x[i] (N, d) as the vector at position positions[i] of a sequence."""
    rope = RotaryEmbedding(x.shape[-1], layout=layout)
    rows = []
    for row, p in zip(x, positions, strict=True):
        seq = torch.zeros(1, p + 1, x.shape[-1], dtype=x.dtype)
        seq[0, p] = row
        rows.append(rope(seq)[0, p])
    return torch.stack(rows)


@pytest.mark.parametrize("d", [2, 8, 64, 128])
@pytest.mark.parametrize("m", [0, 1, 7, 100, 511])
def test_equals_paper_rotation_matrix(d: int, m: int) -> None:
    x = torch.randn(3, d, dtype=torch.float64)
    expected = x @ paper_rotation_matrix(d, m).T  # R x for each row
    assert_close(rotate_at(x.float(), [m, m, m]), expected.float())


def test_preserves_norm() -> None:
    x = torch.randn(1, 300, 2, 64)
    y = RotaryEmbedding(64)(x)
    assert_close(y.norm(dim=-1), x.norm(dim=-1))


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_scores_depend_only_on_relative_position(layout: str) -> None:
    """<R_m q, R_n k> = g(q, k, m - n) (paper eq. 11/16): shift both positions, the score stays (to fp32 tables)."""
    q, k = torch.randn(2, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).unbind(0)
    scores = {}
    for m, n in [(5, 2), (105, 102), (1000, 997), (3, 7), (503, 507)]:
        rq, rk = rotate_at(torch.stack([q, k]), [m, n], layout)
        scores[(m, n)] = float(rq @ rk)
    # relative to |q||k|, the score's scale: a score that nearly cancels would make a relative bound meaningless
    tolerance = 1e-6 * float(q.norm() * k.norm())
    assert scores[(5, 2)] == pytest.approx(scores[(105, 102)], abs=tolerance)
    assert scores[(5, 2)] == pytest.approx(scores[(1000, 997)], abs=tolerance)
    assert scores[(3, 7)] == pytest.approx(scores[(503, 507)], abs=tolerance)
    assert scores[(5, 2)] != pytest.approx(scores[(3, 7)])


def test_layouts_give_identical_scores_after_permutation() -> None:
    T, d = 50, 32
    q, k = torch.randn(2, 1, T, d).unbind(0)
    perm = rotary_permutation(d)
    inter = RotaryEmbedding(d, layout="interleaved")
    half = RotaryEmbedding(d, layout="half")
    scores_inter = inter(q) @ inter(k).transpose(-1, -2)
    scores_half = half(q[..., perm]) @ half(k[..., perm]).transpose(-1, -2)
    assert_close(scores_half, scores_inter)
    assert not torch.allclose(half(q) @ half(k).transpose(-1, -2), scores_inter)  # the permutation is needed


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_input_uses_float32_tables(dtype: torch.dtype) -> None:
    d, m = 64, 100_000
    rope = RotaryEmbedding(d)
    cos, sin = rope.cos_sin(m + 1, torch.device("cpu"))
    assert cos.dtype == torch.float32
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = m * theta
    assert (cos[m].double() - angles.cos()).abs().max() < 1e-6
    assert (sin[m].double() - angles.sin()).abs().max() < 1e-6
    # the rotated low-precision vector equals the float64 rotation, rounded once to the input dtype
    x = torch.randn(1, m + 1, d).to(dtype)
    y = rope(x)[0, m]
    assert y.dtype == dtype
    expected = (x[0, m].double() @ paper_rotation_matrix(d, m).T).to(dtype)
    assert_close(y, expected, atol=0, rtol=0) if dtype == torch.float16 else assert_close(y, expected)


def test_model_cast_does_not_cast_tables() -> None:
    rope = RotaryEmbedding(16).to(torch.bfloat16)
    assert rope.rotations(10, torch.device("cpu")).dtype == torch.complex64
    assert list(rope.state_dict()) == []  # nothing to save: derived from config


def test_no_length_limit_and_growth_keeps_values() -> None:
    rope = RotaryEmbedding(16)
    short = rope.rotations(10, torch.device("cpu")).clone()
    long = rope.rotations(5000, torch.device("cpu"))
    assert long.shape == (5000, 8)
    assert_close(long[:10], short)
    table = SinusoidalPositions(16, scale=1.0)
    assert table(9000, torch.device("cpu"), torch.float32).shape == (9000, 16)


def test_sinusoidal_table_is_vaswani() -> None:
    table = SinusoidalPositions(8, scale=1.0).table(20, torch.device("cpu"))
    pos, i = 13, 2
    angle = pos / 10000 ** (2 * i / 8)
    assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-7)
    assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-7)


def test_apply_rotary_half_layout_matches_neox_formula() -> None:
    x = torch.randn(2, 9, 3, 16)
    rot = RotaryEmbedding(16).rotations(9, torch.device("cpu"))
    cos = torch.cat([rot.real, rot.real], -1)[None, :, None]
    sin = torch.cat([rot.imag, rot.imag], -1)[None, :, None]
    x1, x2 = x.chunk(2, -1)
    expected = x * cos + torch.cat([-x2, x1], -1) * sin  # GPT-NeoX rotate_half
    assert_close(apply_rotary(x, rot, "half"), expected)


def test_compiled_rotary_matches_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torch.compile the rotation takes a real-arithmetic path; it must equal the complex one in both layouts."""
    from roformer.model.rotary import RotaryEmbedding

    for layout in ("interleaved", "half"):
        rotary = RotaryEmbedding(16, layout=layout)
        x = torch.randn(2, 10, 3, 16)
        eager = rotary(x)
        with monkeypatch.context() as m:
            m.setattr(torch.compiler, "is_compiling", lambda: True)
            torch.testing.assert_close(rotary(x), eager)


def test_position_tables_follow_the_model_to_another_device_and_stay_float32() -> None:
    """The tables are plain attributes (a bf16 cast must not reach them) that move with the model: a compiled model
    whose tables stayed behind rebuilt them in its first call, and compiled again."""
    for encoding, tables in (("rotary", "_real_cache"), ("sinusoidal", "_cache")):
        config = roformer.ModelConfig(vocab_size=50, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                                      position_encoding=encoding)  # fmt: skip
        model = roformer.MaskedLM(config).to(torch.bfloat16).to("meta")
        holder = next(m for m in model.modules() if hasattr(m, "tables") and m.tables)
        table = getattr(holder, tables)
        for tensor in table if isinstance(table, tuple) else (table,):
            assert tensor.device.type == "meta" and tensor.dtype == torch.float32, (encoding, tensor)


def test_a_model_moved_to_the_meta_device_builds_its_tables_again_when_materialised() -> None:
    """`to_empty` has no values to move from meta: the tables are dropped and built again on first use."""
    config = roformer.ModelConfig(vocab_size=50, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    model = roformer.MaskedLM(config).to("meta").to_empty(device="cpu")
    rotary = next(m for m in model.modules() if isinstance(m, RotaryEmbedding))
    assert rotary._real_cache is None
    cos, _ = rotary.cos_sin(8, torch.device("cpu"))
    assert cos.device.type == "cpu" and torch.isfinite(cos).all()


# --- the fused eager rotation of a (B, T, 3, H, D) projection -----------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize("at_positions", [False, True])
def test_fused_rotation_equals_the_unfused_one_forward_and_backward(
    dtype: torch.dtype, count: int, at_positions: bool
) -> None:
    """q and k (and v) rotated in one call: the same outputs and the same gradient of the projection, bit for bit."""
    from roformer.model.config import RopeScaling

    g = torch.Generator().manual_seed(count)
    rotary = RotaryEmbedding(16, scaling=RopeScaling(type="yarn", factor=4.0, original_max_position=8))  # magnitude
    x = torch.randn(2, 12, 3, 4, 16, generator=g).to(dtype).requires_grad_()
    weights = torch.randn(3, 2, 12, 4, 16, generator=g).to(dtype)
    positions = torch.randint(0, 40, (2, 12), generator=g) if at_positions else None
    grads, outputs = [], []
    for fused in (True, False):
        out = rotary.rotate_leading(x, count, positions, fused=fused)
        sum((o.float() * w.float()).sum() for o, w in zip(out, weights, strict=True)).backward()
        outputs.append(out)
        grads.append(x.grad)
        x.grad = None
    for fused_out, plain_out in zip(*outputs, strict=True):
        assert_close(fused_out, plain_out, rtol=0, atol=0)
    assert_close(grads[0], grads[1], rtol=0, atol=0)


def test_fused_rotation_passes_gradcheck_and_leaves_unused_slices_at_zero() -> None:
    from roformer.model.rotary import RotateLeading

    rotary = RotaryEmbedding(8)
    x = torch.randn(2, 5, 3, 2, 8, dtype=torch.float64, requires_grad=True)
    table = rotary.rotations(5, x.device).to(torch.complex128).view(5, 1, 1, 4)
    assert torch.autograd.gradcheck(lambda x: RotateLeading.apply(x, table, 2), (x,))
    q, _, _ = rotary.rotate_leading(x, 2)  # k and v unused: their gradients are None inside, zero outside
    q.sum().backward()
    assert x.grad[:, :, 1:].abs().max() == 0 and x.grad[:, :, 0].abs().min() > 0


@pytest.mark.parametrize("encoding_fields", [{}, {"rotary_value": True}, {"rotary_dim": 4}])
def test_a_rotary_model_trains_the_same_with_the_fused_and_the_real_rotation(
    encoding_fields: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loss and every gradient of a left-padded rotary MLM: the fused eager rotation against the real-arithmetic one
    that torch.compile takes (with partial rotary both take the slice path)."""
    from helpers import padded_batch, tiny_config

    torch.manual_seed(0)
    model = roformer.MaskedLM(tiny_config(position_encoding="rotary", **encoding_fields))
    batch = padded_batch()
    batch["attention_mask"] = batch["attention_mask"].flip(-1)  # left padding: rotation at position ids
    batch["input_ids"] = batch["input_ids"].flip(-1)
    batch["token_type_ids"] = batch["token_type_ids"].flip(-1)
    batch["position_ids"] = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    labels = torch.where(batch["attention_mask"].bool(), batch["input_ids"], -100)

    def loss_and_grads() -> tuple[torch.Tensor, dict]:
        model.zero_grad()
        loss = model(**batch, labels=labels).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    from roformer.model.rotary import RotateLeading

    calls, fused = [], RotateLeading.apply
    monkeypatch.setattr(RotateLeading, "apply", lambda *args: calls.append(args) or fused(*args))
    fused_loss, fused_grads = loss_and_grads()
    assert len(calls) == (0 if "rotary_dim" in encoding_fields else 2)  # one per layer where it applies
    with monkeypatch.context() as m:
        m.setattr(torch.compiler, "is_compiling", lambda: True)
        real_loss, real_grads = loss_and_grads()
    assert_close(fused_loss, real_loss)
    assert fused_grads.keys() == real_grads.keys()
    for name, grad in fused_grads.items():
        assert_close(grad, real_grads[name], msg=name)


def test_positions_of_one_row_apply_to_every_row() -> None:
    """position_ids (1, T), as HF users pass them, equal the same positions given for each row."""
    torch.manual_seed(0)
    model = roformer.Backbone(roformer.ModelConfig(vocab_size=50, hidden_size=32, num_layers=1, num_heads=2,
                                                   intermediate_size=64)).eval()  # fmt: skip
    ids = torch.randint(1, 50, (3, 7))
    positions = torch.arange(7)[None] + 5
    with torch.no_grad():
        one, _ = model.encode(ids, position_ids=positions)
        every, _ = model.encode(ids, position_ids=positions.expand(3, 7))
    assert_close(one, every)
