"""A new task type is one module: a toy type written into a temporary folder of the roformer.tasks package, and
nothing else edited, is a config's `data.type` with its own settings section, is listed by `roformer finetune --help`
and runs through the fine-tuning recipe (docs/adding-a-task-type.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import roformer.tasks
from roformer.cli import main
from roformer.config_yaml import write_yaml
from roformer.tasks import registry

TOY = '''"""A toy type: sentiment of one text, read by the shared text task, with a settings section of its own."""

from dataclasses import dataclass

from roformer.config import check_types
from roformer.errors import ConfigError
from roformer.tasks.base import Publishes, TaskSpec
from roformer.tasks.classify import Classes, TextTask


@dataclass
class ToySettings:
    """`data.toy:`: a setting of the toy type's own."""

    note: str = ""
    repeats: int = 1

    def __post_init__(self) -> None:
        check_types(self)
        if self.repeats < 1:
            raise ConfigError(f"toy.repeats must be >= 1, got {self.repeats}")


SPECS = (
    TaskSpec(
        name="toy_sentiment",
        summary="a toy type declared in one module",
        builder=TextTask.reading(Classes),  # the text reader with class labels: composed, not subclassed
        architecture="sequence_classification",
        metrics=("accuracy", "f1"),
        default_metrics=("accuracy",),
        predictions="dev.tsv",
        docs="adding-a-task-type.md",
        section="toy",
        settings=ToySettings,
        capabilities=(Publishes,),  # TextTask's labels.json beside the model: what the class does, declared
    ),
)
'''


@pytest.fixture
def toy_type(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The toy module in a folder of the package's search path for as long as the test runs."""
    folder = tmp_path_factory.mktemp("plugins")
    (folder / "toy_sentiment.py").write_text(TOY, encoding="utf-8")
    roformer.tasks.__path__.append(str(folder))
    registry.specs.cache_clear()
    try:
        yield
    finally:
        roformer.tasks.__path__.remove(str(folder))
        registry.specs.cache_clear()


def toy_config(tmp_path: Path, pretrained: Path, number_task: dict[str, Path], toy: dict | None) -> Path:
    config = {
        "init": str(pretrained),
        "data": {
            "type": "toy_sentiment",
            "task": "toy",
            "train_file": str(number_task["train"]),
            "validation_file": str(number_task["dev"]),
            "text_columns": ["sentence"],
            "max_length": 64,
            **({"toy": toy} if toy is not None else {}),
        },
        "train": {"epochs": 1, "batch_size": 16, "lrs": [1.0e-3], "seeds": [0], "progress": False},
    }
    write_yaml(tmp_path / "toy.yaml", config)
    return tmp_path / "toy.yaml"


@pytest.mark.usefixtures("toy_type")
def test_a_type_in_a_new_module_runs_through_the_recipe(
    tmp_path: Path, pretrained: Path, number_task: dict[str, Path], capsys: pytest.CaptureFixture
) -> None:
    assert registry.spec_of("toy_sentiment").section == "toy"
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    assert "toy_sentiment (data.toy): a toy type declared in one module" in " ".join(capsys.readouterr().out.split())
    config = toy_config(tmp_path, pretrained, number_task, {"note": "hello", "repeats": 2})
    assert main(["finetune", "--config", str(config), "--output-dir", str(tmp_path / "run")]) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["task"] == "toy" and set(results["runs"][0]["dev"]["dev"]) == {"accuracy", "score"}
    assert (tmp_path / "run" / "best" / "labels.json").is_file()  # the capability it declares, asked for
    written = (tmp_path / "run" / "config.yaml").read_text()
    assert "toy:" in written and "note: hello" in written  # its section, under its own key
    capsys.readouterr()
    bad = toy_config(tmp_path, pretrained, number_task, {"nope": 1})
    assert main(["finetune", "--config", str(bad), "--output-dir", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'data.toy.nope'" in err and len(err.strip().splitlines()) == 1, err


def test_without_its_module_the_type_is_unknown(
    tmp_path: Path, pretrained: Path, number_task: dict[str, Path], capsys: pytest.CaptureFixture
) -> None:
    config = toy_config(tmp_path, pretrained, number_task, {})  # its section is unknown without it, then its type
    assert main(["finetune", "--config", str(config), "--output-dir", str(tmp_path / "run")]) == 2
    assert "unknown key 'data.toy'" in capsys.readouterr().err
    config = toy_config(tmp_path, pretrained, number_task, None)
    assert main(["finetune", "--config", str(config), "--output-dir", str(tmp_path / "run")]) == 2
    assert "type: unknown 'toy_sentiment'" in capsys.readouterr().err
