"""`roformer pretrain` in stages: the issue's contract run, exact resume inside a stage and across a boundary, and a
run branching off another run's stage folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import TINY_DATA, TINY_MODEL, interrupted_run, train_losses
from safetensors.torch import load_file

import roformer
from roformer.cli import main
from roformer.config import load
from roformer.config_yaml import write_yaml
from roformer.data.builtin import generate_documents
from roformer.train.config import PretrainConfig
from roformer.train.pretrain import Pretrainer, pretrain
from roformer.train.run_dir import read_metrics

TRAIN = {"batch_size": 4, "lr": 1e-3, "log_every": 1, "eval_every": 0, "save_every": 4, "progress": False}


def staged_config(path: Path, stages: list[dict], model: dict | None = None, **train) -> Path:
    config = {"model": {**TINY_MODEL, **(model or {})}, "data": TINY_DATA, "train": {**TRAIN, **train}}
    write_yaml(path, {**config, "stages": stages})
    return path


@pytest.mark.slow  # long: CI skips it (docs/install.md, the slow marker)
def test_the_contract_run_logs_each_stage_and_leaves_a_folder_per_stage(tmp_path: Path) -> None:
    """The issue's shape: 200 steps at 64 tokens and 30%, then 100 at 256 tokens, 15% and rotary base 160k."""
    stages = [
        {"name": "short", "steps": 200, "data": {"max_seq_len": 64, "mask_rate": 0.3}},
        {
            "name": "long",
            "steps": 100,
            "data": {"max_seq_len": 256, "mask_rate": 0.15},
            "model": {"rotary_base": 160000},
        },
    ]
    yaml = staged_config(tmp_path / "c.yaml", stages, log_every=20, eval_every=100, save_every=150)
    run = pretrain(load(PretrainConfig, yaml), tmp_path / "run")
    events = read_metrics(run / "metrics.jsonl")
    starts = [e for e in events if e["event"] == "stage"]
    assert [(e["stage"], e["step"], e["max_seq_len"], e["rotary_base"]) for e in starts] == [
        ("short", 1, 64, 10000.0),
        ("long", 201, 256, 160000.0),
    ]
    ends = [e for e in events if e["event"] == "stage_end"]
    assert [(e["stage"], e["step"], e["checkpoint"], e["folder"]) for e in ends] == [
        ("short", 200, "checkpoints/step-200", "stages/short"),
        ("long", 300, "checkpoints/step-300", "stages/long"),
    ]
    evals = [(e["step"], e["stage"]) for e in events if e["event"] == "eval"]
    assert evals == [(100, "short"), (200, "short"), (300, "long")]  # every stage's end, on the one validation set
    train = [e for e in events if e["event"] == "train"]
    assert all(e["stage"] == ("short" if e["step"] <= 200 else "long") for e in train)
    assert train[-1]["tokens_seen"] == 200 * 4 * 64 + 100 * 4 * 256  # every step of each stage, at its length
    realised = {stage: [e["mask_rate_realised"] for e in train if e["stage"] == stage] for stage in ("short", "long")}
    assert all(abs(r - 0.3) < 0.03 for r in realised["short"]) and all(abs(r - 0.15) < 0.03 for r in realised["long"])
    short = json.loads((run / "stages" / "short" / "pretraining.json").read_text())
    assert short == {**short, "max_seq_len": 64, "steps": 200, "stages": ["short"]}
    assert json.loads((run / "final" / "pretraining.json").read_text())["max_seq_len"] == 256
    assert roformer.load(run / "stages" / "short").config.rotary_base == 10000.0
    assert roformer.load(run / "final").config.rotary_base == 160000.0  # saved as it last computed
    final, long = (
        load_file(run / "final" / "model.safetensors"),
        load_file(run / "stages" / "long" / "model.safetensors"),
    )
    assert all(torch.equal(final[k], long[k]) for k in final)
    assert (run / "stages" / "short" / "optimizer.pt").is_file()


STAGES = [
    {"name": "a", "steps": 6, "data": {"mask_rate": 0.3}},
    {
        "name": "b",
        "steps": 6,
        "data": {"max_seq_len": 48, "mask_rate": {"start": 0.2, "end": 0.1}, "mask_split": [1, 0, 0]},
        "model": {"rotary_base": 50000},
        "train": {"batch_size": 2, "grad_accum": 2, "schedule": "linear", "warmup_steps": 0, "lr": 5e-4},
    },
]


@pytest.mark.parametrize(
    "crash_step", [6, pytest.param(9, marks=pytest.mark.slow)], ids=["at-the-boundary", "inside-a-stage"]
)  # inside a stage: CI skips it (test_elastic resumes a run inside its second stage)
def test_a_staged_run_resumes_exactly_at_a_boundary_and_inside_a_stage(
    crash_step: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dropout on, another batch layout, length, base, mask recipe and lr phase in the second stage."""
    dropout = {"hidden_dropout": 0.1, "attention_dropout": 0.1}
    yaml = staged_config(tmp_path / "c.yaml", STAGES, model=dropout)
    config = load(PretrainConfig, yaml)
    reference = pretrain(config, tmp_path / "full")
    interrupted_run(config, tmp_path / "cut", crash_step, monkeypatch)
    assert main(["pretrain", "--config", str(yaml), "--output-dir", str(tmp_path / "cut"), "--resume"]) == 0
    assert train_losses(tmp_path / "cut") == train_losses(reference)
    events, uninterrupted = read_metrics(tmp_path / "cut" / "metrics.jsonl"), read_metrics(reference / "metrics.jsonl")
    assert [e["event"] for e in events] == [e["event"] for e in uninterrupted]  # each stage event once
    assert [e.get("lr") for e in events] == [e.get("lr") for e in uninterrupted]
    first, second = (
        load_file(reference / "final" / "model.safetensors"),
        load_file(tmp_path / "cut" / "final" / "model.safetensors"),
    )
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_a_run_branches_a_decay_off_another_runs_stage_folder(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """init: a stage folder starts from its weights and continues its AdamW moments (mmBERT's decay branches)."""
    stable = [{"name": "stable", "steps": 4, "train": {"schedule": "constant", "warmup_steps": 2}}]
    trunk = pretrain(load(PretrainConfig, staged_config(tmp_path / "a.yaml", stable)), tmp_path / "trunk")
    decay = [{"name": "decay", "steps": 3, "train": {"schedule": "linear", "warmup_steps": 0}}]
    yaml = staged_config(tmp_path / "b.yaml", decay)
    config = load(PretrainConfig, yaml, [f"init={trunk / 'stages' / 'stable'}"])
    with caplog.at_level("INFO"):
        branch = pretrain(config, tmp_path / "branch")
    assert "continuing the optimizer state of" in caplog.text
    interrupted_run(config, tmp_path / "cut", 2, monkeypatch)  # before its first checkpoint
    pretrain(config, tmp_path / "cut", resume=True)
    assert train_losses(tmp_path / "cut") == train_losses(branch)  # the moments were continued again
    lrs = [e["lr"] for e in read_metrics(branch / "metrics.jsonl") if e["event"] == "train"]
    assert lrs == pytest.approx([1e-3, 1e-3 * 2 / 3, 1e-3 / 3])
    assert roformer.load(branch / "final").config == roformer.load(trunk / "final").config


def test_a_resume_that_changes_the_stages_or_a_stages_global_batch_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    stages = [{"name": "a", "steps": 4}, {"name": "b", "steps": 4, "train": {"batch_size": 2}}]
    yaml = staged_config(tmp_path / "c.yaml", stages)
    interrupted_run(load(PretrainConfig, yaml), tmp_path / "run", 6, monkeypatch)
    resume = ["pretrain", "--config", str(yaml), "--output-dir", str(tmp_path / "run"), "--resume"]
    assert main([*resume, "--set", "train.batch_size=2", "--set", "train.grad_accum=2"]) == 2
    err = capsys.readouterr().err
    assert "stage 'b' was to train with a global batch of 2 examples, now 4" in err and len(err.splitlines()) == 1
    plain = staged_config(tmp_path / "plain.yaml", [])
    interrupted_run(load(PretrainConfig, plain), tmp_path / "plain", 6, monkeypatch)
    assert main(["pretrain", "--config", str(yaml), "--output-dir", str(tmp_path / "plain"), "--resume"]) == 2
    assert "stages differ from the run's (stages cannot change on resume)" in capsys.readouterr().err


def test_a_mixture_whose_weights_change_in_a_stage_resumes_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpora = []
    for seed in (1, 2):
        corpora.append(tmp_path / f"corpus{seed}.txt")
        corpora[-1].write_text("\n\n".join(generate_documents(150, seed=seed)) + "\n")
    data = {**TINY_DATA, "source": "text", "paths": [str(c) for c in corpora]}
    data["mixture"] = [{"paths": [str(corpora[0])], "weight": 3}, {"paths": [str(corpora[1])], "weight": 1}]
    shift = [{"paths": [str(corpora[0])], "weight": 1}, {"paths": [str(corpora[1])], "weight": 3}]
    stages = [{"name": "a", "steps": 4}, {"name": "b", "steps": 4, "data": {"mixture": shift}}]
    write_yaml(tmp_path / "c.yaml", {"model": TINY_MODEL, "data": data, "train": TRAIN, "stages": stages})
    config = load(PretrainConfig, tmp_path / "c.yaml")
    trainer = Pretrainer(config, tmp_path / "full")
    assert trainer.batches.describe().endswith("a mixture of 573 train blocks (25%), 581 train blocks (75%)")
    # evaluated on each corpus's validation split, which its training split leaves out
    assert len(trainer.eval_ids) == sum(len(part.validation) for part in trainer.mixture_parts.values())
    reference = pretrain(config, tmp_path / "full", overwrite=True)
    interrupted_run(config, tmp_path / "cut", 6, monkeypatch)
    pretrain(config, tmp_path / "cut", resume=True)
    assert train_losses(tmp_path / "cut") == train_losses(reference)


def test_a_damaged_stage_folder_moments_file_is_one_line_before_the_run_folder_exists(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    trunk = pretrain(
        load(PretrainConfig, staged_config(tmp_path / "a.yaml", [{"name": "s", "steps": 2}])), tmp_path / "t"
    )
    moments = trunk / "stages" / "s" / "optimizer.pt"
    good = moments.read_bytes()
    yaml = staged_config(tmp_path / "b.yaml", [])
    branch = ["pretrain", "--config", str(yaml), "--set", f"init={moments.parent}", "--set", "train.max_steps=2"]
    for damaged, message in [
        (b"not a torch file", "damaged or not an optimizer state (torch.load: UnpicklingError)"),
        (good[:200], "damaged or not an optimizer state"),
    ]:
        moments.write_bytes(damaged)
        assert main([*branch, "--output-dir", str(tmp_path / "branch")]) == 2
        err = capsys.readouterr().err
        assert f"{moments}: {message}" in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "branch").exists()  # no started run folder left behind
    existing = tmp_path / "existing"  # nor an earlier run lost to --overwrite
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    assert main([*branch, "--output-dir", str(existing), "--overwrite"]) == 2
    assert (existing / "keep.txt").read_text() == "mine"
    torch.save({"state": [1, 2]}, moments)
    assert main([*branch, "--output-dir", str(tmp_path / "branch")]) == 2
    assert "not an optimizer state (expected a state per parameter index)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        ("[{name: a}]", "--set stages=[{name: a}]: stages[0]: missing key 'stages[0].steps'"),
        ("[{steps: 2}]", "--set stages=[{steps: 2}]: stages[0]: missing key 'stages[0].name'"),
        ("[{name: a, steps: 0}]", "--set stages=[{name: a, steps: 0}]: stages[0]: steps must be >= 1"),
        ("[{name: a, steps: 2, train: {lr: -1}}]", "--set stages=[{name: a, steps: 2, train: {lr: -1}}]: stages[0]"),
    ],
)
def test_a_bad_stage_is_one_line_that_blames_where_it_was_written(
    stages: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    yaml = staged_config(tmp_path / "c.yaml", [])
    assert (
        main(["pretrain", "--config", str(yaml), "--output-dir", str(tmp_path / "o"), "--set", f"stages={stages}"]) == 2
    )
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    written = yaml.read_text().replace("stages: []", "stages: " + stages)
    yaml.write_text(written)  # the same stage in the file: the file is named
    assert main(["pretrain", "--config", str(yaml), "--output-dir", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.startswith(f"roformer pretrain: error: {yaml}: stages[0]")


def test_a_stage_corpus_too_small_to_split_names_the_stage_and_its_files(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    one = tmp_path / "one.txt"
    one.write_text("a single document of a few words\n")
    stage = [{"name": "long", "steps": 2, "data": {"source": "text", "paths": [str(one)]}}]
    yaml = staged_config(tmp_path / "c.yaml", stage)
    assert main(["pretrain", "--config", str(yaml), "--output-dir", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"stages[0] (long): corpus {one}: only 1 documents" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()
