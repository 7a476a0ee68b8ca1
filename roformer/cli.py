"""The `roformer` command line. Bad input ends with one line on stderr and exit code 2, never a traceback.

The CLI parses, runs and turns failures into exit codes. Each command is a handler (`convert_command`) with its
arguments beside it (`convert_arguments`) in its module of roformer.commands (models, runs, studies), which lists it
once in its COMMANDS; what a command computes or checks lives in the floors below.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from roformer.commands import models, runs, studies
from roformer.errors import RunStopped, UserError
from roformer.logs import configure_console
from roformer.version import version_report

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors, and an epilog built only when `--help` asks for it.

    argparse prints the usage block before an error by default. `epilog_of` builds help text that needs heavy
    imports (the task types' modules load torch), which start-up must not pay for.
    """

    epilog_of: Callable[[], str] | None = None

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")

    def format_help(self) -> str:
        if self.epilog_of is not None:
            self.epilog = self.epilog_of()
        return super().format_help()


class _Version(argparse.Action):
    """`--version`: built only when asked (reading every installed distribution's metadata takes ~0.1 s), unwrapped."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        print(version_report())
        parser.exit(0)


# Every subcommand, in the order `roformer --help` lists them: each module of roformer.commands lists its own.
COMMANDS = (*models.COMMANDS, *runs.COMMANDS, *studies.COMMANDS)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of all subcommands."""
    parser = _Parser(prog="roformer", description="RoFormer and BERT baseline: convert, pretrain, fine-tune, compare.")
    parser.add_argument("--version", action=_Version, nargs=0, help="show the versions (and a clash) and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for command in COMMANDS:
        subparser = sub.add_parser(command.name, help=command.help)
        command.add_arguments(subparser)
        subparser.set_defaults(func=command.handler)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    configure_console(int(os.environ.get("RANK", "0")))
    args = build_parser().parse_args(argv)
    code = _run(args)
    if _close_process_group():
        _exit_now(code)
    return code


def _run(args: argparse.Namespace) -> int:
    """Run the command; bad input and stopped runs become one line on stderr and their exit code."""
    from roformer.train.faults import StopAtOnce

    try:
        with StopAtOnce():
            args.func(args)
    except RunStopped as e:  # preempted, disk full, diverged: its own exit code for schedulers
        print(f"roformer {args.command}: stopped: {e}", file=sys.stderr)
        return e.exit_code
    except UserError as e:
        print(f"roformer {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"roformer {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        from roformer.files import is_write_failure, unnamed_write_failure

        if not is_write_failure(e):
            raise  # a bug: its traceback
        stopped = unnamed_write_failure(e)  # outside the staged and atomic writers: still one line and 74
        print(f"roformer {args.command}: stopped: {stopped}", file=sys.stderr)
        return stopped.exit_code
    return 0


def _close_process_group() -> bool:
    """Destroy the process group of a multi-process command; True if there was one.

    No barrier first: a process that ends on its own (its failure not shared) must not wait for the others.
    """
    if "torch" not in sys.modules:  # reporting commands never load torch
        return False
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return False
    dist.destroy_process_group()
    return True


def _exit_now(code: int) -> None:
    """End a multi-process command without C++ static destructors.

    At interpreter shutdown a process of a finished gloo run can still abort (SIGABRT, "terminate called without an
    active exception": a communication thread destroyed while joinable; seen twice in 2-process tests, even after
    destroying the group), and the launcher then reports a failed run. Python's own exit work is done first:
    atexit handlers (temporary token stores), then the output is flushed.
    """
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
