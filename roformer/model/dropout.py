"""Dropout (Srivastava et al. 2014): inverted, as torch's, with a cheaper mask on CPU.

Every dropout of the model goes through here: the embeddings', the blocks', the heads' (`Dropout`) and attention's
(`dropout`, `dropout_mask`, which the written-out softmax kernels use).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """Zero each element with probability `p` and scale the rest by 1 / (1 - p), in training; else `x` as it is.

    On CPU torch draws one Mersenne-Twister number per element, one at a time, and that single-threaded draw was 29%
    of a fine-tuning step of a small model (2 x 64, batch 32 x 128, attention dropout included). Here one 64-bit
    draw gives two elements 32 random bits each, compared with a threshold in one vectorised pass: about 3x less
    time for the mask, at a finer resolution than torch.rand's 24-bit floats. The drop probability is
    round(p * 2^32) / 2^32, and the scale the inverse of its complement, so the expectation is kept exactly. Other
    devices use torch's dropout (its Philox generator is already parallel). Both draw from the global generator, so
    seeding, checkpointed recomputation and resumed runs replay the same masks.

    Raises:
        ValueError: `p` is not in [0, 1] (NaN included), with F.dropout's message, whether training or not.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return x
    if not cheaper_mask_applies(x) or p >= 1.0:
        return F.dropout(x, p, training=True)
    drop, scale = dropout_mask(x, p)
    return torch.where(drop, 0.0, x * scale)


def cheaper_mask_applies(x: Tensor) -> bool:
    """Whether `dropout` draws its own mask for `x`: on CPU in eager mode.

    A compiled graph keeps torch's dropout, which inductor generates as a fused, parallel draw (the in-place draw
    here would split the graph in two).
    """
    return x.device.type == "cpu" and not torch.compiler.is_compiling()


def dropout_mask(x: Tensor, p: float) -> tuple[Tensor, float]:
    """For `dropout` on CPU: which elements of `x` to zero (a bool tensor of its shape) and the scale of the rest."""
    dropped = min(round(p * 2**32), 2**32 - 1)  # of the 2^32 values of a uniform int32
    # uniform over all 64 bits (random_() alone leaves the top one 0), so each int32 half is uniform too
    draws = torch.empty((x.numel() + 1) // 2, dtype=torch.int64, device=x.device).random_(-(2**63), 2**63 - 1)
    drop = draws.view(torch.int32)[: x.numel()] < dropped - 2**31  # the `dropped` lowest of [-2^31, 2^31)
    return drop.view(x.shape), 2**32 / (2**32 - dropped)


class Dropout(nn.Dropout):
    """`nn.Dropout` through `dropout` (the cheaper CPU mask); the same module otherwise (`p`, repr, no weights)."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)
