"""What lets a run survive preemption and failed writes: graceful stop on signals, write-error reporting.

- `GracefulStop` turns the first SIGTERM or SIGINT (what Slurm, Kubernetes and spot instances send before they kill
  a job) into a request that the training loop honours after the current optimizer step: it writes a complete
  checkpoint and stops (roformer.errors.Preempted). A second signal aborts at once; checkpoints are written into a
  hidden directory and renamed when complete, so the previous one stays intact either way.
- `StopAtOnce` handles the same signals outside a training loop (start-up, data preparation, the final save), where
  there is no step to finish: the command stops at once, with the same exit code.
- A failed write (disk full, unwritable) is recognised and described by roformer.files (`write_errors`,
  `describe_write_error`, `stop_on_write_failure`), so that the unfinished checkpoint is discarded and the previous
  one kept. Checkpoints damaged after they were written are caught by the file manifests of
  roformer.train.checkpoints.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _StopSignals:
    """Handlers for SIGTERM and SIGINT while the context is open (main thread only), the previous ones restored."""

    def __enter__(self):
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():  # Python delivers signals to the main thread only
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        raise NotImplementedError


class GracefulStop(_StopSignals):
    """A context in which SIGTERM/SIGINT request a stop instead of killing the process."""

    def __init__(self) -> None:
        self.signal_name: str | None = None

    @property
    def requested(self) -> bool:
        """True once a stop signal arrived."""
        return self.signal_name is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested:  # a second signal: stop now (the last complete checkpoint is untouched)
            raise KeyboardInterrupt(f"second {name}")
        self.signal_name = name
        logger.warning("%s received: finishing this step, writing a checkpoint, then stopping", name)


class StopAtOnce(_StopSignals):
    """Outside a training loop (start-up, data preparation, the final save) SIGTERM/SIGINT stop the command at once.

    There is no step to finish there, and every file is written atomically; the command exits with the same code
    as a graceful stop (75) so a scheduler requeues it. `GracefulStop` takes over while a loop runs.
    """

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        from roformer.errors import Preempted

        raise Preempted(f"stopped by {signal.Signals(signum).name} outside training (nothing was lost)")
