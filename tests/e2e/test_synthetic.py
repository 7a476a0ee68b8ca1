"""The length-generalization lab end to end: a synthetic task trained from scratch by `roformer finetune`, a task study
by `roformer experiment`, and their bad inputs (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import yaml

from roformer.cli import main
from roformer.model.model import load

REPO = Path(__file__).resolve().parents[2]
SHIFT = REPO / "configs" / "synthetic" / "shift.yaml"
QUICK = [
    "train.max_steps=6",
    "train.eval_every=3",
    "data.synthetic.train_examples=64",
    "data.synthetic.eval_examples=8",
    "data.synthetic.train_lengths=[4,8]",
    "data.synthetic.test_multiples=[1,2]",
    "train.batch_size=8",
    "train.progress=false",
]


def finetune(out: Path, *overrides: str, config: Path = SHIFT) -> int:
    args = ["finetune", "--config", str(config), "--output-dir", str(out)]
    for item in [*QUICK, *overrides]:
        args += ["--set", item]
    return main(args)


@pytest.mark.parametrize("task", ["shift", "missing-duplicate", "passkey-binding", "mqar", "mqar-zoology"])
def test_every_shipped_task_trains_from_scratch_and_scores_every_test_length(tmp_path: Path, task: str) -> None:
    config = REPO / "configs" / "synthetic" / f"{task}.yaml"
    shortest = {
        "mqar": ["data.synthetic.train_lengths=[16,20]"],
        "mqar-zoology": ["data.synthetic.train_lengths=[16,20]", "data.max_length=64", "train.lr=1e-3"],
        "passkey-binding": ["data.synthetic.train_lengths=[8,12]"],
    }
    lengths = shortest.get(task, [])
    assert finetune(tmp_path / "run", *lengths, config=config) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["init"] == "" and set(results["runs"][0]["test"]) == {"test_1x", "test_2x"}
    for split in ("dev", "test_1x", "test_2x"):  # every split beside its position-blind floor
        baseline = results["baseline"][split]
        level = "frequent_bit" if task == "missing-duplicate" else "position_blind"  # its reading level (the docs)
        assert baseline["kind"] == level and 0 < baseline["accuracy"] <= 1 and baseline["method"] == "exact"
    for split in ("dev", "test_1x", "test_2x"):
        rows = (tmp_path / "run" / "predictions" / "lr0.001-seed0" / f"{split}.jsonl").read_text().splitlines()
        assert len(rows) == 8 and all(json.loads(r)["answers"] for r in rows)
    model = load(tmp_path / "run" / "best")  # the task's vocabulary and the model: section, written together
    assert model.config.hidden_size == 64 and model.config.vocab_size == len(
        (tmp_path / "run" / "best" / "vocab.txt").read_text().splitlines()
    )


def test_randomized_positions_reach_the_model(tmp_path: Path) -> None:
    """Two runs that differ only in randomized positions train differently (the positions are read), each exactly
    reproducible."""
    losses = []
    randomized = ["data.synthetic.randomized_positions=64"]
    runs = {"a": [], "b": randomized, "c": randomized, "float": [*randomized, "data.synthetic.randomized_kind=float"]}
    for name, extra in runs.items():
        assert finetune(tmp_path / name, "train.log_every=1", *extra) == 0
        events = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        losses.append([json.loads(e)["loss"] for e in events if json.loads(e).get("event") == "train"])
    assert losses[1] == losses[2] and losses[0] != losses[1] and losses[3] not in losses[:3]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["init=runs/x"], "makes its own vocabulary"),
        (["model.vocab_size=40"], "model.vocab_size comes from the task's vocabulary"),
        (["model.hidden_sise=64"], "unknown key 'model.hidden_sise'"),
        (["model.position_encoding=learned", "model.max_position_embeddings=12"], "max_position_embeddings"),
        (["data.max_length=12"], "data.max_length"),
        (["data.synthetic.task=copy"], "synthetic.task"),
        (["data.synthetic.randomized_positions=10"], "randomized_positions"),
        (  # 24 distinct rows of 2-4 bits, every one a training row: no dev row can be new
            [
                "data.synthetic.task=missing-duplicate",
                "data.synthetic.train_lengths=[2,4]",
                "data.synthetic.train_examples=500",
            ],
            "data.synthetic.train_lengths: missing-duplicate has too few distinct rows",
        ),
        (["data.synthetic.task=mqar", "data.synthetic.pairs=20", "data.synthetic.train_lengths=[80,84]"], "pairs (20)"),
        (["data.synthetic.extensions=[pi]"], "extensions: unknown method 'pi'"),
        (["model.position_encoding=alibi", "data.synthetic.extensions=[yarn]"], "yarn rescales RoPE's frequencies"),
        (
            [
                "model.position_encoding=t5_bias",
                "data.synthetic.randomized_positions=64",
                "data.synthetic.randomized_kind=float",
            ],
            "randomized_kind: float draws real positions; t5_bias reads them as table rows",
        ),
    ],
)
def test_bad_settings_are_one_line_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture, overrides: list[str], message: str
) -> None:
    assert finetune(tmp_path / "run", *overrides) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def write_study(tmp_path: Path, **extra: object) -> Path:
    study = {
        "tasks": [str(SHIFT)],
        "arms": {
            "rotary": {"set": []},
            "alibi-asymmetric": {"set": ["model.position_encoding=alibi", "model.alibi_form=asymmetric"]},
        },
        "seeds": [0, 1],
        "overrides": QUICK,
        **extra,
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study))
    return path


def test_a_task_study_trains_every_arm_and_seed_and_compares_by_length(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    arms = {
        "rotary": {"set": []},
        "alibi-asymmetric": {"set": ["model.position_encoding=alibi", "model.alibi_form=asymmetric"]},
        "rotary-randomized": {
            "set": ["data.synthetic.randomized_positions=64", "data.synthetic.extensions=[linear,ntk:4,log_scale]"]
        },
    }
    path, out = write_study(tmp_path, arms=arms, baseline="rotary"), tmp_path / "out"
    assert main(["experiment", "--config", str(path), "--output-dir", str(out)]) == 0
    for arm in arms:
        for seed in (0, 1):
            assert (out / "shift" / f"{arm}-seed{seed}" / "results.json").is_file()
            # each run's result on the console as it ends, every test length beside its position-blind floor
            line = f"{out / 'shift' / f'{arm}-seed{seed}'}: finished: dev score "
            assert line in caplog.text
    assert "; test_2x " in caplog.text and "(position blind " in caplog.text
    summary = json.loads((out / "compare" / "summary.json").read_text())
    cell = summary["tasks"]["shift"]["arms"]["rotary"]["splits"]["test_2x"]
    accuracies = [s["accuracy"] for s in cell["seeds"]]
    assert cell["mean"] == pytest.approx(sum(accuracies) / 2) and cell["interval"][0] <= cell["mean"]
    for seed in cell["seeds"]:
        low, high = seed["wilson"]
        assert low <= seed["accuracy"] <= high and seed["answers"] > 0
    assert summary["tasks"]["shift"]["lengths"] == {"test_1x": 8, "test_2x": 16}
    assert (out / "compare" / "generalization.png").stat().st_size > 0
    table = (out / "compare" / "summary.md").read_text()
    assert "| rotary |" in table
    # the floor of every split, its row first in the table; every arm against the first, paired on the same rows
    task = summary["tasks"]["shift"]
    floor = task["floors"]["test_2x"][0]
    assert floor["kind"] == "position_blind" and floor["method"] == "exact" and list(task["floors"])[0] == "dev"
    assert f"| *position-blind floor* | {100 * task['floors']['test_1x'][0]['accuracy']:.1f} |" in table
    assert task["baseline"] == "rotary" and set(task["differences"]) == {"alibi-asymmetric", "rotary-randomized"}
    for arm in ("alibi-asymmetric", "rotary-randomized"):  # randomized positions change no row
        cell = task["differences"][arm]["test_2x"]
        assert cell["same_rows"] and cell["test"] in ("paired t", None) and len(cell["seeds"]) == 2
        mine = [s["accuracy"] for s in task["arms"][arm]["splits"]["test_2x"]["seeds"]]
        theirs = [s["accuracy"] for s in task["arms"]["rotary"]["splits"]["test_2x"]["seeds"]]
        assert cell["mean"] == pytest.approx(sum(mine) / 2 - sum(theirs) / 2)
        assert [s["difference"] for s in cell["seeds"]] == pytest.approx([a - b for a, b in zip(mine, theirs)])
    assert "shift: arm - rotary in points of accuracy on the same rows" in table and "†" not in table
    # the test-time extensions of the arm that asked for them: a row per method, a panel per arm
    extensions = task["arms"]["rotary-randomized"]["extensions"]
    assert list(extensions) == ["linear", "ntk:4", "log_scale"] and task["arms"]["rotary"]["extensions"] == {}
    for seed in (0, 1):
        results = json.loads((out / "shift" / f"rotary-randomized-seed{seed}" / "results.json").read_text())
        mine = results["test"]["test_2x"]["extensions"]["ntk:4"]["accuracy"]["mean"]
        assert extensions["ntk:4"]["test_2x"]["seeds"][seed]["accuracy"] == pytest.approx(mine)
    assert "| rotary-randomized | ntk:4 |" in table and "| rotary-randomized | as trained |" in table
    assert (out / "compare" / "extensions.png").stat().st_size > 0
    decay = json.loads((out / "compare" / "attention-distance" / "shift-alibi-asymmetric.json").read_text())
    assert decay["length"] == 18 and len(decay["layers"]) == 2 and decay["position_encoding"] == "alibi"
    assert (out / "compare" / "attention-distance" / "shift-rotary.png").is_file()
    # a second call finds every run done and only compares again
    before = (out / "shift" / "rotary-seed0" / "results.json").stat().st_mtime
    assert main(["experiment", "--config", str(path), "--output-dir", str(out)]) == 0
    assert (out / "shift" / "rotary-seed0" / "results.json").stat().st_mtime == before


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"arms": {"a": {"set": []}, "b": {"set": ["train.lr=0.01"]}}}, "differ in train.lr"),
        ({"arms": {"a": {"set": []}, "b": {"config": "x.yaml"}}}, "not a config"),
        ({"probes": {"probes": ["passkey"]}}, "probes"),
        ({"target": 1.5}, "target"),
    ],
)
def test_a_bad_task_study_is_one_line_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture, extra: dict, message: str
) -> None:
    path, out = write_study(tmp_path, **extra), tmp_path / "out"
    assert main(["experiment", "--config", str(path), "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (out / "shift").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (  # its run would be <out>/esc-seed0, outside the task's folder
            {"arms": {"rotary": {"set": []}, "../esc": {"set": ["model.position_encoding=none"]}}},
            "arms: '../esc': a name must be letters, digits, '-', '_' or '.' (a folder name), got '../esc'",
        ),
        (  # found when its turn came, after the arms before it had trained
            {
                "arms": {
                    "rotary": {"set": []},
                    "learned-short": {"set": ["model.position_encoding=learned", "model.max_position_embeddings=12"]},
                }
            },
            "task shift, arm 'learned-short': model.max_position_embeddings (12) must hold 18 positions",
        ),
        ({"tasks": []}, "tasks: is empty: list the task configs a task study trains"),
    ],
)
def test_a_study_that_cannot_run_every_arm_is_one_line_before_the_first_trains(
    tmp_path: Path, capsys: pytest.CaptureFixture, extra: dict, message: str
) -> None:
    path, out = write_study(tmp_path, **extra), tmp_path / "out"
    assert main(["experiment", "--config", str(path), "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "esc-seed0").exists()


def test_compare_only_is_for_a_task_study_that_has_started(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    shipped = REPO / "configs" / "experiments"
    cases = [
        (shipped / "rope-vs-bert-tiny.yaml", "--compare-only is for a task study (tasks:)"),
        (shipped / "length-generalization-tiny.yaml", "--compare-only tabulates the runs of a study that has started"),
    ]
    for config, message in cases:
        command = ["experiment", "--config", str(config), "--output-dir", str(tmp_path / "out"), "--compare-only"]
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1
        assert not (tmp_path / "out").exists()


def test_two_processes_score_the_extensions_as_one(tmp_path: Path) -> None:
    """The main process scores the test-time variants and every process gets them: the results of one process."""
    from helpers import accelerate_launch

    extra = ["data.synthetic.extensions=[linear,ntk:4,log_scale]", "train.batch_size=4"]
    assert finetune(tmp_path / "one", *extra) == 0
    args = ["-m", "roformer", "finetune", "--config", str(SHIFT), "--output-dir", str(tmp_path / "two")]
    for item in [*QUICK, *extra]:
        args += ["--set", item]
    done = accelerate_launch(args)
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = (json.loads((tmp_path / name / "results.json").read_text())["test"] for name in ("one", "two"))
    assert two["test_2x"]["extensions"] == one["test_2x"]["extensions"] and set(one["test_2x"]["extensions"]) == {
        "linear",
        "ntk:4",
        "log_scale",
    }
