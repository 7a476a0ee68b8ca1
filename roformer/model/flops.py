"""Model FLOPs and the peak they are measured against: what `scripts/bench/bench_*.py` report as MFU.

Training FLOPs per token of an encoder with L layers, hidden size h, FFN size f, sequence length T and vocabulary V
(the PaLM appendix-B convention: a multiply-add is 2 FLOPs, backward is twice the forward):

    6 * N                     N = non-embedding parameters of the encoder (4 h^2 + 2 h f + 9 h + f per layer)
  + 12 * L * h * T            attention scores and their weighted sum (QK^T and AV, forward 4 h T per layer)
  + 6 * (h^2 + h V) * r       MLM head (transform + vocabulary projection) on the r decoder rows per token computed

`r` is 1 for a model that projects every position to the vocabulary (HF), and the bucketed masked fraction (~0.15)
for ours (`masked_only`). Element-wise work (rotary, GELU, LayerNorm, softmax) is not counted, as usual.
MFU = achieved model FLOPs / peak. The peak is measured here with a large GEMM in the same dtype on the same device
(what the hardware delivers), next to the spec sheet's dense figure where the device is known.
"""

from __future__ import annotations

import statistics
import time

import torch

from roformer.model.config import ModelConfig

# dense (no sparsity) tensor-core TFLOPS from the vendors' data sheets, by device-name substring and dtype
SPEC_TFLOPS = {
    "H200": {torch.bfloat16: 989.4, torch.float16: 989.4, torch.float32: 494.7},  # fp32 = TF32
    "H100 PCIe": {torch.bfloat16: 756.0, torch.float16: 756.0, torch.float32: 378.0},
    "H100": {torch.bfloat16: 989.4, torch.float16: 989.4, torch.float32: 494.7},  # SXM
    "A100": {torch.bfloat16: 312.0, torch.float16: 312.0, torch.float32: 156.0},
}


def encoder_parameters(config: ModelConfig) -> int:
    """Non-embedding parameters of the encoder layers (attention, FFN, their biases and LayerNorms)."""
    h, f = config.hidden_size, config.intermediate_size
    attention = 4 * h * h + 4 * h  # q, k, v, o
    ffn = 2 * h * f + f + h if f else 0  # intermediate_size 0: no feed-forward sublayer, nor its LayerNorm
    norms = (2 if f else 1) * 2 * h
    return config.num_layers * (attention + ffn + norms)


def training_flops_per_token(config: ModelConfig, seq_len: int, decoder_rows: float = 1.0) -> float:
    """Model FLOPs of one training step (forward + backward) per input token (see the module docstring).

    Args:
        config: The model's shapes.
        seq_len: T, tokens per sequence.
        decoder_rows: Vocabulary-projection rows computed per token (1.0: all positions; ~0.15: masked only).
    """
    h = config.hidden_size
    attention = 12 * config.num_layers * h * seq_len
    decoder = 6 * (h * h + h * config.vocab_size) * decoder_rows
    return 6 * encoder_parameters(config) + attention + decoder


def measure_matmul_tflops(device: str | torch.device, dtype: torch.dtype, size: int | None = None) -> float:
    """Achieved TFLOPS of a square GEMM (median of 5 timings): the practical peak of this device and dtype.

    Args:
        device: Where to measure.
        dtype: The matmul dtype (float32 on CUDA uses TF32 if it is enabled).
        size: Matrix side (default 8192 on CUDA; on a CPU the largest power of two up to 2048 whose product takes
            under ~0.2 s, since CPUs without bf16 units multiply bf16 matrices a hundred times slower).
    """
    device = torch.device(device)
    n = size or (8192 if device.type == "cuda" else _cpu_size(dtype))
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    repeats = 20 if device.type == "cuda" else 2
    times = []
    for trial in range(6):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        synchronize(device)
        if trial:  # the first trial warms up (kernel selection, clocks)
            times.append((time.perf_counter() - start) / repeats)
    return 2 * n**3 / statistics.median(times) / 1e12


def _cpu_size(dtype: torch.dtype) -> int:
    n = 256
    while n < 2048:
        a = torch.randn(n, n, dtype=dtype)
        start = time.perf_counter()
        a @ a
        if (time.perf_counter() - start) * 8 > 0.2:  # the next size takes 8x longer
            break
        n *= 2
    return n


def spec_tflops(device: str | torch.device, dtype: torch.dtype) -> float | None:
    """The data sheet's dense TFLOPS of a known CUDA device for `dtype`, else None."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, table in SPEC_TFLOPS.items():
        if key in name:
            return table.get(dtype)
    return None


def synchronize(device: str | torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously; timings must include it). No-op on a CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
