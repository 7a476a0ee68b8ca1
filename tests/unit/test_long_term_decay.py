"""The paper's long-term decay (sec. 3.4.3, fig. 2): the bound against its formula, and the measured curves.

The bound is checked against the sum written out here with Python's complex numbers, one term at a time, and against
what the figure shows; the measured curves against hand-made logits and, for ALiBi, against its head slopes.
"""

from __future__ import annotations

import cmath
import math
import re

import pytest
import torch
from helpers import REPO, tiny_config

import roformer
from roformer.study.decay import (
    FIGURE_HEAD_SIZE,
    TABLE_DISTANCES,
    DistanceCurves,
    measure_attention_distance,
    relative_upper_bound,
)


def bound_by_hand(r: float, d: int, base: float = 10000.0) -> float:
    """(1/(d/2)) sum_{j=1}^{d/2} |S_j|, S_j = sum_{k=0}^{j-1} e^{i r theta_k}, theta_k = base^(-2k/d): a loop."""
    total, partial = 0.0, 0j
    for k in range(d // 2):
        partial += cmath.exp(1j * r * base ** (-2 * k / d))  # S_{k+1}
        total += abs(partial)
    return total / (d // 2)


@pytest.mark.parametrize("d", [2, 8, 64, 128, 256])
def test_the_bound_is_the_papers_sum(d: int) -> None:
    distances = [0, 1, 2.5, 7, 10, 33, 100, 255, 256, 1000]
    expected = torch.tensor([bound_by_hand(r, d) for r in distances], dtype=torch.float64)
    torch.testing.assert_close(relative_upper_bound(distances, d), expected, rtol=1e-12, atol=1e-12)
    other = [bound_by_hand(r, d, 500.0) for r in distances]
    torch.testing.assert_close(relative_upper_bound(distances, d, 500.0), torch.tensor(other, dtype=torch.float64))


@pytest.mark.parametrize("d", [2, 8, 64, 128, 768])
def test_the_bound_starts_at_its_maximum(d: int) -> None:
    """At r = 0 every |S_j| = j, so the bound is the mean of 1..d/2, (d/2 + 1) / 2, and nothing exceeds it."""
    values = relative_upper_bound(range(0, 600), d)
    assert values[0].item() == pytest.approx((d / 2 + 1) / 2, abs=1e-12)
    assert values.max().item() == values[0].item()
    assert torch.equal(relative_upper_bound([-5, -40], d), relative_upper_bound([5, 40], d))  # |.| of conjugates


def test_the_bound_decays_as_in_the_figure() -> None:
    """Fig. 2: from its maximum at 0, an envelope that falls (with oscillation) over distances 0 to 256."""
    values = relative_upper_bound(range(257))
    windows = [values[start : start + 64].max().item() for start in range(0, 256, 64)]  # 0-63, 64-127, ...
    assert windows == sorted(windows, reverse=True) and windows[-1] < windows[0] / 2
    rises = (values[1:] > values[:-1]).sum().item()
    assert 20 < rises < 128  # it oscillates: not monotone, but falling more often than rising
    assert 0.15 < values[256].item() / values[0].item() < 1 / 3


def test_the_documented_table_is_what_the_code_computes() -> None:
    """docs/length-generalization.md's table of the bound (two decimals) at d = 128."""
    page = (REPO / "docs" / "length-generalization.md").read_text()
    head = re.search(r"^\| relative distance \|(.*)\|$", page, re.M)
    row = re.search(rf"^\| relative upper bound \(d = {FIGURE_HEAD_SIZE}\) \|(.*)\|$", page, re.M)
    assert head and row, "the bound's table is missing from docs/length-generalization.md"
    distances = [int(cell) for cell in head.group(1).split("|")]
    assert tuple(distances) == TABLE_DISTANCES
    written = [float(cell) for cell in row.group(1).split("|")]
    assert written == [round(v, 2) for v in relative_upper_bound(distances).tolist()]
    assert written == [round(bound_by_hand(r, FIGURE_HEAD_SIZE), 2) for r in distances]


def test_an_odd_or_empty_head_has_no_bound() -> None:
    for d in (0, 1, 7):
        with pytest.raises(ValueError, match="even number"):
            relative_upper_bound([1], d)


def test_the_curves_average_each_distance_over_the_pairs_attended() -> None:
    """Logits 10 h + |m - n| (and one key masked): each head's mean at distance r is 10 h + r; weights sum to 1."""
    B, H, T = 2, 3, 5
    distance = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs().float()
    logits = (10 * torch.arange(H).float()[None, :, None, None] + distance).expand(B, H, T, T).clone()
    logits[:, :, :, 4] = float("-inf")  # key 4 never attended: distance 4 has pairs (4, 0) and (0, 4) only
    curves = DistanceCurves(H, T)
    curves.add(logits)
    means = curves.means()
    for h in range(H):
        assert means["heads"]["mean_logit"][h] == pytest.approx([10 * h + r for r in range(T)])
    assert means["mean_logit"] == pytest.approx([10 + r for r in range(T)])  # the heads' mean
    assert curves.pairs[0].tolist() == [2 * 4, 2 * 7, 2 * 5, 2 * 3, 2 * 1]  # (query, key) pairs with key < 4
    queries = (curves.pairs * torch.tensor(means["heads"]["mean_weight"])).sum(dim=1)
    torch.testing.assert_close(queries, torch.full((H,), float(B * T), dtype=torch.float64))


def test_an_untrained_alibi_model_loses_each_heads_slope_per_token() -> None:
    """ALiBi adds -slope_h |m - n| (Press et al. 2022: slopes 2^(-8 i / n)); untrained q.k knows no position, so every
    layer's mean logit of head h falls linearly by slope_h per token of distance (beyond 0, the query itself)."""
    torch.manual_seed(0)
    model = roformer.Backbone(tiny_config(position_encoding="alibi", num_heads=4)).eval()
    ids = torch.randint(1, 101, (8, 48), generator=torch.Generator().manual_seed(0))
    slopes = [2.0 ** (-8 * i / 4) for i in range(1, 5)]
    r = torch.arange(1, 48, dtype=torch.float64)
    for layer in measure_attention_distance(model, ids, batch_size=4):
        means = torch.tensor(layer.means()["heads"]["mean_logit"], dtype=torch.float64)[:, 1:]  # (H, 47)
        for h, slope in enumerate(slopes):
            fitted = ((r - r.mean()) * (means[h] - means[h].mean())).sum() / ((r - r.mean()) ** 2).sum()
            assert fitted.item() == pytest.approx(-slope, abs=5e-4)
            line = means[h].mean() + fitted * (r - r.mean())
            assert (means[h] - line).abs().max().item() < 0.02  # a line, not a curve


def test_a_model_without_softmax_cannot_be_measured() -> None:
    model = roformer.Backbone(tiny_config(attention="linear")).eval()
    with pytest.raises(ValueError, match="linear attention"):
        measure_attention_distance(model, torch.randint(1, 101, (1, 8)))


def test_the_measured_mean_weight_of_a_blind_model_is_uniform() -> None:
    """No position encoding and identical tokens: every key scores alike, so every weight is 1 / T."""
    model = roformer.Backbone(tiny_config(position_encoding="none")).eval()
    (layer, *_) = measure_attention_distance(model, torch.full((2, 16), 7))
    assert layer.means()["mean_weight"] == pytest.approx([1 / 16] * 16)
    assert not any(math.isnan(v) for v in layer.means()["mean_logit"])
