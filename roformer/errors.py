"""User-facing errors: bad config, data, CLI arguments or checkpoints.

The CLI turns a `UserError` into one line on stderr and exit code 2, without a traceback, because the user has to
fix their input, not our code.
"""

from collections.abc import Iterator
from contextlib import contextmanager


class UserError(Exception):
    """Something the user gave us is wrong; the message says what and where."""


@contextmanager
def naming(where: str) -> Iterator[None]:
    """A bad-input error raised inside, said of `where` (a stage, a corpus) that the inner message does not name."""
    try:
        yield
    except RunStopped:
        raise
    except UserError as e:
        raise type(e)(f"{where}: {e}") from None


class ConfigError(UserError, ValueError):
    """A config file or config value is invalid."""


class CheckpointError(UserError):
    """A model directory or checkpoint is missing, corrupt or does not fit the model."""


class RunStopped(UserError):
    """A run stopped before its end for a reason outside the code; its exit code tells a scheduler which.

    Exit codes (docs/cli.md, "Exit codes"): 75 stopped by a signal after a complete checkpoint (requeue and
    `--resume`), 74 a checkpoint or metrics write failed (disk full, unwritable), 65 the loss diverged.
    """

    exit_code = 1


class Preempted(RunStopped):
    """SIGTERM or SIGINT: the current step finished, a checkpoint was written, the run can be resumed exactly."""

    exit_code = 75  # EX_TEMPFAIL: try again later


class WriteFailed(RunStopped):
    """A checkpoint or metrics write failed (disk full, unwritable); the previous checkpoint is intact."""

    exit_code = 74  # EX_IOERR


class Diverged(RunStopped):
    """Too many consecutive steps with a non-finite loss or gradient norm."""

    exit_code = 65  # EX_DATAERR
