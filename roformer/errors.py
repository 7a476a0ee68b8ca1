"""User-facing errors: bad config, data, CLI arguments or checkpoints.

The CLI turns a `UserError` into one line on stderr and exit code 2, without a traceback, because the user has to
fix their input, not our code.
"""


class UserError(Exception):
    """Something the user gave us is wrong; the message says what and where."""


class ConfigError(UserError, ValueError):
    """A config file or config value is invalid."""


class CheckpointError(UserError):
    """A model directory or checkpoint is missing, corrupt or does not fit the model."""
