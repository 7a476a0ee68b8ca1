"""Console noise kept down: loggers quieted for a block (HTTP request lines, messages a check would repeat)."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any


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


class AboveProgressBars(logging.StreamHandler):
    """A stderr handler that writes each message above the progress bars (tqdm.write), not through them.

    An evaluation's line during training lands between the bar's redraws instead of splitting it.
    """

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm.auto import tqdm

        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # as logging's own handlers: a broken stream is reported, never raised
            self.handleError(record)


def evaluation_line(event: dict[str, Any], tags: Sequence[str] = ()) -> str:
    """One evaluation on one console line: `step 200 (epoch 1.00) dev: bleu 27.31, chrf 55.2, loss 2.913`.

    `tags` names the event's fields that say which run it is (a grid's learning rate and seed), shown in brackets.
    """
    hidden = {"event", "step", "epoch", "split", "elapsed_sec", "stage", *tags}
    run = " ".join(f"{tag} {event[tag]:g}" if isinstance(event[tag], float) else f"{tag} {event[tag]}" for tag in tags)
    where = f"step {event['step']}" + (f" (epoch {event['epoch']:.2f})" if "epoch" in event else "")
    split = event.get("split", "eval")
    numbers = ", ".join(
        f"{key.removeprefix('eval_')} {_number(value)}"
        for key, value in event.items()
        if key not in hidden and isinstance(value, int | float) and not isinstance(value, bool)
    )
    return f"{f'[{run}] ' if run else ''}{where} {split}: {numbers}"


def _number(value: float) -> str:
    """Four significant digits, without an exponent for the values metrics take."""
    if isinstance(value, int):
        return str(value)
    return f"{value:.1f}" if abs(value) >= 1000 else f"{value:.4g}"


def configure_console(rank: int) -> None:
    """The CLI's logging: messages alone on stderr; INFO from the main process, only warnings from the others.

    Under torchrun / accelerate launch only the first process reports progress; the others warn and fail only, and
    leave the warnings every process would repeat (MAIN_ONLY) to the main one.
    """
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING, format="%(message)s", handlers=[AboveProgressBars()]
    )
    if rank != 0:
        for handler in logging.getLogger().handlers:
            handler.addFilter(_said_by_the_main_process)
    logging.getLogger("accelerate").setLevel(logging.WARNING)  # per-file "saved ..." lines at every checkpoint
