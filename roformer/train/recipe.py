"""What a recipe gives the engine, and what a step and a resume are made of.

`Recipe` (pretraining, one fine-tuning run) plans each optimizer step (`StepPlan`: this process's micro-batches and
their loss), evaluates, saves and restores its own part of a checkpoint, and lists its stages (`Unstaged` for one
phase). `ProcessLayout` is where a process stands in a step; `dropout_seed` the seed of a chunk's dropout masks;
`layout_notice` what a resume under another process layout cannot carry over. The loop that runs them is
roformer.train.engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from roformer.train.config import ResolvedStage
from roformer.train.interval import MaskCounts, RunState


@dataclass(frozen=True)
class ProcessLayout:
    """Where this process stands in a step: what a step plan needs to take its share of the global batch."""

    rank: int
    num_processes: int
    batch_size: int  # examples per process and micro-batch
    grad_accum: int  # micro-batches per step
    device: torch.device


class StepPlan(Protocol):
    """One optimizer step's data, prepared by a recipe for this process: a value, holding no reference to its maker."""

    tokens: int  # real tokens of the global batch (for tokens_seen and tokens/s)
    padded_tokens: int | None  # positions computed over the global batch, padding included; None: no padding
    mask: MaskCounts | None  # an MLM step's mask rate asked for and realised (logged); None: a step without one

    def micro(self, micro: int) -> Any:
        """This process's inputs of micro-batch `micro`, on the device."""

    def loss(self, model: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(the loss to back-propagate, this process's share of the step's loss: the shares sum to it)."""


class Recipe(Protocol):
    """What a recipe (pretraining, one fine-tuning run) gives the engine.

    `stages` lists the recipe's stages in order (pretraining's `stages:`, each with its own batch layout; one unnamed
    stage for a run without them), or none (fine-tuning: `Unstaged`). The engine enters a stage before its first step
    (and before a resumed step inside it), evaluates and checkpoints at every named stage's end, and tags train and
    eval events with the stage's name.
    """

    stages: Sequence[ResolvedStage]

    def plan(self, step: int) -> StepPlan:
        """The data of optimizer step `step`."""

    def evaluate(self, step: int) -> list[dict[str, Any]]:
        """Evaluation events (metrics) after `step` steps, computed by all processes."""

    def epoch_of(self, step: int) -> float:
        """Epochs completed after `step` steps."""

    def steps_per_epoch(self) -> float | None:
        """Optimizer steps in one epoch (None: unknown, e.g. a stream)."""

    def save_checkpoint_state(self, directory: Path) -> dict[str, Any]:
        """Write what a checkpoint needs beyond model, optimizer and RNG (main process); returns its JSON state."""

    def load_checkpoint_state(self, directory: Path, state: dict[str, Any], step: int) -> None:
        """Restore what `save_checkpoint_state` wrote, to continue after `step` steps."""

    def micro_batch_loss(self) -> str | None:
        """Why a micro-batch's loss depends on which examples share it; None when it does not.

        None: the loss is a sum or mean of per-example terms over the global batch. Otherwise the same chunks of
        batch_size examples give the same steps however they are spread, but another batch_size gives other steps.
        """

    def snapshot_points(self) -> set[int]:
        """The steps after which the engine hands the weights to `snapshot` (fine-tuning's `train.average_last`)."""

    def snapshot(self, step: int) -> None:
        """Keep the model's weights after `step` (called at the steps of `snapshot_points`)."""

    def converged(self, step: int) -> bool:
        """Whether the run ends after `step`, before its last step (fine-tuning's `train.patience`).

        Decided from what every process computed alike (the dev scores), so that every process stops together.
        """

    def enter_stage(self, stage: ResolvedStage) -> None:
        """Make the model compute as `stage` trains (e.g. its rotary base)."""

    def end_stage(self, stage: ResolvedStage, state: RunState) -> dict[str, Any]:
        """Write what a stage leaves behind (its model folder) after its last step; the fields of its end event."""


class Unstaged:
    """The stage part of a recipe whose steps are one phase (fine-tuning): no stages, so nothing to enter or end."""

    stages: Sequence[ResolvedStage] = ()

    def enter_stage(self, stage: ResolvedStage) -> None:
        """Never called: the engine enters the stages a recipe lists."""
        raise AssertionError(f"{type(self).__name__} has no stages")

    def end_stage(self, stage: ResolvedStage, state: RunState) -> dict[str, Any]:
        """Never called: the engine ends the stages a recipe lists."""
        raise AssertionError(f"{type(self).__name__} has no stages")


def dropout_seed(seed: int, step: int, chunk: int) -> int:
    """The seed of the dropout masks of chunk `chunk` (batch_size examples) of step `step`'s global batch.

    Micro-batch m of process r is chunk m x processes + r (roformer.data.sampling.share): the same examples get the
    same masks however the chunks are spread over processes and micro-batches. With one micro-batch per step the
    chunk is the rank, as the seed was before chunks had one of their own.
    """
    return (seed << 32) + step * 4096 + chunk


def saved_layout(saved: dict[str, Any]) -> dict[str, int]:
    """The layout a checkpoint was written under; of one written before checkpoints recorded it, the process count."""
    if isinstance(saved.get("layout"), dict):
        return saved["layout"]
    return {"processes": len(saved["intervals"])} if saved.get("intervals") else {}


def layout_notice(saved: dict[str, int], now: dict[str, int], dropout: bool, recipe: Recipe) -> str | None:
    """What a resume under another process layout cannot carry over, in one line; None when it continues exactly.

    The data, masks, schedule and loss normalisation are the step's; a checkpoint's RNG streams are not needed (the
    RNG is reseeded per micro-batch). What depends on the chunks of batch_size examples is redrawn or recomputed when
    batch_size changes (or is unknown, in a checkpoint that did not record it): dropout masks, and a recipe's loss
    over a micro-batch (`Recipe.micro_batch_loss`).
    """
    changed = [f"{k} {saved[k]} -> {now[k]}" for k in now if k in saved and saved[k] != now[k]]
    if not changed:
        return None
    if saved.get("batch_size") == now["batch_size"]:
        return None  # the same chunks, spread over other processes and micro-batches: exact
    reasons = ["dropout masks are drawn per micro-batch of batch_size examples"] if dropout else []
    loss = recipe.micro_batch_loss()
    if loss:
        reasons.append(loss)
    if not reasons:
        return None
    keep = f"train.batch_size={saved['batch_size']}" if "batch_size" in saved else "the batch_size it was written with"
    return (
        f"resumed under another layout ({', '.join(changed)}): the data order, schedule and optimizer state carry "
        f"over, but {' and '.join(reasons)}, so from here on they differ from the uninterrupted run's (keep {keep} "
        "and set grad_accum to continue exactly)"
    )


def interval_of(saved: list[dict[str, Any]], rank: int, num_processes: int) -> dict[str, Any]:
    """This process's interval sums from a checkpoint's (one entry per process that wrote it).

    Under another process layout (same global batch) the loss shares are summed onto rank 0 and the others start
    from zero: the event's loss, a sum over processes, is the same.
    """
    if len(saved) == num_processes:
        return saved[rank]
    losses = [entry["loss"] for entry in saved if entry["loss"] is not None]
    total = sum(losses) if losses else None
    return {**saved[0], "loss": total if rank == 0 or total is None else 0.0}


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` on `device`; on a GPU copied from pinned host memory without blocking the host."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)
