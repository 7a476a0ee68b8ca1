"""A new position encoding is one module: the example of docs/adding-a-position-encoding.md, copied verbatim into a
copy of the package with nothing else edited, is found, checked and trained (pretraining and the shift task) in a
process that imports that copy; and the encodings after the paper (p_rope, fire) train in pretraining and on every
shipped synthetic task."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, TINY_DATA

import roformer
from roformer.cli import main

PAGE = REPO / "docs" / "adding-a-position-encoding.md"
FILE_LINE = re.compile(r"^# file: (roformer/model/\w+\.py)$")
# a few steps of each recipe, on small data (the commands of the page, shortened by --set)
SHORT_PRETRAINING = [
    "train.max_steps=4",
    "train.eval_every=4",
    "train.save_every=0",
    "train.log_every=2",
    "train.warmup_steps=1",
    "train.batch_size=8",
    "train.progress=false",
    *(f"data.{key}={value}" for key, value in TINY_DATA.items()),
]
SHORT_SYNTHETIC = [
    "train.max_steps=4",
    "train.eval_every=4",
    "train.batch_size=8",
    "train.progress=false",
    "data.synthetic.train_examples=64",
    "data.synthetic.eval_examples=8",
    "data.synthetic.test_multiples=[1,2]",
]
SHORTEST_ROWS = {  # the tasks whose rows need more than the shift task's shortest length
    "mqar": ["data.synthetic.train_lengths=[16,20]"],
    "mqar-zoology": ["data.synthetic.train_lengths=[16,20]", "data.max_length=64"],
    "passkey-binding": ["data.synthetic.train_lengths=[8,12]"],
}


def example_module() -> tuple[str, str]:
    """(where it goes, its text): the page's python block whose first line names its file."""
    blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(encoding="utf-8"), flags=re.S | re.M)
    (module,) = [block for block in blocks if FILE_LINE.match(block.splitlines()[0])]
    return FILE_LINE.match(module.splitlines()[0]).group(1), module


def commands() -> list[list[str]]:
    """The page's `roformer` commands that train the example, as argument lists."""
    lines = re.findall(r"^roformer (pretrain|finetune) (.*)$", PAGE.read_text(encoding="utf-8"), flags=re.M)
    return [[command, *arguments.split()] for command, arguments in lines]


def with_overrides(args: list[str], overrides: list[str], out: Path) -> list[str]:
    """`args` with its --output-dir moved under `out` and `overrides` added as --set items."""
    args = list(args)
    args[args.index("--output-dir") + 1] = str(out / Path(args[args.index("--output-dir") + 1]).name)
    return args + [item for override in overrides for item in ("--set", override)]


def final_losses(run: Path) -> list[float]:
    """Every train and eval loss a run logged."""
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [value for event in events for key, value in event.items() if key in ("loss", "eval_loss")]


def test_the_pages_example_is_one_module_that_trains_in_a_copy_of_the_package(tmp_path: Path) -> None:
    where, module = example_module()
    name = re.search(r'name="(\w+)"', module).group(1)
    assert name not in roformer.model.config.encodings()  # this checkout has no such encoding
    package = tmp_path / "package"
    shutil.copytree(REPO / "roformer", package / "roformer", ignore=shutil.ignore_patterns("__pycache__"))
    (package / "roformer" / "configs").symlink_to(REPO / "configs")  # where a wheel puts the shipped configs
    (package / where).write_text(module, encoding="utf-8")  # verbatim: the only file that differs
    env = {**os.environ, "PYTHONPATH": str(package), "OMP_NUM_THREADS": "1"}

    def run(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    found = run(
        sys.executable,
        "-c",
        f"import roformer.model.config as c; print(c.__file__); print(c.encodings()[{name!r}].paper)",
    ).stdout.splitlines()
    assert found[0].startswith(str(package)) and found[1] == "Chi et al. 2022"  # the copy, and the new module in it
    (pretraining, shift) = commands()
    assert pretraining[:3] == ["pretrain", "--config", "roformer-tiny"] and f"model.position_encoding={name}" in shift
    runs = tmp_path / "runs"
    run(sys.executable, "-m", "roformer", *with_overrides(pretraining, SHORT_PRETRAINING, runs))
    run(sys.executable, "-m", "roformer", *with_overrides(shift, SHORT_SYNTHETIC, runs))
    for folder, model in (("kerple-tiny", "final"), ("kerple-shift", "best")):
        saved = (runs / folder / model / "model.yaml").read_text()
        assert f"position_encoding: {name}" in saved, folder
        assert all(math.isfinite(loss) for loss in final_losses(runs / folder)) and final_losses(runs / folder)
    results = json.loads((runs / "kerple-shift" / "results.json").read_text())
    assert set(results["runs"][0]["test"]) == {"test_1x", "test_2x"}


# each with a setting of its own given on the command line, as a study's arm would
ENCODINGS_AFTER_THE_PAPER = {
    "fire": ("model.position_settings.fire.width=16", "width", 16),
    "p_rope": ("model.position_settings.p_rope.unrotated_fraction=0.5", "unrotated_fraction", 0.5),
}
SYNTHETIC = sorted(path.stem for path in (REPO / "configs" / "synthetic").glob("*.yaml"))
RECIPES = ["pretrain", *SYNTHETIC]


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("encoding", ENCODINGS_AFTER_THE_PAPER)
def test_the_encodings_after_the_paper_train_in_pretraining_and_on_every_synthetic_task(
    tmp_path: Path, encoding: str, recipe: str
) -> None:
    out = tmp_path / "run"
    if recipe == "pretrain":
        args = ["pretrain", "--config", "roformer-tiny", *sum((["--set", s] for s in SHORT_PRETRAINING), [])]
    else:
        overrides = SHORT_SYNTHETIC + SHORTEST_ROWS.get(recipe, ["data.synthetic.train_lengths=[4,8]"])
        args = ["finetune", "--config", f"synthetic/{recipe}", *sum((["--set", s] for s in overrides), [])]
    setting, field, value = ENCODINGS_AFTER_THE_PAPER[encoding]
    args += ["--set", f"model.position_encoding={encoding}", "--set", setting, "--output-dir", str(out)]
    assert main(args) == 0
    losses = final_losses(out)
    assert losses and all(math.isfinite(loss) for loss in losses)
    model = roformer.load(out / ("final" if recipe == "pretrain" else "best"))
    assert model.config.position_encoding == encoding and model.backbone.positions.attribute == encoding
    assert getattr(model.config.position_settings[encoding], field) == value
