"""The FLOPs formula behind the benchmarks' MFU, checked against torch's own FLOP counter on our model and HF's."""

from __future__ import annotations

import pytest
import torch
from helpers import tiny_config
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import roformer
from roformer.data.masking import masked_positions
from roformer.model.flops import encoder_parameters, measure_matmul_tflops, spec_tflops, training_flops_per_token

CONFIG = tiny_config(vocab_size=1000, hidden_size=128, intermediate_size=512, max_position_embeddings=256)
B, T = 4, 256


def counted_flops(model: torch.nn.Module, **batch: torch.Tensor) -> int:
    """Matmul FLOPs of one forward + backward, as torch counts them (math SDPA: attention as bmm, countable)."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(**batch).loss.backward()
    return counter.get_total_flops()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, CONFIG.vocab_size, (B, T), generator=g)
    labels = torch.full_like(ids, -100)
    chosen = torch.rand(B, T, generator=g) < 0.15
    labels[chosen] = ids[chosen]
    return ids, labels


def not_matmul_flops(rows: int) -> int:
    """What the formula counts and a FLOP counter does not: biases and LayerNorm scales (6 per parameter-use)."""
    per_layer = 9 * CONFIG.hidden_size + CONFIG.intermediate_size
    return 6 * CONFIG.num_layers * per_layer * B * T


@pytest.mark.parametrize("encoding", ["rotary", "sinusoidal"])
def test_formula_equals_torch_flop_counter_on_our_masked_decoder(encoding: str) -> None:
    config = roformer.ModelConfig(**{**CONFIG.__dict__, "position_encoding": encoding})
    model = roformer.MaskedLM(config)
    encoder = sum(p.numel() for name, p in model.named_parameters() if ".layers." in name)
    assert encoder_parameters(config) == encoder
    ids, labels = batch()
    positions = masked_positions(labels)
    counted = counted_flops(model, input_ids=ids, labels=labels, masked_only=True, masked_positions=positions)
    formula = training_flops_per_token(config, T, decoder_rows=len(positions) / (B * T)) * B * T
    assert counted == formula - not_matmul_flops(len(positions))


def test_formula_equals_torch_flop_counter_on_hf_roformer() -> None:
    """HF projects every position to the vocabulary: decoder_rows = 1."""
    hf = roformer.to_hf(roformer.MaskedLM(CONFIG))
    ids, labels = batch()
    counted = counted_flops(hf, input_ids=ids, labels=labels)
    assert counted == training_flops_per_token(CONFIG, T, decoder_rows=1.0) * B * T - not_matmul_flops(B * T)


def test_peaks() -> None:
    measured = measure_matmul_tflops("cpu", torch.float32, size=256)
    assert 0 < measured < 100  # a 2-core CPU does not reach 100 TFLOPS
    assert spec_tflops("cpu", torch.float32) is None
