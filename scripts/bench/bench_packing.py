"""Packed (isolated documents) against padded batches: real tokens per second of an MLM training step, same model.

    python scripts/bench/bench_packing.py                          # roformer-small shape, T=128, CPU
    python scripts/bench/bench_packing.py --model configs/model/roformer-tiny.yaml --length 256 --steps 10
    python scripts/bench/bench_packing.py --model configs/model/roformer-base.yaml --length 512 --device cuda \
        --dtype bfloat16

Documents of random lengths (uniform in [--min-length, T], seeded) are batched three ways, each over the same
documents: padded (one document a row, `attention_mask`), padded and unpadded (`Model.set_unpadding`: the blocks
compute on real tokens, attention on the padded grid), and packed (documents first-fit into rows of T with
`document_ids`: attention never crosses a document, positions restart; the padding left is the rows' ends). A step is
forward + backward of the masked-LM loss at 15% of the real tokens. Prints the padding fraction of each layout and the
real tokens/s, with the ratio to padded. Where torch's variable-length attention runs (CUDA, bf16/fp16), two layouts
more attend with it (`Model.set_varlen_attention`): unpadded and packed rows, with no grid and no mask. All compute
the same per-document outputs (tests/unit/test_packed_documents.py, test_varlen_attention.py); only the work differs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from roformer.config import load
from roformer.model.attention import varlen_kernel_available
from roformer.model.config import ModelConfig
from roformer.model.flops import synchronize
from roformer.model.model import MaskedLM

REPO = Path(__file__).resolve().parents[2]


def documents(count: int, low: int, high: int, vocab: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (count,), generator=g).tolist()
    return [torch.randint(5, vocab, (n,), generator=g) for n in lengths]


def padded(docs: list[torch.Tensor], length: int) -> dict[str, torch.Tensor]:
    ids = torch.zeros(len(docs), length, dtype=torch.long)
    for row, doc in enumerate(docs):
        ids[row, : len(doc)] = doc
    return {"input_ids": ids, "attention_mask": (ids != 0).long()}


def packed(docs: list[torch.Tensor], length: int) -> dict[str, torch.Tensor]:
    """First-fit: each document into the first row with room, a new row when none has."""
    rows: list[list[torch.Tensor]] = []
    for doc in docs:
        room = next((r for r in rows if sum(map(len, r)) + len(doc) <= length), None)
        rows.append([doc]) if room is None else room.append(doc)
    ids = torch.zeros(len(rows), length, dtype=torch.long)
    document_ids = torch.full((len(rows), length), -1, dtype=torch.long)
    for row, parts in enumerate(rows):
        start = 0
        for d, doc in enumerate(parts):
            ids[row, start : start + len(doc)] = doc
            document_ids[row, start : start + len(doc)] = d
            start += len(doc)
    return {"input_ids": ids, "attention_mask": (document_ids >= 0).long(), "document_ids": document_ids}


def labels_of(batch: dict[str, torch.Tensor], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    chosen = (torch.rand(batch["input_ids"].shape, generator=g) < 0.15) & batch["attention_mask"].bool()
    return torch.where(chosen, batch["input_ids"], -100)


def seconds_per_step(
    model: MaskedLM, batches: list[dict[str, torch.Tensor]], steps: int, device: str, dtype: torch.dtype
) -> float:
    """Median seconds of forward + backward over `batches` (one warm-up pass first), under autocast to `dtype`."""
    times = []
    for i in range(steps + 2):
        batch = {k: v.to(device) for k, v in batches[i % len(batches)].items()}
        labels = labels_of(batches[i % len(batches)], i).to(device)
        synchronize(device)
        t0 = time.perf_counter()
        with torch.autocast(device.split(":")[0], dtype=dtype, enabled=dtype != torch.float32):
            loss = model(**batch, labels=labels).loss
        loss.backward()
        model.zero_grad(set_to_none=True)
        synchronize(device)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(REPO / "configs/model/roformer-small.yaml"))
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--min-length", type=int, default=8)
    parser.add_argument("--documents", type=int, default=64, help="documents per padded batch")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    config = replace(load(ModelConfig, args.model), vocab_size=8000, hidden_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    model = MaskedLM(config).to(args.device).train()
    groups = [documents(args.documents, args.min_length, args.length, config.vocab_size, seed) for seed in range(4)]
    real = statistics.fmean(sum(len(d) for d in docs) for docs in groups)
    pads, packs = [padded(docs, args.length) for docs in groups], [packed(docs, args.length) for docs in groups]
    layouts = {  # name: batches, unpadding, variable-length kernel
        "padded": (pads, False, False),
        "padded, unpadded blocks": (pads, True, False),
        "packed, isolated documents (mask)": (packs, False, False),
    }
    if varlen_kernel_available(torch.device(args.device), dtype, config.head_size):
        layouts["padded, unpadded, varlen attention"] = (pads, True, True)
        layouts["packed, isolated documents, varlen attention"] = (packs, True, True)
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"{torch.get_num_threads()} threads"
    shape = f"{config.num_layers} x {config.hidden_size}, T={args.length}, {args.dtype}, {device}"
    print(f"{shape}, {args.documents} documents of {args.min_length}-{args.length} tokens a step ({real:.0f} real)")
    print("| layout | rows | padding | real tokens/s | vs padded |\n|---|---|---|---|---|")
    base = None
    for name, (batches, unpadding, varlen) in layouts.items():
        model.set_unpadding(unpadding)
        model.set_varlen_attention(varlen)
        rows = statistics.fmean(b["input_ids"].shape[0] for b in batches)
        padding = 1 - real / (rows * args.length)
        rate = real / seconds_per_step(model, batches, args.steps, args.device, dtype)
        base = base or rate
        print(f"| {name} | {rows:.1f} | {padding:.1%} | {rate:,.0f} | {rate / base:.2f}x |")


if __name__ == "__main__":
    main()
