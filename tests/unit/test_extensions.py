"""Real-valued positions (random float sampling), and test-time context extension: each against its definition."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import roformer
from roformer.errors import ConfigError, UserError
from roformer.model.config import RopeScaling
from roformer.model.positions import SinusoidalPositions
from roformer.tasks.extensions import EvalVariant, Extension, default_factor, parse_extensions
from roformer.tasks.synthetic_rows import SyntheticConfig, random_positions
from tests.helpers import tiny_config

REAL = ("rotary", "p_rope", "sinusoidal", "alibi", "fire")
INTEGER = ("learned", "shaw", "t5_bias")


def _model(encoding: str, **overrides: object) -> roformer.MaskedLM:
    torch.manual_seed(0)
    return roformer.MaskedLM(tiny_config(position_encoding=encoding, max_position_embeddings=64, **overrides)).eval()


def _ids(length: int = 12) -> torch.Tensor:
    return torch.randint(5, 60, (2, length), generator=torch.Generator().manual_seed(1))


# ----------------------------------------------------------------------------------------------------------------
# Real positions


@pytest.mark.parametrize("encoding", REAL)
def test_real_positions_on_the_integer_grid_are_the_integer_positions(encoding: str) -> None:
    model, ids = _model(encoding), _ids()
    positions = torch.tensor([[0, 2, 3, 5, 8, 9, 11, 14, 15, 20, 21, 30]]).expand(2, -1)
    with torch.no_grad():
        torch.testing.assert_close(
            model(ids, position_ids=positions.float()).logits, model(ids, position_ids=positions).logits
        )


@pytest.mark.parametrize("encoding", REAL)
def test_real_positions_between_the_integers_change_the_output(encoding: str) -> None:
    model, ids = _model(encoding), _ids()
    grid = torch.arange(12).float().expand(2, -1)
    with torch.no_grad():
        moved = model(ids, position_ids=grid * 1.37).logits
        assert not torch.allclose(moved, model(ids, position_ids=grid).logits)


@pytest.mark.parametrize("encoding", INTEGER)
def test_table_rows_and_buckets_refuse_real_positions(encoding: str) -> None:
    with pytest.raises(ValueError, match=f"{encoding} reads positions as table rows or buckets"):
        _model(encoding)(_ids(), position_ids=torch.arange(12).float().expand(2, -1))


def test_sinusoidal_at_a_real_position_is_the_formula_written_out() -> None:
    """PE(m)[2i] = sin(m / 10000^(2i/d)), PE(m)[2i+1] = cos(...) (Vaswani et al. sec. 3.5), m a real number."""
    dim, m = 8, 2.5
    table = SinusoidalPositions(dim, scale=1.0)(4, torch.device("cpu"), torch.float32, torch.tensor([[m]]))[0, 0]
    expected = []
    for i in range(dim // 2):
        angle = m / 10000 ** (2 * i / dim)
        expected += [math.sin(angle), math.cos(angle)]
    torch.testing.assert_close(table, torch.tensor(expected))


def test_rotary_at_real_positions_over_a_factor_is_position_interpolation() -> None:
    """positions / f under RoPE is `rope_scaling: linear` with factor f (Chen et al. 2023: theta_i / f)."""
    model, ids = _model("rotary"), _ids(16)
    scaled = roformer.MaskedLM(dataclasses.replace(model.config, rope_scaling=RopeScaling(type="linear", factor=4.0)))
    scaled.load_state_dict(model.state_dict())
    variant = Extension("linear", 4.0).variant(model.config, trained=16, length=64)
    batch = variant.batch({"input_ids": ids})
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, scaled.eval()(ids).logits)


def test_p_rope_leaves_its_unrotated_pairs_unrotated_at_real_positions() -> None:
    rotary = _model("p_rope").backbone.p_rope
    rotations = rotary.rotations_at(torch.tensor([[0.5, 7.25, 100.125]]))  # (1, 3, dim/2)
    assert torch.equal(rotations[..., rotary.rotated :], torch.ones_like(rotations[..., rotary.rotated :]))
    assert not torch.allclose(rotations[..., : rotary.rotated], torch.ones_like(rotations[..., : rotary.rotated]))


def test_random_float_positions_are_sorted_reals_in_the_range_and_integer_ones_unchanged() -> None:
    settings = SyntheticConfig(task="shift", randomized_positions=600, randomized_kind="float")
    rows = random_positions(settings, [10, 40], seed=3)
    for row, length in zip(rows, [10, 40], strict=True):
        assert len(row) == length and row == sorted(row) and all(0.0 <= p < 600 for p in row)
        assert not all(float(p).is_integer() for p in row)
    integer = random_positions(dataclasses.replace(settings, randomized_kind="integer"), [10, 40], seed=3)
    assert all(isinstance(p, int) for row in integer for p in row) and all(len(set(r)) == len(r) for r in integer)


def test_random_float_positions_need_a_range() -> None:
    with pytest.raises(ConfigError, match="randomized_kind: float draws randomized_positions, which is null"):
        SyntheticConfig(task="shift", randomized_kind="float")


# ----------------------------------------------------------------------------------------------------------------
# Test-time extension


def test_extensions_are_parsed_as_eval_mlm_takes_them() -> None:
    assert [e.label for e in parse_extensions(["linear", "yarn:4", "log_scale", "self_extend:2.0"])] == [
        "linear",
        "yarn:4",
        "log_scale",
        "self_extend:2",
    ]
    for bad, message in [
        ("rope", "unknown method 'rope'"),
        ("linear:x", "must be a number"),
        ("ntk:0.5", "finite number >= 1"),
        ("log_scale:2", "log_scale takes no factor"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_extensions([bad])
    with pytest.raises(ConfigError, match="linear given twice"):
        parse_extensions(["linear", "linear"])


@pytest.mark.parametrize(
    ("method", "defined"),
    [
        ("linear", {"rotary", "p_rope", "sinusoidal", "alibi", "fire"}),
        ("ntk", {"rotary"}),
        ("yarn", {"rotary"}),
        ("self_extend", {"rotary"}),
        ("log_scale", {"rotary", "p_rope", "sinusoidal", "alibi", "fire", "learned", "shaw", "t5_bias", "none"}),
    ],
)
def test_each_method_is_defined_where_it_has_something_to_act_on(method: str, defined: set[str]) -> None:
    for encoding in (*REAL, *INTEGER, "none"):
        reason = Extension(method).refusal(tiny_config(position_encoding=encoding))
        assert (reason is None) == (encoding in defined), (method, encoding, reason)
    assert Extension("log_scale").refusal(tiny_config(attention="linear")) is not None


def test_the_default_factor_is_the_length_s_and_a_fixed_one_is_kept() -> None:
    config = tiny_config(position_encoding="rotary")
    assert Extension("linear").variant(config, trained=34, length=130).position_divisor == pytest.approx(130 / 34)
    assert Extension("linear", 8.0).variant(config, trained=34, length=34).position_divisor == 8.0
    yarn = Extension("yarn").variant(config, trained=34, length=66).config.rope_scaling
    assert (yarn.type, yarn.factor, yarn.original_max_position) == ("yarn", pytest.approx(66 / 34), 34)
    grouped = Extension("self_extend").variant(config, trained=34, length=266).config.rope_scaling
    assert grouped.factor == default_factor("self_extend", 266, 34) and grouped.factor > 1
    assert Extension("log_scale").variant(config, trained=34, length=266).config.attention_log_scale == 34


@pytest.mark.parametrize("method", ["linear", "ntk", "yarn", "self_extend", "log_scale"])
def test_at_the_trained_length_the_default_factor_is_the_model_itself(method: str) -> None:
    model, ids = _model("rotary"), _ids(16)
    variant = Extension(method).variant(model.config, trained=16, length=16)
    copy = roformer.MaskedLM(variant.config).eval()
    copy.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(copy(**variant.batch({"input_ids": ids})).logits, model(ids).logits)


def test_a_variant_divides_given_positions_and_makes_them_where_there_were_none() -> None:
    variant = EvalVariant(tiny_config(), position_divisor=2.0)
    ids = torch.zeros(1, 4, dtype=torch.long)
    assert variant.batch({"input_ids": ids})["position_ids"].tolist() == [[0.0, 0.5, 1.0, 1.5]]
    given = variant.batch({"input_ids": ids, "position_ids": torch.tensor([[3, 5, 9, 11]])})
    assert given["position_ids"].tolist() == [[1.5, 2.5, 4.5, 5.5]]


def test_the_divided_grid_is_one_row_for_the_batch_and_the_model_computes_its_terms_once() -> None:
    """Position interpolation gives every row the same grid, expanded (batch stride 0): FIRE, T5 and ALiBi compute
    one (1, H, T, T) bias from it, as without positions, and the outputs equal those of per-row copies."""
    from roformer.model.terms import forward_positions

    ids = _ids()
    shared = EvalVariant(tiny_config(), position_divisor=2.0).batch({"input_ids": ids})["position_ids"]
    assert shared.shape == ids.shape and shared.stride(0) == 0
    queries, keys = forward_positions(shared, None, ids.shape[1], ids.device)
    assert queries.shape == keys.shape == (ids.shape[1],)
    copied = shared.contiguous()  # the same positions, one copy a row: per-row terms
    assert forward_positions(copied, None, ids.shape[1], ids.device)[0].shape == ids.shape
    integers = torch.arange(ids.shape[1]).expand_as(ids)  # T5's buckets take integer positions only
    for encoding, positions in (("fire", shared), ("alibi", shared), ("t5_bias", integers)):
        model = _model(encoding)
        with torch.no_grad():
            expected = model(ids, position_ids=positions.contiguous()).logits
            torch.testing.assert_close(model(ids, position_ids=positions).logits, expected)


def _task(**synthetic: object) -> object:
    from roformer.config import from_dict
    from roformer.tasks.config import FinetuneDataConfig
    from roformer.tasks.synthetic import SyntheticTask

    data = from_dict(
        FinetuneDataConfig, {"type": "synthetic", "task": "shift", "synthetic": {"task": "shift", **synthetic}}
    )
    return SyntheticTask(data)


@pytest.mark.parametrize(
    ("synthetic", "encoding", "message"),
    [
        ({"randomized_positions": 600, "randomized_kind": "float"}, "learned", "learned reads them as table rows"),
        ({"randomized_positions": 600, "randomized_kind": "float"}, "shaw", "shaw reads them as table rows"),
        ({"extensions": ["ntk"]}, "alibi", "ntk rescales RoPE's frequencies"),
        ({"extensions": ["linear"]}, "t5_bias", "linear \\(position interpolation\\) divides positions"),
    ],
)
def test_a_task_refuses_what_its_encoding_cannot_take_in_one_line(synthetic: dict, encoding: str, message: str) -> None:
    task = _task(**synthetic)
    with pytest.raises(UserError, match=message) as error:
        task.check_model(tiny_config(position_encoding=encoding, max_position_embeddings=1024))
    assert "\n" not in str(error.value)


def test_a_task_gives_each_test_split_its_variants_and_the_dev_split_none() -> None:
    task = _task(extensions=["linear", "yarn:2"], train_lengths=[8, 32], test_multiples=[1, 4])
    config = tiny_config(position_encoding="rotary")
    assert task.test_variants(config, "dev") == {}
    variants = task.test_variants(config, "test_4x")
    assert list(variants) == ["linear", "yarn:2"]
    assert variants["linear"].position_divisor == pytest.approx(130 / 34)  # 4 x 32 + [CLS] and [SEP], over 34
    assert variants["yarn:2"].config.rope_scaling.factor == 2.0


def test_randomized_positions_leave_the_position_methods_nothing_to_extend_by_default() -> None:
    """Their range holds every test row: the default factor is 1; the log-length scale still counts tokens."""
    task = _task(extensions=["linear", "ntk", "log_scale", "linear:4"], randomized_positions=600)
    variants = task.test_variants(tiny_config(position_encoding="rotary", max_position_embeddings=1024), "test_8x")
    assert variants["linear"].position_divisor == 1.0 and variants["ntk"].config.rope_scaling.factor == 1.0
    assert variants["linear:4"].position_divisor == 4.0
    assert variants["log_scale"].config.attention_log_scale == 34  # the longest trained row, not the range


def test_an_extension_of_a_model_trained_with_one_is_refused() -> None:
    scaled = tiny_config(position_encoding="rotary", rope_scaling=RopeScaling(type="linear", factor=2.0))
    assert "trained with rope_scaling" in Extension("yarn").refusal(scaled)
    assert "trained with attention_log_scale" in Extension("log_scale").refusal(tiny_config(attention_log_scale=16))
    with pytest.raises(ConfigError, match="a whole number"):
        parse_extensions(["self_extend:2.5"])


def test_real_positions_compile_in_one_graph_and_in_real_arithmetic() -> None:
    """Compiled, rotary at real positions takes cos/sin (Inductor generates no complex code) and equals eager."""
    import warnings

    model, ids = _model("rotary"), _ids()
    positions = (torch.arange(12) * 1.5).expand(2, -1)
    with torch.no_grad():
        eager = model(ids, position_ids=positions).logits
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compiled = torch.compile(model, fullgraph=True)(ids, position_ids=positions).logits
    assert not [w for w in caught if "complex" in str(w.message)]
    torch.testing.assert_close(compiled, eager)
