"""Packed (isolated documents) against padded batches: real tokens per second of an MLM training step, same model.

    python scripts/bench_packing.py                          # roformer-small shape, T=128, CPU
    python scripts/bench_packing.py --model configs/model/roformer-tiny.yaml --length 256 --steps 10

Documents of random lengths (uniform in [--min-length, T], seeded) are batched three ways, each over the same
documents: padded (one document a row, `attention_mask`), padded and unpadded (`Model.set_unpadding`: the blocks
compute on real tokens, attention on the padded grid), and packed (documents first-fit into rows of T with
`document_ids`: attention never crosses a document, positions restart; the padding left is the rows' ends). A step is
forward + backward of the masked-LM loss at 15% of the real tokens. Prints the padding fraction of each layout and the
real tokens/s, with the ratio to padded. The three compute the same per-document outputs (tests/unit/
test_packed_documents.py); only the work differs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from roformer.config import load
from roformer.model.config import ModelConfig
from roformer.model.model import MaskedLM

REPO = Path(__file__).resolve().parents[1]


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


def seconds_per_step(model: MaskedLM, batches: list[dict[str, torch.Tensor]], steps: int) -> float:
    """Median seconds of forward + backward over `batches` (one warm-up pass first)."""
    times = []
    for i in range(steps + 1):
        batch = batches[i % len(batches)]
        t0 = time.perf_counter()
        model(**batch, labels=labels_of(batch, i)).loss.backward()
        model.zero_grad(set_to_none=True)
        if i:
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
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    config = replace(load(ModelConfig, args.model), vocab_size=8000, hidden_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    model = MaskedLM(config).train()
    groups = [documents(args.documents, args.min_length, args.length, config.vocab_size, seed) for seed in range(4)]
    real = statistics.fmean(sum(len(d) for d in docs) for docs in groups)
    layouts = {
        "padded": ([padded(docs, args.length) for docs in groups], False),
        "padded, unpadded blocks": ([padded(docs, args.length) for docs in groups], True),
        "packed, isolated documents": ([packed(docs, args.length) for docs in groups], False),
    }
    shape = f"{config.num_layers} x {config.hidden_size}, T={args.length}, {torch.get_num_threads()} threads"
    print(f"{shape}, {args.documents} documents of {args.min_length}-{args.length} tokens a step ({real:.0f} real)")
    print("| layout | rows | padding | real tokens/s | vs padded |\n|---|---|---|---|---|")
    base = None
    for name, (batches, unpadding) in layouts.items():
        model.set_unpadding(unpadding)
        rows = statistics.fmean(b["input_ids"].shape[0] for b in batches)
        padding = 1 - real / (rows * args.length)
        rate = real / seconds_per_step(model, batches, args.steps)
        base = base or rate
        print(f"| {name} | {rows:.1f} | {padding:.1%} | {rate:,.0f} | {rate / base:.2f}x |")


if __name__ == "__main__":
    main()
