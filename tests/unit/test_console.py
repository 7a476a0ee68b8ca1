"""What the commands print: no blank lines, none said once per process (the fresh head said once: test_finetune)."""

from __future__ import annotations

import logging
import sys

import pytest

from roformer.data.tokenizer import train_tokenizer
from roformer.logs import MAIN_ONLY, configure_console, evaluation_line


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


def test_a_message_during_training_lands_above_the_progress_bar(
    bare_root_logger, capsys: pytest.CaptureFixture
) -> None:
    """The console's handler writes through tqdm.write: the bar is cleared, the line printed, the bar redrawn."""
    from tqdm.auto import tqdm

    bare_root_logger()
    configure_console(0)
    bar = tqdm(total=3, file=sys.stderr, ascii=True)
    bar.update(1)
    logging.getLogger("roformer.train.engine").info("step 1 dev: accuracy 0.5")
    bar.close()
    err = capsys.readouterr().err
    assert "\nstep 1 dev: accuracy 0.5\n" in err.replace("\r", "\n")  # a line of its own, not inside the bar's


def test_an_evaluation_is_one_line_of_its_step_split_and_metrics() -> None:
    event = {"event": "eval", "task": "rte", "peak_lr": 2e-5, "seed": 1, "step": 40, "epoch": 1.0, "split": "dev",
             "accuracy": 0.5271, "score": 0.5271, "elapsed_sec": 12.0, "eval_loss": 0.69314}  # fmt: skip
    line = evaluation_line(event, ["peak_lr", "seed"])
    assert line == "[peak_lr 2e-05 seed 1] step 40 (epoch 1.00) dev: accuracy 0.5271, score 0.5271, loss 0.6931"
    assert evaluation_line({"step": 5, "eval_loss": 4.25, "tokens": 4759}) == "step 5 eval: loss 4.25, tokens 4759"
