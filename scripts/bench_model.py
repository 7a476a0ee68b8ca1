"""Training-step throughput and peak memory: our RoFormer and BERT-sinusoidal vs HF RoFormer and HF BERT (sdpa).

All four models have the same shapes and see the same batches in the same process; timings are interleaved
(model A, B, C, D, A, B, ...) and we report medians over repeats, so machine noise hits every model alike.
A step is forward + backward + AdamW with an MLM loss on 15% masked tokens. `--decoder masked` (default) runs our
models as our trainer does, with the vocabulary projection only at masked positions; `--decoder full` makes every
model compute all logits, so the comparison is the same math everywhere.

Peak memory: on CUDA `max_memory_allocated`; on CPU each model is run in a fresh subprocess and we report the growth
of its resident set size (sampled every ms) over two training steps (activations, gradients and optimizer state).

    python scripts/bench_model.py                     # CPU defaults: T=128 (batch 16) and T=2048 (batch 1)
    python scripts/bench_model.py --device cuda --dtype bfloat16 --seq-lens 512,2048 --batch-sizes 32,8
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import threading
import time

import torch
import transformers

import roformer

MODELS = ("ours-rotary", "ours-sinusoidal", "hf-roformer", "hf-bert")


def build(name: str, args: argparse.Namespace, max_len: int) -> torch.nn.Module:
    """The four models with the same shapes; HF ones are built from our configs through `to_hf`."""
    encoding = {"ours-rotary": "rotary", "hf-roformer": "rotary", "ours-sinusoidal": "sinusoidal"}.get(name, "learned")
    config = roformer.ModelConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        intermediate_size=args.ffn,
        hidden_dropout=args.dropout,
        attention_dropout=args.dropout,
        position_encoding=encoding,
        max_position_embeddings=max(max_len, 512),  # HF RoFormer's table size
    )
    model = roformer.MaskedLM(config)
    if name.startswith("hf-"):
        model = roformer.to_hf(model)  # RoFormerForMaskedLM / BertForMaskedLM (sdpa attention)
        assert name == "hf-roformer" or model.config._attn_implementation == "sdpa"
    return model


def make_batch(args: argparse.Namespace, batch: int, length: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, args.vocab, (batch, length), generator=g)
    labels = torch.full_like(ids, -100)
    masked = torch.rand(batch, length, generator=g) < 0.15
    labels[masked] = ids[masked]
    ids[masked] = 4
    return {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}


def train_step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, batch: dict, device: str, dtype: torch.dtype, masked: bool
) -> None:
    batch = {k: v.to(device) for k, v in batch.items()}
    extra = {"masked_only": True} if masked and isinstance(model, roformer.MaskedLM) else {}
    with torch.autocast(device_type=device.split(":")[0], dtype=dtype, enabled=dtype != torch.float32):
        out = model(**batch, **extra)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def setup(name: str, args: argparse.Namespace, length: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = build(name, args, length).to(args.device).train()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def throughput(args: argparse.Namespace, batch: int, length: int) -> dict[str, float]:
    dtype = getattr(torch, args.dtype)
    runs = {name: setup(name, args, length) for name in MODELS}
    batches = [make_batch(args, batch, length, seed) for seed in range(args.steps)]
    for model, opt in runs.values():  # warm-up: allocator, kernels, AdamW state
        for b in batches[:2]:
            train_step(model, opt, b, args.device, dtype, args.decoder == "masked")
    samples: dict[str, list[float]] = {name: [] for name in MODELS}
    for _ in range(args.repeats):
        for name, (model, opt) in runs.items():
            sync(args.device)
            start = time.perf_counter()
            for b in batches:
                train_step(model, opt, b, args.device, dtype, args.decoder == "masked")
            sync(args.device)
            samples[name].append(batch * length * len(batches) / (time.perf_counter() - start))
    return {name: statistics.median(v) for name, v in samples.items()}


def peak_memory_mb(args: argparse.Namespace, name: str, batch: int, length: int) -> float:
    """Peak memory growth of two training steps, in MiB (measured in a subprocess on CPU)."""
    dtype = getattr(torch, args.dtype)
    if args.device.startswith("cuda"):
        model, opt = setup(name, args, length)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        for seed in range(2):
            train_step(model, opt, make_batch(args, batch, length, seed), args.device, dtype, args.decoder == "masked")
        peak = torch.cuda.max_memory_allocated() - base
        del model, opt
        torch.cuda.empty_cache()
        return peak / 2**20
    cmd = [sys.executable, __file__, "--_memory-child", name, "--_batch", str(batch), "--_length", str(length)]
    cmd += [f"--{k.replace('_', '-')}={v}" for k, v in _shape_args(args).items()]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_mb"]


def _shape_args(args: argparse.Namespace) -> dict:
    keys = ("vocab", "hidden", "layers", "heads", "ffn", "dropout", "decoder", "dtype", "threads")
    return {k: getattr(args, k) for k in keys}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _memory_child(args: argparse.Namespace) -> None:
    """Sample the resident set every millisecond during two training steps; print the peak growth."""
    model, opt = setup(args._memory_child, args, args._length)
    batches = [make_batch(args, args._batch, args._length, seed) for seed in range(2)]
    before = _rss_bytes()
    peak = before
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _rss_bytes())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    for b in batches:
        train_step(model, opt, b, "cpu", getattr(torch, args.dtype), args.decoder == "masked")
    done.set()
    sampler.join()
    print(json.dumps({"peak_mb": (max(peak, _rss_bytes()) - before) / 2**20}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument(
        "--decoder",
        choices=["masked", "full"],
        default="masked",
        help="masked: our models project to the vocabulary only at masked positions, as `roformer pretrain` trains "
        "them (HF cannot); full: every model computes all logits, i.e. the same math everywhere",
    )
    p.add_argument("--dropout", type=float, default=0.1, help="hidden and attention dropout of all four models")
    p.add_argument("--seq-lens", default="128,2048")
    p.add_argument("--batch-sizes", default="16,1")
    p.add_argument("--steps", type=int, default=3, help="training steps per timed sample")
    p.add_argument("--repeats", type=int, default=5, help="timed samples per model (median reported)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--_memory-child", help=argparse.SUPPRESS)
    p.add_argument("--_batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--_length", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args._memory_child:
        _memory_child(args)
        return
    lens = [int(x) for x in args.seq_lens.split(",")]
    batches = [int(x) for x in args.batch_sizes.split(",")]
    if len(lens) != len(batches):
        p.error("--seq-lens and --batch-sizes need the same number of entries")
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, device {args.device}, "
        f"{args.dtype}, threads {torch.get_num_threads()}; L{args.layers} H{args.hidden} A{args.heads} "
        f"FF{args.ffn} V{args.vocab}, dropout {args.dropout}, {args.decoder} decoder; "
        f"median of {args.repeats} x {args.steps} steps"
    )
    results = []
    for length, batch in zip(lens, batches):
        tps = throughput(args, batch, length)
        mem = {name: peak_memory_mb(args, name, batch, length) for name in MODELS}
        results.append({"seq_len": length, "batch": batch, "tokens_per_sec": tps, "peak_mb": mem})
        print(f"\nT={length}, batch {batch}")
        print("| model | tokens/s | vs HF RoFormer | vs ours-sinusoidal | peak MiB | mem vs HF RoFormer |")
        print("|---|---:|---:|---:|---:|---:|")
        for name in MODELS:
            print(
                f"| {name} | {tps[name]:,.0f} | {tps[name] / tps['hf-roformer']:.2f}x | "
                f"{tps[name] / tps['ours-sinusoidal']:.3f}x | {mem[name]:,.0f} | "
                f"{mem[name] / mem['hf-roformer']:.2f}x |"
            )
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
