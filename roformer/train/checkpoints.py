"""Numbered training checkpoints that are complete or absent: `checkpoints/step-N`, the newest `keep` kept.

Each checkpoint's `COMPLETE` marker holds a manifest (size and sha256 of every file), so a resume verifies what it
loads and falls back to the newest intact checkpoint when a newer one was damaged after it was written.

What the engine (roformer.train.engine `save_checkpoint`) writes into `step-N`; the files down to
scaler.pt are accelerate's `save_state` (names as of accelerate 1.15, for a single process or DDP; DeepSpeed writes
sharded files of its own). Under FSDP2 the engine writes model and optimizer itself, as `sharded/` in place of the
first two (roformer.train.sharded: torch.distributed.checkpoint, loadable on any number of processes):

    model.safetensors        model weights
    optimizer.bin            optimizer state (torch.save)
    sharded/                 FSDP2 only: .metadata and one __R_0.distcp per process R (model and optimizer slices)
    custom_checkpoint_0.pkl  the learning-rate schedule (a LambdaLR given to `register_for_checkpointing`)
    random_states_P.pkl      Python, NumPy, torch (and CUDA) RNG states, one file per process P
    scaler.pt                the gradient scaler, only with fp16 mixed precision
    trainer_state.json       RunState (step, tokens_seen, elapsed_sec, skipped_steps, bad_steps), global_batch,
                             layout (processes, batch_size, grad_accum: a resume under another one says what
                             does not carry over), intervals (per process, the train-event sums since the last event)
                             and data_state, the recipe's own state: pretraining's data position ({} for in-memory
                             blocks, the stream position when streamed), fine-tuning's best dev result so far
    best.safetensors         fine-tuning only, once the dev set was evaluated: the best dev weights so far
    COMPLETE                 written last: {"step", "time", "files": {relative path: [size, sha256]}}
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from roformer.errors import CheckpointError
from roformer.files import verify_manifest, write_manifest
from roformer.logs import MAIN_ONLY

logger = logging.getLogger(__name__)


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

    def latest_intact(
        self,
        load: Callable[[Path], None] | None = None,
        agree: Callable[[str | None], str | None] | None = None,
        share: Callable[[list[tuple[int, Path]]], list[tuple[int, Path]]] | None = None,
    ) -> tuple[int, Path] | None:
        """The newest complete checkpoint whose files match their manifest (and that `load` loads); None if none exists.

        A damaged one, or one whose `load(path)` raises although its manifest passes (or it has none), is reported in
        one line and the next older one is tried.

        Args:
            load: Loads a candidate (the engine's accelerate `load_state`, a collective under FSDP).
            agree: Turns this process's verdict on a candidate (None: intact, else what is wrong) into every
                process's (the first problem any process found), so that all skip, or load, the same checkpoint.
            share: Turns this process's list of candidates into every process's (the main process's): processes
                that list the directory differently (nodes without a shared disk, a stale network cache) must still
                try the same candidates, or they would wait in different collectives.

        Raises:
            CheckpointError: checkpoints exist but none is intact, or a process ran out of memory loading one.
        """
        agreed = agree or (lambda problem: problem)
        candidates = (share or (lambda found: found))(self.complete())
        problems = []
        for step, path in reversed(candidates):
            problem = agreed(self.verify(path))  # before loading: a load may be a collective
            if problem is None and load is not None:
                problem = agreed(_load_problem(load, path))
                if problem is not None and problem.startswith(_OUT_OF_MEMORY):
                    raise CheckpointError(f"{path}: {problem} (not a damaged checkpoint: resume with more memory)")
            if problem is None:
                if problems:
                    logger.warning("resuming from %s instead", path.name, extra=MAIN_ONLY)
                return step, path
            logger.warning("checkpoint %s is damaged: %s", path, problem, extra=MAIN_ONLY)
            problems.append(f"{path.name}: {problem}")
        if problems:
            raise CheckpointError(f"{self.directory}: no intact checkpoint ({'; '.join(problems)})")
        return None

    def verify(self, path: Path) -> str | None:
        """None if the checkpoint at `path` is intact, else what is wrong (checkpoints without a manifest pass)."""
        try:
            marker = json.loads((path / self.MARKER).read_text())
        except (OSError, ValueError):
            return f"its {self.MARKER} marker is unreadable"
        manifest = marker.get("files") if isinstance(marker, dict) else None
        return verify_manifest(path, manifest) if manifest else None

    def begin(self, step: int) -> Path:
        """Remove leftovers of interrupted saves and create the hidden directory a checkpoint is written into."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in self.directory.glob(".tmp-step-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = self.tmp_path(step)
        tmp.mkdir()
        return tmp

    def commit(self, step: int) -> Path:
        """Record the manifest, mark the checkpoint complete, rename it to `step-N`, prune all but the last `keep`.

        Pruning runs only after the new checkpoint is in place, so the newest intact one is never deleted first.
        """
        tmp = self.tmp_path(step)
        marker = {"step": step, "time": time.time(), "files": write_manifest(tmp)}
        (tmp / self.MARKER).write_text(json.dumps(marker))
        final = self.directory / f"step-{step}"
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for _, old in self.complete()[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def discard(self, step: int) -> None:
        """Remove the unfinished checkpoint of `step` (after a failed write)."""
        shutil.rmtree(self.tmp_path(step), ignore_errors=True)

    def tmp_path(self, step: int) -> Path:
        """The hidden directory the checkpoint of `step` is written into before it is published."""
        return self.directory / f".tmp-step-{step}"


_OUT_OF_MEMORY = "out of memory while loading"


def first_problem(problems: list[str | None]) -> str | None:
    """Every process's verdicts on a checkpoint as one.

    Out of memory anywhere (which stops the run rather than skip to an older checkpoint), else the first problem by
    rank, else None (intact everywhere).
    """
    found = [p for p in problems if p is not None]
    return next((p for p in found if p.startswith(_OUT_OF_MEMORY)), found[0] if found else None)


def _load_problem(load: Callable[[Path], None], path: Path) -> str | None:
    """None if `load(path)` succeeds, else what its reader said (out of memory is not a damaged checkpoint)."""
    import pickle

    import torch
    from safetensors import SafetensorError

    try:
        load(path)
    except torch.OutOfMemoryError as e:  # every process must hear of it (it is agreed on like a problem), then stop
        return f"{_OUT_OF_MEMORY} ({str(e).splitlines()[0] if str(e) else ''})"
    except (OSError, RuntimeError, ValueError, KeyError, EOFError, pickle.UnpicklingError, SafetensorError) as e:
        first_line = str(e).splitlines()[0] if str(e) else ""
        return f"cannot be loaded ({type(e).__name__}: {first_line})"
    return None
