"""Evaluation of a masked language model on pre-masked blocks, sharded over processes (training and eval-mlm)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from roformer.data.masking import IGNORE_INDEX, masked_positions


@torch.no_grad()
def evaluate_mlm(
    model: torch.nn.Module,
    ids: torch.Tensor,
    labels: torch.Tensor,
    batch_size: int,
    device: torch.device,
    rank: int = 0,
    num_processes: int = 1,
    reduce: Any = None,
    documents: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> dict[str, float]:
    """Masked-token loss and accuracy over pre-masked blocks; each process takes a contiguous share of the rows.

    Sums (not means) are reduced across processes, so the result equals one process's exactly. `documents` gives a
    batch's (document_ids, position_ids) when documents are isolated (`data.packing: isolated`).

    Returns:
        {"eval_loss": mean cross-entropy per masked token, "eval_accuracy": top-1 accuracy, "eval_tokens": count}.
    """
    was_training = model.training
    model.eval()
    totals = torch.zeros(3, dtype=accumulator_dtype(device), device=device)  # loss sum, correct, count
    for chunk in eval_chunks(len(ids), batch_size, rank, num_processes):
        if chunk is None:  # this process has fewer rows than another: a forward to keep FSDP's collectives paired
            model(ids[:1].to(device))
            continue
        x, y = ids[chunk].to(device), labels[chunk].to(device)
        n = int((y != IGNORE_INDEX).sum())
        if n == 0:
            model(x)  # nothing to score, but the other processes run this forward too
            continue
        positions = masked_positions(y)  # bucketed: no data-dependent shape inside a compiled model
        isolated = {} if documents is None else dict(zip(("document_ids", "position_ids"), documents(x), strict=True))
        out = model(x, labels=y, masked_only=True, masked_positions=positions, **isolated)
        target = y.flatten()[positions]  # padded rows carry -100 and never count as correct
        totals += torch.stack(
            [
                out.loss.to(totals.dtype) * n,
                (out.logits.argmax(-1) == target).sum().to(totals.dtype),
                torch.tensor(n, dtype=totals.dtype, device=device),
            ]
        )
    if reduce is not None:
        totals = reduce(totals)
    model.train(was_training)
    count = max(totals[2].item(), 1.0)
    return {
        "eval_loss": totals[0].item() / count,
        "eval_accuracy": totals[1].item() / count,
        "eval_tokens": int(totals[2].item()),
    }


def eval_chunks(num_rows: int, batch_size: int, rank: int, num_processes: int) -> list[torch.Tensor | None]:
    """This process's batches of a contiguous share of `num_rows` rows, padded with None to the longest share's count.

    Shares differ by at most one row, which can mean one batch more on some processes. Under FSDP (and ZeRO-3) every
    forward is a collective: a process that stops early leaves the others waiting forever. So every process runs
    the same number of forwards; a None is a forward whose output is discarded.
    """
    shares = torch.arange(num_rows).tensor_split(num_processes)
    most = max(math.ceil(len(share) / batch_size) for share in shares)
    mine: list[torch.Tensor | None] = list(shares[rank].split(batch_size)) if len(shares[rank]) else []
    return mine + [None] * (most - len(mine))


def accumulator_dtype(device: torch.device) -> torch.dtype:
    """float64, so that sums over millions of tokens stay exact; float32 on MPS, which has no float64."""
    return torch.float32 if device.type == "mps" else torch.float64
