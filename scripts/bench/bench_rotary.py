"""Micro-benchmark of the rotation alone: our complex-multiply RoPE vs HF RoFormer's stack-and-flatten form, and
the fused rotation of a (B, T, 3, H, D) qkv projection against autograd's assembly of it.

Forward + backward on q and k of shape (B, T, 2, H, D), median of repeats, same process. Then on a qkv projection:
q and k rotated, v passed through, the gradient flowing back into the projection, in one `RotateLeading` call
(fused) or through the slice and autograd (unfused); in float32 and bfloat16.

    python scripts/bench/bench_rotary.py [--batch 16 --length 128 --heads 4 --head-size 64]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from roformer.model.positions import RotaryEmbedding


def hf_style(x: torch.Tensor, sinusoidal_pos: torch.Tensor) -> torch.Tensor:
    """The rotation as HF RoFormer writes it (interleaved sin/cos built per call with stack + reshape)."""
    sin, cos = sinusoidal_pos.chunk(2, dim=-1)
    sin_pos = torch.stack([sin, sin], dim=-1).reshape_as(sinusoidal_pos)
    cos_pos = torch.stack([cos, cos], dim=-1).reshape_as(sinusoidal_pos)
    rotated = torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).reshape_as(x)
    return x * cos_pos + rotated * sin_pos


def time_it(fn, x: torch.Tensor, repeats: int) -> float:
    for _ in range(3):
        fn(x).sum().backward()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(10):
            fn(x).sum().backward()
        samples.append((time.perf_counter() - start) / 10 * 1000)
    return statistics.median(samples)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--length", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    B, T, H, D = args.batch, args.length, args.heads, args.head_size
    x = torch.randn(B, T, 2, H, D, requires_grad=True)
    rope = RotaryEmbedding(D)
    table = rope.rotations(T, x.device)
    pos = torch.cat([table.imag, table.real], dim=-1).view(T, 1, 1, D)  # HF layout: [sin | cos]
    ours = time_it(rope, x, args.repeats)
    hf = time_it(lambda t: hf_style(t, pos), x, args.repeats)
    torch.testing.assert_close(rope(x), hf_style(x, pos))
    print(f"B{B} T{T} H{H} D{D}, forward+backward: ours {ours:.2f} ms, HF-style {hf:.2f} ms, ratio {hf / ours:.2f}x")
    for dtype in (torch.float32, torch.bfloat16):
        qkv = torch.randn(B, T, 3, H, D, dtype=dtype, requires_grad=True)
        weights = torch.randn(3, B, T, H, D, dtype=dtype)

        def projection(fused: bool, weights: torch.Tensor = weights) -> Callable[[torch.Tensor], torch.Tensor]:
            # q, k and v each weighted: dense gradients, as attention's backward gives, flow back into the projection
            return lambda t: sum(o * w for o, w in zip(rope.rotate_leading(t, 2, fused=fused), weights, strict=True))

        fused, unfused = (time_it(projection(f), qkv, args.repeats) for f in (True, False))
        print(
            f"qkv (B{B} T{T} 3 H{H} D{D}) {str(dtype).removeprefix('torch.')}, forward+backward: fused {fused:.2f} ms, "
            f"unfused {unfused:.2f} ms, ratio {unfused / fused:.2f}x"
        )


if __name__ == "__main__":
    main()
