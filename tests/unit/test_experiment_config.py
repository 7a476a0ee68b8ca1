"""Experiment configs of two kinds (roformer.study.experiment_config): the `tasks:` key makes a task study, and a key
of the other kind is refused in one line naming it and the file."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from helpers import REPO

from roformer.config import from_dict
from roformer.config_yaml import read_mapping, write_yaml
from roformer.errors import ConfigError
from roformer.study.experiment_config import (
    ExperimentConfig,
    PretrainExperimentConfig,
    TaskStudyConfig,
    experiment_config_class,
    load_experiment_config,
)

EXPERIMENTS = sorted((REPO / "configs" / "experiments").glob("*.yaml"))
TASK_STUDY = {"tasks": ["synthetic/shift"], "arms": {"rotary": {}, "none": {"set": ["model.position_encoding=none"]}}}
PRETRAINING = {"arms": {"roformer": "roformer-tiny", "bert": "pretrain/bert-tiny"}, "baseline": "bert"}


def names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_each_kind_has_its_own_fields_over_the_shared_ones() -> None:
    shared = {"arms", "seeds", "overrides", "baseline", "vary"}
    assert names(ExperimentConfig) == shared
    assert names(PretrainExperimentConfig) - shared == {"targets", "glue", "length", "probes", "comparisons"}
    assert names(TaskStudyConfig) - shared == {"tasks", "target"}
    with pytest.raises(TypeError, match="the base of the two kinds"):
        ExperimentConfig(arms={"a": "x.yaml", "b": "y.yaml"})


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_every_shipped_experiment_loads_into_the_config_of_its_kind(path: Path) -> None:
    config = load_experiment_config(path)
    expected = TaskStudyConfig if "tasks" in read_mapping(path) else PretrainExperimentConfig
    assert type(config) is expected is experiment_config_class(read_mapping(path))


def test_the_shipped_experiments_of_each_kind() -> None:
    kinds = {path.stem: type(load_experiment_config(path)) for path in EXPERIMENTS}
    studies = {name for name, kind in kinds.items() if kind is TaskStudyConfig}
    assert {"length-generalization-tiny", "mqar-zoology", "translation-multi30k"} <= studies
    assert {"rope-vs-bert-tiny", "chinese-tiny", "mask-schedules-tiny", "long-context-tiny"} <= set(kinds) - studies
    assert studies == {name for name in kinds if name.startswith(("length-generalization", "mqar", "translation"))}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("glue", {"suite": "../glue/small-cpu.yaml"}),
        ("length", {"seq_lens": [64, 128]}),
        ("probes", {"probes": ["passkey"]}),
        ("comparisons", {"rotary": {"arms": ["rotary", "none"], "baseline": "none"}}),
        ("targets", [5.0]),
    ],
)
def test_a_pretraining_key_in_a_task_study_is_refused_naming_it_and_the_file(
    tmp_path: Path, key: str, value: object
) -> None:
    path = tmp_path / "study.yaml"
    write_yaml(path, {**TASK_STUDY, key: value})
    with pytest.raises(ConfigError) as error:
        load_experiment_config(path)
    message = str(error.value)
    assert message.startswith(f"{path}: unknown key '{key}' (") and len(message.splitlines()) == 1
    assert "tasks" in message and "glue" not in message.partition("known keys:")[2]


def test_a_task_study_key_in_a_pretraining_experiment_is_refused_naming_it_and_the_file(tmp_path: Path) -> None:
    path = tmp_path / "experiment.yaml"
    write_yaml(path, {**PRETRAINING, "target": 0.9})
    with pytest.raises(ConfigError, match=rf"^{path}: unknown key 'target' \(did you mean 'targets'\? known keys: "):
        load_experiment_config(path)
    write_yaml(path, PRETRAINING)
    assert type(load_experiment_config(path)) is PretrainExperimentConfig


def test_the_refusals_are_one_line_and_exit_2_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from roformer.cli import main

    study, experiment = tmp_path / "study.yaml", tmp_path / "experiment.yaml"
    write_yaml(study, {**TASK_STUDY, "glue": {"suite": "../glue/small-cpu.yaml"}})
    write_yaml(experiment, {**PRETRAINING, "target": 0.9})
    for path, key in ((study, "glue"), (experiment, "target")):
        out = tmp_path / f"out-{key}"
        assert main(["experiment", "--config", str(path), "--output-dir", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert f"{path}: unknown key '{key}'" in err and len(err.splitlines()) == 1 and "Traceback" not in err
        assert not out.exists()


def test_the_key_that_chooses_is_tasks_even_when_empty_or_null(tmp_path: Path) -> None:
    """A `tasks:` key makes the file a task study, whose tasks must then be listed."""
    path = tmp_path / "study.yaml"
    write_yaml(path, {**TASK_STUDY, "tasks": []})
    with pytest.raises(ConfigError, match="tasks: is empty: list the task configs a task study trains"):
        load_experiment_config(path)
    write_yaml(path, {**TASK_STUDY, "tasks": None})
    with pytest.raises(ConfigError, match=r"key 'tasks' must be a list"):
        load_experiment_config(path)


def test_the_arms_of_each_kind_keep_their_form() -> None:
    with pytest.raises(ConfigError, match="an arm is {set: \\[...\\]} over every task, not a config"):
        from_dict(TaskStudyConfig, {**TASK_STUDY, "arms": {"a": "x.yaml", "b": {}}})
    with pytest.raises(ConfigError, match="arms.b: needs config:"):
        from_dict(PretrainExperimentConfig, {"arms": {"a": "x.yaml", "b": {"set": []}}})


def test_the_task_study_does_not_import_the_experiment_that_runs_it() -> None:
    """One direction only (roformer.study.experiment imports roformer.study.task_study), type-only imports included."""

    def imported(module: str) -> set[str]:
        tree = ast.parse((REPO / "roformer" / "study" / f"{module}.py").read_text())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
        return found

    assert "roformer.study.task_study" in imported("experiment")
    assert "roformer.study.experiment" not in imported("task_study")
    assert "roformer.study.experiment_config" in imported("task_study")
    assert not {"roformer.study.experiment", "roformer.study.task_study"} & imported("experiment_config")
