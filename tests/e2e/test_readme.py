"""The README's install and test commands are the ones CI runs, in a new virtualenv."""

import re

from helpers import REPO

TEST_COMMAND = (
    'pip install torch==2.13.0 && pip install -e ".[dev]" && '
    "python -m pytest -q -n auto --dist worksteal --maxprocesses 4"
)


def test_ci_runs_the_readme_test_command_in_a_new_virtualenv() -> None:
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    assert TEST_COMMAND in readme.splitlines()
    # .ci/run reads the command out of the README with this pattern and evals it: it must find exactly that line
    pattern = re.search(r"grep -m 1 -E '(.+?)' README\.md", ci)
    assert pattern is not None
    assert [line for line in readme.splitlines() if re.search(pattern[1], line)] == [TEST_COMMAND]
    assert 'eval "$test_command"' in ci
    assert re.search(r"python3 -m venv \"\$venv\"", ci) and 'source "$venv/bin/activate"' in ci
    assert "scripts/check_yaml_versions.sh" in ci
