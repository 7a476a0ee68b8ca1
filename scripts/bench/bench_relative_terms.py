"""The ways to compute the relative encodings' attention terms, timed against each other (forward + backward).

What the model does is checked here against the obvious alternatives, equal outputs first:
- Shaw et al.'s q_i . a^K_clip(j - i): ours multiplies q by the R <= 2k + 1 distinct embeddings, (B, H, T, R), then
  gathers each pair's entry; the direct way gathers a (T, T, d) tensor of embeddings and contracts it with q.
- T5's bias and ALiBi: ours materialises the (H, T, T) bias once per forward and passes it to SDPA as a float mask
  (shared by every layer; T5's needs its gradient too); FlexAttention (`torch.nn.attention.flex_attention`,
  compiled) computes it inside the kernel with a `score_mod` and never stores it.
Each row reports the median time of forward + backward of one attention (B, H, T, d as the small model: H 4, d 64).

    python scripts/bench/bench_relative_terms.py             # T=128 x 16 and T=512 x 4
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from roformer.model.flops import synchronize
from roformer.model.positions import ShawTerms, alibi_slopes, relative_distances


def timed(fn: Callable[[], torch.Tensor], inputs: list[torch.Tensor], repeats: int) -> float:
    """Median seconds of fn() + backward over `repeats` runs (after one warm-up)."""
    times = []
    for i in range(repeats + 1):
        for t in inputs:
            t.grad = None
        synchronize(inputs[0].device)
        start = time.perf_counter()
        fn().sum().backward()
        synchronize(inputs[0].device)
        if i:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def shaw_rows(B: int, H: int, T: int, d: int, k: int, repeats: int, device: str) -> list[tuple[str, float]]:
    q = torch.randn(B, H, T, d, device=device, requires_grad=True)
    table = torch.randn(2 * k + 1, d, device=device, requires_grad=True)
    distance = relative_distances(torch.arange(T, device=device), torch.arange(T, device=device))
    low, high = max(1 - T, -k), min(T - 1, k)
    ours = ShawTerms(table[low + k : high + k + 1], None, distance.clamp(-k, k) - low)

    def direct() -> torch.Tensor:  # (T, T, d) embeddings, then q_i . a_ij
        return torch.einsum("bhid,ijd->bhij", q, table[distance.clamp(-k, k) + k])

    torch.testing.assert_close(ours.logits(q), direct())
    return [("Shaw: distinct rows + gather (ours)", timed(lambda: ours.logits(q), [q, table], repeats)),
            ("Shaw: (T, T, d) gather + einsum", timed(direct, [q, table], repeats))]  # fmt: skip


def bias_rows(B: int, H: int, T: int, d: int, repeats: int, flex: bool, device: str) -> list[tuple[str, float]]:
    q, k, v = (torch.randn(B, H, T, d, device=device, requires_grad=True) for _ in range(3))
    slopes = alibi_slopes(H).to(device)
    positions = torch.arange(T, device=device)
    bias = -slopes[:, None, None] * relative_distances(positions, positions).abs()  # (H, T, T)

    def plain() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)

    def biased() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias[None])

    learned = bias.clone().requires_grad_()  # T5's bias is trained: its gradient is part of the cost

    def biased_learned() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=learned[None])

    rows = [
        ("SDPA, no bias (rotary's attention)", timed(plain, [q, k, v], repeats)),
        ("SDPA + fixed (H, T, T) bias (ours, ALiBi)", timed(biased, [q, k, v], repeats)),
        ("SDPA + learned (H, T, T) bias (ours, T5)", timed(biased_learned, [q, k, v, learned], repeats)),
    ]
    if flex:
        from torch.nn.attention.flex_attention import flex_attention

        def alibi(score, b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202 (FlexAttention's score_mod signature)
            return score - slopes[h] * (q_idx - kv_idx).abs()

        compiled = torch.compile(flex_attention)
        try:
            out = compiled(q, k, v, score_mod=alibi)
        except NotImplementedError as error:  # torch 2.13 on CPU: "FlexAttention does not support backward on CPU"
            print(f"FlexAttention cannot train here: {error}")
            return rows
        torch.testing.assert_close(out, biased())
        flex_time = timed(lambda: compiled(q, k, v, score_mod=alibi), [q, k, v], repeats)
        rows.append(("FlexAttention score_mod (compiled)", flex_time))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-lens", default="128,512")
    p.add_argument("--batch-sizes", default="16,4")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head-size", type=int, default=64)
    p.add_argument("--max-distance", type=int, default=128, help="Shaw's k")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-flex", action="store_true", help="skip FlexAttention (it compiles)")
    args = p.parse_args()
    print(
        f"torch {torch.__version__}, {args.device}, threads {torch.get_num_threads()}, H {args.heads}, "
        f"d {args.head_size}, k {args.max_distance}; median of {args.repeats} forward + backward"
    )
    for T, B in zip((int(x) for x in args.seq_lens.split(",")), (int(x) for x in args.batch_sizes.split(","))):
        rows = shaw_rows(B, args.heads, T, args.head_size, args.max_distance, args.repeats, args.device)
        rows += bias_rows(B, args.heads, T, args.head_size, args.repeats, not args.no_flex, args.device)
        print(f"\nT={T}, batch {B}\n| term | ms | vs first of its kind |\n|---|---:|---:|")
        for name, seconds in rows:
            first = rows[0][1] if name.startswith("Shaw") else rows[2][1]
            print(f"| {name} | {1000 * seconds:.2f} | {seconds / first:.2f}x |")


if __name__ == "__main__":
    main()
