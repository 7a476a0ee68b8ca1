"""Speed of the heads added for the RoFormer family, against HF transformers in the same process, and the memory that
activation checkpointing saves.

    generate     greedy `generate()` with the KV cache, ours vs HF RoFormerForCausalLM.generate (same weights through
                 `to_hf`), new tokens per second; the outputs are checked to be the same tokens
    train-step   forward + backward + AdamW of token classification (full rows, and rows of mixed lengths) and of the
                 causal LM, ours vs HF's classes, with dropout (--dropout, 0.1 by default)
    checkpoint   activation checkpointing off vs on (MaskedLM training step): bytes of the activations kept for the
                 backward pass (counted exactly with torch.autograd.graph.saved_tensors_hooks; on CUDA also
                 max_memory_allocated) and the step time

Timings interleave the models (A, B, A, B, ...) and report medians over repeats, so machine noise hits both alike.

    python scripts/bench/bench_heads.py                      # all three on this CPU, small shapes
    python scripts/bench/bench_heads.py --only generate --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

import roformer
from roformer.model.flops import synchronize
from roformer.model.model import CausalLM, MaskedLM, TokenClassifier

SHAPE = dict(vocab_size=8000, hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024)


def config(**kw) -> roformer.ModelConfig:
    return roformer.ModelConfig(**{**SHAPE, "hidden_dropout": 0.0, "attention_dropout": 0.0, **kw})


def interleaved(fns: dict[str, Callable[[], object]], repeats: int, device: str) -> dict[str, float]:
    """Median seconds of each callable, run in turns after one warm-up call each."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def bench_generate(args: argparse.Namespace) -> list[str]:
    torch.manual_seed(0)
    ours = CausalLM(config()).to(args.device).eval()
    hf = roformer.to_hf(ours).to(args.device).eval()
    rows = ["| batch | prompt | new tokens | ours tokens/s | HF tokens/s | ours / HF | same tokens |", "|---" * 7 + "|"]
    for batch in args.generate_batches:
        g = torch.Generator().manual_seed(batch)
        ids = torch.randint(1, SHAPE["vocab_size"], (batch, args.prompt), generator=g).to(args.device)
        mask = torch.ones_like(ids)
        mask[1:, : args.prompt // 4] = 0  # left padding in every row but the first
        ids = ids.masked_fill(mask == 0, 0)
        new = args.new_tokens

        run_ours = partial(ours.generate, ids, mask, max_new_tokens=new)
        run_hf = partial(hf.generate, input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False,
                         pad_token_id=0)  # fmt: skip

        same = torch.equal(run_ours(), run_hf())
        t = interleaved({"ours": run_ours, "hf": run_hf}, args.repeats, args.device)
        rate = {k: batch * new / v for k, v in t.items()}
        rows.append(
            f"| {batch} | {args.prompt} | {new} | {rate['ours']:,.0f} | {rate['hf']:,.0f} | "
            f"{rate['ours'] / rate['hf']:.2f} | {'yes' if same else 'NO'} |"
        )
    return rows


def training_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> Callable[[], None]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def bench_train_step(args: argparse.Namespace) -> list[str]:
    """Training steps of full rows, and of token classification on rows of mixed lengths (right-padded, lengths
    uniform in [4, T]), where ours computes on the real tokens alone as `roformer finetune` does (`set_unpadding`)."""
    rows = ["| head | batch x length | padding | ours ms/step | HF ms/step | HF / ours |", "|---" * 6 + "|"]
    B, T = args.batch, args.length
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, SHAPE["vocab_size"], (B, T), generator=g)
    full = torch.ones_like(ids)
    lengths = torch.randint(4, T + 1, (B,), generator=g)
    mixed = (torch.arange(T)[None, :] < lengths[:, None]).long()
    tags = torch.randint(0, 9, (B, T), generator=g)
    heads = {
        "token classification": (TokenClassifier, full, {"labels": tags}, {"num_labels": 9}),
        "token classification, mixed lengths": (
            TokenClassifier,
            mixed,
            {"labels": tags.masked_fill(mixed == 0, -100)},
            {"num_labels": 9},
        ),
        "causal LM": (CausalLM, full, {"labels": ids}, {}),
    }
    dropout = {"hidden_dropout": args.dropout, "attention_dropout": args.dropout}
    for head, (cls, mask, labels, extra) in heads.items():
        torch.manual_seed(0)
        ours = cls(config(**extra, **dropout)).to(args.device).train()
        hf = roformer.to_hf(ours).to(args.device).train()
        ours.set_unpadding(True)
        batch = {"input_ids": ids * mask, "attention_mask": mask, **labels}
        batch = {k: v.to(args.device) for k, v in batch.items()}
        t = interleaved({"ours": training_step(ours, batch), "hf": training_step(hf, batch)}, args.repeats, args.device)
        padding = 1 - mask.float().mean().item()
        rows.append(
            f"| {head} | {B} x {T} | {padding:.0%} | {t['ours'] * 1e3:.0f} | {t['hf'] * 1e3:.0f} | "
            f"{t['hf'] / t['ours']:.2f} |"
        )
    return rows


def saved_activation_bytes(step: Callable[[], None]) -> int:
    """Bytes of the tensors autograd keeps for the backward pass during one step (each storage counted once)."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(storages.values())


def bench_checkpointing(args: argparse.Namespace) -> list[str]:
    rows = [
        "| batch x length | layers | kept activations off | on | on / off | step time on / off | peak CUDA on / off |",
        "|---" * 7 + "|",
    ]
    for T in args.checkpoint_lengths:
        B = max(1, args.batch * args.length // T)
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(1, SHAPE["vocab_size"], (B, T), generator=g).to(args.device)
        batch = {"input_ids": ids, "labels": ids}
        steps, kept, peaks = {}, {}, {}
        for on in (False, True):
            torch.manual_seed(0)
            model = MaskedLM(config(hidden_dropout=0.1, attention_dropout=0.1)).to(args.device).train()
            model.set_gradient_checkpointing(on)
            steps[on] = training_step(model, batch)
            kept[on] = saved_activation_bytes(steps[on])
            if args.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
                steps[on]()
                peaks[on] = torch.cuda.max_memory_allocated()
        t = interleaved({"off": steps[False], "on": steps[True]}, args.repeats, args.device)
        peak = f"{peaks[True] / peaks[False]:.2f}" if peaks else "(CPU)"
        rows.append(
            f"| {B} x {T} | {SHAPE['num_layers']} | {kept[False] / 2**20:.0f} MiB | {kept[True] / 2**20:.0f} MiB | "
            f"{kept[True] / kept[False]:.2f} | {t['on'] / t['off']:.2f} | {peak} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=["generate", "train-step", "checkpoint"], action="append")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=32, help="prompt length for generate")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--generate-batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--dropout", type=float, default=0.1, help="hidden and attention dropout of train-step")
    parser.add_argument("--checkpoint-lengths", type=lambda s: [int(x) for x in s.split(",")], default=[128, 512])
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    shape = ", ".join(f"{k} {v}" for k, v in SHAPE.items())
    print(f"device {args.device}, torch {torch.__version__}, {shape}, medians of {args.repeats} interleaved repeats")
    for name, bench in (
        ("generate", bench_generate),
        ("train-step", bench_train_step),
        ("checkpoint", bench_checkpointing),
    ):
        if args.only and name not in args.only:
            continue
        print(f"\n{name}\n")
        print("\n".join(bench(args)))


if __name__ == "__main__":
    main()
