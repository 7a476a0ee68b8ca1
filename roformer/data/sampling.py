"""Launch-independent batch order: which examples optimizer step `s` trains on, and which rows each process takes.

The data position is a function of the step (exact resume needs no sampler state), every global batch is full (an
epoch boundary falls inside a batch), and the order does not depend on the number of processes or on gradient
accumulation: one process with batch 2B, two with B, and one with B and two micro-batches see the same examples.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from roformer.errors import UserError


class EpochSampler:
    """Example indices of optimizer step `s`: positions [s*G, (s+1)*G) of seeded per-epoch permutations.

    Args:
        size: Number of examples.
        global_batch: G, examples per optimizer step over all processes and micro-batches.
        seed: Seed of the permutations (epoch e uses seed * 1_000_003 + e).
    """

    def __init__(self, size: int, global_batch: int, seed: int) -> None:
        if size < 1:
            raise UserError("no training examples")
        self.size = size
        self.global_batch = global_batch
        self.seed = seed
        self._epoch: tuple[int, torch.Tensor] | None = None

    def indices(self, step: int) -> torch.Tensor:
        """(G,) indices of `step`."""
        return self.at(step * self.global_batch, self.global_batch)

    def at(self, start: int, count: int) -> torch.Tensor:
        """(count,) indices at positions [start, start + count) of the epochs' orders laid end to end."""
        n = self.size
        positions = torch.arange(start, start + count)
        out = torch.empty_like(positions)
        for epoch in positions.div(n, rounding_mode="floor").unique().tolist():
            in_epoch = positions // n == epoch
            out[in_epoch] = self.permutation(epoch)[positions[in_epoch] % n]
        return out

    def permutation(self, epoch: int) -> torch.Tensor:
        """The order of epoch `epoch`."""
        if self._epoch is None or self._epoch[0] != epoch:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._epoch = (epoch, torch.randperm(self.size, generator=generator))
        return self._epoch[1]

    def epoch_of(self, step: int) -> float:
        """Epochs completed at the start of `step` (fractional)."""
        return self.epoch_at(step * self.global_batch)

    def epoch_at(self, position: int) -> float:
        """Epochs completed after `position` examples (fractional)."""
        return position / self.size


class LengthGroupedSampler(EpochSampler):
    """EpochSampler whose per-epoch orders put examples of similar length into the same global batch.

    Each epoch's permutation is cut into windows of `window` global batches; inside a window the examples are sorted
    by length and the resulting global batches are shuffled (seeded), so a batch holds neighbours in length while the
    order of lengths over training stays random (HF's `group_by_length` sorts megabatches of 50 batches the same way).
    Batches are aligned with the step grid even when an epoch starts inside a global batch, and every order is still
    a permutation that depends only on (seed, epoch): resume and launch independence are unchanged. Less padding,
    slightly less random batches (a batch's gradient is over similar-length examples).

    Args:
        lengths: Tokens per example.
        global_batch: G, examples per optimizer step.
        seed: Seed of the permutations.
        window: Global batches sorted together.
    """

    def __init__(self, lengths: list[int], global_batch: int, seed: int, window: int = 50) -> None:
        super().__init__(len(lengths), global_batch, seed)
        self.lengths = torch.tensor(lengths)
        self.window = window

    def permutation(self, epoch: int) -> torch.Tensor:
        """The random order of `epoch`, regrouped by length within each window."""
        if self._epoch is not None and self._epoch[0] == epoch:
            return self._epoch[1]
        order = super().permutation(epoch)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch + 500_009)
        g, n = self.global_batch, self.size
        head = (-(epoch * n)) % g  # positions finishing a global batch that began in the previous epoch
        parts = [order[:head]] if head else []
        for start in range(head, n, self.window * g):
            window = order[start : start + self.window * g]
            window = window[torch.sort(self.lengths[window], descending=True, stable=True).indices]
            batches = list(window.split(g))
            full = [b for b in batches if len(b) == g]  # a short last batch is cut by the epoch's end: stays last
            shuffled = [full[i] for i in torch.randperm(len(full), generator=generator).tolist()]
            parts += shuffled + batches[len(full) :]
        self._epoch = (epoch, torch.cat(parts))
        return self._epoch[1]


def share(batch: Any, micro: int, rank: int, num_processes: int, batch_size: int) -> Any:
    """Rows of micro-batch `micro` for process `rank`: chunk micro * processes + rank of a global batch."""
    chunk = micro * num_processes + rank
    return batch[chunk * batch_size : (chunk + 1) * batch_size]


def global_batch_size(batch_size: int, num_processes: int, grad_accum: int) -> int:
    """Examples per optimizer step: `batch_size` per process and micro-batch, over processes and micro-batches."""
    return batch_size * num_processes * grad_accum


def token_batches(sizes: Sequence[int], order: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Rows cut into batches by a token budget, in `order`: each batch's rows x its largest size is at most max_tokens.

    fairseq's `batch_by_size`: with rows in order of length, a batch takes the next rows while count x longest stays
    within the budget, so a batch of short sentences holds many and one of long sentences few, and padding is small.

    Args:
        sizes: Tokens a row costs in a batch (a pair's: the longer side, padded as batches are).
        order: The rows in the order batches take them (by length, for little padding).
        max_tokens: The budget.

    Raises:
        ValueError: a row larger than the budget by itself.
    """
    batches: list[list[int]] = []
    batch: list[int] = []
    longest = 0
    for row in order:
        size = sizes[row]
        if size > max_tokens:
            raise ValueError(f"row {row} has {size} tokens, more than max_tokens {max_tokens}")
        if batch and (len(batch) + 1) * max(longest, size) > max_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(row)
        longest = max(longest, size)
    if batch:
        batches.append(batch)
    return batches
