"""The README's install and test commands are the ones CI runs."""

from conftest import REPO


def test_ci_runs_the_readme_commands() -> None:
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    for command in ("pip install torch==2.13.0", 'pip install -e ".[dev]"', "python -m pytest -q"):
        assert command in readme, command
        assert command in ci, command
