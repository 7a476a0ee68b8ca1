"""`roformer compare RUN_DIR ... --out DIR`: convergence of pretraining runs (and GLUE results) side by side.

Runs are grouped into arms by their label (`label:` of the config, else the position encoding); runs of one arm
are seeds, drawn as a mean with a min-max band. For each arm we report the final eval loss, the eval loss at the
largest step every arm evaluated, and the steps, tokens and training seconds needed to first reach target eval
losses (by default the baseline's final eval loss and a few levels above it); then the ratio RoFormer / baseline
of each. Seeds are averaged first: an arm's eval curve is the mean over its seeds at the steps they all evaluated,
and a target counts as reached at the first of those steps whose mean loss is at or below it (no interpolation,
so the numbers are exact and reproducible from metrics.jsonl); tokens and seconds are the seeds' means there.

Arms trained with another tokenizer than the baseline's (`vary: [data.jieba]` in an experiment: character- against
word-level Chinese) predict other tokens, so their MLM losses are set apart: listed, not compared. Every arm's
vocabulary and tokens per character (its run's tokenization.json) are tabulated, and fine-tuning results compare
all arms alike. A `roformer glue` suite folder stands for its task runs. `roformer probe` result files are tabulated
and drawn (probes.png): accuracy by length per arm and scaling, a seed's Wilson interval or a t interval over seeds.

This module computes the comparison (`summarise`: a JSON-ready dict); roformer.study.markdown renders summary.md.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from roformer.errors import UserError
from roformer.files import check_output_dir, staged_output_dir
from roformer.study.markdown import summary_markdown
from roformer.study.outputs import (
    CURVES_PLOT_FILE,
    LENGTH_PLOT_FILE,
    PROBE_PLOT_FILE,
    SUMMARY_JSON_FILE,
    SUMMARY_MARKDOWN_FILE,
)
from roformer.study.plots import plot_curves, plot_lengths, plot_probes
from roformer.study.runs import (
    EVAL_SETUP,
    Arm,
    GlueRun,
    PretrainRun,
    check_one_vocabulary_per_arm,
    first_reaching,
    glue_columns,
    group_arms,
    load_runs,
    read_probe_file,
    tokens_at,
)
from roformer.study.stats import (
    glue_differences,
    length_differences,
    pretraining_differences,
    t_quantile,
    wilson_interval,
)
from roformer.tasks.glue_metrics import seed_summary

TARGET_OFFSETS = (0.5, 0.25, 0.1, 0.0)  # eval-loss levels above the baseline's final eval loss


def mean_eval_curve(arm: Arm) -> list[dict[str, Any]]:
    """Eval events averaged over the arm's seeds (eval_loss, elapsed_sec) at the steps every seed evaluated."""
    per_run = [{e["step"]: e for e in r.eval} for r in arm.runs]
    steps = sorted(set.intersection(*(set(p) for p in per_run)))
    return [
        {
            "step": step,
            "eval_loss": statistics.fmean(p[step]["eval_loss"] for p in per_run),
            "elapsed_sec": _mean_or_none([p[step].get("elapsed_sec") for p in per_run]),
        }
        for step in steps
    ]


def _mean_or_none(values: list[float | None]) -> float | None:
    return None if not values or any(v is None for v in values) else statistics.fmean(values)


def arm_summary(arm: Arm, targets: list[float], common_step: int | None) -> dict[str, Any]:
    """Final eval loss, loss at the common step, and steps / tokens / seconds to each target (means over seeds)."""
    finals = [max(r.eval, key=lambda e: e["step"]) for r in arm.runs]
    out: dict[str, Any] = {
        "label": arm.label,
        "position_encoding": arm.position_encoding,
        "seeds": len(arm.runs),
        "final_step": statistics.fmean(e["step"] for e in finals),
        "final_eval_loss": statistics.fmean(e["eval_loss"] for e in finals),
        "final_eval_loss_std": statistics.stdev([e["eval_loss"] for e in finals]) if len(finals) > 1 else 0.0,
        "final_eval_accuracy": _mean_or_none([e.get("eval_accuracy") for e in finals]),
    }
    if common_step is not None:
        at = [next(e for e in r.eval if e["step"] == common_step) for r in arm.runs]
        out["common_step"] = common_step
        out["eval_loss_at_common_step"] = statistics.fmean(e["eval_loss"] for e in at)
    curve = mean_eval_curve(arm)
    reached = []
    for target in targets:
        hit = first_reaching(curve, target)
        reached.append(
            {
                "target": target,
                "steps": hit["step"] if hit else None,
                "tokens": _mean_or_none([tokens_at(r, hit["step"]) for r in arm.runs]) if hit else None,
                "seconds": hit["elapsed_sec"] if hit else None,
            }
        )
    out["targets"] = reached
    return out


def choose_baseline(arms: list[Arm], baseline: str | None) -> tuple[Arm, Arm | None]:
    """(baseline arm, RoFormer arm): `baseline` by label, else the first non-rotary arm; RoFormer = first rotary.

    Raises:
        UserError: an unknown baseline label.
    """
    if baseline is not None:
        matches = [a for a in arms if a.label == baseline]
        if not matches:
            raise UserError(f"--baseline {baseline!r}: no such arm (arms: {', '.join(a.label for a in arms)})")
        base = matches[0]
    else:
        base = next((a for a in arms if a.position_encoding != "rotary"), arms[0])
    rope = next((a for a in arms if a.position_encoding == "rotary" and a is not base), None)
    return base, rope


def common_eval_step(arms: list[Arm]) -> int | None:
    """The largest step evaluated by every run of every arm (None if there is none)."""
    steps = None
    for arm in arms:
        for run in arm.runs:
            mine = {e["step"] for e in run.eval}
            steps = mine if steps is None else steps & mine
    return max(steps) if steps else None


def summarise(
    runs: list[PretrainRun], glue: list[GlueRun], baseline: str | None = None, targets: list[float] | None = None
) -> dict[str, Any]:
    """The comparison as a JSON-ready dict (see the module docstring).

    Raises:
        UserError: no runs, or runs with no common metric.
    """
    if not runs and not glue:
        raise UserError("no runs to compare")
    summary: dict[str, Any] = {}
    if runs:
        arms = group_arms(runs)
        _check_one_run_per_seed(arms)
        tokenization = tokenization_summary(arms)
        arms, others = split_by_vocabulary(arms, choose_baseline(arms, baseline)[0])
        base, rope = choose_baseline(arms, baseline)  # RoFormer among the arms that share the baseline's tokenizer
        runs = [run for arm in arms for run in arm.runs]
        summary["notes"] = comparability_notes(runs)
        if tokenization:
            summary["tokenization"] = tokenization
        if others:
            summary["notes"].append(_other_tokenizer_note(others))
            summary["other_tokenizer_arms"] = [arm_summary(arm, [], None) for arm in others]
        base_final = statistics.fmean(max(r.eval, key=lambda e: e["step"])["eval_loss"] for r in base.runs)
        levels = targets if targets else [base_final + offset for offset in TARGET_OFFSETS]
        common = common_eval_step(arms)
        per_arm = [arm_summary(arm, levels, common) for arm in arms]
        summary["baseline"] = base.label
        summary["roformer"] = rope.label if rope else None
        summary["targets"] = levels
        summary["arms"] = per_arm
        lengths = length_means(arms)
        if lengths:
            summary["length_extrapolation"] = lengths
            summary["length_differences"] = length_differences(arms, base)
        summary["differences"] = pretraining_differences(arms, base, levels)
        if rope is not None:
            summary["ratios"] = _ratios(
                next(a for a in per_arm if a["label"] == rope.label),
                next(a for a in per_arm if a["label"] == base.label),
            )
    if glue:
        summary["glue"] = glue_means(glue)
        summary["glue_scores"] = score_metrics(glue)
        summary["glue_baselines"] = glue_baselines(glue)
        base_label = summary.get("baseline") or baseline
        if base_label is not None:
            summary["glue_baseline"] = base_label
            summary["glue_differences"] = glue_differences(glue, base_label)
    return summary


def probe_table(results: list[dict[str, Any]], pool_distances: bool = False) -> list[dict[str, Any]]:
    """Probe accuracy by arm, scaling (and distance) and length, over the seeds' files: one row each.

    One file: its accuracy and Wilson interval over samples. Several seeds: their mean and 95% t interval over
    seeds. A length no seed could run keeps its reason (`error`). With `pool_distances`, passkey-MLM's distances at
    a length count as one row (each file's samples over all of them), as the plot draws them.
    """
    groups: dict[tuple, dict[int, list[dict[str, Any]]]] = {}  # row key -> file -> its rows
    for number, result in enumerate(results):
        for row in result["rows"]:
            distance = None if pool_distances else row.get("distance")
            key = (result.get("label", result["model"]), result["probe"], result["scaling"], distance, row["length"])
            groups.setdefault(key, {}).setdefault(number, []).append(row)
    table = []
    for (label, probe, scaling, distance, length), files in groups.items():
        line = f"{label} ({scaling}" + (f", d={distance}" if distance is not None else "") + ")"
        out = {"label": label, "probe": probe, "scaling": scaling, "distance": distance, "length": length}
        chance = next((r["chance"] for rows in files.values() for r in rows if "chance" in r), None)
        out |= {"chance": chance} if chance is not None else {}
        ok = [pooled(rows) for rows in files.values() if any("accuracy" in r and r["samples"] for r in rows)]
        if not ok:
            first = next(iter(files.values()))[0]
            table.append({**out, "line": line, "error": first.get("error", "not run")})
            continue
        accuracy = statistics.fmean(r["accuracy"] for r in ok)
        samples = sum(r["samples"] for r in ok)
        interval = list(wilson_interval(round(sum(r["accuracy"] * r["samples"] for r in ok)), samples))
        if len(ok) > 1:  # the seeds' spread, but never narrower than the pooled samples allow (all 0 or all 1)
            half = t_quantile(0.975, len(ok) - 1) * statistics.stdev(r["accuracy"] for r in ok) / len(ok) ** 0.5
            interval = [min(interval[0], max(0.0, accuracy - half)), max(interval[1], min(1.0, accuracy + half))]
        table.append(
            {**out, "line": line, "accuracy": accuracy, "interval": interval, "seeds": len(ok), "samples": samples}
        )
    return sorted(table, key=lambda r: (r["probe"], r["line"], r["length"]))


def pooled(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One file's rows at one length (its distances) as one: the accuracy over all their samples."""
    ok = [r for r in rows if "accuracy" in r and r["samples"]]
    samples = sum(r["samples"] for r in ok)
    return {"accuracy": sum(r["accuracy"] * r["samples"] for r in ok) / samples, "samples": samples}


def split_by_vocabulary(arms: list[Arm], base: Arm) -> tuple[list[Arm], list[Arm]]:
    """(arms trained with the baseline's tokenizer, arms with another one).

    An MLM loss is per token of one vocabulary: arms with another tokenizer (character- against word-level Chinese)
    predict other things, so their curves, targets, differences and length tables are left out; their fine-tuning is
    compared. An arm whose runs record no vocabulary hash (runs from before hashes) counts as the baseline's.

    Raises:
        UserError: the baseline records no hash while the other arms record several: which share its tokenizer?
    """
    hashes = {arm.label: _vocabulary_of(arm) for arm in arms}
    vocabulary = hashes[base.label]
    if vocabulary is None and len({h for h in hashes.values() if h is not None}) > 1:
        raise UserError(
            f"the baseline {base.label!r} records no vocabulary hash (runs from before hashes) and the other arms "
            "were trained with different tokenizers: which share the baseline's cannot be told"
        )
    same = [a for a in arms if vocabulary is None or hashes[a.label] in (None, vocabulary)]
    return same, [a for a in arms if a not in same]


def _vocabulary_of(arm: Arm) -> str | None:
    """The vocabulary hash of an arm's runs (check_one_vocabulary_per_arm: they agree), None when none records one."""
    return next((run.vocab_hash for run in arm.runs if run.vocab_hash is not None), None)


def _other_tokenizer_note(others: list[Arm]) -> str:
    """The note saying which arms' MLM losses are set apart, and why."""
    labels = ", ".join(a.label for a in others)
    return (
        f"{labels} read another tokenizer than the baseline: MLM losses over other tokens are not comparable, so "
        "the curves, targets, differences and length tables leave them out (their final losses are listed apart; "
        "compare them downstream)"
    )


def tokenization_summary(arms: list[Arm]) -> list[dict[str, Any]]:
    """Each arm's vocabulary and tokens per character of its training text (runs with tokenization.json)."""
    out = []
    for arm in arms:
        known = [r.tokenization for r in arm.runs if r.tokenization]
        if known:
            out.append({"label": arm.label, **known[0]})  # an arm's seeds share data and tokenizer
    return out


def _check_one_run_per_seed(arms: list[Arm]) -> None:
    """The differences pair runs by `train.seed`: two runs of one arm with one seed would be counted once.

    Raises:
        UserError: naming the arm, the seed and the two runs.
    """
    for arm in arms:
        seen: dict[int, PretrainRun] = {}
        for run in arm.runs:
            if run.seed is not None and run.seed in seen:
                raise UserError(
                    f"arm {arm.label!r} has two runs with train.seed {run.seed} ({seen[run.seed].path}, {run.path}): "
                    "runs are paired by seed; give each run of an arm its own seed, or its own label"
                )
            if run.seed is not None:
                seen[run.seed] = run


def comparability_notes(runs: list[PretrainRun]) -> list[str]:
    """What makes the runs' final numbers not like for like: different lengths, different eval sets or masks."""
    notes = []
    finals = sorted({max(e["step"] for e in run.eval) for run in runs})
    if len(finals) > 1:
        notes.append(
            f"the runs end at different steps ({', '.join(map(str, finals))}): final eval losses compare different "
            "amounts of training; the eval loss at the common step compares like with like"
        )
    for key in EVAL_SETUP:
        values = {repr(run.eval_setup.get(key)) for run in runs if run.eval_setup}
        if len(values) > 1:
            notes.append(
                f"the runs are scored on different evaluation sets or masks (data.{key}: {', '.join(sorted(values))}): "
                "their eval losses are not directly comparable"
            )
    return notes


def length_means(arms: list[Arm]) -> dict[str, list[dict[str, Any]]]:
    """{label: [{seq_len, eval_loss, eval_accuracy} means over seeds, or {seq_len, error}]} where measured."""
    table = {}
    for arm in arms:
        measured = [r.lengths for r in arm.runs if r.lengths]
        if not measured:
            continue
        rows = []
        for length in sorted({m["seq_len"] for runs in measured for m in runs}):
            found = [m for runs in measured for m in runs if m["seq_len"] == length]
            ok = [m for m in found if "error" not in m]
            if not ok:
                rows.append({"seq_len": length, "error": found[0]["error"]})
                continue
            rows.append(
                {
                    "seq_len": length,
                    "eval_loss": statistics.fmean(m["eval_loss"] for m in ok),
                    "eval_accuracy": statistics.fmean(m["eval_accuracy"] for m in ok),
                    "seeds": len(ok),
                }
            )
        table[arm.label] = rows
    return table


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _ratios(rope: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """RoFormer / baseline for every reported quantity (< 1 means RoFormer needs less, or reaches a lower loss)."""
    out = {"final_eval_loss": _ratio(rope["final_eval_loss"], base["final_eval_loss"])}
    if "eval_loss_at_common_step" in rope:
        out["eval_loss_at_common_step"] = _ratio(rope["eval_loss_at_common_step"], base["eval_loss_at_common_step"])
    out["targets"] = [
        {"target": r["target"], **{k: _ratio(r[k], b[k]) for k in ("steps", "tokens", "seconds")}}
        for r, b in zip(rope["targets"], base["targets"])
    ]
    return out


def score_metrics(glue: list[GlueRun]) -> dict[str, list[str]]:
    """{task: the metrics whose mean is its score} (results.json's `metrics`: nDCG@10 of retrieval, ...)."""
    return {run.task: list(run.results["metrics"]) for run in glue if run.results.get("metrics")}


def glue_baselines(glue: list[GlueRun]) -> dict[str, dict[str, Any]]:
    """{column: the trivial baseline's kind and score}: the constant answer's level of each GLUE column.

    Computed from each task's training labels, so the same for every arm (the first run's is taken); none for
    results written before baselines were.
    """
    levels: dict[str, dict[str, Any]] = {}
    for run in glue:
        for split, column in glue_columns(run).items():
            baseline = run.results.get("baseline", {}).get(split)
            if baseline is not None and column not in levels:
                levels[column] = {"kind": baseline["kind"], "score": baseline["score"]}
    return levels


def glue_means(glue: list[GlueRun]) -> dict[str, dict[str, Any]]:
    """{label: {column: {metric: mean/std}}} from GLUE results: over seeds at the selected lr, and over runs.

    Every dev split is reported: MNLI gives `mnli-m` (matched, the split that selects) and `mnli-mm` (mismatched).
    Several runs of one arm and task (one per pretraining seed, from `roformer experiment`) are averaged; their std
    is then the spread of the runs' means.

    Raises:
        UserError: runs of one task fine-tuned with different classifier heads.
    """
    heads: dict[str, tuple[str, Path]] = {}
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in glue:
        head = run.results.get("classifier_head")
        seen = heads.setdefault(run.task, (head, run.path))
        if None not in (head, seen[0]) and head != seen[0]:
            raise UserError(
                f"{seen[1]} and {run.path} fine-tuned {run.task} with different heads ({seen[0]} vs {head}): "
                "a comparison needs the same classifier_head in every arm"
            )
        for split, column in glue_columns(run).items():
            cells.setdefault((run.label, column), []).append(run.results["summary"][split])
    table: dict[str, dict[str, Any]] = {}
    for (label, column), runs in cells.items():
        metrics = {}
        for m in runs[0]:
            over_seeds = seed_summary([r[m]["mean"] for r in runs])  # non-finite means left out, counted
            std = runs[0][m]["std"] if len(runs) == 1 else over_seeds["std"]
            metrics[m] = {"mean": over_seeds["mean"], "std": std}
        table.setdefault(label, {})[column] = {**metrics, "runs": len(runs)}
    return table


def compare(
    paths: list[str | Path],
    out: str | Path,
    baseline: str | None = None,
    targets: list[float] | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Read the runs, write curves.png (and length.png), summary.md and summary.json into `out`; returns the summary.

    Raises:
        UserError: a directory that is not a run, runs without evaluations, GLUE runs sharing no task, an arm whose
            seeds used different tokenizers, a damaged results file.
    """
    check_output_dir(Path(out), overwrite)  # before reading the runs
    probes = {str(p): read_probe_file(Path(p)) for p in paths}
    probe_results = [result for result in probes.values() if result is not None]
    runs, glue = load_runs([p for p in paths if probes[str(p)] is None])
    check_one_vocabulary_per_arm(runs)
    labels = {g.label for g in glue}
    if len(labels) > 1 and not set.intersection(*({g.task for g in glue if g.label == lb} for lb in labels)):
        raise UserError("the GLUE runs share no task: nothing to compare")
    summary = summarise(runs, glue, baseline, targets) if runs or glue or not probe_results else {}
    if probe_results:
        summary["probes"] = probe_table(probe_results)
    summary["runs"] = [str(Path(p)) for p in paths]
    with staged_output_dir(out, overwrite) as staging:
        if probe_results:
            plot_probes(probe_table(probe_results, pool_distances=True), staging / PROBE_PLOT_FILE)
        if runs:
            comparable = {a["label"] for a in summary["arms"]}  # the baseline's tokenizer
            plot_curves([a for a in group_arms(runs) if a.label in comparable], staging / CURVES_PLOT_FILE)
        if "length_extrapolation" in summary:
            plot_lengths(summary["length_extrapolation"], staging / LENGTH_PLOT_FILE)
        (staging / SUMMARY_JSON_FILE).write_text(json.dumps(summary, indent=2))
        (staging / SUMMARY_MARKDOWN_FILE).write_text(summary_markdown(summary))
    return summary
