"""The optimizer: AdamW parameter groups, the warmup + decay schedule, and the end of a micro-step (clip, step)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from roformer.errors import CheckpointError, UserError
from roformer.train.config import DECAY_SHAPES, SCHEDULES


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: weight decay on >= 2-D weights (matrices, embeddings) only; none on biases, LayerNorm, scalars.

    As in nanoGPT and BERT: decaying gains and biases pulls them towards 0, which is not regularisation.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def make_optimizer(
    model: torch.nn.Module,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    eps: float,
    warmup_steps: int,
    total_steps: int,
    schedule: str = "linear",
    fused: bool | None = None,
    decay_steps: int = 0,
    decay_shape: str = "1-sqrt",
    multiplier: Callable[[int], float] | None = None,
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `param_groups` and its warmup + decay schedule (stepped once per optimizer step).

    `fused` (None: on when CUDA is present) uses the one-kernel CUDA AdamW instead of a kernel per tensor group.
    `multiplier` (a run in stages: roformer.train.stages.lr_multiplier_for) replaces the schedule's factor of `lr`.
    """
    if fused is None:
        fused = torch.cuda.is_available()
    groups = param_groups(model, weight_decay)
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused or None)
    if multiplier is None:

        def multiplier(s: int) -> float:
            return lr_multiplier(s, warmup_steps, total_steps, schedule, decay_steps, decay_shape)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)
    return optimizer, scheduler


MOMENTS_FILE = "optimizer.pt"  # AdamW's state in a stage folder: a branch continues it


def save_moments(optimizer: torch.optim.Optimizer, path: Path) -> None:
    """Write the optimizer's per-parameter state (AdamW's moments and step counts) to `path` (full tensors)."""
    torch.save({"state": optimizer.state_dict()["state"]}, path)


def read_moments(optimizer: torch.optim.Optimizer, path: Path) -> dict[int, dict[str, Any]]:
    """The per-parameter state `save_moments` wrote, checked against this optimizer's parameters (not yet loaded).

    Raises:
        CheckpointError: the file is damaged or is not an optimizer state, naming it.
        UserError: the saved state does not fit the parameters (another model's file).
    """
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)["state"]
    except Exception as e:  # a truncated zip, a pickle torch refuses, another object: the file is not usable
        raise CheckpointError(f"{path}: damaged or not an optimizer state (torch.load: {type(e).__name__})") from None
    if not isinstance(saved, dict) or not all(isinstance(i, int) and isinstance(v, dict) for i, v in saved.items()):
        raise CheckpointError(f"{path}: not an optimizer state (expected a state per parameter index)")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, state in saved.items():
        shape = state.get("exp_avg", torch.empty(0)).shape
        if index >= len(params) or (shape and shape != params[index].shape):
            raise UserError(f"{path}: the optimizer state does not fit this model's parameters (parameter {index})")
    return saved


def apply_moments(optimizer: torch.optim.Optimizer, saved: dict[int, dict[str, Any]]) -> int:
    """Continue the moments `read_moments` returned, under this optimizer's own hyperparameters.

    The learning rate, betas and weight decay stay this run's: only the moments and step counts carry over (a decay
    branched off another run's stage continues its AdamW state). Returns how many parameters' states were loaded.
    """
    optimizer.load_state_dict({"state": saved, "param_groups": optimizer.state_dict()["param_groups"]})
    return len(saved)


def load_moments(optimizer: torch.optim.Optimizer, path: Path) -> int:
    """`read_moments` then `apply_moments`: returns how many parameters' states were loaded.

    Raises:
        CheckpointError: a damaged file. UserError: a state that does not fit the parameters.
    """
    return apply_moments(optimizer, read_moments(optimizer, path))


def finish_micro_step(
    accelerator: Any, model: Any, optimizer: Any, scheduler: Any, max_grad_norm: float | None, guard: bool = True
) -> tuple[float | None, bool]:
    """Finish a micro-batch inside `accelerator.accumulate`: clip and step at the last one, then zero gradients.

    With `guard`, a non-finite gradient norm (a NaN or inf loss gives one too) skips the update: the gradients are
    dropped and the weights and optimizer state stay as they were. The norm is reduced over all processes, so they
    all skip together. The schedule still advances (it is indexed by step, like the data). Under fp16 loss scaling
    the scaler skips such steps itself, so the caller passes `guard=False`; its skips are reported all the same, so
    that they count towards `train.max_bad_steps` and stay out of the averaged loss and gradient norm.

    Returns:
        (the global gradient norm before clipping at the last micro-batch, nan if unknown, else None;
        whether this update was skipped as non-finite).
    """
    norm, skipped = None, False
    if accelerator.sync_gradients:
        value = accelerator.clip_grad_norm_(model.parameters(), max_grad_norm or math.inf)
        norm = float(value) if value is not None else float("nan")
        skipped = guard and value is not None and not math.isfinite(norm)
    if skipped:
        optimizer.zero_grad(set_to_none=True)  # nothing for the optimizer to apply
        with warnings.catch_warnings():  # "scheduler before optimizer" is the point here: the step index advances
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            scheduler.step()
        return norm, True
    scaler = getattr(accelerator, "scaler", None) if accelerator.sync_gradients else None
    scale = scaler.get_scale() if scaler is not None else None
    optimizer.step()  # accelerate's wrapper only steps when gradients are synchronised
    # fp16: the scaler skips a step with inf/nan gradients and lowers its scale. Read the skip from the scale: with a
    # fused optimizer (the CUDA default) accelerate's `optimizer_step_was_skipped` never sees it.
    skipped = scaler is not None and scaler.get_scale() < scale
    if accelerator.sync_gradients:
        with warnings.catch_warnings():  # a skipped step still advances the schedule (indexed by step)
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm, skipped


def lr_multiplier(
    step: int,
    warmup_steps: int,
    total_steps: int,
    schedule: str = "linear",
    decay_steps: int = 0,
    decay_shape: str = "1-sqrt",
) -> float:
    """Learning-rate factor at optimizer step `step` (0-based): linear warmup to 1, then decay to 0 at `total_steps`.

    Steps are optimizer updates, i.e. after gradient accumulation and independent of the number of processes: the
    schedule ends exactly at `train.max_steps` whatever the launch (a known pitfall of the HF example scripts).
    `wsd` (warmup-stable-decay) holds 1 after warmup until the last `decay_steps` steps, which decay to 0 in
    `decay_shape` (from the end of warmup if the two overlap). As in the other schedules, the run's last step is one
    step of progress short of 0. `inverse_sqrt` (Vaswani et al. 2017, fairseq) is min(s / warmup, sqrt(warmup / s))
    at update s = step + 1: the linear warmup, then the inverse square root of the update number, whatever the run's
    length.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r} (known: {', '.join(SCHEDULES)})")
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "inverse_sqrt":
        if warmup_steps < 1:
            raise ValueError("the inverse_sqrt schedule needs warmup_steps >= 1")
        return math.sqrt(warmup_steps / (step + 1))
    if schedule == "wsd":
        start = max(total_steps - decay_steps, warmup_steps)  # the decay's first step
        return 1.0 if step < start else decayed(min(1.0, (step - start) / max(1, total_steps - start)), decay_shape)
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return decayed(progress, schedule)


def decayed(progress: float, shape: str) -> float:
    """The factor `progress` (0 to 1) into a decay from 1 to 0 of `shape`: linear, cosine or 1-sqrt."""
    if shape not in DECAY_SHAPES:
        raise ValueError(f"unknown decay shape {shape!r} (known: {', '.join(DECAY_SHAPES)})")
    if shape == "linear":
        return 1.0 - progress
    if shape == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0 - math.sqrt(progress)
