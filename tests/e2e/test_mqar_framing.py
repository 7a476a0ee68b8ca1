"""scripts/studies/mqar_framing.py at toy size: both models, both ways of asking, one JSON line per evaluation."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "studies" / "mqar_framing.py"
TOY = ["--set", "data.synthetic.symbols=16", "--set", "data.synthetic.values=16", "--set",
       "data.synthetic.train_examples=64", "--set", "data.synthetic.eval_examples=16"]  # fmt: skip


@pytest.mark.parametrize(
    ("model", "flags"),
    [("reference", ["--causal", "--ask", "key"]), ("ours", ["--model-set", "norm_position=pre", "--ask", "mask"])],
)
def test_the_framing_study_trains_and_reports_each_evaluation(tmp_path: Path, model: str, flags: list[str]) -> None:
    out = tmp_path / "evals.jsonl"
    command = [sys.executable, str(SCRIPT), "--model", model, *flags, "--steps", "4", "--batch", "8",
               "--eval-every", "2", "--out", str(out), *TOY]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=300)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["step"] for line in lines] == [2, 4]
    assert all(0.0 <= line["dev_accuracy"] <= 1.0 and line["dev_loss"] > 0 for line in lines)
    assert lines[0]["model"] == model and lines[0]["ask"] == flags[flags.index("--ask") + 1]
