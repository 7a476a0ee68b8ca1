"""CLI conventions: `roformer --version`, one table of subcommands."""

from __future__ import annotations

import pytest

import roformer
from roformer.cli import main


def test_version_names_the_distribution_and_warns_of_the_port_that_shares_the_import_name(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from importlib import metadata

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    out = capsys.readouterr().out
    assert stop.value.code == 0 and out.startswith(f"roformer {roformer.__version__} (distribution roformer-pytorch)")
    assert "torch " in out and "warning" not in out
    both = {"roformer": ["roformer-pytorch", "roformer"]}  # JunnYu's port installed beside us
    monkeypatch.setattr(metadata, "packages_distributions", lambda: both)
    with pytest.raises(SystemExit):
        main(["--version"])
    assert "warning: roformer also installs the import package `roformer`" in capsys.readouterr().out


def test_every_command_of_the_table_is_a_subcommand_with_its_help(capsys: pytest.CaptureFixture) -> None:
    from roformer.cli import COMMANDS, build_parser

    parser = build_parser()
    assert list(parser._subparsers._group_actions[0].choices) == [command.name for command in COMMANDS]
    for command in COMMANDS:
        with pytest.raises(SystemExit) as stop:
            main([command.name, "--help"])
        assert stop.value.code == 0 and capsys.readouterr().out.startswith(f"usage: roformer {command.name}")
