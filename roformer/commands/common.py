"""What the subcommands share: the Command record, argparse types, the run commands' --config/--output-dir."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple


class Command(NamedTuple):
    """A subcommand: its name, its one-line help, what adds its arguments, and what runs it."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    handler: Callable[[argparse.Namespace], None]


def task_types_help() -> str:
    """The task types `data.type` may name, each with its settings section: from their declarations."""
    from roformer.tasks.registry import specs

    types = "; ".join(f"{s.name}{f' (data.{s.section})' if s.section else ''}: {s.summary}" for s in specs().values())
    return f"task types (data.type): {types}."


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (a batch size, a token budget, a length)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def finite_float(text: str) -> float:
    """An argparse type: a finite number (float() also reads 'nan' and 'inf', which pass every range check)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def add_run_arguments(parser: argparse.ArgumentParser, config_help: str, default_out: str) -> None:
    parser.add_argument("--config", metavar="FILE", help=config_help)
    parser.add_argument("--output-dir", metavar="DIR", help=f"run directory (default: {default_out})")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key, e.g. train.lr=3e-4"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty run directory")


def config_and_output(args: argparse.Namespace, folder: str, *runs_subdir: str) -> tuple[Path | None, Path]:
    """The --config file (a path, or a shipped name looked up in `folder`) and the output directory.

    The output directory is --output-dir, else runs/<runs_subdir>/<config name>; the caller has checked that one of
    --config and --output-dir is given.
    """
    from roformer.catalogue import find_config

    config = find_config(args.config, folder) if args.config else None
    return config, Path(args.output_dir) if args.output_dir else Path("runs", *runs_subdir, config.stem)
