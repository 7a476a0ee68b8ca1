"""The relative-position baselines (Shaw et al., T5's bias, ALiBi) against references no one here wrote.

T5's buckets equal transformers' `T5Attention._relative_position_bucket`, ALiBi's slopes BLOOM's (`build_alibi_tensor`),
and Shaw's attention the paper's equations (Shaw et al. 2018, eq. 3-5) written out term by term in float64.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import BIASED, ENCODINGS, assert_checkpointing_changes_nothing, padded_batch, short_range, tiny_config
from torch.testing import assert_close

import roformer
from roformer.model.attention import AttentionContext
from roformer.model.config import encodings, relative_encodings
from roformer.model.model import CausalLM
from roformer.model.relative import ShawEmbeddings, alibi_slopes, relative_distances, t5_buckets


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (16, 20), (8, 5), (64, 512)])
def test_t5_buckets_equal_transformers(num_buckets: int, max_distance: int, bidirectional: bool) -> None:
    from transformers.models.t5.modeling_t5 import T5Attention

    distance = torch.arange(-700, 701)[None] - torch.zeros(1, dtype=torch.long)[:, None]  # (1, 1401)
    expected = T5Attention._relative_position_bucket(
        distance, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    assert torch.equal(t5_buckets(distance, num_buckets, max_distance, bidirectional), expected)


def test_a_causal_t5_decoder_uses_every_bucket_for_the_past_as_t5s_decoder() -> None:
    from roformer.model.model import CausalLM

    distance = relative_distances(torch.arange(300), torch.arange(300))
    reached = {}
    for pattern in ("causal", "unilm"):
        model = CausalLM(tiny_config(position_encoding="t5_bias", attention_pattern=pattern))
        bias = model.backbone.relative_bias
        buckets = t5_buckets(distance, 32, 128, bias.bidirectional)
        visible = buckets[distance <= 0] if pattern == "causal" else buckets  # a causal query sees no later key
        reached[pattern] = visible.unique().numel()
        assert_close(bias(distance)[0], bias.buckets.weight[buckets].permute(2, 0, 1))
    # bidirectional buckets would leave a causal decoder 16 (a later key at distance 0 does not exist: 31 for unilm)
    assert reached == {"causal": 32, "unilm": 31}
    with pytest.raises(roformer.ConfigError, match="must exceed relative_num_buckets / 2 "):
        CausalLM(tiny_config(position_encoding="t5_bias", relative_max_distance=12))  # fine for an encoder (> 8)


@pytest.mark.parametrize("num_heads", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24, 32])
def test_alibi_slopes_equal_bloom(num_heads: int) -> None:
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    # BLOOM's bias at position p is slope_h * p: position 1 of a two-token row is the slope (every transformers 5)
    bloom = build_alibi_tensor(torch.ones(1, 2), num_heads, torch.float32)[:, 0, 1]  # (H,)
    assert_close(alibi_slopes(num_heads), bloom)


def test_alibi_slopes_are_the_papers_geometric_sequence() -> None:
    """8 heads: 1/2, 1/4, ..., 1/256 (Press et al. sec. 3)."""
    assert_close(alibi_slopes(8), torch.tensor([2.0**-i for i in range(1, 9)]))


def shaw_reference(x, layer, shaw_keys, shaw_values, k: int, keep) -> torch.Tensor:
    """One attention layer of Shaw et al. in float64, every sum written out over (i, j) and heads.

    e_ij = x_i W^Q (x_j W^K + a^K_ij)^T / sqrt(d_z), alpha = softmax_j(e), z_i = sum_j alpha_ij (x_j W^V + a^V_ij),
    a_ij = w_clip(j - i, k), then the output projection (eq. 3, 4, 5 and sec. 3.2's clipping).
    """
    T, C = x.shape
    H = layer.num_heads
    d = C // H
    q, kk, v = layer.qkv(x).view(T, 3, H, d).unbind(1)  # (T, H, d) each
    z = torch.zeros(T, H, d, dtype=torch.float64)
    for h in range(H):
        for i in range(T):
            e = torch.full((T,), float("-inf"), dtype=torch.float64)
            for j in range(T):
                if keep[j]:
                    rel = max(-k, min(k, j - i)) + k
                    e[j] = torch.dot(q[i, h], kk[j, h] + shaw_keys[rel]) / math.sqrt(d)
            alpha = torch.softmax(e, dim=0)
            for j in range(T):
                rel = max(-k, min(k, j - i)) + k
                value = v[j, h] + (shaw_values[rel] if shaw_values is not None else 0.0)
                z[i, h] += alpha[j] * value
    return layer.proj(z.reshape(T, C))


@pytest.mark.parametrize("values", [False, True])
def test_shaw_attention_is_the_papers_equation_in_float64(values: bool) -> None:
    torch.manual_seed(0)
    config = tiny_config(position_encoding="shaw", relative_max_distance=3, shaw_values=values, num_layers=1)
    model = roformer.Backbone(config).double().eval()
    for table in list(model.shaw.keys) + list(model.shaw.values or []):
        torch.nn.init.normal_(table.weight, std=0.5)  # large enough that a wrong term shows
    T = 9  # longer than 2k + 1 = 7: some pairs are clipped
    x = torch.randn(2, T, config.hidden_size, dtype=torch.float64)
    mask = torch.ones(2, T, dtype=torch.long)
    mask[1, 6:] = 0
    layer = model.layers[0].attn
    shaw = model.shaw.for_layers(relative_distances(torch.arange(T), torch.arange(T)), 1 - T, T - 1)
    with torch.no_grad():
        got = layer(x, AttentionContext(mask.bool()[:, None, None, :], shaw=shaw, kernel="biased"))
        for b in range(2):
            keys = model.shaw.keys[0].weight
            value_table = model.shaw.values[0].weight if values else None
            expected = shaw_reference(x[b], layer, keys, value_table, 3, mask[b].bool())
            real = int(mask[b].sum())
            assert_close(got[b, :real], expected[:real])


def test_shaw_reads_only_the_distances_present_and_clips_beyond_k() -> None:
    shaw = ShawEmbeddings(tiny_config(position_encoding="shaw", relative_max_distance=4))
    terms = shaw.for_layers(relative_distances(torch.arange(3), torch.arange(3)), -2, 2)(1)
    assert terms.keys.shape[0] == 5 and torch.equal(terms.keys, shaw.keys[1].weight[2:7])
    assert torch.equal(terms.index, torch.tensor([[2, 3, 4], [1, 2, 3], [0, 1, 2]]))
    far = shaw.for_layers(relative_distances(torch.arange(12), torch.arange(12)), -11, 11)(0)
    assert far.keys.shape[0] == 9 and far.index.min() == 0 and far.index.max() == 8  # clipped at +-4
    shared = ShawEmbeddings(tiny_config(position_encoding="shaw", shaw_shared_layers=True))
    assert len(shared.keys) == 1 and shared.values is None


def test_t5_bias_is_shared_by_the_layers_and_alibi_has_no_parameters() -> None:
    t5 = roformer.Backbone(tiny_config(position_encoding="t5_bias", num_layers=3))
    extra = {n: p.shape for n, p in t5.named_parameters() if "relative" in n}
    assert extra == {"relative_bias.buckets.weight": (32, 4)}
    rotary = roformer.Backbone(tiny_config(position_encoding="rotary", num_layers=3))
    alibi = roformer.Backbone(tiny_config(position_encoding="alibi", num_layers=3))
    assert alibi.num_parameters() == rotary.num_parameters() == t5.num_parameters() - 32 * 4
    per_layer = roformer.Backbone(tiny_config(position_encoding="shaw", num_layers=3, shaw_values=True))
    assert per_layer.num_parameters() - rotary.num_parameters() == 2 * 3 * 257 * 8


def test_t5_and_alibi_biases_are_their_formulas() -> None:
    t5 = roformer.Backbone(tiny_config(position_encoding="t5_bias"))
    distance = relative_distances(torch.arange(6), torch.arange(6))
    bias = t5.relative_bias(distance)  # (1, H, T, T)
    buckets = t5_buckets(distance, 32, 128)
    assert_close(bias[0], t5.relative_bias.buckets.weight[buckets].permute(2, 0, 1))
    alibi = roformer.Backbone(tiny_config(position_encoding="alibi"))
    expected = -alibi_slopes(4)[:, None, None] * (torch.arange(6)[None, :] - torch.arange(6)[:, None]).abs()
    assert_close(alibi.relative_bias(distance)[0], expected)


@pytest.mark.parametrize("encoding", relative_encodings())
def test_shifting_every_position_leaves_the_output_unchanged(encoding: str) -> None:
    """The relative property: position_ids + c (every row, every token) changes no score."""
    torch.manual_seed(0)
    model = roformer.MaskedLM(short_range(encoding)).eval()
    batch = padded_batch()
    positions = torch.arange(batch["input_ids"].shape[1])[None].expand_as(batch["input_ids"])
    with torch.no_grad():
        plain = model(**batch).logits
        for shift in (1, 37, 1000):
            assert_close(model(**batch, position_ids=positions + shift).logits, plain)


@pytest.mark.parametrize("encoding", BIASED)
def test_cached_decoding_equals_recomputing(encoding: str) -> None:
    torch.manual_seed(0)
    model = CausalLM(short_range(encoding)).eval()
    ids = torch.randint(1, 101, (2, 20), generator=torch.Generator().manual_seed(2))
    cache = roformer.model.masks.KVCache(capacity=4)
    with torch.no_grad():
        pieces = [model(ids[:, i : i + 3], cache=cache).logits for i in range(0, 20, 3)]
        assert_close(torch.cat(pieces, dim=1), model(ids).logits)


@pytest.mark.parametrize("encoding", [*BIASED, "shaw-values"])
def test_checkpointing_and_mixed_precision(encoding: str) -> None:
    fields = {"shaw_values": True} if encoding == "shaw-values" else {}
    config = short_range(encoding.removesuffix("-values"), hidden_dropout=0.1, attention_dropout=0.1, **fields)
    batch = padded_batch()
    batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    model = assert_checkpointing_changes_nothing(lambda: roformer.MaskedLM(config), batch)
    model.eval()
    with torch.no_grad():
        full = model(**batch).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = model(**batch).logits
    assert half.dtype == torch.bfloat16
    assert_close(half.float(), full, atol=0.05, rtol=0.05)  # bf16 rounding, not a different computation


def test_config_errors_and_hf_export_refusal() -> None:
    for fields, message in [
        ({"position_encoding": "alibi", "attention": "linear"}, "linear has no attention logits"),
        ({"position_encoding": "rotary", "shaw_values": True}, "shaw_values is only meaningful"),
        ({"position_encoding": "t5_bias", "relative_num_buckets": 7}, "even and >= 4"),
        ({"position_encoding": "t5_bias", "relative_max_distance": 8}, "must exceed relative_num_buckets / 4"),
        ({"position_encoding": "shaw", "relative_max_distance": 0}, "relative_max_distance must be >= 1"),
    ]:
        with pytest.raises(roformer.ConfigError, match=message):
            tiny_config(**fields)
    for encoding in [name for name, spec in encodings().items() if spec.hf is None]:  # one line each
        with pytest.raises(roformer.CheckpointError, match=f"have no {encoding} positions: only "):
            roformer.to_hf(roformer.MaskedLM(tiny_config(position_encoding=encoding)))


def test_shaw_values_on_a_row_of_padding_only_is_finite() -> None:
    """SDPA gives a query with no key to attend 0; the written-out attention with a^V must too, not NaN.

    The model's mask gives such a row its own tokens (tested below), so the layer is also called with none.
    """
    torch.manual_seed(0)
    model = roformer.MaskedLM(short_range("shaw", shaw_values=True)).train()
    batch = padded_batch()
    batch["attention_mask"][2] = 0  # the whole row is padding
    batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    model(**batch).loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    T, backbone = 7, model.backbone
    x = torch.randn(2, T, model.config.hidden_size, requires_grad=True)
    keep = torch.ones(2, T, dtype=torch.bool)
    keep[1] = False  # no key at all
    layer = backbone.layers[0].attn
    shaw = backbone.shaw.for_layers(relative_distances(torch.arange(T), torch.arange(T)), 1 - T, T - 1)
    y = layer(x, AttentionContext(keep[:, None, None, :], shaw=shaw, kernel="biased"))  # (B, T, C)
    assert_close(y[1], layer.proj.bias.expand(T, -1))  # attention gives 0, projected
    y.sum().backward()
    assert x.grad.isfinite().all()


@pytest.mark.parametrize("encoding", [*ENCODINGS, "rotary-linear"])
def test_a_row_of_padding_only_attends_as_if_unpadded_and_changes_no_other_row(encoding: str) -> None:
    """A static batch's filler row or a padded choice has no key to attend: it sees all of its tokens, so that an
    exported graph gives what PyTorch does (tests/e2e/test_onnx.py), where a softmax over -inf only would be NaN."""
    torch.manual_seed(0)
    fields = {"attention": "linear"} if encoding == "rotary-linear" else {}
    model = roformer.MaskedLM(short_range(encoding.removesuffix("-linear"), **fields)).eval()
    batch = padded_batch()
    batch["attention_mask"][2] = 0
    with torch.no_grad():
        logits = model(**batch).logits
        others = model(**{name: value[:2] for name, value in batch.items()}).logits
        alone = model(batch["input_ids"][2:], token_type_ids=batch["token_type_ids"][2:]).logits
    assert logits.isfinite().all()
    assert_close(logits[:2], others)
    assert_close(logits[2:], alone)


def test_an_unpadded_causal_mask_is_not_per_row() -> None:
    """A bias is added to it: a (1, 1, T, T) mask keeps the (1, H, T, T) bias from growing B times."""
    from roformer.model.masks import self_attention_mask

    mask, shortcut = self_attention_mask("causal", None, None, None, (5, 7), torch.device("cpu"), False)
    assert not shortcut and mask.shape == (1, 1, 7, 7) and torch.equal(mask[0, 0], torch.ones(7, 7).tril().bool())
