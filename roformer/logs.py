"""Console noise kept down: loggers quieted for a block (HTTP request lines, messages a check would repeat)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def quiet_loggers(*names: str, level: int = logging.WARNING) -> Iterator[None]:
    """Raise the named loggers to at least `level` for the block, then restore their levels.

    What they log below `level` is dropped (warnings and errors still show by default); a level the user set
    higher is kept.
    """
    loggers = [logging.getLogger(name) for name in names]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(max(log.getEffectiveLevel(), level))
    try:
        yield
    finally:
        for log, old in zip(loggers, levels):
            log.setLevel(old)


# `extra=MAIN_ONLY` on a warning that every process of a multi-process run would give alike (a resume's changed
# setting, a damaged checkpoint all of them skip): the main process says it, the others drop it.
MAIN_ONLY = {"main_only": True}


def _said_by_the_main_process(record: logging.LogRecord) -> bool:
    return not getattr(record, "main_only", False)


def configure_console(rank: int) -> None:
    """The CLI's logging: messages alone on stderr; INFO from the main process, only warnings from the others.

    Under torchrun / accelerate launch only the first process reports progress; the others warn and fail only, and
    leave the warnings every process would repeat (MAIN_ONLY) to the main one.
    """
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format="%(message)s")
    if rank != 0:
        for handler in logging.getLogger().handlers:
            handler.addFilter(_said_by_the_main_process)
    logging.getLogger("accelerate").setLevel(logging.WARNING)  # per-file "saved ..." lines at every checkpoint
