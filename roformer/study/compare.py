"""`roformer compare RUN_DIR ... --out DIR`: convergence of pretraining runs (and GLUE results) side by side.

Runs are grouped into arms by their label (`label:` of the config, else the position encoding); runs of one arm
are seeds, drawn as a mean with a min-max band. For each arm we report the final eval loss, the eval loss at the
largest step every arm evaluated, and the steps, tokens and training seconds needed to first reach target eval
losses (by default the baseline's final eval loss and a few levels above it); then the ratio RoFormer / baseline
of each. Seeds are averaged first: an arm's eval curve is the mean over its seeds at the steps they all evaluated,
and a target counts as reached at the first of those steps whose mean loss is at or below it (no interpolation,
so the numbers are exact and reproducible from metrics.jsonl); tokens and seconds are the seeds' means there.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from roformer.errors import UserError
from roformer.files import check_output_dir, staged_output_dir
from roformer.study.plots import plot_curves, plot_lengths
from roformer.study.runs import (
    Arm,
    GlueRun,
    PretrainRun,
    check_same_vocabulary,
    first_reaching,
    glue_columns,
    group_arms,
    load_runs,
    tokens_at,
)
from roformer.study.stats import glue_differences, length_differences, pretraining_differences

TARGET_OFFSETS = (0.5, 0.25, 0.1, 0.0)  # eval-loss levels above the baseline's final eval loss
GLUE_NOTE = (
    "Selected on dev: each cell is the mean over seeds at the learning rate with the best mean dev score (MNLI: on "
    "matched), each seed at its best dev checkpoint, so the numbers are optimistic estimates; unbiased ones need "
    "the test server (each run's submission/)."
)


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
        base, rope = choose_baseline(arms, baseline)
        base_final = statistics.fmean(max(r.eval, key=lambda e: e["step"])["eval_loss"] for r in base.runs)
        levels = targets if targets else [base_final + offset for offset in TARGET_OFFSETS]
        common = common_eval_step(arms)
        per_arm = [arm_summary(arm, levels, common) for arm in arms]
        summary["baseline"] = base.label
        summary["roformer"] = rope.label if rope else None
        summary["targets"] = levels
        summary["arms"] = per_arm
        lengths = length_table(arms)
        if lengths:
            summary["length_extrapolation"] = lengths
            summary["length_differences"] = length_differences(arms, base)
        summary["differences"] = pretraining_differences(arms, base, levels)
        if rope is not None:
            summary["ratios"] = _ratios(next(a for a in per_arm if a["label"] == rope.label),
                                        next(a for a in per_arm if a["label"] == base.label))  # fmt: skip
    if glue:
        summary["glue"] = glue_table(glue)
        base_label = summary.get("baseline") or baseline
        if base_label is not None:
            summary["glue_baseline"] = base_label
            summary["glue_differences"] = glue_differences(glue, base_label)
    return summary


def length_table(arms: list[Arm]) -> dict[str, list[dict[str, Any]]]:
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


def glue_table(glue: list[GlueRun]) -> dict[str, dict[str, Any]]:
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
            means = [r[m]["mean"] for r in runs]
            std = runs[0][m]["std"] if len(runs) == 1 else statistics.stdev(means)
            metrics[m] = {"mean": statistics.fmean(means), "std": std}
        table.setdefault(label, {})[column] = {**metrics, "runs": len(runs)}
    return table


def _fmt(value: float | None, digits: int = 3) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def summary_markdown(summary: dict[str, Any]) -> str:
    """summary.md: the arms table, steps-to-target table with ratios, and the GLUE table."""
    lines = []
    if "arms" in summary:
        header = (
            "| arm | position encoding | seeds | final step | final eval loss | eval loss at common step | accuracy |"
        )
        lines += ["## MLM pretraining", "", header, "|---|---|---:|---:|---:|---:|---:|"]
        for a in summary["arms"]:
            loss = _fmt(a["final_eval_loss"]) + (f" ± {a['final_eval_loss_std']:.3f}" if a["seeds"] > 1 else "")
            acc = a["final_eval_accuracy"]
            lines.append(
                f"| {a['label']} | {a['position_encoding']} | {a['seeds']} | {a['final_step']:.0f} | {loss} | "
                f"{_fmt(a.get('eval_loss_at_common_step'))} | {'—' if acc is None else f'{100 * acc:.1f}%'} |"
            )
        ratio_columns = " ratio steps | ratio seconds |" if "ratios" in summary else ""
        lines += [
            "",
            f"Steps (tokens, training seconds) to first reach an eval loss; baseline: {summary['baseline']}.",
            "",
            "| target eval loss | " + " | ".join(a["label"] for a in summary["arms"]) + " |" + ratio_columns,
            "|---:|" + "---:|" * len(summary["arms"]) + ("---:|---:|" if ratio_columns else ""),
        ]
        for i, target in enumerate(summary["targets"]):
            cells = []
            for a in summary["arms"]:
                r = a["targets"][i]
                cells.append("not reached" if r["steps"] is None else f"{r['steps']:.0f} ({_tokens(r['tokens'])}, "
                             f"{_fmt(r['seconds'], 0)} s)")  # fmt: skip
            row = f"| {target:.3f} | " + " | ".join(cells) + " |"
            if "ratios" in summary:
                ratio = summary["ratios"]["targets"][i]
                row += f" {_fmt(ratio['steps'], 2)} | {_fmt(ratio['seconds'], 2)} |"
            lines.append(row)
        if "ratios" in summary:
            ratios = summary["ratios"]
            lines += ["", f"RoFormer ({summary['roformer']}) / baseline ({summary['baseline']}): final eval loss "
                      f"{_fmt(ratios['final_eval_loss'])}"]  # fmt: skip
    if summary.get("differences"):
        lines += _differences_markdown(summary)
    if "length_extrapolation" in summary:
        lines += ["", "## Length extrapolation (eval MLM loss / masked-token accuracy, fixed mask)", ""]
        lengths = sorted({r["seq_len"] for rows in summary["length_extrapolation"].values() for r in rows})
        lines += ["| arm | " + " | ".join(str(n) for n in lengths) + " |", "|---|" + "---:|" * len(lengths)]
        for label, rows in summary["length_extrapolation"].items():
            by_length = {r["seq_len"]: r for r in rows}
            cells = []
            for n in lengths:
                r = by_length.get(n)
                if r is None or "error" in r:
                    cells.append("—" if r is None else "cannot")
                else:
                    cells.append(f"{r['eval_loss']:.3f} / {100 * r['eval_accuracy']:.1f}%")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        if summary.get("length_differences"):
            intro = (f"Eval-loss differences from {summary['baseline']} (arm - baseline, mean [95% interval over "
                     "seeds]; n.s. = the interval includes 0):")  # fmt: skip
            rows = {label: [_difference_cell(by_length[n], 3) if n in by_length else "—" for n in lengths]
                    for label, by_length in summary["length_differences"].items()}  # fmt: skip
            lines += _difference_table(intro, [str(n) for n in lengths], rows)
    if "glue" in summary:
        tasks = sorted({t for rows in summary["glue"].values() for t in rows})
        lines += ["", "## GLUE (dev, mean ± std over seeds, %)", "", GLUE_NOTE, "",
                  "| arm | " + " | ".join(tasks) + " |", "|---|" + "---:|" * len(tasks)]  # fmt: skip
        for label, rows in summary["glue"].items():
            cells = [f"{100 * rows[t]['score']['mean']:.1f} ± {100 * rows[t]['score']['std']:.1f}" if t in rows else "—"
                     for t in tasks]  # fmt: skip
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        if summary.get("glue_differences"):
            intro = (f"Dev score differences from {summary['glue_baseline']} (points, arm - baseline, mean [95% "
                     "interval over seeds]; n.s. = the interval includes 0):")  # fmt: skip
            rows = {label: [_difference_cell(_points(columns[t]), 1) if t in columns else "—" for t in tasks]
                    for label, columns in summary["glue_differences"].items()}  # fmt: skip
            lines += _difference_table(intro, tasks, rows)
    return "\n".join(lines) + "\n"


def _points(d: dict[str, Any]) -> dict[str, Any]:
    """A score difference in percentage points."""
    return {**d, **{k: 100 * d[k] for k in ("mean", "low", "high") if d.get(k) is not None}}


def _differences_markdown(summary: dict[str, Any]) -> list[str]:
    """Arm - baseline for the final loss and the steps to each target, with the 95% interval over seeds."""
    tests = sorted({d["test"] for arm in summary["differences"].values() for d in _all(arm) if d.get("test")})
    intro = (f"Differences from the baseline ({summary['baseline']}): arm - baseline, mean over seeds [95% "
             f"interval; {', '.join(tests) or 'one seed: no interval'}]; n.s. = the interval includes 0.")
    headers = ["final eval loss", *(f"steps to {t:.3f}" for t in summary["targets"])]
    rows = {
        label: [_difference_cell(arm["final_eval_loss"], 3), *(_difference_cell(d, 0) for d in arm["steps_to_target"])]
        for label, arm in summary["differences"].items()
    }
    return _difference_table(intro, headers, rows)


def _difference_table(intro: str, headers: list[str], rows: dict[str, list[str]]) -> list[str]:
    """Markdown lines: the intro, then one row of difference cells per arm."""
    table = ["| arm | " + " | ".join(headers) + " |", "|---|" + "---:|" * len(headers)]
    return ["", intro, "", *table, *(f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows.items())]


def _all(arm: dict[str, Any]) -> list[dict[str, Any]]:
    return [arm["final_eval_loss"], *arm["steps_to_target"]]


def _difference_cell(d: dict[str, Any], digits: int) -> str:
    if d.get("mean") is None:
        return "not reached"
    cell = f"{d['mean']:+.{digits}f}"
    if d.get("low") is None:
        return cell
    cell += f" [{d['low']:+.{digits}f}, {d['high']:+.{digits}f}]"
    return cell if d["significant"] else cell + " n.s."


def _tokens(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value / 1e6:.2f}M tok" if value >= 1e6 else f"{value / 1e3:.0f}k tok"


def compare(
    paths: list[str | Path],
    out: str | Path,
    baseline: str | None = None,
    targets: list[float] | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Read the runs, write curves.png, summary.md and summary.json into `out`; returns the summary.

    Raises:
        UserError: a directory that is not a run, runs without evaluations, GLUE runs sharing no task.
    """
    check_output_dir(Path(out), overwrite)  # before reading the runs
    runs, glue = load_runs(paths)
    check_same_vocabulary(runs)
    labels = {g.label for g in glue}
    if len(labels) > 1 and not set.intersection(*({g.task for g in glue if g.label == lb} for lb in labels)):
        raise UserError("the GLUE runs share no task: nothing to compare")
    summary = summarise(runs, glue, baseline, targets)
    summary["runs"] = [str(Path(p)) for p in paths]
    with staged_output_dir(out, overwrite) as staging:
        if runs:
            plot_curves(group_arms(runs), staging / "curves.png")
        if "length_extrapolation" in summary:
            plot_lengths(summary["length_extrapolation"], staging / "length.png")
        (staging / "summary.json").write_text(json.dumps(summary, indent=2))
        (staging / "summary.md").write_text(summary_markdown(summary))
    return summary
