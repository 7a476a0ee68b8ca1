"""Mixed precision on the CPU: what must stay float32 under bf16 autocast (LayerNorm, loss, rotary tables)."""

from __future__ import annotations

import torch
from helpers import padded_batch, tiny_config

import roformer
from roformer.model.rotary import RotaryEmbedding, rotary_angles


def test_layernorm_and_loss_stay_float32_under_bf16_autocast() -> None:
    model = roformer.MaskedLM(tiny_config()).eval()
    dtypes: dict[str, set] = {}
    for module in model.modules():
        if isinstance(module, torch.nn.LayerNorm | torch.nn.Linear):
            module.register_forward_hook(lambda m, i, o: dtypes.setdefault(type(m).__name__, set()).add(o.dtype))
    batch = padded_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(**batch, labels=batch["input_ids"])
    assert dtypes["LayerNorm"] == {torch.float32}  # CPU autocast alone would give bf16 for the block norms
    assert dtypes["Linear"] == {torch.bfloat16}  # the matmuls do run in bf16
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss)
    with torch.no_grad():
        reference = model(**batch, labels=batch["input_ids"]).loss
    assert abs(out.loss.item() - reference.item()) < 0.02 * reference.item()
    bf16_model = roformer.MaskedLM(tiny_config()).to(torch.bfloat16).eval()  # no autocast: the model's own dtype
    assert bf16_model.backbone.embeddings.norm(torch.ones(2, 32, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_rotary_scores_at_long_positions_match_float32_under_bf16() -> None:
    """cos/sin tables are float32 whatever the compute dtype: a bf16 angle table is off by radians at m ~ 4000."""
    torch.manual_seed(0)
    head, positions = 64, 4100
    q, k = torch.randn(1, positions, 1, head), torch.randn(1, positions, 1, head)
    rope = RotaryEmbedding(head)
    exact_q, exact_k = rope(q.double()).float(), rope(k.double()).float()  # float64 in, our float32 tables
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16_q, bf16_k = rope(q.bfloat16()), rope(k.bfloat16())
    assert rope.rotations(positions, q.device).dtype == torch.complex64
    far = slice(4000, 4100)

    def scores(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a[0, far, 0].float() @ b[0, far, 0].float().T) / head**0.5

    reference = scores(exact_q, exact_k)
    ours = scores(bf16_q, bf16_k)
    assert (ours - reference).abs().max() < 0.1  # bf16 rounding of q and k only
    angles = rotary_angles(positions, head).to(torch.bfloat16).double()  # the bug class: angles rounded to bf16
    bad_rotations = torch.polar(torch.ones_like(angles), angles).to(torch.complex64)
    from roformer.model.rotary import apply_rotary

    bad = scores(apply_rotary(q, bad_rotations), apply_rotary(k, bad_rotations))
    assert (bad - reference).abs().max() > 10 * (ours - reference).abs().max()
