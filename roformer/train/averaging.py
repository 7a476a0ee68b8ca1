"""Checkpoint averaging: the element-wise mean of the weights of a run's last N models (Vaswani et al. 2017).

The Transformer and RoFormer papers report the average of the last checkpoints (5 in RoFormer's table 1), as fairseq's
`scripts/average_checkpoints.py` computes it: every floating-point tensor is the mean of its values over the models,
summed in float64 and cast back to its dtype; a tensor of integers (a step counter, an index buffer) cannot be
averaged and is taken from the newest model. The fine-tuning recipe keeps the models of the last `train.average_last`
evaluation points of a run (`AveragePoints`) and writes their average beside the best one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def average_states(states: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The element-wise mean of state dicts of one model (same keys, same shapes), oldest first.

    Raises:
        ValueError: no state, or states of different keys or shapes.
    """
    if not states:
        raise ValueError("nothing to average: no state")
    keys = list(states[-1])
    for state in states:
        if set(state) != set(keys):  # in any order (a state read back from safetensors is sorted by name)
            raise ValueError("the states to average hold different tensors")
    averaged = {}
    for key in keys:
        tensors = [state[key] for state in states]
        if any(t.shape != tensors[-1].shape for t in tensors):
            raise ValueError(f"{key}: the states to average have different shapes")
        newest = tensors[-1]
        if not newest.is_floating_point():
            averaged[key] = newest.clone()
            continue
        total = torch.zeros(newest.shape, dtype=torch.float64)
        for tensor in tensors:
            total += tensor.detach().to("cpu", torch.float64)
        averaged[key] = (total / len(tensors)).to(newest.dtype)
    return averaged


def last_points(points: set[int] | Sequence[int], count: int) -> list[int]:
    """The last `count` of a run's evaluation steps, in order (all of them when there are fewer; none for 0)."""
    return sorted(points)[-count:] if count > 0 else []
