"""`roformer finetune` / `roformer glue`: learning, run directory, server files, multi-process eval, bad input."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch
from helpers import accelerate_launch, launch_two, task_config, tiny_run_config, write_wrapper

import roformer
from roformer.cli import main
from roformer.config import load
from roformer.config_yaml import write_yaml
from roformer.train.config import FinetuneConfig
from roformer.train.finetune import finetune


@pytest.mark.slow  # long: CI skips it (docs/install.md, the slow marker)
def test_finetune_beats_the_majority_class(tmp_path: Path, pretrained: Path, number_task: dict) -> None:
    config = load(FinetuneConfig, task_config(tmp_path / "c.yaml", pretrained, number_task))
    results = finetune(config, tmp_path / "run")
    run = tmp_path / "run"
    accuracy = results["summary"]["dev"]["accuracy"]
    assert accuracy["mean"] > 0.5 + 0.2, accuracy  # the majority class gets 50% here
    assert len(accuracy["values"]) == 2 and accuracy["max"] >= accuracy["median"] >= min(accuracy["values"])
    assert {p.name for p in run.iterdir()} == {
        "config.yaml",
        "metrics.jsonl",
        "results.json",
        "predictions",
        "submission",
        "best",
    }
    saved = json.loads((run / "results.json").read_text())
    assert [(r["peak_lr"], r["seed"]) for r in saved["runs"]] == [(1e-3, 0), (1e-3, 1)]
    assert all(r["best_step"] > 0 for r in saved["runs"]) and saved["selected"]["seed"] in (0, 1)
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {e["event"] for e in events} == {"train", "eval"}
    assert sum(e["event"] == "eval" for e in events) == 2 * 3  # every epoch, both seeds
    # server format: header, one row per test example, class names
    lines = (run / "submission" / "SST-2.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 1 + 57
    assert [line.split("\t")[0] for line in lines[1:4]] == ["0", "1", "2"]
    assert {line.split("\t")[1] for line in lines[1:]} <= {"0", "1"}
    dev = (run / "predictions" / "lr0.001-seed0" / "dev.tsv").read_text().splitlines()
    assert dev[0] == "index\tprediction\tlabel" and len(dev) == 1 + 101
    best = roformer.load(run / "best")
    assert isinstance(best, roformer.SequenceClassifier) and best.config.num_labels == 2
    assert (run / "best" / "tokenizer.json").is_file()


def test_multiprocess_evaluation_equals_one_process(tmp_path: Path, pretrained: Path, number_task: dict) -> None:
    """max_steps: 0 evaluates the initial model: 2 processes must give exactly the 1-process predictions (101 rows)."""
    yaml = task_config(tmp_path / "c.yaml", pretrained, number_task, max_steps=0, seeds=[3], eval_batch_size=8)
    assert main(["finetune", "--config", str(yaml), "--output-dir", str(tmp_path / "one")]) == 0
    done = accelerate_launch(
        ["-m", "roformer", "finetune", "--config", str(yaml), "--output-dir", str(tmp_path / "two")]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    one = json.loads((tmp_path / "one" / "results.json").read_text())
    two = json.loads((tmp_path / "two" / "results.json").read_text())
    assert one["runs"][0]["dev"] == two["runs"][0]["dev"]
    for name in ("dev.tsv", "SST-2.tsv"):
        a = (tmp_path / "one" / "predictions" / "lr0.001-seed3" / name).read_text()
        b = (tmp_path / "two" / "predictions" / "lr0.001-seed3" / name).read_text()
        assert a == b


@pytest.mark.slow  # long: CI skips it (docs/install.md, the slow marker)
def test_real_glue_tasks_write_server_files(tmp_path: Path, pretrained: Path, shared_data: Path) -> None:
    """RTE (classification, names) and STS-B (regression, scores) from the official TSVs, a few steps each."""
    for task, rows in (("rte", 3000), ("stsb", 1379)):
        config = {
            "init": str(pretrained),
            "data": {"task": task, "glue_dir": str(shared_data / "glue"), "max_train_examples": 64, "max_length": 64},
            "train": {"max_steps": 4, "batch_size": 8, "lr": 1e-3, "progress": False},
        }
        write_yaml(tmp_path / f"{task}.yaml", config)
        results = finetune(load(FinetuneConfig, tmp_path / f"{task}.yaml"), tmp_path / task)
        name = {"rte": "RTE.tsv", "stsb": "STS-B.tsv"}[task]
        lines = (tmp_path / task / "submission" / name).read_text().splitlines()
        assert lines[0] == "index\tprediction" and len(lines) == 1 + rows
        values = [line.split("\t")[1] for line in lines[1:]]
        if task == "rte":
            assert set(values) <= {"entailment", "not_entailment"}
            assert set(results["summary"]["dev"]) == {"accuracy", "score"}
        else:
            assert all(0.0 <= float(v) <= 5.0 for v in values)
            assert set(results["summary"]["dev"]) == {"pearson", "spearman", "score"}


def test_mnli_writes_matched_mismatched_and_ax(tmp_path: Path, pretrained: Path) -> None:
    glue = tmp_path / "glue"
    (glue / "MNLI").mkdir(parents=True)
    (glue / "diagnostic").mkdir()
    labels = ["entailment", "neutral", "contradiction"]
    header = "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\tgold_label\n"
    for split, n in (("train", 30), ("dev_matched", 9), ("dev_mismatched", 7)):
        body = "".join(f"{i}\tp\tq\tfiction\tduo tri tet\tpen hex {i}\t{labels[i % 3]}\n" for i in range(n))
        (glue / "MNLI" / f"{split}.tsv").write_text(header + body)
    for split, n in (("test_matched", 5), ("test_mismatched", 6)):
        rows = "".join(f"{i}\tp\tq\tfiction\tun duo\ttri {i}\n" for i in range(n))
        (glue / "MNLI" / f"{split}.tsv").write_text("index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\n" + rows)
    (glue / "diagnostic" / "diagnostic.tsv").write_text("index\tsentence1\tsentence2\n0\tun\tduo\n1\ttri\ttet\n")
    config = {
        "init": str(pretrained),
        "data": {"task": "mnli", "glue_dir": str(glue)},
        "train": {"max_steps": 2, "batch_size": 4, "progress": False},
    }
    write_yaml(tmp_path / "mnli.yaml", config)
    results = finetune(load(FinetuneConfig, tmp_path / "mnli.yaml"), tmp_path / "run")
    assert set(results["summary"]) == {"dev_matched", "dev_mismatched"}
    counts = {p.name: len(p.read_text().splitlines()) - 1 for p in (tmp_path / "run" / "submission").iterdir()}
    assert counts == {"MNLI-m.tsv": 5, "MNLI-mm.tsv": 6, "AX.tsv": 2}


def test_glue_suite_writes_one_table(
    tmp_path: Path, pretrained: Path, number_task: dict, caplog: pytest.LogCaptureFixture
) -> None:
    from roformer.study.outputs import SUITE_TABLE_FILE

    caplog.set_level(logging.INFO)
    task_config(tmp_path / "sst2.yaml", pretrained, number_task, max_steps=3, seeds=[0])
    write_yaml(tmp_path / "suite.yaml", {"tasks": ["sst2.yaml"], "overrides": ["train.batch_size=8"]})
    assert main(["glue", "--config", str(tmp_path / "suite.yaml"), "--output-dir", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    table = (out / SUITE_TABLE_FILE).read_text()
    assert table.startswith("| task | split | metric |") and "| sst2 | dev | accuracy |" in table
    assert "| sst2 | dev | accuracy: *majority class* |" in table  # under the task's score, the trivial one's
    assert f"{out / 'sst2'}: finished: dev score " in caplog.text and "(majority class " in caplog.text
    assert (out / "submission" / "SST-2.tsv").is_file()
    assert set(json.loads((out / "results.json").read_text())) == {"sst2"}


# ---------------------------------------------------------------------------------------------------------------
# Bad input: one line, exit code 2, nothing written


def test_bad_inputs(tmp_path: Path, pretrained: Path, number_task: dict, capsys: pytest.CaptureFixture) -> None:
    import shutil

    no_tokenizer = tmp_path / "no_tokenizer"
    no_tokenizer.mkdir()
    for name in ("model.yaml", "model.safetensors"):
        shutil.copy2(pretrained / name, no_tokenizer / name)
    unlabelled_train = tmp_path / "unlabelled.csv"
    unlabelled_train.write_text("sentence\nsome text\n")
    wrong_label = tmp_path / "wrong.csv"
    wrong_label.write_text("sentence,label\nsome text,positive\n")
    base = task_config(tmp_path / "c.yaml", pretrained, number_task)
    cases = [
        (["data.task=sst3"], "unknown GLUE task 'sst3'"),
        (["data.source=glue_dir", f"data.glue_dir={tmp_path / 'nowhere'}"], "data.glue_dir: ", "--set data.source=hub"),
        (["data.source=glue_dir", f"data.glue_dir={tmp_path}"], "no SST-2 directory"),
        ([f"init={no_tokenizer}"], "has no tokenizer"),
        ([f"init={tmp_path / 'runs' / 'final'}"], f"init: {tmp_path / 'runs' / 'final'}: no such model folder"),
        ([f"data.train_file={unlabelled_train}"], "no label column 'label'"),
        ([f"data.train_file={wrong_label}"], "label 'positive' is not one of the sst2 labels"),
        (["train.lrs=[-1]"], "learning rates must be > 0"),
        (["init="], "init is required"),
        (["data.max_eval_examples=0"], "max_eval_examples must be >= 1"),  # was a traceback after training
        (["train.seeds=[-1]"], "seeds must be in [0, 2^32 - 1], got -1"),
    ]
    for overrides, *expected in cases:
        args = ["finetune", "--config", str(base), "--output-dir", str(tmp_path / "run")]
        for item in overrides:
            args += ["--set", item]
        assert main(args) == 2, overrides
        err = capsys.readouterr().err
        assert all(e in err for e in expected) and len(err.strip().splitlines()) == 1, (overrides, err)
        assert not (tmp_path / "run").exists()


def test_overwrite_with_an_init_that_does_not_load_keeps_the_job(
    tmp_path: Path, pretrained: Path, number_task: dict, capsys: pytest.CaptureFixture
) -> None:
    import shutil

    yaml = task_config(tmp_path / "c.yaml", pretrained, number_task, max_steps=2, seeds=[0])
    job = tmp_path / "job"
    assert main(["finetune", "--config", str(yaml), "--output-dir", str(job)]) == 0
    before = sorted(str(p.relative_to(job)) for p in job.rglob("*"))
    broken = tmp_path / "broken"
    shutil.copytree(pretrained, broken)
    (broken / "model.safetensors").write_bytes((pretrained / "model.safetensors").read_bytes()[:1000])
    capsys.readouterr()
    args = ["finetune", "--config", str(yaml), "--output-dir", str(job), "--overwrite", "--set", f"init={broken}"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "corrupt or unreadable" in err and len(err.strip().splitlines()) == 1, err
    assert sorted(str(p.relative_to(job)) for p in job.rglob("*")) == before  # results, best/, predictions kept
    args = ["finetune", "--config", str(yaml), "--output-dir", str(job), "--overwrite"]
    assert main([*args, "--set", "train.report_to=[nosuchtracker]"]) == 2  # refused by the accelerator's checks
    assert "unknown tracker" in capsys.readouterr().err
    assert sorted(str(p.relative_to(job)) for p in job.rglob("*")) == before
    # a GLUE suite: every task's init is checked before the suite's directory is replaced
    write_yaml(tmp_path / "suite.yaml", {"tasks": ["c.yaml"]})
    suite = ["glue", "--config", str(tmp_path / "suite.yaml"), "--output-dir", str(tmp_path / "suite")]
    assert main(suite) == 0
    kept = sorted(str(p.relative_to(tmp_path / "suite")) for p in (tmp_path / "suite").rglob("*"))
    for override, message in [(f"init={broken}", "corrupt or unreadable"), ("data.train_file=/nowhere.csv", "nowhere")]:
        assert main([*suite, "--overwrite", "--set", override]) == 2
        assert message in capsys.readouterr().err
        assert sorted(str(p.relative_to(tmp_path / "suite")) for p in (tmp_path / "suite").rglob("*")) == kept


def test_two_processes_run_a_glue_suite_with_a_slow_rank(tmp_path: Path, pretrained: Path, number_task: dict) -> None:
    """Rank 1 checks the task directory late: the main process must not have written it yet (it waits for every
    process before writing); both exit 0 and print nothing but on the main process."""

    task_config(tmp_path / "sst2.yaml", pretrained, number_task, max_steps=1, seeds=[0], batch_size=4)
    write_yaml(tmp_path / "suite.yaml", {"tasks": ["sst2.yaml"]})
    wrapper = write_wrapper(
        tmp_path / "slow.py",
        "import time\n"
        "from roformer.train import run_dir\n"
        "original = run_dir.RunDir.__init__\n"
        "def slow(self, path, *args, **kwargs):\n"
        "    if RANK == 1 and str(path).endswith('sst2'):\n"
        "        time.sleep(3)  # a busy core, a slow file system\n"
        "    original(self, path, *args, **kwargs)\n"
        "run_dir.RunDir.__init__ = slow\n",
    )
    ranks = launch_two(
        wrapper, ["glue", "--config", str(tmp_path / "suite.yaml"), "--output-dir", str(tmp_path / "out")]
    )
    assert [code for code, _ in ranks] == [0, 0], [err[-1500:] for _, err in ranks]
    assert (tmp_path / "out" / "results.json").is_file()


@pytest.mark.slow
def test_interrupted_grid_resumes_exactly(tmp_path: Path, pretrained: Path, number_task: dict, monkeypatch) -> None:
    """Killed in the second run after a checkpoint: --resume keeps the finished run and continues the other exactly."""
    from safetensors.torch import load_file

    from roformer.train.engine import Engine

    yaml = task_config(
        tmp_path / "c.yaml", pretrained, number_task, epochs=1, save_every=5, log_every=1, model={"hidden_dropout": 0.1}
    )
    whole = finetune(load(FinetuneConfig, yaml), tmp_path / "whole")
    original = Engine.train_step

    def crash(self, task, step):
        if self.seed == 1 and step == 17:
            raise KeyboardInterrupt
        return original(self, task, step)

    with monkeypatch.context() as patch:
        patch.setattr(Engine, "train_step", crash)
        with pytest.raises(KeyboardInterrupt):
            finetune(load(FinetuneConfig, yaml), tmp_path / "cut")
    assert (tmp_path / "cut" / ".progress" / "lr0.001-seed0" / "record.json").is_file()
    assert (tmp_path / "cut" / ".progress" / "lr0.001-seed1" / "checkpoints" / "step-15").is_dir()
    assert main(["finetune", "--resume", "--output-dir", str(tmp_path / "cut")]) == 0
    resumed = json.loads((tmp_path / "cut" / "results.json").read_text())
    assert resumed["runs"] == whole["runs"] and resumed["selected"] == whole["selected"]

    def events(run: Path) -> list[dict]:
        lines = (run / "metrics.jsonl").read_text().splitlines()
        drop = ("elapsed_sec", "tokens_per_sec", "data_fraction")
        return [{k: v for k, v in json.loads(line).items() if k not in drop} for line in lines]

    assert events(tmp_path / "cut") == events(tmp_path / "whole")  # every loss, once, in order
    a = load_file(tmp_path / "whole" / "best" / "model.safetensors")
    b = load_file(tmp_path / "cut" / "best" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not (tmp_path / "cut" / ".progress").exists()


def test_nan_dev_scores_do_not_crash(tmp_path: Path, pretrained: Path, number_task: dict, monkeypatch) -> None:
    """Constant predictions give NaN correlations; the run still ends, with a model and NaN in the table."""
    import roformer.tasks.glue as glue_module

    nan = float("nan")
    monkeypatch.setattr(glue_module, "compute", lambda metrics, p, y: {"accuracy": nan, "score": nan})
    yaml = task_config(tmp_path / "c.yaml", pretrained, number_task, epochs=1, seeds=[0])
    results = finetune(load(FinetuneConfig, yaml), tmp_path / "run")
    assert math.isnan(results["summary"]["dev"]["score"]["mean"]) and (tmp_path / "run" / "best").is_dir()


def test_max_length_is_capped_at_the_pretraining_length(tmp_path: Path, pretrained: Path, number_task: dict) -> None:
    """Fine-tuning past the pretraining length would use positions MLM never trained (random learned rows)."""
    from roformer.train.finetune import Finetuner

    assert json.loads((pretrained / "pretraining.json").read_text())["max_seq_len"] == 32
    path = task_config(tmp_path / "c.yaml", pretrained, number_task)  # asks for 64
    assert Finetuner(load(FinetuneConfig, path), tmp_path / "a").max_length == 32
    lifted = load(FinetuneConfig, path, ["data.beyond_pretraining_length=true"])
    assert Finetuner(lifted, tmp_path / "b").max_length == 64
    (pretrained / "pretraining.json").rename(pretrained / "moved.json")  # an older run: its config.yaml tells
    try:
        assert Finetuner(load(FinetuneConfig, path), tmp_path / "c").max_length == 32
    finally:
        (pretrained / "moved.json").rename(pretrained / "pretraining.json")


def test_an_interrupted_glue_suite_resumes_where_it_stopped(
    tmp_path: Path, pretrained: Path, number_task: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Finished tasks are read back, the interrupted task keeps its finished (lr, seed) runs and continues."""
    from roformer.study.outputs import SUITE_TABLE_FILE
    from roformer.study.suite import run_suite
    from roformer.train.engine import Engine
    from roformer.train.finetune import Finetuner

    for task in ("sst2", "cola"):
        path = task_config(tmp_path / f"{task}.yaml", pretrained, number_task, epochs=1, seeds=[0, 1])
        config = roformer.config_yaml.read_yaml(path)
        config["data"]["task"] = task
        write_yaml(path, config)
    write_yaml(tmp_path / "suite.yaml", {"tasks": ["sst2.yaml", "cola.yaml"]})
    original = Engine.train_step

    def crash_in_cola_seed1(self, task, step):
        if self.tags.get("task") == "cola" and self.tags.get("seed") == 1 and step == 3:
            raise KeyboardInterrupt
        return original(self, task, step)

    monkeypatch.setattr(Engine, "train_step", crash_in_cola_seed1)
    with pytest.raises(KeyboardInterrupt):
        run_suite(tmp_path / "suite.yaml", tmp_path / "out")
    monkeypatch.undo()
    first = json.loads((tmp_path / "out" / "sst2" / "results.json").read_text())
    trained = []
    original_run_one = Finetuner._run_one

    def counting(self, lr, seed, fold):
        trained.append((self.task.name, seed))
        return original_run_one(self, lr, seed, fold)

    monkeypatch.setattr(Finetuner, "_run_one", counting)
    results = run_suite(tmp_path / "suite.yaml", tmp_path / "out", resume=True)
    assert trained == [("cola", 1)]  # sst2 finished, cola seed 0 finished: only the interrupted run trains
    assert results["sst2"]["summary"] == first["summary"] and set(results) == {"sst2", "cola"}
    assert (tmp_path / "out" / SUITE_TABLE_FILE).is_file() and (tmp_path / "out" / "cola" / "results.json").is_file()


def test_bf16_finetuning_on_cpu(tmp_path: Path, pretrained: Path, number_task: dict) -> None:
    """train.mixed_precision: bf16 fine-tunes on the CPU too (accelerate autocasts), with finite losses."""
    from roformer.train.run_dir import read_metrics

    path = task_config(tmp_path / "c.yaml", pretrained, number_task, epochs=1, seeds=[0], mixed_precision="bf16")
    results = finetune(load(FinetuneConfig, path), tmp_path / "run")
    losses = [e["loss"] for e in read_metrics(tmp_path / "run" / "metrics.jsonl") if e["event"] == "train"]
    assert losses and all(math.isfinite(v) for v in losses)
    assert math.isfinite(results["summary"]["dev"]["score"]["mean"])
    padding = [e["padding_fraction"] for e in read_metrics(tmp_path / "run" / "metrics.jsonl") if e["event"] == "train"]
    assert all(0.0 < p < 0.9 for p in padding), padding  # sentences of mixed lengths, padded to multiples of 8


@pytest.mark.slow
def test_length_grouped_batches_pad_less(tmp_path: Path, pretrained: Path, number_task: dict) -> None:
    from roformer.train.run_dir import read_metrics

    def padding(name: str, **data) -> float:
        path = task_config(tmp_path / f"{name}.yaml", pretrained, number_task, epochs=1, seeds=[0], log_every=1)
        config = load(FinetuneConfig, path, [f"data.{k}={v}" for k, v in data.items()])
        finetune(config, tmp_path / name)
        events = [e for e in read_metrics(tmp_path / name / "metrics.jsonl") if e["event"] == "train"]
        return sum(e["padding_fraction"] for e in events) / len(events)

    plain, grouped = padding("plain"), padding("grouped", group_by_length="true", pad_to_multiple_of=1)
    assert grouped < plain / 2, (plain, grouped)


@pytest.mark.slow
def test_compiled_finetuning_matches_eager(tmp_path: Path, pretrained: Path, number_task: dict) -> None:
    """Variable batch lengths do not recompile every step: dynamo's automatic dynamic shapes after the first change."""
    from torch._dynamo.utils import counters

    from roformer.train.run_dir import read_metrics

    def losses(name: str) -> list[float]:
        return [e["loss"] for e in read_metrics(tmp_path / name / "metrics.jsonl") if e["event"] == "train"]

    path = task_config(tmp_path / "c.yaml", pretrained, number_task, epochs=1, seeds=[0], log_every=1)
    eager = finetune(load(FinetuneConfig, path), tmp_path / "eager")
    torch._dynamo.reset()
    counters.clear()
    compiled = finetune(load(FinetuneConfig, path, ["train.compile=true"]), tmp_path / "compiled")
    # a static training graph, a dynamic-length one, an evaluation one (measured: 3 for 28 steps of 6 lengths)
    assert counters["stats"]["unique_graphs"] <= 3, dict(counters["stats"])
    assert losses("compiled") == pytest.approx(losses("eager"), rel=1e-4)
    assert compiled["summary"]["dev"] == eager["summary"]["dev"]


def test_console_summary_lists_every_dev_metric(
    tmp_path: Path, pretrained: Path, number_task: dict, capsys, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    yaml = task_config(tmp_path / "c.yaml", pretrained, number_task, max_steps=2, seeds=[0, 1])
    assert main(["finetune", "--config", str(yaml), "--output-dir", str(tmp_path / "run")]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "## Dev (lr 0.001: mean ± std over 2 run(s), each at its best checkpoint)" in out
    assert "| split | accuracy | score |" in out and str(tmp_path / "run" / "best") in out
    majority = json.loads((tmp_path / "run" / "results.json").read_text())["baseline"]["dev"]
    assert majority["kind"] == "majority_class" and 0.4 < majority["accuracy"] < 0.6  # the dev file is balanced
    row = f"| dev: majority class (baseline) | {100 * majority['accuracy']:.2f} | {100 * majority['score']:.2f} |"
    assert row in out and (tmp_path / "run" / "results.md").read_text() in out
    # a grid's runs each end with a line; two steps learn one class: said, not left for the reader to find
    said = caplog.text  # the console's lines (logging; the CLI writes them to stderr, above any progress bar)
    assert "sst2 lr 0.001 seed 0 finished (1/2): dev score" in said and "step 2 (epoch " in said
    assert any(warning in said for warning in ("every dev prediction is the same", "at or below its majority class"))


@pytest.mark.slow
def test_a_publish_interrupted_before_results_json_is_done_again_on_resume(
    tmp_path: Path, pretrained: Path, number_task: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed inside the publishing step (best/ moved, results.json not yet written): --resume publishes again."""
    import roformer.train.finetune as finetune_module

    config = load(FinetuneConfig, task_config(tmp_path / "c.yaml", pretrained, number_task, epochs=1, lrs=[1e-3, 2e-3]))
    reference = finetune(config, tmp_path / "full")
    write = finetune_module.atomic_write_text

    def killed_at_results(path: Path, text: str) -> None:
        if Path(path).name == "results.json":
            raise KeyboardInterrupt("killed while publishing")
        write(path, text)

    monkeypatch.setattr(finetune_module, "atomic_write_text", killed_at_results)
    with pytest.raises(KeyboardInterrupt):
        finetune(config, tmp_path / "cut")
    assert (tmp_path / "cut" / "best").is_dir() and not (tmp_path / "cut" / "results.json").exists()
    monkeypatch.setattr(finetune_module, "atomic_write_text", write)
    resumed = finetune(config, tmp_path / "cut", resume=True)
    assert resumed["runs"] == reference["runs"] and resumed["selected"] == reference["selected"]
    assert {p.name for p in (tmp_path / "cut").iterdir()} == {p.name for p in (tmp_path / "full").iterdir()}
    best = [(tmp_path / run / "best" / "model.safetensors").read_bytes() for run in ("full", "cut")]
    assert best[0] == best[1]


def test_resume_policy_is_the_same_for_both_recipes(
    tmp_path: Path, pretrained: Path, number_task: dict, capsys: pytest.CaptureFixture
) -> None:
    """One declared policy (roformer.train.run_dir.RESUME_MAY_CHANGE): what only watches or ends a run may change."""
    yaml = task_config(tmp_path / "c.yaml", pretrained, number_task, epochs=1, seeds=[0])
    finetune_args = ["finetune", "--config", str(yaml), "--output-dir", str(tmp_path / "ft")]
    pre_yaml = tiny_run_config(tmp_path / "p.yaml", max_steps=2)
    pretrain_args = ["pretrain", "--config", str(pre_yaml), "--output-dir", str(tmp_path / "pre")]
    for args in (finetune_args, pretrain_args):
        assert main(args) == 0, capsys.readouterr().err
        code = main(args + ["--resume", "--set", "train.weight_decay=0.5"])  # enters every step: refused
        err = capsys.readouterr().err
        assert code == 2 and "train.weight_decay" in err and len(err.strip().splitlines()) == 1, err
        assert main(args + ["--resume", "--set", "train.log_every=3", "--set", "label=renamed"]) == 0


def test_run_length_may_change_on_resume_only_until_a_run_finishes(
    tmp_path: Path, pretrained: Path, number_task: dict, capsys: pytest.CaptureFixture
) -> None:
    """Every run of a grid must train for as long and be selected alike: epochs are frozen once one has finished."""
    yaml = task_config(tmp_path / "c.yaml", pretrained, number_task, epochs=1, seeds=[0])
    args = ["finetune", "--config", str(yaml), "--output-dir", str(tmp_path / "ft")]
    assert main(args) == 0, capsys.readouterr().err
    code = main(args + ["--resume", "--set", "train.epochs=2"])
    err = capsys.readouterr().err
    assert code == 2 and "train.epochs" in err and "1 run(s) finished" in err, err


def test_a_suite_written_before_suites_had_a_config_yaml_resumes(
    tmp_path: Path, pretrained: Path, number_task: dict
) -> None:
    from roformer.study.suite import run_suite

    write_yaml(tmp_path / "sst2.yaml", yaml_of(task_config(tmp_path / "t.yaml", pretrained, number_task, epochs=1)))
    write_yaml(tmp_path / "suite.yaml", {"tasks": ["sst2.yaml"], "overrides": ["train.seeds=[0]"]})
    first = run_suite(tmp_path / "suite.yaml", tmp_path / "out")
    (tmp_path / "out" / "config.yaml").unlink()  # as an older version left it
    again = run_suite(tmp_path / "suite.yaml", tmp_path / "out", resume=True)
    assert again["sst2"]["summary"] == first["sst2"]["summary"] and (tmp_path / "out" / "config.yaml").is_file()


def yaml_of(path: Path) -> dict:
    return roformer.config_yaml.read_yaml(path)


def test_a_nan_dev_score_neither_locks_the_best_checkpoint_nor_crashes_the_summary(
    tmp_path: Path, pretrained: Path, number_task: dict, monkeypatch
) -> None:
    """Seed 0 scores NaN at every evaluation, seed 1 NaN first and then numbers: seed 1 is selected at a later step,
    and the summary over the two seeds leaves the NaN out (statistics.stdev raises on one)."""
    import roformer.tasks.glue as glue_module
    import roformer.train.finetune as finetune_module

    calls = {0: 0, 1: 0}
    seed_of = {}

    def scores(metrics, predictions, labels):
        seed = seed_of["current"]
        calls[seed] += 1
        value = float("nan") if seed == 0 or calls[seed] == 1 else 0.5 + 0.1 * calls[seed]
        return {"accuracy": value, "score": value}

    original = finetune_module.Finetuner._run_one

    def run_one(self, lr, seed, fold):
        seed_of["current"] = seed
        return original(self, lr, seed, fold)

    monkeypatch.setattr(glue_module, "compute", scores)
    monkeypatch.setattr(finetune_module.Finetuner, "_run_one", run_one)
    yaml = task_config(tmp_path / "c.yaml", pretrained, number_task, epochs=3, seeds=[0, 1])
    results = finetune(load(FinetuneConfig, yaml), tmp_path / "run")
    assert results["selected"]["seed"] == 1 and results["selected"]["best_step"] > results["runs"][1]["steps"] / 3
    score = results["summary"]["dev"]["score"]
    assert score["mean"] == pytest.approx(0.5 + 0.1 * 3) and score["non_finite"] == 1


def test_the_fresh_head_is_reported_once_per_run(
    tmp_path: Path,
    pretrained: Path,
    number_task: dict,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = load(FinetuneConfig, task_config(tmp_path / "c.yaml", pretrained, number_task, epochs=1, seeds=[0]))
    with caplog.at_level(logging.INFO):
        finetune(config, tmp_path / "run")
    said = [r.getMessage() for r in caplog.records if "freshly initialised" in r.getMessage()]
    assert len(said) == 1 and "sequence_classification: dense.weight" in said[0], said
