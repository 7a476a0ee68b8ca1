"""An experiment over tasks trained from scratch: `tasks:` in an experiment config (the length-generalization lab).

The config is a roformer.study.experiment_config.TaskStudyConfig (roformer.study.experiment reads it and runs the
study here; this module does not import that one).

Where `arms:` of a pretraining experiment are pretraining configs, an experiment with `tasks:` lists fine-tuning
configs that train from scratch (`init:` empty, e.g. configs/synthetic/*.yaml) and its arms are overrides alone
(`{set: [model.position_encoding=alibi, model.alibi_form=asymmetric]}`): every (task, arm, seed) is one
`roformer finetune` run in `<out>/<task>/<arm>-seed<k>/`, resumed where it stopped and skipped once it has its
results. Arms may differ only in position-encoding fields of the model and in `data.synthetic.randomized_positions`,
`randomized_kind` and `extensions` (and what `vary` names).

The comparison (`<out>/compare/`) reads each run's files and gives, per task, arm and test split: the accuracy of
every seed with its 95% Wilson interval over the split's answers, the mean over seeds with a 95% t-interval, and the
steps to reach a target dev accuracy (`target`, 0.9: at the trained lengths, the paper's "faster convergence" in its
purest form), and the seconds each run trained; per task and split its position-blind floor (what a model that
ignores positions can reach, roformer.tasks.synthetic_floors.floors), and every arm's difference from the `baseline`
arm, paired by seed and by row: the arms of a seed answer the same rows. `summary.md` and `summary.json` hold the
tables, `generalization.png` the accuracy against test length (a panel per task, a line per arm, interval bands, the
floor line); where arms list test-time extension methods (roformer.tasks.extensions), a table per task of (arm,
method) against length and `extensions.png` (a panel per task and arm, a line per method); and
`attention-distance/<task>-<arm>.json` and `.png` the first seed's mean pre-softmax logit and attention weight
against the distance |m - n| per layer (roformer.study.decay), on 32 rows of its task's `test_2x` split (else its
longest) at positions 0..T-1, beside the paper's bound.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from roformer.config import load
from roformer.config_paths import config_file
from roformer.errors import ConfigError, UserError, naming
from roformer.files import atomic_write_text
from roformer.model.config import position_fields
from roformer.study.experiment_config import TaskStudyConfig
from roformer.study.outputs import COMPARE_DIR, REPORT_FILE, SUMMARY_JSON_FILE, SUMMARY_MARKDOWN_FILE
from roformer.study.runs import run_seconds
from roformer.study.stats import difference, mean_interval, wilson_interval
from roformer.study.translation_study import PLOT_FILE as BLEU_PLOT_FILE
from roformer.study.translation_study import bleu_plot_rows, summarise_translation, translation_markdown
from roformer.tasks.synthetic_floors import floors
from roformer.tasks.synthetic_rows import split_lengths
from roformer.train.finetune import run_tag
from roformer.train.launch import check_run_settings
from roformer.train.results_card import result_line
from roformer.train.run_dir import METRICS_FILE, PREDICTIONS_DIR, RESULTS_FILE, RunDir, read_metrics

if TYPE_CHECKING:
    from roformer.train.config import FinetuneConfig

logger = logging.getLogger(__name__)

PLOT_FILE = "generalization.png"
EXTENSIONS_PLOT_FILE = "extensions.png"  # per task and arm, accuracy against length under each extension method
DECAY_DIR = "attention-distance"  # compare/: per task and arm, the measured decay (roformer.study.decay)
DECAY_ROWS = 32  # rows of the test_2x split measured
# The data fields an arm may set besides the model's position fields: how positions are presented to the model
ARM_DATA_FIELDS = ("synthetic.randomized_positions", "synthetic.randomized_kind", "synthetic.extensions")
STUDY_TYPES = ("synthetic", "translation")  # the task types trained from scratch that a study compares


def load_task_arms(
    experiment: TaskStudyConfig, path: Path, overrides: list[str] | None = None
) -> dict[str, dict[str, FinetuneConfig]]:
    """{task name: {arm: its resolved fine-tuning config}} (each config's label set to the arm).

    Raises:
        ConfigError: a bad task config or arm override, a task that does not train from scratch, two tasks of one
            name, or arms that differ in more than the position encoding (and `vary`).
    """
    from roformer.train.config import FinetuneConfig

    tasks: dict[str, dict[str, FinetuneConfig]] = {}
    for task_file in experiment.tasks:
        source = config_file(path.parent, task_file, "synthetic")
        arms = {}
        for label, arm in experiment.arms.items():
            config = load(FinetuneConfig, source, arm.set + experiment.overrides + list(overrides or []))
            arms[label] = replace(config, label=label)
        first = next(iter(arms.values()))
        if first.data.type not in STUDY_TYPES:
            raise ConfigError(
                f"{path}: tasks: {task_file} is type {first.data.type}; a task study compares types "
                f"{' and '.join(STUDY_TYPES)}"
            )
        if first.init:
            raise ConfigError(
                f"{path}: tasks: {task_file} starts from init {first.init!r}: a task study trains from scratch"
            )
        varied_data = sorted(key for key in experiment.vary if key.startswith("data."))
        if first.data.type == "translation" and varied_data:
            raise ConfigError(
                f"{path}: vary: {varied_data[0]}: the arms of a translation task share its data (one set of "
                "references scores them all)"
            )
        name = first.data.task
        if name in tasks:
            raise ConfigError(f"{path}: tasks: two configs of task {name!r} (set data.task to tell them apart)")
        check_task_arms(arms, f"{path}: task {name}", set(experiment.vary))
        tasks[name] = arms
    return tasks


def check_task_arms(arms: dict[str, FinetuneConfig], source: str, vary: set[str]) -> None:
    """Arms of a task must differ only in position fields of the model, ARM_DATA_FIELDS and `vary`.

    Raises:
        ConfigError: naming the first two arms and the field in which they differ.
    """
    allowed = {f"model.{name}" for name in position_fields()} | {f"data.{f}" for f in ARM_DATA_FIELDS} | vary
    (first_label, first), *rest = arms.items()
    reference = flat(first.to_dict())
    for label, config in rest:
        other = flat(config.to_dict())
        for key in sorted(set(reference) | set(other)):
            # a position field's own keys (model.position_settings.p_rope.unrotated_fraction) are that field's
            position_field = any(key.startswith(f"{name}.") for name in allowed)
            if key == "label" or key in allowed or position_field or reference.get(key) == other.get(key):
                continue
            raise ConfigError(
                f"{source}: arms {first_label!r} and {label!r} differ in {key} ({reference.get(key)!r} vs "
                f"{other.get(key)!r}); only position-encoding fields may (and those named in vary)"
            )


def flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as {dotted key: value}."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_task_runs(tasks: dict[str, dict[str, FinetuneConfig]]) -> None:
    """What would stop a run only when its turn comes, checked for every (task, arm) before the first one trains.

    Each arm's model against its task (a learned position table that cannot hold the longest test row, a
    data.max_length that would cut it) and its run settings; each synthetic task's rows are generated once (dev
    rows kept apart from training rows may be too few).

    Raises:
        UserError: naming the task and arm.
    """
    from roformer.tasks.base import learn_model
    from roformer.train.finetune import check_before_writing, learned_length, task_inputs

    for task, arms in tasks.items():
        for index, (label, config) in enumerate(arms.items()):
            with naming(f"task {task}, arm {label!r}"):
                if config.data.type != "synthetic":
                    check_run_settings(config.train)  # a translation task's data and tokenizer: read by its run
                    continue
                task_object, tokenizer, model_config = task_inputs(config)
                check_before_writing(config, task_object)
                facts = learn_model(task_object, model_config)
                table = learned_length(model_config)
                max_length = config.data.max_length if table is None else min(config.data.max_length, table)
                if index == 0:  # the rows are the same for every arm: generated (and checked) once
                    task_object.encode(tokenizer, max_length, facts)
                else:
                    task_object.check_length(max_length)


def run_path(out: Path, task: str, label: str, seed: int) -> Path:
    """Where the run of a task, arm and seed lives: `<out>/<task>/<label>-seed<seed>/`."""
    return out / task / f"{label}-seed{seed}"


def run_task_study(
    experiment: TaskStudyConfig, path: Path, out: Path, overrides: list[str] | None, compare_only: bool = False
) -> dict[str, Any]:
    """Train every (task, arm, seed) that has no results yet, then compare; returns the summary.

    Seeds come first: every task and arm gets its first seed before any gets a second, so that a study stopped
    part-way (or read with `compare_only`, which trains nothing and tabulates the finished runs) already compares
    every arm.
    """
    from roformer.train.finetune import finetune

    tasks = load_task_arms(experiment, path, overrides)
    for index, seed in enumerate([] if compare_only else experiment.seeds):
        for task, arms in tasks.items():
            # the arm order alternates between seeds: one-time warm-up costs do not always land on one arm
            order = list(arms.items()) if index % 2 == 0 else list(reversed(arms.items()))
            for label, arm in order:
                if not experiment.arm_runs_seed(label, seed):  # an arm of fewer seeds (arms.<label>.seeds)
                    continue
                directory = run_path(out, task, label, seed)
                if (directory / RESULTS_FILE).is_file():
                    logger.info("%s: done, skipped", directory)
                    continue
                config = replace(arm, train=replace(arm.train, seed=seed, seeds=[]))
                resume = RunDir.started(directory)
                logger.info("%s: %s", directory, "resuming" if resume else "starting")
                results = finetune(config, directory, overwrite=not resume, resume=resume)
                if results:  # the main process: the run's result where it is made, beside its baselines
                    logger.info("%s: finished: %s", directory, result_line(results))
    if compare_only and not any(
        (run_path(out, task, label, seed) / RESULTS_FILE).is_file()
        for task, arms in tasks.items()
        for label in arms
        for seed in experiment.seeds
    ):
        raise UserError(f"{out}: no run of this study has finished yet: nothing to compare")
    summary = summarise_task_study(out, tasks, experiment.seeds, experiment.target, experiment.baseline)
    plots = write_summary(out / COMPARE_DIR, summary)
    measure_decay(out, tasks, experiment.seeds[0])
    atomic_write_text(out / REPORT_FILE, report(summary, path, overrides, plots))
    return summary


# ----------------------------------------------------------------------------------------------------------------
# The comparison


def summarise_task_study(
    out: Path, tasks: dict[str, dict[str, FinetuneConfig]], seeds: list[int], target: float, baseline: str | None = None
) -> dict[str, Any]:
    """What the comparison holds: per task its chance level, floors, test lengths and, per arm, its seeds' results.

    Per arm: the accuracy at every test split (each seed with a Wilson interval, their mean with a t-interval), the
    steps to `target` dev accuracy and the seconds of every run. Per task: the position-blind floor of the dev and
    every test split (and the simpler guesses worth reading against, roformer.tasks.synthetic_floors.floors), and
    every arm against `baseline` (default: the first arm), paired on the rows both answered (`paired_differences`).
    """
    summary: dict[str, Any] = {"target": target, "seeds": seeds, "tasks": {}}
    for task, arms in tasks.items():
        first = next(iter(arms.values()))
        if first.data.type == "translation":
            directories = {label: [run_path(out, task, label, seed) for seed in seeds] for label in arms}
            summary["tasks"][task] = summarise_translation(directories, first, seeds)
            continue
        settings = first.data.synthetic
        longest = settings.train_lengths[1]
        lengths = {f"test_{m}x": longest * m for m in settings.test_multiples}
        table, records = {}, {}
        for label in arms:
            finished = [seed for seed in seeds if (run_path(out, task, label, seed) / RESULTS_FILE).is_file()]
            if not finished:  # a study in progress: the arm has no finished run yet
                continue
            runs = [run_record(run_path(out, task, label, seed), list(lengths), target) for seed in finished]
            records[label] = dict(zip(finished, runs, strict=True))
            table[label] = {
                "seeds": finished,
                "splits": {split: over_seeds([r["splits"][split] for r in runs]) for split in lengths},
                "extensions": extensions_over_seeds(runs, list(lengths)),
                "steps_to_target": [r["steps_to_target"] for r in runs],
                "seconds": [r["seconds"] for r in runs],
            }
        reference = baseline if baseline in records else next(iter(records), None)
        summary["tasks"][task] = {
            "kind": "synthetic",
            "chance": settings.chance,
            "floors": {
                split: [floor.to_dict() for floor in floors(settings, split_lengths(settings, split))]
                for split in ["dev", *lengths]
            },
            "train_lengths": settings.train_lengths,
            "lengths": lengths,
            "arms": table,
            "baseline": reference,
            "differences": paired_differences(records, reference, list(lengths)) if reference else {},
        }
    return summary


def run_record(directory: Path, splits: list[str], target: float) -> dict[str, Any]:
    """One run's test accuracies (with the counts and rows behind them), steps to `target` dev accuracy, its time.

    Per split: `accuracy`, `correct`, `answers` and `rows`, a digest of its rows (inputs and answers: two runs with
    equal digests answered the same rows); `hits` holds every row's right answers, for paired comparisons.

    Raises:
        UserError: the run has no results (it did not finish).
    """
    results_file = directory / RESULTS_FILE
    if not results_file.is_file():
        raise UserError(f"{directory}: no {RESULTS_FILE} (the run did not finish)")
    results = json.loads(results_file.read_text())
    selected = results["selected"]
    tag = run_tag(selected["peak_lr"], selected["seed"])
    record: dict[str, Any] = {"splits": {}, "hits": {}}
    for split in splits:
        digest, hits, answers = hashlib.sha256(), [], []
        for line in (directory / PREDICTIONS_DIR / tag / f"{split}.jsonl").read_text().splitlines():
            row = json.loads(line)
            digest.update(json.dumps([row["input"], row["answers"]]).encode())
            hits.append(sum(p == a for p, a in zip(row["predicted"], row["answers"], strict=True)))
            answers.append(len(row["answers"]))
        record["splits"][split] = {
            "accuracy": sum(hits) / sum(answers),
            "correct": sum(hits),
            "answers": sum(answers),
            "rows": digest.hexdigest()[:16],
        }
        record["hits"][split] = hits
        for method, scores in results.get("test", {}).get(split, {}).get("extensions", {}).items():
            correct = round(scores["accuracy"]["mean"] * sum(answers))  # a run's own accuracy: one value
            cell = {"accuracy": correct / sum(answers), "correct": correct, "answers": sum(answers)}
            record.setdefault("extensions", {}).setdefault(method, {})[split] = cell
    events = read_metrics(directory / METRICS_FILE)
    evals = sorted((e for e in events if e.get("event") == "eval" and e.get("split") == "dev"), key=lambda e: e["step"])
    record["steps_to_target"] = next((e["step"] for e in evals if e["accuracy"] >= target), None)
    record["seconds"] = run_seconds(directory)
    return record


def paired_differences(
    records: dict[str, dict[int, dict[str, Any]]], baseline: str, splits: list[str]
) -> dict[str, dict[str, Any]]:
    """{arm: {split: its accuracy - the baseline's}} for every other arm, paired by seed and, within one, by row.

    The arms of one seed answer the same rows (each split is a function of the data seed; randomized positions
    change no row), so a seed's difference carries no row-sampling noise between the arms. Per split: the mean
    over the seeds both arms finished with a paired t-interval over them (roformer.study.stats.difference), and per
    seed the difference with a t-interval over its rows (every row's right answers of the arm minus the
    baseline's, per answer). `same_rows` says whether the two runs' rows are equal (runs from before the positions
    had a stream of their own are not): without it a seed has no row interval.
    """
    base = records[baseline]
    out: dict[str, dict[str, Any]] = {}
    for label, runs in records.items():
        if label == baseline:
            continue
        out[label] = {}
        for split in splits:
            common = [seed for seed in runs if seed in base]
            per_seed = [seed_difference(runs[seed], base[seed], split) | {"seed": seed} for seed in common]
            mine = {seed: runs[seed]["splits"][split]["accuracy"] for seed in common}
            theirs = {seed: base[seed]["splits"][split]["accuracy"] for seed in common}
            out[label][split] = {
                **difference(mine, theirs),
                "same_rows": all(s["same_rows"] for s in per_seed),
                "seeds": per_seed,
            }
    return out


def seed_difference(run: dict[str, Any], base: dict[str, Any], split: str) -> dict[str, Any]:
    """One seed's accuracy difference (arm - baseline) on a split, with a t-interval over its rows if they are equal.

    A row's value is its right answers minus the baseline's, over the split's mean answers per row, so that their
    mean is the difference of the accuracies (a test split's rows all hold the same number of answers).
    """
    mine, theirs = run["splits"][split], base["splits"][split]
    same = mine["rows"] == theirs["rows"]
    out = {"difference": mine["accuracy"] - theirs["accuracy"], "same_rows": same, "interval": None}
    if same:
        per_row = mine["answers"] / len(run["hits"][split])
        values = [(a - b) / per_row for a, b in zip(run["hits"][split], base["hits"][split], strict=True)]
        if len(set(values)) > 1:  # rows that all differ alike (or not at all) have no spread to draw from
            out["interval"] = mean_interval(values)["interval"]
    return out


def extensions_over_seeds(runs: list[dict[str, Any]], splits: list[str]) -> dict[str, dict[str, Any]]:
    """{method: {split: over_seeds}} for the test-time extension methods every one of `runs` was scored under."""
    methods = [m for m in runs[0].get("extensions", {}) if all(m in r.get("extensions", {}) for r in runs)]
    return {
        method: {split: over_seeds([r["extensions"][method][split] for r in runs]) for split in splits}
        for method in methods
        if all(split in r["extensions"][method] for r in runs for split in splits)
    }


def over_seeds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Every seed's accuracy with its 95% Wilson interval, their mean with a 95% t-interval (none for one seed)."""
    return {
        **mean_interval([r["accuracy"] for r in runs]),
        "seeds": [{**r, "wilson": list(wilson_interval(r["correct"], r["answers"]))} for r in runs],
    }


def task_study_markdown(summary: dict[str, Any]) -> str:
    """A table per task: accuracy (%) per arm and test length under its floors; then the paired differences.

    Accuracy is the mean [95% interval] over seeds; steps to the target dev accuracy and seconds per run beside it.
    """
    parts = []
    for task, data in summary["tasks"].items():
        if data["kind"] == "translation":
            parts.append(translation_markdown(task, data, summary["seeds"]))
            continue
        lengths = data["lengths"]
        shortest, longest = data["train_lengths"]
        dev_floor = data["floors"]["dev"][0]["accuracy"]
        parts.append(
            f"### {task}\n\ntrained on {shortest}-{longest} tokens; chance {100 * data['chance']:.1f}%; the first "
            f"row{'s' if len(data['floors']['dev']) > 1 else ''}: what a guess of the row's bag of tokens scores, "
            f"the position-blind floor first (dev: {100 * dev_floor:.1f}%); accuracy (%) over the answers at each "
            f"test length, mean over the finished seeds of {len(summary['seeds'])} [95% t-interval]; steps to "
            f"{100 * summary['target']:.0f}% dev accuracy per seed (- = not reached); seconds per run\n"
        )
        header = ["arm", *(f"{split.removeprefix('test_')} ({n})" for split, n in lengths.items()), "steps", "s/run"]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += floor_lines(data["floors"], list(lengths))
        for label, arm in data["arms"].items():
            cells = [label, *(accuracy_cell(arm["splits"][split]) for split in lengths)]
            cells.append(", ".join("-" if s is None else str(s) for s in arm["steps_to_target"]))
            cells.append(f"{statistics.fmean(arm['seconds']):.0f}")
            lines.append("| " + " | ".join(cells) + " |")
        parts.append("\n".join(lines) + "\n")
        if any(arm.get("extensions") for arm in data["arms"].values()):
            parts.append(extensions_markdown(task, data))
        if data["differences"]:
            parts.append(differences_markdown(task, data))
    return "\n".join(parts)


def accuracy_cell(cell: dict[str, Any]) -> str:
    """A mean accuracy over seeds in %, with its 95% t-interval where there are two seeds or more."""
    interval = cell["interval"]
    spread = f" [{100 * interval[0]:.1f}, {100 * interval[1]:.1f}]" if interval else ""
    return f"{100 * cell['mean']:.1f}{spread}"


def extensions_markdown(task: str, data: dict[str, Any]) -> str:
    """The test-time extension methods of a task: accuracy (%) per (arm, method) and test length, floor first.

    Each arm's first row is the model as trained; the others are the same weights under each method
    (roformer.tasks.extensions), with no training.
    """
    lengths = data["lengths"]
    lines = [
        f"{task}: test-time extension (the same weights, no training), accuracy (%) at each test length, mean over "
        "the finished seeds [95% t-interval]\n",
        "| arm | method | " + " | ".join(split.removeprefix("test_") for split in lengths) + " |",
        "|---|---|" + "---:|" * len(lengths),
    ]
    floor = data["floors"]
    name = FLOOR_NAMES.get(floor[next(iter(lengths))][0]["kind"], "*floor*")
    lines.append(f"| {name} | | " + " | ".join(f"{100 * floor[s][0]['accuracy']:.1f}" for s in lengths) + " |")
    for label, arm in data["arms"].items():
        if not arm.get("extensions"):
            continue
        rows = {"as trained": arm["splits"], **arm["extensions"]}
        for method, splits in rows.items():
            lines.append(f"| {label} | {method} | " + " | ".join(accuracy_cell(splits[s]) for s in lengths) + " |")
    return "\n".join(lines) + "\n"


FLOOR_NAMES = {"position_blind": "*position-blind floor*", "frequent_bit": "*frequent visible bit*"}
# a level beside the one read against (missing-duplicate's parity: what the bag determines, a bound no arm nears)
REFERENCE_NAMES = {"position_blind": "position-blind bound (the bag)", "frequent_bit": "frequent visible bit"}


def floor_lines(split_floors: dict[str, list[dict[str, Any]]], splits: list[str]) -> list[str]:
    """A table row per floor (the position-blind one first): its accuracy (%) at every test split."""
    lines = []
    for i, level in enumerate(split_floors[splits[0]]):
        name = FLOOR_NAMES.get(level["kind"], f"*{level['kind']}*")
        cells = [name, *(f"{100 * split_floors[split][i]['accuracy']:.1f}" for split in splits), "", ""]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def differences_markdown(task: str, data: dict[str, Any]) -> str:
    """The paired differences of a task: points of accuracy, arm - baseline, per test length.

    A cell is the mean over seeds with its paired t-interval; with one seed, that seed's interval over rows. A cell
    marked † pairs runs whose rows differ (made before positions had a stream of their own).
    """
    lengths = data["lengths"]
    lines = [
        f"{task}: arm - {data['baseline']} in points of accuracy on the same rows, mean over seeds [95% paired "
        "t-interval; one seed: over its rows]\n",
        "| arm | " + " | ".join(split.removeprefix("test_") for split in lengths) + " |",
        "|" + "---|" * (len(lengths) + 1),
    ]
    for label, splits in data["differences"].items():
        cells = [label]
        for split in lengths:
            cell = splits[split]
            if cell["mean"] is None:
                cells.append("-")
                continue
            interval = [cell["low"], cell["high"]] if cell["low"] is not None else None
            if interval is None and len(cell["seeds"]) == 1:
                interval = cell["seeds"][0]["interval"]
            spread = f" [{100 * interval[0]:+.1f}, {100 * interval[1]:+.1f}]" if interval else ""
            cells.append(f"{100 * cell['mean']:+.1f}{spread}{'' if cell['same_rows'] else ' †'}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The summary as probe-plot rows: a panel per task, a line per arm, its floors (study.plots.plot_probes)."""
    rows = []
    for task, data in summary["tasks"].items():
        if data["kind"] != "synthetic":
            continue
        for label, arm in data["arms"].items():
            for split, length in data["lengths"].items():
                cell = arm["splits"][split]
                interval = cell["interval"] or [cell["mean"], cell["mean"]]
                floor, *references = data["floors"][split]
                rows.append(
                    {
                        "probe": task,
                        "label": label,
                        "scaling": "none",
                        "length": length,
                        "accuracy": cell["mean"],
                        "interval": interval,
                        "floor": floor["accuracy"],
                        "floor_name": f"{task}: {FLOOR_NAMES[floor['kind']].strip('*')}",
                        "references": {REFERENCE_NAMES[r["kind"]]: r["accuracy"] for r in references},
                    }
                )
    return rows


def extension_plot_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The extension methods as probe-plot rows: a panel per (task, arm), a line per method, the task's floor."""
    rows = []
    for row in plot_rows(summary):
        task, label = row["probe"], row["label"]
        arm = summary["tasks"][task]["arms"][label]
        if not arm.get("extensions"):
            continue
        split = next(s for s, n in summary["tasks"][task]["lengths"].items() if n == row["length"])
        rows.append({**row, "probe": f"{task}: {label}", "label": "as trained"})
        for method, splits in arm["extensions"].items():
            cell = splits[split]
            interval = cell["interval"] or [cell["mean"], cell["mean"]]
            rows.append(
                {**row, "probe": f"{task}: {label}", "label": method, "accuracy": cell["mean"], "interval": interval}
            )
    return rows


def write_summary(folder: Path, summary: dict[str, Any]) -> list[str]:
    """summary.json, summary.md, generalization.png and extensions.png (synthetic tasks), bleu-by-length.png.

    Returns:
        The names of the plots drawn (a plot with no point to draw is not), for the report to link.
    """
    from roformer.study.plots import INTERVAL_BAND, plot_bleu_by_length, plot_probes

    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / SUMMARY_JSON_FILE, json.dumps(summary, indent=2))
    atomic_write_text(folder / SUMMARY_MARKDOWN_FILE, task_study_markdown(summary))
    drawn = []
    if rows := plot_rows(summary):
        plot_probes(rows, folder / PLOT_FILE, INTERVAL_BAND)
        drawn.append(PLOT_FILE)
    if rows := extension_plot_rows(summary):
        arms = max(len(d["arms"]) for d in summary["tasks"].values() if d["kind"] == "synthetic")
        plot_probes(rows, folder / EXTENSIONS_PLOT_FILE, INTERVAL_BAND, per_row=min(arms, 4))  # a task's arms a row
        drawn.append(EXTENSIONS_PLOT_FILE)
    if rows := bleu_plot_rows(summary):
        plot_bleu_by_length(rows, summary, folder / BLEU_PLOT_FILE)
        drawn.append(BLEU_PLOT_FILE)
    return drawn


def report(summary: dict[str, Any], path: Path, overrides: list[str] | None, plots: list[str]) -> str:
    """report.md: how to reproduce the study, then its tables and `plots` (names in compare/)."""
    command = f"roformer experiment --config {path}" + "".join(f" --set {o}" for o in overrides or [])
    images = "".join(f"![{name}]({COMPARE_DIR}/{name})\n" for name in plots)
    return f"# {path.stem}\n\n```\n{command}\n```\n\n{task_study_markdown(summary)}\n{images}"


def measure_decay(out: Path, tasks: dict[str, dict[str, FinetuneConfig]], seed: int) -> None:
    """Each arm's measured decay (its `seed` run's best model) on its task's test_2x rows; a file there is kept."""
    from roformer.data.tokenizer import load_tokenizer
    from roformer.model.model import load as load_model
    from roformer.study.decay import attention_distance, write_attention_distance
    from roformer.tasks.build import make_task
    from roformer.train.run_dir import BEST_DIR

    folder = out / COMPARE_DIR / DECAY_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for task, arms in tasks.items():
        for label, config in arms.items():
            target = folder / f"{task}-{label}.json"
            model_dir = run_path(out, task, label, seed) / BEST_DIR
            if config.data.type != "synthetic" or target.is_file() or config.model.get("attention") == "linear":
                continue  # the decay of an encoder's self-attention: not measured for an encoder-decoder
            if not model_dir.is_dir():  # a study in progress: that seed has not finished
                continue
            task_object = make_task(config.data)
            split = "test_2x" if "test_2x" in task_object.test_splits else task_object.test_splits[-1]
            encoded = task_object.split(split, load_tokenizer(model_dir).get_vocab())  # that split alone
            windows = torch.tensor(encoded.ids[:DECAY_ROWS])  # rows of one length: no padding
            model = load_model(model_dir).eval()
            write_attention_distance(attention_distance(model, windows, str(model_dir), f"{task} {split}"), target)
