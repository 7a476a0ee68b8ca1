"""What the commands print: no blank lines, none said once per process (the fresh head said once: test_finetune)."""

from __future__ import annotations

import logging

import pytest

from roformer.data.tokenizer import train_tokenizer
from roformer.logs import MAIN_ONLY, configure_console


def test_training_a_tokenizer_prints_no_blank_lines(capfd: pytest.CaptureFixture) -> None:
    """The tokenizers trainer drew its bar as blank lines where stderr is a file or a pipe (after `mixed precision`)."""
    train_tokenizer(["the cat sat on the mat", "a dog ran"] * 50, vocab_size=60)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


@pytest.fixture
def bare_root_logger():
    """The root logger without handlers (as at a command's start) while the test calls it, restored afterwards.

    pytest adds its capturing handlers to the root logger for the test's call: they are removed by calling this.
    """
    root = logging.getLogger()
    saved: list[logging.Handler] = []
    level = root.level

    def strip() -> logging.Logger:
        saved.extend(root.handlers)
        root.handlers.clear()
        return root

    yield strip
    root.handlers[:] = saved
    root.setLevel(level)


@pytest.mark.parametrize("rank", [0, 1])
def test_what_every_process_would_say_alike_is_said_by_the_main_one(
    rank: int, bare_root_logger, capsys: pytest.CaptureFixture
) -> None:
    bare_root_logger()
    configure_console(rank)
    log = logging.getLogger("roformer.train.run_dir")
    log.warning("resuming with a changed setting: train.log_every: 1 -> 2", extra=MAIN_ONLY)
    log.warning("rank %d: its own warning", rank)
    log.info("progress")
    err = capsys.readouterr().err.splitlines()
    if rank == 0:
        assert err == [
            "resuming with a changed setting: train.log_every: 1 -> 2",
            "rank 0: its own warning",
            "progress",
        ]
    else:
        assert err == ["rank 1: its own warning"]
