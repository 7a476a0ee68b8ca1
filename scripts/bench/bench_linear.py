"""Linear attention with RoPE (paper eq. 19) vs softmax attention through SDPA: time and peak memory against length.

One self-attention layer of the model (hidden 256, 4 heads of 64, rotary), forward + backward on one sequence of
length T, for: `softmax` with attention dropout 0 (SDPA may use its fused, O(T)-memory kernel), `softmax-dropout`
(dropout 0.1, BERT's default: on a CPU SDPA then materialises the T x T scores), and `linear` (O(T) by
construction). Each (variant, T) runs in a fresh subprocess: time is the median of `--repeats` steps after a
warm-up, memory the growth of the process's peak resident set over one step.

    python scripts/bench/bench_linear.py                          # T = 512 ... 8192 on this machine
    python scripts/bench/bench_linear.py --device cuda --seq-lens 1024,4096,16384,65536
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

from roformer.model.attention import AttentionContext, SelfAttention
from roformer.model.config import ModelConfig
from roformer.model.plan import grid_kernel
from roformer.model.rotary import RotaryEmbedding

VARIANTS = {"softmax": ("softmax", 0.0), "softmax-dropout": ("softmax", 0.1), "linear": ("linear", 0.0)}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def child(variant: str, length: int, args: argparse.Namespace) -> dict[str, float]:
    """Time and memory of one (variant, length) in this process."""
    attention, dropout = VARIANTS[variant]
    config = ModelConfig(hidden_size=args.hidden, num_heads=args.heads, attention=attention, attention_dropout=dropout)
    device = torch.device(args.device)
    layer = SelfAttention(config).to(device).train()
    rotary = RotaryEmbedding(config.head_size)
    ctx = AttentionContext(rotary=rotary, kernel=grid_kernel(config, rotary))  # linear, or softmax by SDPA
    x = torch.randn(1, length, args.hidden, device=device, requires_grad=True)

    def step() -> None:
        layer(x, ctx).sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize()

    step()  # warm-up (tables, allocator)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = _rss_bytes()
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    return {"ms": 1000 * statistics.median(times), "peak_mb": max(peak, 0) / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", default="512,1024,2048,4096,8192")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._child:
        print(json.dumps(child(args._child[0], int(args._child[1]), args)))
        return
    lengths = [int(n) for n in args.seq_lens.split(",")]
    print(
        f"torch {torch.__version__}, {args.device}, {torch.get_num_threads()} threads; one attention layer "
        f"(hidden {args.hidden}, {args.heads} heads, rotary), forward + backward, batch 1"
    )
    print("| T | " + " | ".join(f"{v} ms | {v} MiB" for v in VARIANTS) + " | linear / softmax time |")
    print("|---:|" + "---:|---:|" * len(VARIANTS) + "---:|")
    results = []
    for length in lengths:
        row = {}
        for variant in VARIANTS:
            shape = ["--hidden", str(args.hidden), "--heads", str(args.heads), "--repeats", str(args.repeats)]
            cmd = [sys.executable, __file__, "--_child", variant, str(length), "--device", args.device, *shape]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            row[variant] = json.loads(out.strip().splitlines()[-1])
        results.append({"seq_len": length, **row})
        cells = " | ".join(f"{row[v]['ms']:,.1f} | {row[v]['peak_mb']:,.0f}" for v in VARIANTS)
        print(f"| {length} | {cells} | {row['linear']['ms'] / row['softmax']['ms']:.2f}x |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
