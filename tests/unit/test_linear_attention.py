"""Linear attention with RoPE (paper sec. 3.3, eq. 19) against its explicit O(T^2) form written from the paper."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import paper_rotation_matrix, tiny_config
from torch.testing import assert_close
from torch.utils._python_dispatch import TorchDispatchMode

import roformer
from roformer.model.attention import LINEAR_ATTENTION_EPS, linear_attention
from roformer.model.positions import RotaryEmbedding


def explicit_eq19(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None, rotary: bool):
    """Eq. 19 for one sequence and head, term by term: (T, D) inputs, R_m the paper's rotation matrix (float64)."""
    q, k, v = q.double(), k.double(), v.double()
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    T, D = q.shape
    R = [paper_rotation_matrix(D, m) if rotary else torch.eye(D, dtype=torch.float64) for m in range(T)]
    out = torch.zeros_like(v)
    for m in range(T):
        numerator, denominator = torch.zeros(D, dtype=torch.float64), torch.tensor(0.0, dtype=torch.float64)
        for n in range(T):
            if keep is not None and not keep[n]:
                continue
            numerator += ((R[m] @ phi_q[m]) @ (R[n] @ phi_k[n])) * v[n]
            denominator += phi_q[m] @ phi_k[n]
        out[m] = numerator / (denominator + LINEAR_ATTENTION_EPS)
    return out


@pytest.mark.parametrize("rotary", [True, False])
@pytest.mark.parametrize("padded", [False, True])
def test_equals_the_explicit_quadratic_form(rotary: bool, padded: bool) -> None:
    B, T, H, D = 2, 11, 3, 8
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, generator=g, dtype=torch.float64) for _ in range(3))
    keep = torch.ones(B, T, dtype=torch.bool)
    if padded:
        keep[1, 7:] = False
    got = linear_attention(q, k, v, keep if padded else None, RotaryEmbedding(D) if rotary else None)
    for b in range(B):
        for h in range(H):
            expected = explicit_eq19(q[b, :, h], k[b, :, h], v[b, :, h], keep[b] if padded else None, rotary)
            assert_close(got[b, :, h], expected)


def test_numerator_scores_depend_only_on_relative_position() -> None:
    """(R_m phi(q))^T (R_n phi(k)) = phi(q)^T R_{n-m} phi(k): shifting both positions leaves the score."""
    rope = RotaryEmbedding(16)
    phi_q, phi_k = F.elu(torch.randn(16)) + 1, F.elu(torch.randn(16)) + 1

    def score(m: int, n: int) -> torch.Tensor:
        seq = torch.zeros(1, 100, 2, 16)
        seq[0, m, 0], seq[0, n, 1] = phi_q, phi_k
        rotated = rope(seq)
        return rotated[0, m, 0] @ rotated[0, n, 1]

    for m, n in [(0, 5), (9, 2), (30, 30)]:
        for shift in (1, 17, 60):
            assert_close(score(m + shift, n + shift), score(m, n), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(score(0, 5), score(0, 9))  # and it does depend on the distance


@pytest.mark.parametrize("encoding", ["rotary", "sinusoidal", "learned", "none"])
def test_every_position_encoding_trains_and_padding_is_ignored(encoding: str) -> None:
    config = tiny_config(
        vocab_size=50, num_heads=2, intermediate_size=64, attention="linear", position_encoding=encoding
    )
    model = roformer.MaskedLM(config)
    ids = torch.randint(5, 50, (2, 12))
    labels = torch.where(torch.rand(2, 12) < 0.3, ids, -100)
    labels[0, 0] = ids[0, 0]
    out = model(ids, labels=labels)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.eval()
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 8:] = 0
    padded = model(ids, attention_mask=mask).logits
    other = ids.clone()
    other[1, 8:] = 7  # different padding content: real positions must not notice
    assert_close(model(other, attention_mask=mask).logits[1, :8], padded[1, :8])
    assert_close(model(ids[1:, :8]).logits[0], padded[1, :8])


class LargestTensor(TorchDispatchMode):
    """Records the element count of the largest tensor any op produces."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_memory_is_linear_in_length() -> None:
    """No T x T matrix at T = 4096, forward and backward (softmax attention would build B*H*T*T elements)."""
    config = tiny_config(vocab_size=50, num_layers=1, num_heads=2, intermediate_size=64, attention="linear")
    model = roformer.MaskedLM(config)
    T = 4096
    ids = torch.randint(5, 50, (1, T))
    with LargestTensor() as probe:
        model(ids, labels=ids).loss.backward()
    assert probe.largest < T * T // 16, probe.largest  # the largest is the (T, V) logits
