"""`roformer experiment`: both arms and seeds end to end at a few steps, controlled arms, resumability."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file
from test_pretrain import interrupted_run, tiny_run_config

from roformer.cli import main
from roformer.config import ConfigError, write_yaml
from roformer.study.experiment import load_experiment, run_experiment
from roformer.train.pretrain import Pretrainer


def experiment_files(tmp_path: Path, **train) -> Path:
    tiny_run_config(tmp_path / "rope.yaml", model={"position_encoding": "rotary"}, max_steps=6, eval_every=3,
                    save_every=3, **train)  # fmt: skip
    tiny_run_config(tmp_path / "bert.yaml", model={"position_encoding": "sinusoidal"}, max_steps=6, eval_every=3,
                    save_every=3, **train)  # fmt: skip
    write_yaml(tmp_path / "exp.yaml", {"arms": {"roformer": "rope.yaml", "bert": "bert.yaml"}, "seeds": [0, 1]})
    return tmp_path / "exp.yaml"


def test_experiment_end_to_end(tmp_path: Path) -> None:
    config = experiment_files(tmp_path)
    assert main(["experiment", "--config", str(config), "--output-dir", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    assert {p.name for p in out.iterdir()} == {"roformer-seed0", "bert-seed0", "roformer-seed1", "bert-seed1",
                                               "compare"}  # fmt: skip
    summary = json.loads((out / "compare" / "summary.json").read_text())
    assert summary["baseline"] == "bert" and summary["roformer"] == "roformer"
    assert [a["seeds"] for a in summary["arms"]] == [2, 2]
    # same initial weights and batches per seed: the first train loss differs only through the position encoding,
    # and the two seeds of an arm differ
    first = {d.name: json.loads((d / "metrics.jsonl").read_text().splitlines()[0])["loss"]
             for d in out.iterdir() if d.name != "compare"}  # fmt: skip
    assert first["roformer-seed0"] != first["roformer-seed1"]
    a = load_file(out / "roformer-seed0" / "checkpoints" / "step-3" / "model.safetensors")
    assert a  # checkpoints exist for resuming


def test_arms_start_from_the_same_weights(tmp_path: Path) -> None:
    _, arms = load_experiment(experiment_files(tmp_path))
    models = {}
    for label, config in arms.items():
        trainer = Pretrainer(config, tmp_path / label)
        trainer.prepare_run_dir()
        trainer.build_model()
        models[label] = trainer.engine.bare_model().state_dict()
    assert set(models["roformer"]) == set(models["bert"])
    assert all((models["roformer"][k] == models["bert"][k]).all() for k in models["roformer"])


def test_experiment_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = experiment_files(tmp_path)
    reference = run_experiment(config, tmp_path / "full")
    # kill the first run mid-way, as an interrupted experiment would leave it
    _, arms = load_experiment(config)
    arms["roformer"].train.seed = 0
    interrupted_run(arms["roformer"], tmp_path / "cut" / "roformer-seed0", 4, monkeypatch)
    resumed = run_experiment(config, tmp_path / "cut")
    for got, want in zip(resumed["arms"], reference["arms"], strict=True):  # exact losses; wall times differ
        assert got["final_eval_loss"] == want["final_eval_loss"]
        assert [t["steps"] for t in got["targets"]] == [t["steps"] for t in want["targets"]]


def test_uncontrolled_arms_are_refused(tmp_path: Path) -> None:
    config = experiment_files(tmp_path)
    tiny_run_config(tmp_path / "bert.yaml", model={"position_encoding": "sinusoidal"}, max_steps=6, eval_every=3,
                    save_every=3, lr=5e-3)  # fmt: skip
    with pytest.raises(ConfigError, match="differ in train.lr"):
        load_experiment(config)
    tiny_run_config(tmp_path / "bert.yaml", model={"position_encoding": "sinusoidal", "num_layers": 3}, max_steps=6,
                    eval_every=3, save_every=3)  # fmt: skip
    with pytest.raises(ConfigError, match="differ in model.num_layers"):
        load_experiment(config)


def test_arms_with_different_classifier_heads_are_refused(tmp_path: Path) -> None:
    config = experiment_files(tmp_path)
    tiny_run_config(tmp_path / "bert.yaml", model={"position_encoding": "sinusoidal", "classifier_head": "pooler"},
                    max_steps=6, eval_every=3, save_every=3)  # fmt: skip
    with pytest.raises(ConfigError, match="differ in model.classifier_head"):
        load_experiment(config)


def test_arm_overrides_and_the_fields_under_comparison(tmp_path: Path) -> None:
    """Arms as {config, set}; a non-position field may differ only when `vary` names it; new position fields may."""
    experiment_files(tmp_path)
    arms = {"softmax": "rope.yaml", "linear": {"config": "rope.yaml", "set": ["model.attention=linear"]},
            "linear-none": {"config": "rope.yaml", "set": ["model.attention=linear", "model.position_encoding=none"]}}
    write_yaml(tmp_path / "exp.yaml", {"arms": arms})  # fmt: skip
    with pytest.raises(ConfigError, match="differ in model.attention"):
        load_experiment(tmp_path / "exp.yaml")
    write_yaml(tmp_path / "exp.yaml", {"arms": arms, "vary": ["attention"]})
    _, loaded = load_experiment(tmp_path / "exp.yaml")
    assert loaded["linear-none"].model.attention == "linear" and loaded["linear-none"].model.position_encoding == "none"
    assert loaded["softmax"].model.attention == "softmax"
    write_yaml(tmp_path / "exp.yaml", {"arms": {"a": "rope.yaml", "b": {"config": "rope.yaml",
               "set": ["model.rotary_dim=8", "model.rope_scaling={type: linear, factor: 2}"]}}})  # fmt: skip
    assert load_experiment(tmp_path / "exp.yaml")[1]["b"].model.rotary_dim == 8
    write_yaml(tmp_path / "exp.yaml", {"arms": arms, "vary": ["atention"]})
    with pytest.raises(ConfigError, match="'atention' is not a model field"):
        load_experiment(tmp_path / "exp.yaml")
