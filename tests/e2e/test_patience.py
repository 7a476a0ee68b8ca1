"""`train.patience`: a fine-tuning run ends once its dev score stops improving, and resumes to the same end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import stop_in_process
from test_translation import config, corpus, events, finetune  # noqa: F401 (corpus: the fixture)

from roformer.train.run_dir import read_metrics

# A learning rate too small to move greedy BLEU off 0: every evaluation after the first ties it (no improvement).
FLAT = ["train.lr=1e-9", "train.max_steps=12", "train.eval_every=2", "train.save_every=0", "train.patience=2"]


def test_a_run_without_improvement_stops_after_patience_evaluations(tmp_path: Path, corpus: Path) -> None:  # noqa: F811
    path = config(tmp_path, corpus)
    assert finetune(path, tmp_path / "run", *FLAT) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    run = results["runs"][0]
    assert run["best_step"] == 2 and run["stopped_at"] == 6 and run["steps"] == 12  # 4, 6: no better
    assert results["averaged"]["points"] == [4, 6]  # the last two models before the stop, not the last two of 12 steps
    found = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [e["step"] for e in found if e["event"] == "eval"] == [2, 4, 6]
    assert [(e["step"], e["of_steps"]) for e in found if e["event"] == "converged"] == [(6, 12)]
    assert max(e["step"] for e in found if e["event"] == "train") == 6


def test_without_patience_the_run_trains_every_step(tmp_path: Path, corpus: Path) -> None:  # noqa: F811
    path = config(tmp_path, corpus)
    assert finetune(path, tmp_path / "run", *FLAT[:-1]) == 0
    run = json.loads((tmp_path / "run" / "results.json").read_text())["runs"][0]
    assert "stopped_at" not in run and run["steps"] == 12


def test_a_resumed_run_stops_where_the_uninterrupted_one_did(
    tmp_path: Path,
    corpus: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = config(tmp_path, corpus)
    assert finetune(path, tmp_path / "reference", *FLAT) == 0
    with monkeypatch.context() as patched:
        stop_in_process(patched, 5)  # after the evaluation of step 4 and its checkpoint (save_every 1 below)
        assert finetune(path, tmp_path / "run", *FLAT, "train.save_every=1") == 75
    assert main_resume(path, tmp_path / "run") == 0
    assert events(tmp_path / "run") == events(tmp_path / "reference")
    ours, theirs = (json.loads((tmp_path / r / "results.json").read_text()) for r in ("run", "reference"))
    assert ours["runs"] == theirs["runs"] and ours["averaged"]["points"] == theirs["averaged"]["points"] == [4, 6]


def test_patience_below_one_is_refused(tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture) -> None:  # noqa: F811
    path = config(tmp_path, corpus)
    assert finetune(path, tmp_path / "run", "train.patience=0") == 2
    assert "patience must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def main_resume(path: Path, out: Path) -> int:
    from roformer.cli import main

    overrides = [arg for item in [*FLAT, "train.save_every=1"] for arg in ("--set", item)]
    return main(["finetune", "--config", str(path), "--output-dir", str(out), "--resume", *overrides])
