"""`roformer eval-mlm`: two lengths on a tiny run; learned positions say they cannot go beyond their table."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from helpers import REPO, run_python, tiny_run_config

import roformer
from roformer.cli import main
from roformer.config import load
from roformer.study.compare import compare
from roformer.study.outputs import LENGTH_PLOT_FILE, SUMMARY_MARKDOWN_FILE
from roformer.train.config import PretrainConfig
from roformer.train.pretrain import pretrain
from roformer.train.run_dir import FINAL_DIR, LENGTH_FILE


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("length")
    out = {}
    for encoding in ("rotary", "learned"):
        yaml = tiny_run_config(
            tmp / f"{encoding}.yaml", model={"position_encoding": encoding}, max_steps=4, eval_every=2, save_every=0
        )
        out[encoding] = pretrain(load(PretrainConfig, yaml), tmp / encoding)
    return out


def test_two_lengths_and_compare(runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for encoding, run in runs.items():
        assert main(["eval-mlm", "--model", str(run / FINAL_DIR), "--seq-lens", "32,128", "--max-tokens", "1024"]) == 0
        printed = capsys.readouterr().out
        results = json.loads((run / LENGTH_FILE).read_text())["results"]
        assert [r["seq_len"] for r in results] == [32, 128]
        assert results[0]["eval_loss"] > 0 and results[0]["blocks"] == 1024 // 32
        if encoding == "rotary":  # trained at 32 tokens, evaluated at 4x that: rotary has no length limit
            assert results[1]["eval_loss"] > 0 and results[1]["blocks"] == 1024 // 128
        else:  # the tiny config's learned table has 64 positions
            assert "error" in results[1] and "learned positions cover 64 tokens" in results[1]["error"]
            assert "cannot evaluate 128" in printed
    summary = compare(list(runs.values()), tmp_path / "cmp")
    table = summary["length_extrapolation"]
    assert [r["seq_len"] for r in table["rotary"]] == [32, 128] and "error" in table["learned"][1]
    assert (tmp_path / "cmp" / LENGTH_PLOT_FILE).is_file()
    assert "cannot" in (tmp_path / "cmp" / SUMMARY_MARKDOWN_FILE).read_text()


def test_eval_mlm_arguments_are_checked_and_results_kept(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    final = str(runs["rotary"] / FINAL_DIR)
    for args, expected in [
        (["--batch-size", "0"], "--batch-size: expected an integer >= 1, got 0"),  # was a ZeroDivisionError
        (["--max-tokens", "-5"], "--max-tokens: expected an integer >= 1, got -5"),
    ]:
        with pytest.raises(SystemExit) as stop:  # argparse's own exit, through our one-line error
            main(["eval-mlm", "--model", final, *args])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and expected in err and len(err.strip().splitlines()) == 1, err
    assert main(["eval-mlm", "--model", final, "--seq-lens", "32,0"]) == 2
    assert "--seq-lens: expected comma-separated integers >= 1" in capsys.readouterr().err
    assert main(["eval-mlm", "--model", str(tmp_path / "nothere")]) == 2
    assert "--model " in (err := capsys.readouterr().err) and "no such model directory" in err, err
    out = tmp_path / "lengths.json"
    out.write_text("earlier results")
    assert main(["eval-mlm", "--model", final, "--seq-lens", "32", "--max-tokens", "256", "--out", str(out)]) == 2
    assert "exists (pass --overwrite" in capsys.readouterr().err and out.read_text() == "earlier results"
    args = ["eval-mlm", "--model", final, "--seq-lens", "32", "--max-tokens", "256", "--out", str(out), "--overwrite"]
    assert main(args) == 0 and json.loads(out.read_text())["results"][0]["seq_len"] == 32


def test_every_length_scores_the_same_tokens_when_the_text_is_shorter_than_the_budget(runs: dict[str, Path]) -> None:
    from roformer.study.length_eval import LengthEvalSettings, evaluate_lengths

    results = evaluate_lengths(runs["rotary"] / FINAL_DIR, runs["rotary"], LengthEvalSettings((32, 64, 128), 10**8))
    scored = [r["blocks"] * r["seq_len"] for r in results]
    assert max(scored) - min(scored) < 128, scored  # within one block of the longest length (the tail was 32-only)


def test_the_length_table_has_a_column_per_explicit_factor() -> None:
    from roformer.study.markdown import length_results_table

    rows = [
        {"seq_len": 64, "rope_scaling": label, "column": column, "eval_loss": loss, "eval_accuracy": 0.5, "blocks": 1}
        for label, column, loss in (("none", "none", 5.0), ("yarn x2", "yarn x2", 3.0), ("yarn x4", "yarn x4", 4.0))
    ]
    table = length_results_table(rows)
    assert table.startswith("| length | none | yarn x2 | yarn x4 |") and "3.000" in table and "4.000" in table


def test_length_beyond_the_validation_text(runs: dict[str, Path]) -> None:
    from roformer.study.length_eval import LengthEvalSettings, evaluate_lengths

    results = evaluate_lengths(runs["rotary"] / FINAL_DIR, runs["rotary"], LengthEvalSettings((32, 100_000)))
    assert "eval_loss" in results[0] and "corpus too small" in results[1]["error"]


def test_bad_lengths(runs: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    assert main(["eval-mlm", "--model", str(runs["rotary"] / FINAL_DIR), "--seq-lens", "32,abc"]) == 2
    assert "--seq-lens" in capsys.readouterr().err
    assert (
        main(["eval-mlm", "--model", str(runs["rotary"] / FINAL_DIR), "--data", "/nonexistent.yaml", "--overwrite"])
        == 2
    )
    assert "neither a pretraining config" in capsys.readouterr().err


def test_rope_scaling_methods(runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Trained at 32: at 32 every method's factor is 1 (the same tables); at 128 they differ, same weights."""
    final = runs["rotary"] / FINAL_DIR
    out = tmp_path / "scaled.json"
    args = ["eval-mlm", "--model", str(final), "--seq-lens", "32,128", "--max-tokens", "1024", "--out", str(out)]
    assert main([*args, "--rope-scaling", "none,linear,ntk,yarn,linear:2,self_extend"]) == 0
    printed = capsys.readouterr().out
    assert "| length | none | linear | ntk | yarn |" in printed
    results = json.loads(out.read_text())["results"]
    by = {(r["seq_len"], r["rope_scaling"]): r["eval_loss"] for r in results}
    methods = ("none", "linear x1", "ntk x1", "yarn x1", "linear x2", "self_extend x1")
    assert set(by) == {(n, m) for n in (32, 128) for m in methods} - {
        (128, m) for m in ("linear x1", "ntk x1", "yarn x1", "self_extend x1")
    } | {(128, m) for m in ("linear x4", "ntk x4", "yarn x4", "self_extend x8")}  # groups of 8 beyond a window of 16
    assert by[(32, "none")] == pytest.approx(by[(32, "linear x1")], rel=1e-6) == pytest.approx(by[(32, "yarn x1")])
    assert by[(32, "none")] == pytest.approx(by[(32, "self_extend x1")], rel=1e-6)
    assert compare([runs["rotary"]], tmp_path / "cmp")  # compare still reads the run (scaled rows are elsewhere)


def test_rope_scaling_bad_input(runs: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    for model, scaling, message in [
        ("rotary", "pi", "unknown method 'pi'"),
        ("rotary", "yarn:0.5", "'yarn:0.5': the factor must be a finite number >= 1"),
        ("learned", "linear", "learned positions, not rotary"),
    ]:
        args = ["eval-mlm", "--model", str(runs[model] / FINAL_DIR), "--seq-lens", "32", "--rope-scaling", scaling]
        assert main([*args, "--overwrite"]) == 2  # the run's earlier results file is not what is tested
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1


def test_device(runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--device cpu evaluates there; a device this machine cannot run on: one line, exit code 2, nothing written."""
    args = ["eval-mlm", "--model", str(runs["rotary"] / FINAL_DIR), "--seq-lens", "32", "--max-tokens", "256"]
    assert main([*args, "--device", "cpu", "--out", str(tmp_path / "cpu.json")]) == 0
    assert json.loads((tmp_path / "cpu.json").read_text())["results"][0]["eval_loss"] > 0
    capsys.readouterr()
    missing = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"
    for device in ("nonsense", "meta", missing):
        out = tmp_path / f"{device}.json"
        assert main([*args, "--device", device, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"--device {device!r}: not a device this machine can run on" in err
        assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_rope_scaling_study_script(tmp_path: Path) -> None:
    """scripts/studies/rope_scaling_study.py end to end at toy size: both tables, every method, continued runs."""
    yaml = tiny_run_config(tmp_path / "c.yaml", max_steps=3, eval_every=3, save_every=0)
    done = run_python(
        [
            str(REPO / "scripts" / "studies" / "rope_scaling_study.py"),
            "--config",
            str(yaml),
            "--out",
            str(tmp_path / "study"),
            "--seq-lens",
            "32,64",
            "--long",
            "64",
            "--continue-steps",
            "2",
            "--max-tokens",
            "512",
        ]
    )
    assert done.returncode == 0, done.stderr[-2000:]
    tables = (tmp_path / "study" / "tables.md").read_text()
    assert "| length | none | linear | ntk | yarn |" in tables
    assert all(f"| {m} |" in tables for m in ("none", "linear", "ntk", "yarn"))
    results = json.loads((tmp_path / "study" / "results.json").read_text())
    assert set(results["continued"]) == {"none", "linear", "ntk", "yarn"}
    assert roformer.load(tmp_path / "study" / "continued-yarn" / FINAL_DIR).config.rope_scaling.factor == 2


def test_compare_reads_the_rows_of_the_model_as_trained(tmp_path: Path) -> None:
    """A model trained with linear x2 tables: `--rope-scaling none` removes them, so that row is not the model."""
    from roformer.study.runs import load_runs

    yaml = tiny_run_config(
        tmp_path / "c.yaml",
        model={"rope_scaling": {"type": "linear", "factor": 2.0}},
        max_steps=2,
        eval_every=2,
        save_every=0,
    )
    run = pretrain(load(PretrainConfig, yaml), tmp_path / "run")
    args = ["eval-mlm", "--model", str(run / FINAL_DIR), "--seq-lens", "32", "--max-tokens", "512"]
    assert main([*args, "--rope-scaling", "none,linear:2"]) == 0
    rows = json.loads((run / LENGTH_FILE).read_text())["results"]
    assert {r["rope_scaling"]: r["as_trained"] for r in rows} == {"none": False, "linear x2": True}
    (read,) = load_runs([run])[0]
    assert [r["rope_scaling"] for r in read.lengths] == ["linear x2"]


def test_a_tokenizer_larger_than_the_model_is_one_line(runs: dict[str, Path], tmp_path: Path, capsys) -> None:
    """A tokenizer copied from another run (more ids than embedding rows): exit 2 in every command, no IndexError."""
    import shutil

    from roformer.data.builtin import generate_documents
    from roformer.data.tokenizer import save_tokenizer, train_tokenizer

    model = tmp_path / "model"
    shutil.copytree(runs["rotary"] / FINAL_DIR, model)
    bigger = train_tokenizer(generate_documents(300, seed=5), vocab_size=roformer.load(model).config.vocab_size + 200)
    save_tokenizer(bigger, model)
    capsys.readouterr()
    commands = [
        ["eval-mlm", "--model", str(model), "--data", str(runs["rotary"]), "--seq-lens", "32"],
        ["convert", "--to-hf", str(model), "--out", str(tmp_path / "hf")],
    ]
    for command in commands:
        assert main(command) == 2, command
        err = capsys.readouterr().err.strip()
        assert "the tokenizer has" in err and len(err.splitlines()) == 1, err


def test_eval_mlm_with_no_length_it_can_evaluate_exits_2(runs: dict[str, Path], capsys) -> None:
    final = runs["learned"] / FINAL_DIR
    code = main(["eval-mlm", "--model", str(final), "--seq-lens", "4096", "--max-tokens", "4096", "--overwrite"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("roformer ")]  # no bars
    assert code == 2 and len(errors) == 1 and "no requested length could be evaluated" in errors[0], errors
    assert not (runs["learned"] / LENGTH_FILE).exists() or "4096" not in (runs["learned"] / LENGTH_FILE).read_text()


@pytest.mark.parametrize("encoding", ["shaw", "t5_bias", "alibi"])
def test_relative_baselines_extrapolate_beyond_their_training_length(encoding: str, tmp_path: Path) -> None:
    """Trained at 32 tokens with distances clipped at 16 (Shaw) or bucketed up to 16 (T5): eval-mlm at 4x."""
    model = {"position_encoding": encoding, "max_position_embeddings": 32}
    if encoding != "alibi":
        model["relative_max_distance"] = 16
    yaml = tiny_run_config(tmp_path / "run.yaml", model=model, max_steps=2, eval_every=2, save_every=0)
    run = pretrain(load(PretrainConfig, yaml), tmp_path / "run")
    code = main(["eval-mlm", "--model", str(run / FINAL_DIR), "--seq-lens", "32,128", "--max-tokens", "1024"])
    results = json.loads((run / LENGTH_FILE).read_text())["results"]
    assert code == 0 and [r["seq_len"] for r in results] == [32, 128]
    assert all(math.isfinite(r["eval_loss"]) for r in results)
