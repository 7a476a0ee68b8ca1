"""`roformer compare` on run directories with known, constructed curves: exact steps-to-target and ratios."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roformer.cli import main
from roformer.config_yaml import read_yaml, write_yaml
from roformer.study.compare import compare
from roformer.study.outputs import CURVES_PLOT_FILE, SUMMARY_JSON_FILE, SUMMARY_MARKDOWN_FILE
from roformer.train.run_dir import FINAL_DIR, LENGTH_FILE, METRICS_FILE, RESULTS_FILE, RUN_CONFIG_FILE


def make_run(
    path: Path,
    label: str,
    encoding: str,
    eval_losses: dict[int, float],
    seconds_per_step: float,
    tokens_per_step: int = 1000,
    vocab_hash: str = "abc",
    seed: int | None = None,
) -> Path:
    """A pretraining run directory whose metrics.jsonl holds the given eval losses (and linear train losses)."""
    path.mkdir(parents=True)
    config = {"label": label, "model": {"position_encoding": encoding}, "data": {"vocab_hash": vocab_hash}}
    if seed is not None:
        config["train"] = {"seed": seed}
    write_yaml(path / RUN_CONFIG_FILE, config)
    lines = []
    for step in sorted(eval_losses):
        lines.append(
            {
                "event": "train",
                "step": step,
                "loss": eval_losses[step] + 0.1,
                "lr": 1e-3,
                "grad_norm": 1.0,
                "tokens_seen": step * tokens_per_step,
                "tokens_per_sec": 1.0,
                "elapsed_sec": step * seconds_per_step,
            }
        )
        lines.append(
            {
                "event": "eval",
                "step": step,
                "eval_loss": eval_losses[step],
                "eval_accuracy": 0.5,
                "elapsed_sec": step * seconds_per_step,
            }
        )
    (path / METRICS_FILE).write_text("".join(json.dumps(e) + "\n" for e in lines))
    return path


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    # BERT (two seeds) ends at 4.0; RoFormer reaches 4.0 at step 200 and ends at 3.0; rotary costs 10% more per step
    bert = [
        make_run(tmp_path / "bert-0", "bert", "sinusoidal", {100: 5.0, 200: 4.6, 300: 4.3, 400: 4.1}, 1.0),
        make_run(tmp_path / "bert-1", "bert", "sinusoidal", {100: 5.2, 200: 4.8, 300: 4.2, 400: 3.9}, 1.0),
    ]
    rope = [make_run(tmp_path / "rope-0", "roformer", "rotary", {100: 4.5, 200: 4.0, 300: 3.4, 400: 3.0}, 1.1)]
    return rope + bert


def test_steps_to_target_and_ratios_are_exact(runs: list[Path], tmp_path: Path) -> None:
    summary = compare(runs, tmp_path / "out")
    assert summary["baseline"] == "bert" and summary["roformer"] == "roformer"
    assert summary["targets"] == pytest.approx([4.5, 4.25, 4.1, 4.0])  # bert's final mean 4.0 + offsets
    arms = {a["label"]: a for a in summary["arms"]}
    assert arms["bert"]["final_eval_loss"] == pytest.approx(4.0) and arms["bert"]["seeds"] == 2
    assert arms["roformer"]["eval_loss_at_common_step"] == pytest.approx(3.0)
    # bert's mean curve over its seeds: 5.1, 4.7, 4.25, 4.0 at steps 100..400; roformer: 4.5, 4.0, 3.4, 3.0
    rope_t, bert_t = arms["roformer"]["targets"], arms["bert"]["targets"]
    assert [t["steps"] for t in rope_t] == [100, 200, 200, 200]
    assert [t["steps"] for t in bert_t] == [300, 300, 400, 400]  # 4.5 and 4.25 first at 300; 4.1 and 4.0 at 400
    assert bert_t[3]["seconds"] == pytest.approx(400.0) and rope_t[0]["tokens"] == pytest.approx(100_000)
    ratios = summary["ratios"]["targets"]
    assert [r["steps"] for r in ratios] == pytest.approx([100 / 300, 200 / 300, 200 / 400, 200 / 400])
    assert ratios[0]["seconds"] == pytest.approx(110 / 300)  # 10% slower steps
    assert ratios[1]["tokens"] == pytest.approx(200 / 300)
    assert summary["ratios"]["final_eval_loss"] == pytest.approx(3.0 / 4.0)
    out = tmp_path / "out"
    assert {p.name for p in out.iterdir()} == {CURVES_PLOT_FILE, SUMMARY_MARKDOWN_FILE, SUMMARY_JSON_FILE}
    assert (out / CURVES_PLOT_FILE).stat().st_size > 10_000
    table = (out / SUMMARY_MARKDOWN_FILE).read_text()
    assert "| 4.500 | 100 (100k tok, 110 s) | 300 (300k tok, 300 s) | 0.33 | 0.37 |" in table


def test_explicit_targets_and_baseline(runs: list[Path], tmp_path: Path) -> None:
    summary = compare(runs, tmp_path / "out", baseline="roformer", targets=[4.6])
    assert summary["baseline"] == "roformer" and summary["roformer"] is None  # no other rotary arm
    arms = {a["label"]: a for a in summary["arms"]}
    assert arms["bert"]["targets"][0]["steps"] == 300  # mean curve 4.7 at 200, 4.25 at 300


def test_glue_table(tmp_path: Path) -> None:
    for label, score in (("roformer", 0.7), ("bert", 0.6)):
        run = tmp_path / f"glue-{label}"
        run.mkdir()
        summary = {"dev": {"accuracy": {"mean": score, "std": 0.01}, "score": {"mean": score, "std": 0.01}}}
        results = {"task": "rte", "label": label, "selection_split": "dev", "summary": summary}
        (run / RESULTS_FILE).write_text(json.dumps(results))
    summary = compare([tmp_path / "glue-roformer", tmp_path / "glue-bert"], tmp_path / "out")
    assert summary["glue"]["roformer"]["rte"]["score"]["mean"] == 0.7
    assert "| roformer | 70.0 ± 1.0 |" in (tmp_path / "out" / SUMMARY_MARKDOWN_FILE).read_text()


def glue_run(path: Path, label: str, task: str, splits: dict[str, float], head: str = "mlp") -> Path:
    """A results.json of a fine-tuning job with the given mean dev score per split."""
    path.mkdir()
    summary = {s: {"score": {"mean": v, "std": 0.0}} for s, v in splits.items()}
    results = {
        "task": task,
        "label": label,
        "selection_split": next(iter(splits)),
        "summary": summary,
        "classifier_head": head,
    }
    (path / RESULTS_FILE).write_text(json.dumps(results))
    return path


def test_glue_table_reports_mnli_mismatched_and_says_selection_is_on_dev(tmp_path: Path) -> None:
    runs = [
        glue_run(tmp_path / f"mnli-{label}", label, "mnli", {"dev_matched": m, "dev_mismatched": mm})
        for label, m, mm in (("roformer", 0.8, 0.81), ("bert", 0.7, 0.72))
    ]
    summary = compare(runs, tmp_path / "out")
    assert summary["glue"]["bert"]["mnli-mm"]["score"]["mean"] == 0.72
    text = (tmp_path / "out" / SUMMARY_MARKDOWN_FILE).read_text()
    assert "| arm | mnli-m | mnli-mm |" in text and "| roformer | 80.0 ± 0.0 | 81.0 ± 0.0 |" in text
    assert "Selected on dev" in text


def test_compare_refuses_different_heads_and_tokenizers(
    runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    a = glue_run(tmp_path / "rte-a", "roformer", "rte", {"dev": 0.7}, head="mlp")
    b = glue_run(tmp_path / "rte-b", "bert", "rte", {"dev": 0.6}, head="pooler")
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "o1")]) == 2
    assert "different heads (mlp vs pooler)" in capsys.readouterr().err
    other = make_run(tmp_path / "bert-9", "bert", "sinusoidal", {100: 5.0, 400: 4.0}, 1.0, vocab_hash="def")
    assert main(["compare", *map(str, runs), str(other), "--out", str(tmp_path / "o2")]) == 2
    assert "different tokenizers" in capsys.readouterr().err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_bad_inputs(runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["compare", str(empty), "--out", str(tmp_path / "o1")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    no_eval = tmp_path / "no-eval"
    no_eval.mkdir()
    (no_eval / METRICS_FILE).write_text(json.dumps({"event": "train", "step": 1, "loss": 3.0}) + "\n")
    assert main(["compare", str(no_eval), str(runs[0]), "--out", str(tmp_path / "o2")]) == 2
    assert "no eval events" in capsys.readouterr().err
    for label, task in (("a", "rte"), ("b", "mrpc")):
        run = tmp_path / f"glue-{label}"
        run.mkdir()
        results = {"task": task, "label": label, "selection_split": "dev", "summary": {"dev": {"score": {"mean": 1}}}}
        (run / RESULTS_FILE).write_text(json.dumps(results))
    assert main(["compare", str(tmp_path / "glue-a"), str(tmp_path / "glue-b"), "--out", str(tmp_path / "o3")]) == 2
    assert "share no task" in capsys.readouterr().err
    assert main(["compare", *map(str, runs), "--out", str(tmp_path / "o4"), "--targets", "x"]) == 2
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 5))


def test_differences_have_paired_intervals_over_seeds(tmp_path: Path) -> None:
    """Three seeds per arm, paired by train.seed; checked against scipy; n.s. where the interval includes 0."""
    from scipy import stats

    rope_final, bert_final = {0: 3.0, 1: 3.2, 2: 3.1}, {0: 4.0, 1: 4.1, 2: 3.95}
    rope_first, bert_first = {0: 4.5, 1: 4.7, 2: 4.5}, {0: 4.7, 1: 4.5, 2: 4.5}  # 4.6 reached at 100 or 200
    runs = []
    for seed in (0, 1, 2):
        runs.append(
            make_run(
                tmp_path / f"r{seed}",
                "roformer",
                "rotary",
                {100: rope_first[seed], 200: rope_final[seed]},
                1.0,
                seed=seed,
            )
        )
        runs.append(
            make_run(
                tmp_path / f"b{seed}",
                "bert",
                "sinusoidal",
                {100: bert_first[seed], 200: bert_final[seed]},
                1.0,
                seed=seed,
            )
        )
    summary = compare(runs, tmp_path / "out", targets=[4.6, 4.05])
    final = summary["differences"]["roformer"]["final_eval_loss"]
    expected = stats.ttest_rel(list(rope_final.values()), list(bert_final.values())).confidence_interval(0.95)
    assert final["test"] == "paired t" and final["significant"] is True
    assert (final["low"], final["high"]) == pytest.approx((expected.low, expected.high))
    steps = summary["differences"]["roformer"]["steps_to_target"]
    assert steps[0]["mean"] == 0.0 and steps[0]["low"] < 0 < steps[0]["high"]  # per seed -100, +100, 0
    assert steps[0]["significant"] is False
    assert steps[1]["mean"] is None  # bert's seed 1 ends at 4.1: never reaches 4.05
    assert steps[1]["unreached"] == {"arm": [], "baseline": [1]}  # the baseline's seed, not roformer's
    text = (tmp_path / "out" / SUMMARY_MARKDOWN_FILE).read_text()
    assert "paired t" in text and "n.s." in text
    row = next(line for line in text.splitlines() if line.startswith("| roformer |") and "[" in line)
    assert row.endswith("| baseline never reached it (seed 1) |") and "not reached" not in row
    assert json.loads((tmp_path / "out" / SUMMARY_JSON_FILE).read_text())["differences"]["roformer"]["final_eval_loss"]


def seeded_glue_run(path: Path, label: str | None, scores: dict[int, float], init: str = "") -> Path:
    """A complete results.json: per fine-tuning seed dev scores at the selected lr (and a worse lr)."""
    path.mkdir(parents=True)
    runs = [{"peak_lr": 2e-5, "seed": s, "dev": {"dev": {"score": v}}} for s, v in scores.items()]
    runs += [{"peak_lr": 5e-5, "seed": s, "dev": {"dev": {"score": v - 0.1}}} for s, v in scores.items()]
    mean = sum(scores.values()) / len(scores)
    results = {
        "task": "rte",
        "label": label,
        "init": init,
        "selection_split": "dev",
        "runs": runs,
        "selected": {"peak_lr": 2e-5, "seed": 0},
        "summary": {"dev": {"score": {"mean": mean, "std": 0.0}}},
    }
    (path / RESULTS_FILE).write_text(json.dumps(results))
    return path


def test_glue_differences_paired_by_fine_tuning_seed_then_by_pretraining_seed(tmp_path: Path) -> None:
    from scipy import stats

    rope, bert = {0: 0.62, 1: 0.66, 2: 0.60}, {0: 0.58, 1: 0.61, 2: 0.59}
    a, b = seeded_glue_run(tmp_path / "a", "roformer", rope), seeded_glue_run(tmp_path / "b", "bert", bert)
    summary = compare([a, b], tmp_path / "out", baseline="bert")
    d = summary["glue_differences"]["roformer"]["rte"]
    expected = stats.ttest_rel(list(rope.values()), list(bert.values())).confidence_interval(0.95)
    assert d["test"] == "paired t" and (d["low"], d["high"]) == pytest.approx((expected.low, expected.high))
    assert "Dev score differences from bert" in (tmp_path / "out" / SUMMARY_MARKDOWN_FILE).read_text()
    # one GLUE run per pretraining seed (init = <run>/final, whose config.yaml has the seed): paired by that seed
    runs = []
    for seed, (r, b_) in enumerate([(0.62, 0.60), (0.70, 0.61), (0.64, 0.63)]):
        for label, value in (("roformer", r), ("bert", b_)):
            pre = tmp_path / "pre" / f"{label}-seed{seed}"
            (pre / FINAL_DIR).mkdir(parents=True)
            write_yaml(pre / RUN_CONFIG_FILE, {"train": {"seed": seed}})
            runs.append(
                seeded_glue_run(tmp_path / f"g-{label}-{seed}", label, {0: value, 1: value}, init=str(pre / FINAL_DIR))
            )
    summary = compare(runs, tmp_path / "out2", baseline="bert")
    d = summary["glue_differences"]["roformer"]["rte"]
    assert d["test"] == "paired t" and d["n"] == [3, 3] and d["mean"] == pytest.approx((0.02 + 0.09 + 0.01) / 3)
    assert summary["glue"]["roformer"]["rte"]["runs"] == 3
    assert summary["glue"]["roformer"]["rte"]["score"]["mean"] == pytest.approx((0.62 + 0.70 + 0.64) / 3)


def test_length_differences_paired_by_seed(tmp_path: Path) -> None:
    runs = []
    for seed, bert_offset in enumerate((0.5, 0.6, 0.55)):  # 3 seeds: with 2, t(0.975, 1) = 12.7 swallows 0.55
        for label, encoding, offset in (("roformer", "rotary", 0.0), ("bert", "sinusoidal", bert_offset)):
            run = make_run(tmp_path / f"{label}-{seed}", label, encoding, {100: 4.0}, 1.0, seed=seed)
            rows = [{"seq_len": n, "eval_loss": 3.0 + offset + n / 1000, "eval_accuracy": 0.3} for n in (128, 512)]
            (run / LENGTH_FILE).write_text(json.dumps({"results": rows}))
            runs.append(run)
    summary = compare(runs, tmp_path / "out")
    d = summary["length_differences"]["roformer"]
    assert set(d) == {128, 512} and d[128]["test"] == "paired t"
    assert d[512]["mean"] == pytest.approx(-0.55) and d[512]["significant"] is True
    assert "Eval-loss differences from bert" in (tmp_path / "out" / SUMMARY_MARKDOWN_FILE).read_text()


def test_two_runs_of_an_arm_with_one_seed_are_refused_not_counted_once(tmp_path: Path, capsys) -> None:
    runs = [make_run(tmp_path / f"rope-{i}", "roformer", "rotary", {100: 4.0 + i}, 1.0, seed=0) for i in range(2)]
    runs.append(make_run(tmp_path / "bert", "bert", "sinusoidal", {100: 4.5}, 1.0, seed=0))
    assert main(["compare", *map(str, runs), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "arm 'roformer' has two runs with train.seed 0" in err and len(err.strip().splitlines()) == 1, err


def test_runs_of_different_lengths_or_eval_sets_are_compared_with_a_note(tmp_path: Path) -> None:
    rope = make_run(tmp_path / "rope", "roformer", "rotary", {100: 4.6, 200: 4.5}, 1.0, seed=0)
    bert = make_run(tmp_path / "bert", "bert", "sinusoidal", {100: 4.7, 200: 4.6, 400: 4.1}, 1.0, seed=0)
    config = read_yaml(bert / RUN_CONFIG_FILE)
    config["data"]["mask_rate"] = 0.4  # written before eval_mask_rate: evaluated at its training rate
    write_yaml(bert / RUN_CONFIG_FILE, config)
    summary = compare([rope, bert], tmp_path / "out")
    assert any("end at different steps (200, 400)" in note for note in summary["notes"])
    assert any("data.eval_mask_rate: 0.4, None" in note for note in summary["notes"])
    config["data"]["eval_mask_rate"] = 0.15  # a run that trains at 40% but evaluates at 15%: no note about masks
    write_yaml(bert / RUN_CONFIG_FILE, config)
    rope_config = read_yaml(rope / RUN_CONFIG_FILE)
    rope_config["data"]["eval_mask_rate"] = 0.15
    write_yaml(rope / RUN_CONFIG_FILE, rope_config)
    notes = compare([rope, bert], tmp_path / "out2")["notes"]
    assert not any("mask_rate" in note for note in notes)
    text = (tmp_path / "out" / SUMMARY_MARKDOWN_FILE).read_text()
    assert "Note: the runs end at different steps" in text and "eval loss at the common step" in text


def test_length_table_counts_one_row_per_run_and_length(tmp_path: Path) -> None:
    """eval-mlm --rope-scaling none,linear,ntk writes three rows with the model's own tables at the trained length."""
    runs = []
    for seed, loss in enumerate((7.0, 9.0)):
        run = make_run(tmp_path / f"rope-{seed}", "roformer", "rotary", {100: 4.0}, 1.0, seed=seed)
        methods = ("none", "linear x1", "ntk x1") if seed == 0 else ("none",)
        rows = [{"seq_len": 32, "rope_scaling": m, "as_trained": True, "eval_loss": loss, "eval_accuracy": 0.3}
                for m in methods]  # fmt: skip
        (run / LENGTH_FILE).write_text(json.dumps({"results": rows}))
        runs.append(run)
    runs.append(make_run(tmp_path / "bert", "bert", "sinusoidal", {100: 4.5}, 1.0, seed=0))
    row = compare(runs, tmp_path / "out")["length_extrapolation"]["roformer"][0]
    assert row["seeds"] == 2 and row["eval_loss"] == pytest.approx(8.0)  # was 3 + 1 rows: 4 "seeds", mean 7.5


def test_a_suite_directory_is_read_as_its_task_runs_labelled_by_the_pretraining_run(tmp_path: Path) -> None:
    """`roformer glue`'s output folder (results.json keyed by task) stands for its task runs; a run without a label
    takes the one of the pretraining run it started from (config.yaml), so standalone suites group like an experiment's.
    """
    pre = tmp_path / "pre" / "bert-char-seed0"
    (pre / FINAL_DIR).mkdir(parents=True)
    write_yaml(pre / RUN_CONFIG_FILE, {"label": "bert-char", "train": {"seed": 0}})
    suite = tmp_path / "suite"
    for task, score in (("rte", 0.6), ("mrpc", 0.7)):
        run = seeded_glue_run(suite / task, None, {0: score}, init=str(pre / FINAL_DIR))
        results = json.loads((run / RESULTS_FILE).read_text())
        (run / RESULTS_FILE).write_text(json.dumps({**results, "task": task}))
    (suite / RESULTS_FILE).write_text(json.dumps({"rte": {}, "mrpc": {}}))
    other = seeded_glue_run(tmp_path / "other", "roformer", {0: 0.65})
    summary = compare([suite, other], tmp_path / "out", baseline="bert-char")
    assert summary["glue"]["bert-char"]["mrpc"]["score"]["mean"] == pytest.approx(0.7)
    assert summary["glue"]["bert-char"]["rte"]["score"]["mean"] == pytest.approx(0.6)


def test_a_results_file_that_is_neither_a_run_nor_a_suite_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / RESULTS_FILE).write_text("{}")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / RESULTS_FILE).write_text("{not json")
    for name, says in (("empty", "neither a fine-tuning run's results"), ("broken", "damaged or unreadable")):
        assert main(["compare", str(tmp_path / name), "--out", str(tmp_path / f"out-{name}")]) == 2
        err = capsys.readouterr().err
        assert says in err and str(tmp_path / name / RESULTS_FILE) in err and "Traceback" not in err
        assert not (tmp_path / f"out-{name}").exists()


def write_tokenization(run: Path, vocab_size: int, tokens: int, characters: int = 1000) -> None:
    stats = {"split": "train", "documents": 10, "characters": characters, "tokens": tokens, "vocab_size": vocab_size}
    (run / "tokenization.json").write_text(json.dumps({**stats, "tokens_per_character": tokens / characters}))


def test_an_arm_with_another_tokenizer_is_listed_apart_and_its_tokenization_tabulated(
    runs: list[Path], tmp_path: Path
) -> None:
    for run in runs:
        write_tokenization(run, 300, 900)
    compare(runs, tmp_path / "o1")
    text = (tmp_path / "o1" / SUMMARY_MARKDOWN_FILE).read_text()
    assert "Every arm read one tokenizer: vocabulary 300, 0.900 tokens per character" in text
    char = make_run(tmp_path / "char-0", "bert-char", "sinusoidal", {100: 3.0, 400: 2.0}, 1.0, vocab_hash="def")
    write_tokenization(char, 200, 1000)
    nameless = make_run(tmp_path / "old-0", "old", "sinusoidal", {100: 5.0, 400: 4.5}, 1.0)  # no tokenization.json
    summary = compare([*runs, char, nameless], tmp_path / "o2", baseline="bert")
    assert [a["label"] for a in summary["arms"]] == ["roformer", "bert", "old"]
    assert [a["label"] for a in summary["other_tokenizer_arms"]] == ["bert-char"]
    assert summary["other_tokenizer_arms"][0]["final_eval_loss"] == 2.0 and "bert-char" not in summary["differences"]
    assert summary["targets"] == pytest.approx([4.5, 4.25, 4.1, 4.0])  # the baseline's: bert-char's 2.0 plays no part
    text = (tmp_path / "o2" / SUMMARY_MARKDOWN_FILE).read_text()
    assert "| bert-char | 200 | 1.000 | 1,000 | 1,000 |" in text and "| roformer | 300 | 0.900 | 900 | 1,000 |" in text
    assert "| old | unknown (no tokenization.json) |" in text and "bert-char read another tokenizer" in text


def test_a_baseline_without_a_vocabulary_hash_is_compared_only_when_that_is_unambiguous(
    runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    old = [make_run(tmp_path / f"old-{s}", "old", "sinusoidal", {100: 5.0, 400: 4.5}, 1.0, seed=s) for s in (0, 1)]
    for run in old:  # runs from before config.yaml recorded data.vocab_hash
        config = read_yaml(run / RUN_CONFIG_FILE)
        config["data"] = {}
        write_yaml(run / RUN_CONFIG_FILE, config)
    summary = compare([*runs, *old], tmp_path / "o1", baseline="old")
    assert {a["label"] for a in summary["arms"]} == {"roformer", "bert", "old"}
    assert "other_tokenizer_arms" not in summary
    char = make_run(tmp_path / "char-0", "bert-char", "sinusoidal", {100: 3.0, 400: 2.0}, 1.0, vocab_hash="def")
    assert main(["compare", *map(str, [*runs, *old, char]), "--baseline", "old", "--out", str(tmp_path / "o2")]) == 2
    assert "'old' records no vocabulary hash" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists()


def test_a_suite_folder_reads_the_tasks_its_results_name(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    suite = tmp_path / "suite"
    seeded_glue_run(suite / "rte", "bert", {0: 0.6})
    (suite / "submission").mkdir()  # what a suite writes beside its tasks
    seeded_glue_run(suite / "stale", "bert", {0: 0.1})  # a task of an older suite, not in its results.json
    (suite / RESULTS_FILE).write_text(json.dumps({"rte": {}}))
    other = seeded_glue_run(tmp_path / "other", "roformer", {0: 0.65})
    summary = compare([suite, other], tmp_path / "o1", baseline="bert")
    assert set(summary["glue"]["bert"]) == {"rte"}
    (suite / RESULTS_FILE).write_text(json.dumps({"rte": {}, "mrpc": {}}))
    assert main(["compare", str(suite), str(other), "--out", str(tmp_path / "o2")]) == 2
    assert f"{suite / 'mrpc' / RESULTS_FILE}: missing" in capsys.readouterr().err
    (suite / RESULTS_FILE).write_text(json.dumps({"rte": {}}))
    (suite / "rte" / RESULTS_FILE).write_text("[1, 2]")
    assert main(["compare", str(suite), str(other), "--out", str(tmp_path / "o3")]) == 2
    err = capsys.readouterr().err
    assert f"{suite / 'rte' / RESULTS_FILE}: expected a JSON object, got list" in err and "Traceback" not in err


def probe_file(seed: int, accuracies: dict[int, float]) -> dict:
    """One passkey-MLM result file at length 128: an accuracy per distance, 50 samples each."""
    rows = [
        {"probe": "passkey-mlm", "length": 128, "scaling": "none", "distance": d, "chance": 0.1, "accuracy": a,
         "interval": [0.0, 1.0], "samples": 50}
        for d, a in accuracies.items()
    ]  # fmt: skip
    return {"model": "m", "label": "rotary", "seed": seed, "probe": "passkey-mlm", "scaling": "none", "rows": rows}


def test_probe_rows_by_distance_or_pooled_over_distances_per_seed(tmp_path: Path) -> None:
    """Per distance: the seeds' mean at each. Pooled (the plot): each seed's samples over all distances, then the mean
    over seeds; chance travels with the rows and the plot draws them."""
    from roformer.study.compare import probe_table
    from roformer.study.plots import plot_probes

    files = [probe_file(0, {16: 0.2, 64: 0.4}), probe_file(1, {16: 0.0, 64: 0.2})]
    by_distance = {r["distance"]: r for r in probe_table(files)}
    assert by_distance[16]["accuracy"] == pytest.approx(0.1) and by_distance[64]["accuracy"] == pytest.approx(0.3)
    assert by_distance[16]["seeds"] == 2 and by_distance[16]["samples"] == 100
    (pooled,) = probe_table(files, pool_distances=True)
    assert pooled["accuracy"] == pytest.approx(0.2) and pooled["samples"] == 200 and pooled["seeds"] == 2
    assert pooled["distance"] is None and pooled["line"] == "rotary (none)" and pooled["chance"] == 0.1
    low, high = pooled["interval"]
    assert low < 0.2 < high
    plot_probes([pooled], tmp_path / "probes.png")
    assert (tmp_path / "probes.png").stat().st_size > 1000
