"""The README's install and test commands are the ones CI runs, in a new virtualenv."""

import json
import re
import subprocess
from pathlib import Path

import pytest
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
    assert "scripts/checks/check_yaml_versions.sh" in ci


# The quickstart's last line, as the README states it; docs/cli.md quotes the whole line, other pages its numbers
QUICKSTART_END = re.compile(r"final eval loss (\d\.\d{3}), masked-token accuracy (\d+\.\d)% at step 600")
QUICKSTART_COMMAND = "roformer pretrain --config configs/pretrain/roformer-tiny.yaml"
# the summary line of roformer.commands.runs.pretraining_summary, as docs/cli.md quotes it
SUMMARY_LINE = re.compile(
    r"pretraining finished: final eval loss (?P<loss>[\d.]+), masked-token accuracy (?P<accuracy>[\d.]+)% at step "
    r"(?P<step>\d+); (?P=step) steps in [\d.]+ min, (?P<tokens>[\d,]+) tokens \((?P<rate>[\d,]+) tokens/s\); the run "
    r"kept (?P<kept>[\d.]+)% of its steps' (?P=rate) tokens/s \((?P<wall_rate>[\d,]+) over (?P<wall>\d+) s of wall "
    r"time; eval (?P<eval>[\d.]+) s, checkpoint (?P<checkpoint>[\d.]+) s\); model: (?P<run>\S+)/final "
)


def readme_quickstart() -> tuple[str, str]:
    """(final eval loss, masked-token accuracy) as the README's quickstart states them."""
    readme = (REPO / "README.md").read_text()
    assert QUICKSTART_COMMAND in readme
    stated = QUICKSTART_END.search(readme)
    assert stated is not None, "the README's quickstart states its final line"
    return stated[1], stated[2]


def quoted_summary() -> re.Match[str]:
    """The quickstart's last line as docs/cli.md quotes it, parsed as the summary prints it."""
    lines = [line for line in (REPO / "docs" / "cli.md").read_text().splitlines() if "pretraining finished:" in line]
    assert len(lines) == 1
    quoted = SUMMARY_LINE.match(lines[0])
    assert quoted is not None, f"docs/cli.md's pretraining line is not what pretraining_summary prints: {lines[0]}"
    return quoted


def test_the_docs_quote_the_quickstart_the_readme_states() -> None:
    loss, accuracy = readme_quickstart()
    quoted = quoted_summary()
    assert (quoted["loss"], quoted["accuracy"], quoted["step"]) == (loss, accuracy, "600")
    for page in sorted((REPO / "docs").glob("*.md")):  # "the quickstart ... ends at 3.773 / 35.9%" elsewhere
        for found in re.finditer(r"quickstart[^.]*?\bends at (\d\.\d+) / (\d+\.\d)%", page.read_text()):
            decimals = len(found[1].split(".")[1])
            assert (found[1], found[2]) == (f"{float(loss):.{decimals}f}", accuracy), page.name


def test_the_quoted_quickstart_line_is_what_the_summary_prints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/cli.md's line, rebuilt by pretraining_summary from the numbers it quotes: the format has not drifted."""
    from roformer.commands.runs import pretraining_summary
    from roformer.train.run_dir import METRICS_FILE

    quoted = quoted_summary()
    tokens, rate = (int(quoted[name].replace(",", "")) for name in ("tokens", "rate"))
    events = [
        {
            "event": "eval",
            "step": 600,
            "eval_loss": float(quoted["loss"]),
            "eval_accuracy": float(quoted["accuracy"]) / 100,
        },
        {"event": "train", "step": 600, "elapsed_sec": tokens / rate, "tokens_seen": tokens},
        {
            "event": "throughput",
            "kept": float(quoted["kept"]) / 100,
            "step_tokens_per_sec": rate,
            "tokens_per_sec": int(quoted["wall_rate"].replace(",", "")),
            "wall_sec": float(quoted["wall"]),
            **{f"{k}_sec": float(quoted[k]) for k in ("eval", "checkpoint")},
            **{f"{k}_sec": 0.0 for k in ("log", "stage")},
        },
    ]
    run = tmp_path / quoted["run"]
    run.mkdir(parents=True)
    (run / METRICS_FILE).write_text("".join(json.dumps(e) + "\n" for e in events))
    monkeypatch.chdir(tmp_path)
    assert pretraining_summary(Path(quoted["run"])) == quoted.string


@pytest.mark.slow
def test_the_quickstart_ends_where_the_readme_says(tmp_path: Path) -> None:
    """The README's quickstart, run (about 80 s on one core): its last line has the numbers the README states."""
    loss, accuracy = readme_quickstart()
    command = [*QUICKSTART_COMMAND.split(), "--output-dir", str(tmp_path / "run"), "--set", "train.progress=false"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert f"final eval loss {loss}, masked-token accuracy {accuracy}% at step 600" in last, last
    assert SUMMARY_LINE.match(last.replace(str(tmp_path / "run"), "runs/roformer-tiny")), last
