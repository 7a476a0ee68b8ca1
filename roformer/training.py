"""Training utilities shared by pretraining and fine-tuning: optimizer groups, LR schedules, checkpoints, metrics.

Nothing here knows about accelerate or the model internals; the recipes wire them together.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from roformer.errors import UserError

SCHEDULES = ("linear", "cosine", "constant")

# Run-directory layout shared by `roformer pretrain`, `roformer finetune` and `roformer compare`.
CONFIG_FILE = "config.yaml"  # the fully resolved config of the run
METRICS_FILE = "metrics.jsonl"  # one JSON object per event
CHECKPOINTS_DIR = "checkpoints"  # complete training states, `step-N`
FINAL_DIR = "final"  # model + tokenizer, loadable with roformer.load
TOKENIZER_DIR = "tokenizer"  # the run's tokenizer


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
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `param_groups` and its warmup + decay schedule (stepped once per optimizer step)."""
    optimizer = torch.optim.AdamW(param_groups(model, weight_decay), lr=lr, betas=betas, eps=eps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_multiplier(s, warmup_steps, total_steps, schedule)
    )
    return optimizer, scheduler


def finish_micro_step(
    accelerator: Any, model: Any, optimizer: Any, scheduler: Any, max_grad_norm: float | None
) -> float | None:
    """Finish a micro-batch inside `accelerator.accumulate`: clip and step at the last one, then zero gradients.

    The schedule steps with the optimizer, not when fp16 loss scaling skipped the step.

    Returns:
        The global gradient norm before clipping at the last micro-batch (nan if unknown), else None.
    """
    norm = None
    if accelerator.sync_gradients:
        value = accelerator.clip_grad_norm_(model.parameters(), max_grad_norm or math.inf)
        norm = float(value) if value is not None else float("nan")
    optimizer.step()  # accelerate's wrapper only steps when gradients are synchronised
    if accelerator.sync_gradients and not accelerator.optimizer_step_was_skipped:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return norm


def lr_multiplier(step: int, warmup_steps: int, total_steps: int, schedule: str = "linear") -> float:
    """Learning-rate factor at optimizer step `step` (0-based): linear warmup to 1, then decay to 0 at `total_steps`.

    Steps are optimizer updates, i.e. after gradient accumulation and independent of the number of processes: the
    schedule ends exactly at `train.max_steps` whatever the launch (a known pitfall of the HF example scripts).
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r} (known: {', '.join(SCHEDULES)})")
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


class CheckpointManager:
    """Numbered checkpoint directories `checkpoints/step-N`, written atomically, the last `keep` kept.

    A checkpoint is written into a hidden `.tmp-step-N` directory, completed with a `COMPLETE` marker file, and
    only then renamed to `step-N`. A process killed mid-write leaves a `.tmp-*` directory (or a `step-N` without the
    marker, should a file system reorder the rename), which `latest()` ignores and the next save removes.
    """

    MARKER = "COMPLETE"
    _PATTERN = re.compile(r"step-(\d+)$")

    def __init__(self, directory: str | Path, keep: int = 2) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(directory)
        self.keep = keep

    def complete(self) -> list[tuple[int, Path]]:
        """(step, path) of every complete checkpoint, oldest first."""
        if not self.directory.is_dir():
            return []
        found = []
        for path in self.directory.iterdir():
            match = self._PATTERN.match(path.name)
            if match and path.is_dir() and (path / self.MARKER).is_file():
                found.append((int(match.group(1)), path))
        return sorted(found)

    def latest(self) -> tuple[int, Path] | None:
        """The newest complete checkpoint, or None."""
        done = self.complete()
        return done[-1] if done else None

    def save(self, step: int, write: Callable[[Path], None]) -> Path:
        """Call `write(tmp_dir)` to fill a new checkpoint for `step`, then publish it and prune old ones."""
        tmp = self.begin(step)
        write(tmp)
        return self.commit(step)

    def begin(self, step: int) -> Path:
        """Remove leftovers of interrupted saves and create the hidden directory a checkpoint is written into."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in self.directory.glob(".tmp-step-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = self.tmp_path(step)
        tmp.mkdir()
        return tmp

    def commit(self, step: int) -> Path:
        """Mark the written checkpoint complete, rename it to `step-N` and prune all but the last `keep`."""
        tmp = self.tmp_path(step)
        (tmp / self.MARKER).write_text(json.dumps({"step": step, "time": time.time()}))
        final = self.directory / f"step-{step}"
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for _, old in self.complete()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def tmp_path(self, step: int) -> Path:
        """The hidden directory the checkpoint of `step` is written into before it is published."""
        return self.directory / f".tmp-step-{step}"


class MetricsWriter:
    """Append-only JSONL: one JSON object per event, flushed at once so a crash loses nothing written."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def write(self, event: dict[str, Any]) -> None:
        """Write one event (numbers, strings, lists; tensors are converted to Python numbers)."""
        clean = {k: (v.item() if isinstance(v, torch.Tensor) else v) for k, v in event.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        self._file.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All events of a metrics.jsonl; a torn last line (a run killed mid-write) is skipped.

    Raises:
        UserError: a malformed line elsewhere, naming the file and line.
    """
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    events = []
    for number, line in enumerate(lines, start=1):
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines):
                raise UserError(f"{path}:{number}: not a JSON line") from None
    return events


# ----------------------------------------------------------------------------------------------------------------
# Launch-independent batches and the accelerate set-up shared by the recipes


class EpochSampler:
    """Example indices of optimizer step `s`: positions [s*G, (s+1)*G) of seeded per-epoch permutations.

    The data position is a function of the step (exact resume, no sampler state), every global batch is full
    (an epoch boundary falls inside a batch), and the order does not depend on the number of processes.
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
        n = self.size
        positions = torch.arange(step * self.global_batch, (step + 1) * self.global_batch)
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


def share(batch: Any, micro: int, rank: int, num_processes: int, batch_size: int) -> Any:
    """Rows of micro-batch `micro` for process `rank`: chunk micro * processes + rank of a global batch."""
    chunk = micro * num_processes + rank
    return batch[chunk * batch_size : (chunk + 1) * batch_size]


def process_state() -> Any:
    """Accelerate's PartialState (rank, world size) with the CPU process group formed when there is no GPU."""
    from accelerate import PartialState

    return PartialState(cpu=not has_accelerator_device())


def make_accelerator(mixed_precision: str, grad_accum: int, report_to: list[str], project_dir: Path) -> Any:
    """An Accelerator for one run: trackers checked, CPU process groups formed, quiet non-main processes.

    Raises:
        UserError: a tracker that is unknown or not installed, fp16 without a GPU.
    """
    from accelerate import Accelerator

    check_trackers(report_to)
    if mixed_precision == "fp16" and not torch.cuda.is_available():
        raise UserError("train.mixed_precision: fp16 needs a GPU (use bf16 or no on CPU)")
    reset_accelerator_state()
    accelerator = Accelerator(
        # On a machine without GPUs, processes started by torchrun / `accelerate launch --multi_gpu` must still
        # form a group (gloo); accelerate only does that for CPU when told so.
        cpu=not has_accelerator_device(),
        mixed_precision=mixed_precision,
        gradient_accumulation_steps=grad_accum,
        log_with=report_to or None,
        project_dir=str(project_dir),
    )
    if not accelerator.is_main_process:  # one process speaks for all
        import datasets

        logging.getLogger().setLevel(logging.WARNING)
        datasets.disable_progress_bars()
    return accelerator


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten a nested config for trackers (which want scalar hyperparameters)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flat_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, int | float | str | bool) else str(value)
    return out


def reset_accelerator_state() -> None:
    """Forget the settings of an earlier run in this process (accelerate keeps one global state per process).

    Several runs in one process (the experiment runner, notebooks, tests) may differ in mixed precision or
    accumulation; the process group (PartialState) is kept.
    """
    from accelerate.state import AcceleratorState, GradientState

    for state in (AcceleratorState, GradientState):
        reset = getattr(state, "_reset_state", None)
        if reset is not None:
            reset()


def has_accelerator_device() -> bool:
    """True when a GPU (or another torch accelerator such as MPS or XPU) is present."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        return accelerator.is_available()
    return torch.cuda.is_available()


def check_trackers(report_to: list[str]) -> None:
    """Every requested tracker must be installed (accelerate would drop a missing one silently)."""
    if not report_to:
        return
    from accelerate.tracking import get_available_trackers
    from accelerate.utils import LoggerType

    available = {str(t.value) for t in get_available_trackers()}
    for name in report_to:
        if name not in {t.value for t in LoggerType}:
            raise UserError(f"train.report_to: unknown tracker {name!r} (known: {', '.join(LoggerType.list())})")
        if name != "all" and name not in available:
            raise UserError(f"train.report_to: {name} is not installed (pip install {name})")
