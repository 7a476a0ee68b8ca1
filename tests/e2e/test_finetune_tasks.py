"""A fine-tuning job runs whatever task object `make_task` gives it (roformer.tasks.base.FinetuneTask)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import roformer
from roformer.config import load
from roformer.config_yaml import write_yaml
from roformer.tasks.glue import Encoded, GlueTask
from roformer.train.config import FinetuneConfig


class NumbersTask(GlueTask):
    """Not a GLUE task to the recipe: its own name, head size and files (the number task's data, read as SST-2)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.name, self.tracker_project = "numbers", "numbers-project"
        self.num_labels = 3  # one output more than the data's labels: the head's size comes from the task
        self.label_names = ["no", "yes", "spare"]

    def write_predictions(self, folder: Path, encoded: dict[str, Encoded], predictions: dict) -> None:
        for split, values in predictions.items():
            (folder / f"{split}-predictions.txt").write_text("".join(f"{v}\n" for v in values))

    def write_submission(self, run_folder: Path, submission: Path) -> None:
        (submission / "numbers.txt").write_bytes((run_folder / "test-predictions.txt").read_bytes())


def test_a_job_runs_the_task_object_it_is_given(
    tmp_path: Path, pretrained: Path, number_task: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    import roformer.train.finetune as finetune_module
    from roformer.train.engine import Engine

    monkeypatch.setattr(finetune_module, "make_task", lambda data: NumbersTask.from_config(data))
    runs = []
    fit = Engine.fit

    def keep_the_run(self, run, *args, **kwargs):
        runs.append(run)
        return fit(self, run, *args, **kwargs)

    monkeypatch.setattr(Engine, "fit", keep_the_run)
    files = {"train_file": "train", "validation_file": "dev", "test_file": "test"}
    config = {
        "init": str(pretrained),
        "data": {
            "task": "sst2",
            "source": "files",
            "max_length": 64,
            **{k: str(number_task[v]) for k, v in files.items()},
        },
        "train": {"epochs": 1, "batch_size": 16, "lr": 1e-3, "seed": 0, "progress": False, "log_every": 5},
    }
    write_yaml(tmp_path / "c.yaml", config)
    results = finetune_module.finetune(load(FinetuneConfig, tmp_path / "c.yaml"), tmp_path / "run")

    run = tmp_path / "run"
    assert results["task"] == "numbers" and results["metrics"] == ["accuracy"]
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert events and {e["task"] for e in events} == {"numbers"}
    assert {p.name for p in (run / "submission").iterdir()} == {"numbers.txt"}
    predicted = (run / "submission" / "numbers.txt").read_text().splitlines()
    assert len(predicted) == 57 and set(predicted) <= {"0", "1", "2"}
    assert {p.name for p in (run / "predictions" / "lr0.001-seed0").iterdir()} == {
        "dev-predictions.txt",
        "test-predictions.txt",
    }
    assert roformer.load(run / "best").config.num_labels == 3
    assert json.loads((run / "best" / "labels.json").read_text()) == ["no", "yes", "spare"]  # the task's names
    # a run holds the task, its encoded splits and its settings, not the job
    (one,) = runs
    assert not any(isinstance(v, finetune_module.Finetuner) for v in vars(one).values())
    assert one.data.task.name == "numbers"
