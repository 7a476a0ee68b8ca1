"""Training utilities shared by pretraining and fine-tuning: optimizer groups, LR schedules, checkpoints, metrics.

Nothing here knows about accelerate or the model internals; the recipes wire them together.
"""

from __future__ import annotations

import json
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
