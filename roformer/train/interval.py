"""A run's counters, the numbers of one optimizer step, and their sums between two train events of metrics.jsonl."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class RunState:
    """Counters of a run, saved in every checkpoint."""

    step: int = 0
    tokens_seen: int = 0
    elapsed_sec: float = 0.0  # training time: evaluation and checkpoint writes excluded
    skipped_steps: int = 0  # updates skipped for a non-finite loss or gradient norm
    bad_steps: int = 0  # of those, how many in a row up to now


@dataclass
class MaskCounts:
    """An MLM step's masking: the rate it selected with, the tokens it masked and those it could have."""

    rate: float
    masked: int
    maskable: int


@dataclass
class StepResult:
    """What one optimizer step reports."""

    loss: torch.Tensor  # this process's share of the step's loss
    grad_norm: float
    lr: float
    data_sec: float
    step_sec: float
    tokens: int
    skipped: bool = False
    padded_tokens: int | None = None  # positions computed, padding included (None: no padding)
    mask: MaskCounts | None = None  # an MLM step's masking (None: not MLM)


class Pace:
    """Where a run's wall time goes, and the tokens/s it keeps of its own training steps' rate.

    The steps (and the data they wait for inside them), then evaluation, checkpoints, logging and stage folders
    between them; the rest (`other_sec`) is the loop itself.
    """

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.tokens: list[int] = []
        self.seconds: list[float] = []
        self.data_sec = 0.0
        self.between: dict[str, float] = {"eval": 0.0, "checkpoint": 0.0, "log": 0.0, "stage": 0.0}

    @property
    def steps(self) -> int:
        return len(self.tokens)

    def add(self, result: StepResult) -> None:
        """Count one training step."""
        self.tokens.append(result.tokens)
        self.seconds.append(result.step_sec)
        self.data_sec += result.data_sec

    @contextlib.contextmanager
    def spent(self, what: str) -> Iterator[None]:
        """Time the block as `what` (eval, checkpoint, log, stage)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.between[what] += time.perf_counter() - t0

    def event(self) -> dict[str, Any]:
        """The `throughput` event: whole-run and training-step tokens/s, the share kept, where the rest went.

        Also the step rates of the first and last tenth of the steps: a run whose steps slow down shows it there.
        """
        wall = time.perf_counter() - self.start
        tokens, train = sum(self.tokens), sum(self.seconds)
        tenth = max(1, self.steps // 10)
        first = sum(self.tokens[:tenth]) / max(sum(self.seconds[:tenth]), 1e-9)
        last = sum(self.tokens[-tenth:]) / max(sum(self.seconds[-tenth:]), 1e-9)
        between = {f"{k}_sec": v for k, v in self.between.items()}
        return {
            "steps": self.steps,
            "tokens": tokens,
            "wall_sec": wall,
            "train_sec": train,
            "tokens_per_sec": tokens / max(wall, 1e-9),
            "step_tokens_per_sec": tokens / max(train, 1e-9),
            "kept": train / max(wall, 1e-9),
            "data_sec": self.data_sec,
            **between,
            "other_sec": wall - train - sum(self.between.values()),
            "first_tenth_tokens_per_sec": first,
            "last_tenth_tokens_per_sec": last,
        }


class Interval:
    """Sums over the steps between two train events."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss: torch.Tensor | None = None
        self.grad_norm = self.data_sec = self.step_sec = 0.0
        self.tokens = self.steps = self.finite_steps = self.padded = self.masked = self.maskable = 0
        self.lr = 0.0
        self.mask_rate: float | None = None

    def add(self, result: StepResult) -> None:
        """Add one step; a skipped (non-finite) step counts for time and tokens, not for loss and gradient norm."""
        if not result.skipped:
            self.loss = result.loss if self.loss is None else self.loss + result.loss
            self.grad_norm += result.grad_norm
            self.finite_steps += 1
        self.data_sec += result.data_sec
        self.step_sec += result.step_sec
        self.tokens += result.tokens
        self.padded += result.padded_tokens if result.padded_tokens is not None else result.tokens
        self.steps += 1
        self.lr = result.lr
        if result.mask is not None:
            self.masked += result.mask.masked
            self.maskable += result.mask.maskable
            self.mask_rate = result.mask.rate

    def state_dict(self) -> dict[str, Any]:
        """The sums so far (JSON-ready; the loss share exactly, as the float32 value it is), for a checkpoint."""
        sums = {k: v for k, v in vars(self).items() if k != "loss"}
        return {**sums, "loss": None if self.loss is None else self.loss.item()}

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        """Continue the sums of `state_dict` (a resumed run's first event then averages the same steps)."""
        self.reset()
        for key, value in state.items():
            if key != "loss":
                setattr(self, key, value)
        if state.get("loss") is not None:
            self.loss = torch.tensor(state["loss"], dtype=torch.float32, device=device)

    def event(self, reduce: Callable[..., torch.Tensor], state: RunState) -> dict[str, Any]:
        """The numbers of a train event (loss summed over processes, averaged over the interval), then reset.

        Loss and gradient norm average the finite steps (nan if every step of the interval was skipped).
        """
        finite = self.finite_steps
        loss = reduce(self.loss, "sum").item() / finite if self.loss is not None else math.nan
        event = {
            "loss": loss,
            "lr": self.lr,
            "grad_norm": self.grad_norm / finite if finite else math.nan,
            "tokens_seen": state.tokens_seen,
            "tokens_per_sec": self.tokens / max(self.step_sec, 1e-9),
            "elapsed_sec": state.elapsed_sec,
            "data_fraction": self.data_sec / max(self.step_sec, 1e-9),
            "skipped_steps": state.skipped_steps,
            "padding_fraction": 1.0 - self.tokens / self.padded if self.padded else 0.0,
        }
        if self.mask_rate is not None:  # the last step's rate, and the interval's masked share of maskable tokens
            event.update(mask_rate=self.mask_rate, mask_rate_realised=self.masked / max(self.maskable, 1))
        self.reset()
        return event
