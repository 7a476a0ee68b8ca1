"""`roformer experiment`: both arms and seeds end to end at a few steps, controlled arms, resumability."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from helpers import interrupted_run, small_beir, tiny_run_config
from safetensors.torch import load_file

from roformer.cli import main
from roformer.config import ConfigError
from roformer.config_yaml import read_yaml, write_yaml
from roformer.model.weights import WEIGHTS_FILE
from roformer.study.experiment import arm_run_path, load_experiment, run_experiment
from roformer.study.outputs import (
    COMPARE_DIR,
    CURVES_PLOT_FILE,
    GLUE_DIR,
    LENGTH_PLOT_FILE,
    REPORT_FILE,
    SUMMARY_JSON_FILE,
)
from roformer.train.pretrain import Pretrainer
from roformer.train.run_dir import CHECKPOINTS_DIR, FINAL_DIR, METRICS_FILE, RESULTS_FILE


def experiment_files(tmp_path: Path, **train) -> Path:
    tiny_run_config(
        tmp_path / "rope.yaml", model={"position_encoding": "rotary"}, max_steps=6, eval_every=3, save_every=3, **train
    )
    tiny_run_config(
        tmp_path / "bert.yaml",
        model={"position_encoding": "sinusoidal"},
        max_steps=6,
        eval_every=3,
        save_every=3,
        **train,
    )
    write_yaml(tmp_path / "exp.yaml", {"arms": {"roformer": "rope.yaml", "bert": "bert.yaml"}, "seeds": [0, 1]})
    return tmp_path / "exp.yaml"


def test_experiment_end_to_end(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    config = experiment_files(tmp_path)
    assert main(["experiment", "--config", str(config), "--output-dir", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    assert f"{out / 'roformer-seed0'}: finished: eval loss " in caplog.text  # each arm's run as it ends
    assert {p.name for p in out.iterdir()} == {
        "roformer-seed0",
        "bert-seed0",
        "roformer-seed1",
        "bert-seed1",
        COMPARE_DIR,
        REPORT_FILE,
    }
    assert arm_run_path(out, "bert", 1) == out / "bert-seed1"
    report = (out / REPORT_FILE).read_text()
    assert f"![MLM loss curves]({COMPARE_DIR}/{CURVES_PLOT_FILE})" in report and "## How this was made" in report
    assert "Differences from the baseline (bert)" in report and "Arm `roformer`, resolved pretraining config" in report
    summary = json.loads((out / COMPARE_DIR / SUMMARY_JSON_FILE).read_text())
    assert summary["baseline"] == "bert" and summary["roformer"] == "roformer"
    assert [a["seeds"] for a in summary["arms"]] == [2, 2]
    # same initial weights and batches per seed: the first train loss differs only through the position encoding,
    # and the two seeds of an arm differ
    first = {
        d.name: json.loads((d / METRICS_FILE).read_text().splitlines()[0])["loss"]
        for d in out.iterdir()
        if d.name.endswith(("seed0", "seed1"))
    }
    assert first["roformer-seed0"] != first["roformer-seed1"]
    a = load_file(out / "roformer-seed0" / CHECKPOINTS_DIR / "step-3" / WEIGHTS_FILE)
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


@pytest.mark.slow
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
    tiny_run_config(
        tmp_path / "bert.yaml",
        model={"position_encoding": "sinusoidal"},
        max_steps=6,
        eval_every=3,
        save_every=3,
        lr=5e-3,
    )
    with pytest.raises(ConfigError, match="differ in train.lr"):
        load_experiment(config)
    tiny_run_config(
        tmp_path / "bert.yaml",
        model={"position_encoding": "sinusoidal", "num_layers": 3},
        max_steps=6,
        eval_every=3,
        save_every=3,
    )
    with pytest.raises(ConfigError, match="differ in model.num_layers"):
        load_experiment(config)


def test_arms_with_different_classifier_heads_are_refused(tmp_path: Path) -> None:
    config = experiment_files(tmp_path)
    tiny_run_config(
        tmp_path / "bert.yaml",
        model={"position_encoding": "sinusoidal", "classifier_head": "pooler"},
        max_steps=6,
        eval_every=3,
        save_every=3,
    )
    with pytest.raises(ConfigError, match="differ in model.classifier_head"):
        load_experiment(config)


def test_arm_overrides_and_the_fields_under_comparison(tmp_path: Path) -> None:
    """Arms as {config, set}; a non-position field may differ only when `vary` names it; new position fields may."""
    experiment_files(tmp_path)
    arms = {
        "softmax": "rope.yaml",
        "linear": {"config": "rope.yaml", "set": ["model.attention=linear"]},
        "linear-none": {"config": "rope.yaml", "set": ["model.attention=linear", "model.position_encoding=none"]},
    }
    write_yaml(tmp_path / "exp.yaml", {"arms": arms})
    with pytest.raises(ConfigError, match="differ in model.attention"):
        load_experiment(tmp_path / "exp.yaml")
    write_yaml(tmp_path / "exp.yaml", {"arms": arms, "vary": ["attention"]})
    _, loaded = load_experiment(tmp_path / "exp.yaml")
    assert loaded["linear-none"].model.attention == "linear" and loaded["linear-none"].model.position_encoding == "none"
    assert loaded["softmax"].model.attention == "softmax"
    write_yaml(
        tmp_path / "exp.yaml",
        {
            "arms": {
                "a": "rope.yaml",
                "b": {
                    "config": "rope.yaml",
                    "set": ["model.rotary_dim=8", "model.rope_scaling={type: linear, factor: 2}"],
                },
            }
        },
    )
    assert load_experiment(tmp_path / "exp.yaml")[1]["b"].model.rotary_dim == 8
    relative = {
        "shaw": {"config": "rope.yaml", "set": ["model.position_encoding=shaw", "model.relative_max_distance=16",
                                               "model.shaw_values=true", "model.shaw_shared_layers=true"]},
        "t5": {"config": "rope.yaml", "set": ["model.position_encoding=t5_bias", "model.relative_num_buckets=16"]},
        "alibi": {"config": "rope.yaml", "set": ["model.position_encoding=alibi"]},
    }  # fmt: skip
    write_yaml(tmp_path / "exp.yaml", {"arms": {"rotary": "rope.yaml", **relative}})
    loaded = load_experiment(tmp_path / "exp.yaml")[1]
    assert loaded["shaw"].model.shaw_values and loaded["t5"].model.relative_num_buckets == 16
    assert loaded["alibi"].model.position_encoding == "alibi"
    write_yaml(tmp_path / "exp.yaml", {"arms": arms, "vary": ["atention"]})
    with pytest.raises(ConfigError, match="'atention' is neither a model field nor a tokenization field"):
        load_experiment(tmp_path / "exp.yaml")
    write_yaml(tmp_path / "exp.yaml", {"arms": arms, "seeds": [0, 4294967296]})  # numpy would fail mid-experiment
    with pytest.raises(ConfigError, match=r"seeds must be in \[0, 2\^32 - 1\], got 4294967296"):
        load_experiment(tmp_path / "exp.yaml")


def test_glue_and_length_stages_resume_and_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After pretraining: a GLUE suite on every final model and eval-mlm at two lengths; a rerun redoes nothing."""
    import csv

    import roformer.study.experiment as experiment_module
    from roformer.data.builtin import NUMBERS, generate_documents

    config = experiment_files(tmp_path)
    sentences = [s.strip() for d in generate_documents(400, seed=9) for s in d.split(" . ") if s.strip()][:120]
    for split, rows in (("train", sentences[:80]), ("dev", sentences[80:])):
        with (tmp_path / f"{split}.csv").open("w", newline="") as f:
            csv.writer(f).writerows(
                [("sentence", "label"), *((s, int(bool(set(NUMBERS) & set(s.split())))) for s in rows)]
            )
    task = {
        "data": {
            "task": "sst2",
            "source": "files",
            "train_file": "train.csv",
            "validation_file": "dev.csv",
            "max_length": 32,
        },
        "train": {"max_steps": 2, "batch_size": 8, "lr": 1e-3, "seeds": [0, 1], "progress": False},
    }
    write_yaml(tmp_path / "sst2.yaml", {"init": "unused", **task})
    for split, rows in (("train", sentences[:80]), ("dev", sentences[80:])):  # a tag per word: number words
        lines = ["\n".join(f"{w} {'B-NUM' if w in NUMBERS else 'O'}" for w in s.split()) for s in rows]
        (tmp_path / f"{split}.conll").write_text("\n\n".join(lines) + "\n")
    ner = {
        "type": "token_classification",
        "task": "toy-ner",
        "train_file": "train.conll",
        "validation_file": "dev.conll",
    }
    write_yaml(tmp_path / "ner.yaml", {"init": "unused", "data": ner, "train": task["train"]})
    for split, rows in (("train", sentences[:80]), ("dev", sentences[80:])):  # pairs scored by their shared words
        pairs = [(a, b, len(set(a.split()) & set(b.split()))) for a, b in zip(rows, rows[1:])]
        (tmp_path / f"{split}-pairs.tsv").write_text("".join(f"{a}\t{b}\t{n}\n" for a, b, n in pairs))
    sts = {
        "type": "similarity",
        "task": "toy-sts",
        "train_file": "train-pairs.tsv",
        "validation_file": "dev-pairs.tsv",
        "column_names": ["a", "b", "score"],
        "text_columns": ["a", "b"],
        "label_column": "score",
    }
    write_yaml(tmp_path / "sts.yaml", {"init": "unused", "data": sts, "train": task["train"]})
    small_beir(tmp_path / "beir")  # retrieval: every arm compared by nDCG@10 too
    retrieval = {"type": "retrieval", "task": "toy-retrieval", "beir_dir": "beir"}
    write_yaml(tmp_path / "retrieval.yaml", {"init": "unused", "data": retrieval, "train": task["train"]})
    # GLUE and any other task type: token classification, a bi-encoder of sentence vectors, retrieval
    write_yaml(tmp_path / "suite.yaml", {"tasks": ["sst2.yaml", "ner.yaml", "sts.yaml", "retrieval.yaml"]})
    data = read_yaml(config)
    suite = f"../{tmp_path.name}/suite.yaml"  # a path through `..`, as configs/experiments/ names configs/glue/
    data.update(
        {
            "glue": {"suite": suite, "overrides": ["data.max_length=32"]},
            "length": {"seq_lens": [32, 64], "max_tokens": 512},
        }
    )
    write_yaml(config, data)
    summary = run_experiment(config, tmp_path / "out")
    out = tmp_path / "out"
    assert sorted(p.name for p in (out / GLUE_DIR).iterdir()) == [
        "bert-seed0",
        "bert-seed1",
        "roformer-seed0",
        "roformer-seed1",
    ]
    results = json.loads((out / GLUE_DIR / "roformer-seed1" / "sst2" / RESULTS_FILE).read_text())
    assert results["label"] == "roformer" and results["init"].endswith(f"roformer-seed1/{FINAL_DIR}")
    assert summary["glue"]["roformer"]["sst2"]["runs"] == 2 and "sst2" in summary["glue_differences"]["roformer"]
    assert summary["glue"]["roformer"]["toy-ner"]["runs"] == 2 and "toy-ner" in summary["glue_differences"]["roformer"]
    assert summary["glue"]["roformer"]["toy-sts"]["runs"] == 2 and "toy-sts" in summary["glue_differences"]["roformer"]
    retrieved = summary["glue_differences"]["roformer"]["toy-retrieval"]  # nDCG@10, arm - baseline with an interval
    assert summary["glue"]["roformer"]["toy-retrieval"]["runs"] == 2 and {"mean", "low", "high"} <= set(retrieved)
    ndcg = json.loads((out / GLUE_DIR / "bert-seed0" / "toy-retrieval" / RESULTS_FILE).read_text())["summary"]["dev"]
    assert ndcg["score"]["values"] == ndcg["ndcg@10"]["values"]  # the score compared is nDCG@10
    assert set(summary["length_differences"]["roformer"]) == {32, 64}
    # each column's constant-answer level, one for all arms (from the training labels); none for retrieval
    assert (
        summary["glue_baselines"]["sst2"]["kind"] == "majority_class"
        and "toy-retrieval" not in summary["glue_baselines"]
    )
    assert summary["glue_baselines"]["toy-ner"]["kind"] == "all_outside"
    report = (out / REPORT_FILE).read_text()
    assert "| *trivial baseline (majority class; training mean: 0)* |" in report
    assert "### GLUE" in report and "Dev score differences from bert" in report and "GLUE suite" in report
    assert "toy-retrieval ndcg@10" in report  # what each column's score is
    assert f"GLUE suite (`{tmp_path / 'suite.yaml'}`)" in report  # the path shown without `..`
    assert f"![eval loss against length]({COMPARE_DIR}/{LENGTH_PLOT_FILE})" in report

    calls = []
    monkeypatch.setattr(experiment_module, "pretrain", lambda *a, **k: calls.append("pretrain"))
    monkeypatch.setattr(experiment_module, "evaluate_lengths", lambda *a, **k: calls.append("length"))
    again = run_experiment(config, tmp_path / "out")
    assert calls == [] and again["glue"] == summary["glue"]  # finished runs, tasks and length files are kept


def test_running_the_arms_leaves_their_configs_as_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each seed's run gets its own copy of the arm's config: the arms (and the report made from them) keep theirs."""
    import roformer.study.experiment as experiment_module

    experiment, arms = load_experiment(experiment_files(tmp_path))
    before = {label: config.to_dict() for label, config in arms.items()}
    started = []

    def fake_pretrain(config, directory, resume=False, overwrite=False):
        started.append((config.label, config.train.seed))
        return directory

    monkeypatch.setattr(experiment_module, "pretrain", fake_pretrain)
    monkeypatch.setattr(experiment_module, "load_runs", lambda runs: ([], []))
    monkeypatch.setattr(experiment_module, "check_same_vocabulary", lambda runs: None)
    experiment_module.pretrain_arms(experiment, arms, tmp_path / "out")
    assert started == [("roformer", 0), ("bert", 0), ("bert", 1), ("roformer", 1)]
    assert {label: config.to_dict() for label, config in arms.items()} == before


@pytest.mark.slow  # long: CI skips it (docs/install.md, the slow marker)
def test_arms_with_other_tokenizers_are_compared_apart(tmp_path: Path) -> None:
    """`vary: [data.vocab_size]`: each run records its tokenization; the report tabulates vocabulary and tokens per
    character, and keeps the other tokenizer's MLM loss out of the baseline's curves, targets and differences."""
    experiment_files(tmp_path)
    arms = {
        "roformer": "rope.yaml",
        "bert": "bert.yaml",
        "bert-big-vocab": {"config": "bert.yaml", "set": ["data.vocab_size=400"]},
    }
    write_yaml(tmp_path / "exp.yaml", {"arms": arms, "seeds": [0], "baseline": "bert"})
    with pytest.raises(ConfigError, match="differ in data.vocab_size"):
        load_experiment(tmp_path / "exp.yaml")
    write_yaml(tmp_path / "exp.yaml", {"arms": arms, "seeds": [0], "baseline": "bert", "vary": ["data.max_seq_len"]})
    with pytest.raises(ConfigError, match="'data.max_seq_len' is neither a model field nor a tokenization field"):
        load_experiment(tmp_path / "exp.yaml")
    write_yaml(tmp_path / "exp.yaml", {"arms": arms, "seeds": [0], "baseline": "bert", "vary": ["data.vocab_size"]})
    summary = run_experiment(tmp_path / "exp.yaml", tmp_path / "out")
    rows = {r["label"]: r for r in summary["tokenization"]}
    assert rows["bert"]["vocab_size"] == 300 and rows["bert-big-vocab"]["vocab_size"] == 400
    assert rows["bert"] == {**rows["roformer"], "label": "bert"}  # one tokenizer, one reading of the text
    assert rows["bert-big-vocab"]["tokens_per_character"] < rows["bert"]["tokens_per_character"]  # longer pieces
    recorded = tmp_path / "out" / "bert-seed0" / "tokenization.json"
    expected = {k: v for k, v in rows["bert"].items() if k != "label"} | {"split": "train"}
    assert json.loads(recorded.read_text()) == expected
    recorded.unlink()  # a run from before runs recorded it: resuming writes it
    Pretrainer(load_experiment(tmp_path / "exp.yaml")[1]["bert"], tmp_path / "out" / "bert-seed0", resume=True).run()
    assert json.loads(recorded.read_text())["vocab_size"] == 300
    assert [a["label"] for a in summary["arms"]] == ["roformer", "bert"]
    assert [a["label"] for a in summary["other_tokenizer_arms"]] == ["bert-big-vocab"]
    assert set(summary["differences"]) == {"roformer"}
    text = (tmp_path / "out" / "compare" / "summary.md").read_text()
    assert "Tokenization of each arm" in text and "| bert-big-vocab | 400 |" in text
    assert "Arms with another tokenizer" in text and "bert-big-vocab read another tokenizer" in text


def test_arms_under_other_mask_recipes_and_stages_compare_against_baselines_of_their_own(tmp_path: Path) -> None:
    """`vary: [data.mask_rate, stages]` admits recipe arms; `comparisons` sets a group against its own baseline."""
    experiment_files(tmp_path)
    stages = "stages=[{name: hot, steps: 4, data: {mask_rate: 0.3}}, {name: cool, steps: 2, data: {mask_rate: 0.05}}]"
    arms = {
        "roformer": "rope.yaml",
        "roformer-30": {"config": "rope.yaml", "set": ["data.mask_rate=0.3"]},
        "roformer-staged": {"config": "rope.yaml", "set": [stages]},
        "bert": "bert.yaml",
    }
    comparisons = {"rotary": {"arms": ["roformer", "roformer-30", "roformer-staged"], "baseline": "roformer"}}
    write_yaml(tmp_path / "exp.yaml", {"arms": arms, "seeds": [0], "baseline": "bert", "vary": ["data.mask_rate"]})
    with pytest.raises(ConfigError, match="arms 'roformer' and 'roformer-staged' differ in stages"):
        load_experiment(tmp_path / "exp.yaml")
    bad = {"rotary": {"arms": ["roformer", "roformer-31"], "baseline": "roformer"}}
    write_yaml(tmp_path / "exp.yaml", {"arms": arms, "vary": ["data.mask_rate", "stages"], "comparisons": bad})
    with pytest.raises(ConfigError, match="comparisons.rotary: 'roformer-31' is not one of the arms"):
        load_experiment(tmp_path / "exp.yaml")
    experiment = {"arms": arms, "seeds": [0], "baseline": "bert", "vary": ["data.mask_rate", "stages"]}
    write_yaml(tmp_path / "exp.yaml", {**experiment, "comparisons": comparisons})
    summary = run_experiment(tmp_path / "exp.yaml", tmp_path / "out")
    assert summary["baseline"] == "bert" and len(summary["arms"]) == 4
    rotary = json.loads((tmp_path / "out" / f"{COMPARE_DIR}-rotary" / SUMMARY_JSON_FILE).read_text())
    assert rotary["baseline"] == "roformer" and [a["label"] for a in rotary["arms"]] == list(
        comparisons["rotary"]["arms"]
    )
    assert set(rotary["differences"]) == {"roformer-30", "roformer-staged"}
    report = (tmp_path / "out" / REPORT_FILE).read_text()
    assert "## Comparison `rotary`: roformer, roformer-30, roformer-staged against roformer" in report
    staged = [json.loads(line) for line in (tmp_path / "out" / "roformer-staged-seed0" / METRICS_FILE).open()]
    assert [e["stage"] for e in staged if e["event"] == "stage"] == ["hot", "cool"]


def test_a_probe_stage_probes_every_final_model_and_the_report_tabulates_it(tmp_path: Path) -> None:
    experiment_files(tmp_path, batch_size=4)
    probes = {"probes": ["needle"], "lengths": [64, 96], "samples": 4, "scalings": ["none", "self_extend"]}
    write_yaml(tmp_path / "exp.yaml", {**read_yaml(tmp_path / "exp.yaml"), "seeds": [0], "probes": probes})
    summary = run_experiment(tmp_path / "exp.yaml", tmp_path / "out")
    rope, bert = tmp_path / "out" / "roformer-seed0" / "probes", tmp_path / "out" / "bert-seed0" / "probes"
    assert sorted(p.name for p in rope.iterdir()) == ["needle-none.json", "needle-self_extend.json"]
    assert sorted(p.name for p in bert.iterdir()) == ["needle-none.json"]  # no scaling without rotary
    assert {(r["label"], r["scaling"]) for r in summary["probes"]} == {
        ("roformer", "none"), ("roformer", "self_extend"), ("bert", "none")
    }  # fmt: skip
    assert "## Probe `needle`" in (tmp_path / "out" / REPORT_FILE).read_text()
    write_yaml(tmp_path / "exp.yaml", {**read_yaml(tmp_path / "exp.yaml"), "probes": {"probes": ["haystack"]}})
    with pytest.raises(ConfigError, match=r"probes: probe: unknown probe 'haystack'"):
        load_experiment(tmp_path / "exp.yaml")


def test_every_stage_input_is_checked_before_the_first_arm_trains(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    config = experiment_files(tmp_path)
    base = read_yaml(config)
    out = tmp_path / "out"
    (tmp_path / "empty").mkdir()
    write_yaml(tmp_path / "task.yaml", {"init": "unused", "data": {"task": "sst2", "source": "files",
               "train_file": "missing.csv", "validation_file": "missing.csv"}})  # fmt: skip
    write_yaml(tmp_path / "suite.yaml", {"tasks": ["task.yaml"]})
    for stage, message in [
        ({"probes": {"probes": ["passkey"], "lengths": [64], "haystack": "empty"}}, "probes.haystack: "),
        ({"probes": {"probes": ["passkey-mlm"], "lengths": [64]}}, "probes: passkey-mlm on arm 'roformer': "),
        ({"glue": {"suite": "suite.yaml"}}, "glue: task sst2: "),
    ]:
        write_yaml(config, {**base, **stage})
        assert main(["experiment", "--config", str(config), "--output-dir", str(out)]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
        assert not out.exists()  # no arm trained
