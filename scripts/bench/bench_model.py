"""Training-step throughput and peak memory: our RoFormer and BERT-sinusoidal vs HF RoFormer and HF BERT (sdpa).

All four models have the same shapes and see the same batches in the same process; timings are interleaved
(model A, B, C, D, A, B, ...) and we report medians over repeats, so machine noise hits every model alike.
A step is forward + backward + AdamW with an MLM loss on 15% masked tokens. `--decoder masked` (default) runs our
models as our trainer does, with the vocabulary projection only at masked positions; `--decoder full` makes every
model compute all logits, so the comparison is the same math everywhere.

Peak memory: on CUDA `max_memory_allocated`; on CPU each model is run in a fresh subprocess and we report the growth
of its resident set size (sampled every ms) over two training steps (activations, gradients and optimizer state).

MFU: model FLOPs per token from `roformer.model.flops.training_flops_per_token` (each model credited with the
decoder rows it computes) times tokens/s, over the peak of a large GEMM measured in the same dtype on the same
device (and over the spec sheet's dense figure where the device is known).

    python scripts/bench/bench_model.py                     # CPU defaults: T=128 (batch 16) and T=2048 (batch 1)
    python scripts/bench/bench_model.py --models ours-rotary,ours-shaw,ours-t5_bias,ours-alibi,ours-sinusoidal \
        --seq-lens 128,512 --batch-sizes 16,4         # every position encoding of one backbone, against rotary
    python scripts/bench/bench_model.py --shape base --device cuda --dtype bf16 --compile --seq-lens 128,512 \
        --batch-sizes 128,32
"""

from __future__ import annotations

import argparse
import functools
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
from roformer.data.masking import masked_positions
from roformer.model.flops import measure_matmul_tflops, spec_tflops, synchronize, training_flops_per_token
from roformer.model.positions import RotaryEmbedding

# the default set; `ours-<encoding>` for any, `ours-rotary-unfused` for rotary without its fused eager rotation
MODELS = ("ours-rotary", "ours-sinusoidal", "hf-roformer", "hf-bert")
SHAPES = {  # --shape presets: (vocab, hidden, layers, heads, ffn)
    "small": (8000, 256, 4, 4, 1024),
    "base": (30522, 768, 12, 12, 3072),  # BERT-base, the paper's shapes
}
DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}


def model_config(name: str, args: argparse.Namespace, max_len: int) -> roformer.ModelConfig:
    """The shapes every model shares; the position encoding is the model's."""
    encoding = {"hf-roformer": "rotary", "hf-bert": "learned"}.get(name) or name.removeprefix("ours-")
    encoding = encoding.removesuffix("-unfused")
    extra = {"shaw_values": True} if encoding == "shaw-values" else {}  # Shaw et al. with a^V too
    encoding = "shaw" if extra else encoding
    return roformer.ModelConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_heads=args.heads,
        intermediate_size=args.ffn,
        hidden_dropout=args.dropout,
        attention_dropout=args.dropout,
        position_encoding=encoding,
        max_position_embeddings=max(max_len, 512),  # HF RoFormer's table size
        **extra,
    )


def build(name: str, args: argparse.Namespace, max_len: int) -> torch.nn.Module:
    """The four models with the same shapes; HF ones are built from our configs through `to_hf`."""
    model = roformer.MaskedLM(model_config(name, args, max_len))
    if name.endswith("-unfused"):  # rotary as autograd assembles it from the slice, not in one fused call
        for module in model.modules():
            if isinstance(module, RotaryEmbedding):
                module.rotate_leading = functools.partial(module.rotate_leading, fused=False)
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
    batch = {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}
    return {**batch, "positions": masked_positions(labels)}


def decoder_rows(name: str, args: argparse.Namespace, batch: dict[str, torch.Tensor]) -> float:
    """Vocabulary-projection rows per token the model computes (ours with the masked decoder: the masked rows)."""
    if args.decoder == "masked" and name.startswith("ours-"):
        return len(batch["positions"]) / batch["input_ids"].numel()
    return 1.0


def train_step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, batch: dict, device: str, dtype: torch.dtype, masked: bool
) -> None:
    batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    ours = isinstance(getattr(model, "_orig_mod", model), roformer.MaskedLM)
    # as the trainer does: masked rows as bucketed flat indices, so a compiled model sees few shapes
    extra = {"masked_only": True, "masked_positions": batch.pop("positions")} if masked and ours else {}
    batch.pop("positions", None)
    with torch.autocast(device_type=device.split(":")[0], dtype=dtype, enabled=dtype != torch.float32):
        out = model(**batch, **extra)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def setup(name: str, args: argparse.Namespace, length: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = build(name, args, length).to(args.device).train()
    fused = {"fused": True} if args.device.startswith("cuda") else {}  # what our trainer uses on CUDA
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, **fused)
    return (torch.compile(model) if args.compile else model), optimizer


def throughput(
    args: argparse.Namespace, batch: int, length: int
) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Median tokens/s of every model, its model TFLOPs per step-token (for MFU), and on CUDA its peak memory.

    On CUDA the peak is read during each model's first two warm-up steps (from a fresh optimizer and no gradients,
    the same growth `peak_memory_mb` measures), so a compiled model is compiled once, not again for memory.
    """
    dtype = getattr(torch, args.dtype)
    runs = {name: setup(name, args, length) for name in args.models}
    batches = [make_batch(args, batch, length, seed) for seed in range(args.steps)]
    if args.device.startswith("cuda"):
        batches = [{k: v.pin_memory() for k, v in b.items()} for b in batches]
    cuda = args.device.startswith("cuda")
    peaks: dict[str, float] = {}
    for name, (model, opt) in runs.items():  # warm-up: allocator, kernels, AdamW state, compilation
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        for step, b in enumerate(batches[: 3 if args.compile else 2]):
            train_step(model, opt, b, args.device, dtype, args.decoder == "masked")
            if cuda and step == 1:
                peaks[name] = (torch.cuda.max_memory_allocated() - base) / 2**20
    samples: dict[str, list[float]] = {name: [] for name in args.models}
    for _ in range(args.repeats):
        for name, (model, opt) in runs.items():
            synchronize(args.device)
            start = time.perf_counter()
            for b in batches:
                train_step(model, opt, b, args.device, dtype, args.decoder == "masked")
            synchronize(args.device)
            samples[name].append(batch * length * len(batches) / (time.perf_counter() - start))
    flops = {
        name: statistics.mean(
            training_flops_per_token(model_config(name, args, length), length, decoder_rows(name, args, b))
            for b in batches
        )
        for name in args.models
    }
    return {name: statistics.median(v) for name, v in samples.items()}, flops, peaks


def peak_memory_mb(args: argparse.Namespace, name: str, batch: int, length: int) -> float:
    """Peak resident-memory growth of two training steps on CPU, in MiB (a fresh subprocess per model)."""
    cmd = [sys.executable, __file__, "--_memory-child", name, "--_batch", str(batch), "--_length", str(length)]
    cmd += [f"--{k.replace('_', '-')}={v}" for k, v in _shape_args(args).items() if k != "compile"]
    cmd += ["--compile"] if args.compile else []
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_mb"]


def print_table(
    args: argparse.Namespace,
    length: int,
    batch: int,
    tps: dict[str, float],
    mem: dict[str, float],
    mfu: dict[str, float],
    spec_mfu: dict[str, float] | None,
) -> None:
    """A markdown table of one shape: ratios against the baseline model (and ours-sinusoidal when it ran)."""
    base = args.baseline
    sinusoidal = "ours-sinusoidal" in tps and base != "ours-sinusoidal"
    print(f"\nT={length}, batch {batch}")
    print(
        f"| model | tokens/s | vs {base} |{' vs ours-sinusoidal |' if sinusoidal else ''} MFU (GEMM) |"
        f"{' MFU (spec) |' if spec_mfu else ''} peak MiB | mem vs {base} |"
    )
    print("|---|---:|---:|" + ("---:|" if sinusoidal else "") + "---:|" + ("---:|" if spec_mfu else "") + "---:|---:|")
    for name in args.models:
        cells = [f"{tps[name]:,.0f}", f"{tps[name] / tps[base]:.2f}x"]
        cells += [f"{tps[name] / tps['ours-sinusoidal']:.3f}x"] if sinusoidal else []
        cells += [f"{100 * mfu[name]:.1f}%"] + ([f"{100 * spec_mfu[name]:.1f}%"] if spec_mfu else [])
        cells += [f"{mem[name]:,.0f}", f"{mem[name] / mem[base]:.2f}x"]
        print(f"| {name} | " + " | ".join(cells) + " |")


def _shape_args(args: argparse.Namespace) -> dict:
    keys = ("vocab", "hidden", "layers", "heads", "ffn", "dropout", "decoder", "dtype", "threads", "compile")
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
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="autocast dtype (fp32: none)")
    p.add_argument("--compile", action="store_true", help="torch.compile every model (timed after compiling)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="small", help="preset of the five shape options")
    p.add_argument("--vocab", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--ffn", type=int)
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
    p.add_argument(
        "--models",
        default=",".join(MODELS),
        help="comma list: hf-roformer, hf-bert, ours-<encoding> (ours-shaw-values: Shaw with a^V; ours-rotary-unfused: "
        "rotary without its fused eager rotation)",
    )
    p.add_argument("--baseline", help="the model the ratios divide by (default hf-roformer, else the first)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--_memory-child", help=argparse.SUPPRESS)
    p.add_argument("--_batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--_length", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.dtype = DTYPES[args.dtype]
    for key, value in zip(("vocab", "hidden", "layers", "heads", "ffn"), SHAPES[args.shape]):
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True  # as our trainer sets it
        torch.backends.cudnn.allow_tf32 = True
    if args._memory_child:
        _memory_child(args)
        return
    args.models = args.models.split(",")
    unknown = [m for m in args.models if m not in ("hf-roformer", "hf-bert") and not m.startswith("ours-")]
    if unknown:
        p.error(f"--models: unknown {', '.join(unknown)} (hf-roformer, hf-bert or ours-<position encoding>)")
    args.baseline = args.baseline or ("hf-roformer" if "hf-roformer" in args.models else args.models[0])
    if args.baseline not in args.models:
        p.error(f"--baseline {args.baseline} is not one of --models")
    lens = [int(x) for x in args.seq_lens.split(",")]
    batches = [int(x) for x in args.batch_sizes.split(",")]
    if len(lens) != len(batches):
        p.error("--seq-lens and --batch-sizes need the same number of entries")
    dtype = getattr(torch, args.dtype)
    peak = measure_matmul_tflops(args.device, dtype)
    spec = spec_tflops(args.device, dtype)
    name = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else "cpu"
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, {name}, {args.dtype}"
        f"{', compiled' if args.compile else ''}, threads {torch.get_num_threads()}; L{args.layers} H{args.hidden} "
        f"A{args.heads} FF{args.ffn} V{args.vocab}, dropout {args.dropout}, {args.decoder} decoder; "
        f"median of {args.repeats} x {args.steps} steps; measured GEMM peak {peak:.3g} TFLOPS"
        + (f", spec sheet {spec:.0f} dense" if spec else "")
    )
    results = []
    for length, batch in zip(lens, batches):
        tps, flops, mem = throughput(args, batch, length)
        mem = mem or {name: peak_memory_mb(args, name, batch, length) for name in args.models}
        mfu = {name: tps[name] * flops[name] / 1e12 / peak for name in args.models}
        results.append(
            {
                "seq_len": length,
                "batch": batch,
                "tokens_per_sec": tps,
                "peak_mb": mem,
                "mfu": mfu,
                "flops_per_token": flops,
                "gemm_tflops": peak,
                "spec_tflops": spec,
            }
        )
        spec_mfu = {name: tps[name] * flops[name] / 1e12 / spec for name in tps} if spec else None
        print_table(args, length, batch, tps, mem, mfu, spec_mfu)
        sys.stdout.flush()
        if args.json:  # after every shape: a run stopped at a time limit keeps the shapes it finished
            with open(args.json, "w") as f:
                json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
