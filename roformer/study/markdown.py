"""The studies' markdown: every table and cell that `roformer compare`, `glue`, `eval-mlm` and `experiment` write.

The modules that compute (compare, stats, suite, length_eval) return plain data; this one only lays it out, with
no arithmetic beyond units for display (fractions as %, tokens as k/M), and imports no torch.

    summary_markdown            summary.md of `roformer compare` (the dict of roformer.study.compare.summarise)
    glue_suite_table            results.md of `roformer glue` (per task: roformer.train.finetune's results)
    length_results_table        the table `roformer eval-mlm` prints (roformer.study.length_eval.evaluate_lengths)
    upper_bound_table           the paper's long-term decay bound at some distances (roformer.study.decay)
    attention_distance_table    the table `roformer attention-distance` prints (roformer.study.decay)
    experiment_report_markdown  report.md of `roformer experiment` (its sources, gathered by roformer.study.report)
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

GLUE_NOTE = (
    "Selected on dev: each cell is the mean over seeds at the learning rate with the best mean dev score (MNLI: on "
    "matched), each seed at its best dev checkpoint, so the numbers are optimistic estimates; unbiased ones need "
    "the test server (each run's submission/)."
)


def summary_markdown(summary: dict[str, Any]) -> str:
    """summary.md: the arms table, steps-to-target table with ratios, differences, and the length and GLUE tables."""
    lines = []
    if "arms" in summary:
        lines += _pretraining_lines(summary)
    if summary.get("differences"):
        lines += _differences_lines(summary)
    if "length_extrapolation" in summary:
        lines += _length_lines(summary)
    if "glue" in summary:
        lines += _glue_lines(summary)
    if "probes" in summary:
        lines += _probe_lines(summary["probes"])
    return "\n".join(lines) + "\n"


def probe_results_table(rows: list[dict[str, Any]]) -> str:
    """The table `roformer probe` prints: a row per length (and distance) with accuracy, interval, samples, time."""
    lines = [
        "| probe | length | distance | scaling | accuracy | 95% interval | samples | seconds |",
        "|---|---:|---:|---|---:|---|---:|---:|",
    ]
    for row in rows:
        if "error" in row:
            distance = row.get("distance", "")
            lines.append(f"| {row['probe']} | {row['length']} | {distance} | {row['scaling']} | {row['error']} | | | |")
            continue
        low, high = row["interval"]
        lines.append(
            f"| {row['probe']} | {row['length']} | {row.get('distance', '')} | {row['scaling']} | "
            f"{row['accuracy']:.3f} | [{low:.3f}, {high:.3f}] | {row['samples']} | {row['seconds']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def _probe_lines(rows: list[dict[str, Any]]) -> list[str]:
    """A table per probe: accuracy [95% interval] of every arm, scaling (and distance) at every length."""
    lines = []
    for probe in sorted({r["probe"] for r in rows}):
        mine = [r for r in rows if r["probe"] == probe]
        lengths = sorted({r["length"] for r in mine})
        lines += ["", f"## Probe `{probe}` (accuracy [95% interval])", ""]
        lines += ["| arm (scaling) | " + " | ".join(str(n) for n in lengths) + " |", "|---|" + "---:|" * len(lengths)]
        for line in dict.fromkeys(r["line"] for r in mine):
            at = {r["length"]: r for r in mine if r["line"] == line}
            cells = [_probe_cell(at.get(n)) for n in lengths]
            lines.append(f"| {line} | " + " | ".join(cells) + " |")
    return lines


def _probe_cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "—"
    if "error" in row:
        return "cannot"
    low, high = row["interval"]
    return f"{row['accuracy']:.3f} [{low:.3f}, {high:.3f}]"


def glue_suite_table(results: dict[str, dict[str, Any]]) -> str:
    """results.md of a suite: a row per task and metric (mean +- std over runs, median, max, selected lr, runs).

    A task's runs at the selected lr are its seeds, or seeds x folds for a cross-validated task. Under each metric, its
    trivial baseline (`baseline` of the task's results: the majority class, the training mean...), in italics.

    Args:
        results: {task: the results of roformer.train.finetune (its `summary` and `selected`)}.
    """
    lines = [
        "| task | split | metric | mean ± std | median | max | lr | runs |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for task, r in results.items():
        for split, metrics in r["summary"].items():
            for name, s in metrics.items():
                if name == "score" and len(metrics) == 2:
                    continue  # one metric: its score is the same number
                numbers = (
                    f"{100 * s['mean']:.2f} ± {100 * s['std']:.2f} | {100 * s['median']:.2f} | {100 * s['max']:.2f}"
                )
                lr, runs = r["selected"]["peak_lr"], len(s["values"])
                lines.append(f"| {task} | {split} | {name} | {numbers} | {lr:g} | {runs} |")
                baseline = r.get("baseline", {}).get(split)
                if baseline is not None and name in baseline:  # the level a model that learned nothing reaches
                    kind = baseline["kind"].replace("_", " ")
                    lines.append(f"| {task} | {split} | {name}: *{kind}* | {100 * baseline[name]:.2f} | | | | |")
    return "\n".join(lines) + "\n"


def length_results_table(results: list[dict[str, Any]]) -> str:
    """The eval-mlm table of one model: a row per length (one column per scaling method when there are several).

    Args:
        results: The rows of roformer.study.length_eval.evaluate_lengths.
    """
    scored = [r for r in results if "error" not in r]

    def column(r: dict[str, Any]) -> str:  # a method at its default factor (which grows with the length), or at one
        return r.get("column") or r.get("rope_scaling", "").split(" ")[0]  # explicit factor (yarn x2 beside yarn x4)

    methods = list(dict.fromkeys(column(r) for r in scored))
    if methods and methods != [""]:
        lines = ["| length | " + " | ".join(methods) + " |", "|---:|" + "---:|" * len(methods)]
        for length in dict.fromkeys(r["seq_len"] for r in results):
            row = {column(r): r for r in scored if r["seq_len"] == length}
            cells = [_loss_accuracy_cell(row[m]) if m in row else "—" for m in methods]
            lines.append(f"| {length} | " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n(eval loss / masked-token accuracy)\n"
    lines = ["| length | eval loss | masked-token accuracy | blocks |", "|---:|---:|---:|---:|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['seq_len']} | — | — | {r['error']} |")
        else:
            lines.append(f"| {r['seq_len']} | {r['eval_loss']:.3f} | {100 * r['eval_accuracy']:.1f}% | {r['blocks']} |")
    return "\n".join(lines) + "\n"


def upper_bound_table(distances: list[int], values: list[float], head_size: int) -> str:
    """The paper's relative upper bound (fig. 2) at some distances: one row of distances, one of values (2 decimals)."""
    lines = [
        "| relative distance | " + " | ".join(str(d) for d in distances) + " |",
        "|---|" + "---:|" * len(distances),
        f"| relative upper bound (d = {head_size}) | " + " | ".join(f"{v:.2f}" for v in values) + " |",
    ]
    return "\n".join(lines) + "\n"


def attention_distance_table(result: dict[str, Any]) -> str:
    """What `roformer attention-distance` prints: each layer's mean logit and weight at distances 1, 2, 4, ... T - 1.

    The weight is shown times the window length T (1 is the uniform weight 1 / T); the bound's row is the paper's.
    """
    length = result["length"]
    shown = [d for d in (2**i for i in range(length.bit_length())) if d < length - 1] + [length - 1]
    header = ["| layer | " + " | ".join(f"{d}" for d in shown) + " |", "|---|" + "---:|" * len(shown)]
    logits, weights = [], []
    for layer in result["layers"]:
        logits.append(f"| {layer['layer']} | " + " | ".join(_number(layer["mean_logit"][d]) for d in shown) + " |")
        times_t = [None if layer["mean_weight"][d] is None else layer["mean_weight"][d] * length for d in shown]
        weights.append(f"| {layer['layer']} | " + " | ".join(_number(w) for w in times_t) + " |")
    bound = result["bound"]
    bound_row = f"| bound (d = {bound['head_size']}) | " + " | ".join(
        _number(bound["relative_upper_bound"][d], 2) for d in shown
    )
    unknown = f", {result['unknown_rate']:.2%} [UNK]" if "unknown_rate" in result else ""
    title = (
        f"mean pre-softmax logit by distance |m - n| ({result['position_encoding']}, {result['samples']} windows"
        f"{unknown})"
    )
    lines = [title, *header, *logits, bound_row + " |", "", "mean attention weight x T by distance (1 = uniform)"]
    lines += [*header, *weights]
    return "\n".join(lines) + "\n"


def experiment_report_markdown(
    *,
    config_path: Path,
    config_text: str,
    command: list[str],
    figures: list[tuple[str, str]],
    summary: str,
    resolved_arms: dict[str, str],
    glue_suite: tuple[Path, str, list[str]] | None = None,
) -> str:
    """report.md of an experiment: the figures, the comparison's summary.md, and how to reproduce it.

    Args:
        config_path: The experiment YAML as given on the command line.
        config_text: Its text.
        command: The command line that makes the experiment (argv).
        figures: (link relative to the report, caption) of every figure to embed.
        summary: The comparison's summary.md (its sections become subsections).
        resolved_arms: {label: the arm's fully resolved pretraining config as YAML}.
        glue_suite: (path, text, overrides of every task) of the GLUE stage's suite, if any.
    """
    lines = [f"# Experiment report: {config_path.name}", ""]
    for link, caption in figures:
        lines += [f"![{caption}]({link})", ""]
    lines += [summary.replace("\n## ", "\n### "), ""]
    lines += [
        "## How this was made",
        "",
        "```bash",
        shlex.join(command),
        "```",
        "",
        f"Experiment config (`{config_path}`):",
        "",
        "```yaml",
        config_text.rstrip(),
        "```",
        "",
    ]
    if glue_suite is not None:
        suite, text, overrides = glue_suite
        lines += [
            f"GLUE suite (`{suite}`), with overrides {overrides} and each run's `init` and `label`:",
            "",
            "```yaml",
            text.rstrip(),
            "```",
            "",
        ]
    for label, resolved in resolved_arms.items():
        lines += [
            f"Arm `{label}`, resolved pretraining config (the seed is each run's):",
            "",
            "```yaml",
            resolved.rstrip(),
            "```",
            "",
        ]
    return "\n".join(lines)


def _pretraining_lines(summary: dict[str, Any]) -> list[str]:
    """The arms table, the steps-to-target table (with RoFormer / baseline ratios) and the final-loss ratio."""
    header = "| arm | position encoding | seeds | final step | final eval loss | eval loss at common step | accuracy |"
    lines = ["## MLM pretraining", ""]
    lines += [f"Note: {note}." for note in summary.get("notes", [])] + ([""] if summary.get("notes") else [])
    lines += _tokenization_lines(summary)
    lines += [header, "|---|---|---:|---:|---:|---:|---:|"]
    lines += [_arm_row(a) for a in summary["arms"]]
    if summary.get("other_tokenizer_arms"):
        intro = "Arms with another tokenizer (eval loss over their own tokens: not comparable with the above):"
        lines += ["", intro, ""]
        lines += [header, "|---|---|---:|---:|---:|---:|---:|"]
        lines += [_arm_row(a) for a in summary["other_tokenizer_arms"]]
    ratio_columns = " ratio steps | ratio seconds |" if "ratios" in summary else ""
    lines += [
        "",
        f"Steps (tokens, training seconds) at which the arm's eval loss, averaged over its seeds at each step, first "
        f"reaches a level; baseline: {summary['baseline']}. (The differences below average each seed's own first "
        "step instead, so the two can differ.)",
        "",
        "| target eval loss | " + " | ".join(a["label"] for a in summary["arms"]) + " |" + ratio_columns,
        "|---:|" + "---:|" * len(summary["arms"]) + ("---:|---:|" if ratio_columns else ""),
    ]
    for i, target in enumerate(summary["targets"]):
        cells = [_steps_to_target_cell(a["targets"][i]) for a in summary["arms"]]
        row = f"| {target:.3f} | " + " | ".join(cells) + " |"
        if "ratios" in summary:
            ratio = summary["ratios"]["targets"][i]
            row += f" {_number(ratio['steps'], 2)} | {_number(ratio['seconds'], 2)} |"
        lines.append(row)
    if "ratios" in summary:
        ratios = summary["ratios"]
        lines += [
            "",
            f"RoFormer ({summary['roformer']}) / baseline ({summary['baseline']}): final eval loss "
            f"{_number(ratios['final_eval_loss'])}",
        ]
    return lines


def _arm_row(a: dict[str, Any]) -> str:
    """One arm of the pretraining table: final eval loss (± std over seeds), loss at the common step, accuracy."""
    loss = _number(a["final_eval_loss"]) + (f" ± {a['final_eval_loss_std']:.3f}" if a["seeds"] > 1 else "")
    acc = a["final_eval_accuracy"]
    return (
        f"| {a['label']} | {a['position_encoding']} | {a['seeds']} | {a['final_step']:.0f} | {loss} | "
        f"{_number(a.get('eval_loss_at_common_step'))} | {'—' if acc is None else f'{100 * acc:.1f}%'} |"
    )


def _tokenization_lines(summary: dict[str, Any]) -> list[str]:
    """Each arm's vocabulary and tokens per character: one sentence when they agree, a table when they differ."""
    rows = summary.get("tokenization", [])
    if not rows:
        return []
    kinds = {(r["vocab_size"], round(r["tokens_per_character"], 4)) for r in rows}
    labels = [a["label"] for a in summary["arms"] + summary.get("other_tokenizer_arms", [])]
    unknown = [label for label in labels if label not in {r["label"] for r in rows}]
    if len(kinds) == 1 and not summary.get("other_tokenizer_arms") and not unknown:
        r = rows[0]
        return [
            f"Every arm read one tokenizer: vocabulary {r['vocab_size']:,}, {r['tokens_per_character']:.3f} tokens "
            f"per character of the training text ({r['characters']:,} characters).",
            "",
        ]
    lines = [
        "Tokenization of each arm (the training text as its tokenizer reads it):",
        "",
        "| arm | vocabulary | tokens per character | training tokens | training characters |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['vocab_size']:,} | {r['tokens_per_character']:.3f} | {r['tokens']:,} | "
            f"{r['characters']:,} |"
        )
    lines += [f"| {label} | unknown (no tokenization.json) | | | |" for label in unknown]
    return lines + [""]


def _steps_to_target_cell(reached: dict[str, Any]) -> str:
    """`steps (tokens, seconds)` of one arm and target, or `not reached`."""
    if reached["steps"] is None:
        return "not reached"
    return f"{reached['steps']:.0f} ({_tokens(reached['tokens'])}, {_number(reached['seconds'], 0)} s)"


def _differences_lines(summary: dict[str, Any]) -> list[str]:
    """Arm - baseline for the final loss and the steps to each target, with the 95% interval over seeds."""
    differences = summary["differences"].values()
    tests = sorted(
        {d["test"] for arm in differences for d in (arm["final_eval_loss"], *arm["steps_to_target"]) if d.get("test")}
    )
    intro = (
        f"Differences from the baseline ({summary['baseline']}): arm - baseline, mean over seeds [95% "
        f"interval; {', '.join(tests) or 'one seed: no interval'}]; n.s. = the interval includes 0."
    )
    headers = ["final eval loss", *(f"steps to {t:.3f}" for t in summary["targets"])]
    rows = {
        label: [_difference_cell(arm["final_eval_loss"], 3), *(_difference_cell(d, 0) for d in arm["steps_to_target"])]
        for label, arm in summary["differences"].items()
    }
    return _difference_table(intro, headers, rows)


def _length_lines(summary: dict[str, Any]) -> list[str]:
    """Eval loss / accuracy of every arm at every length, then the arms' eval-loss differences from the baseline."""
    lines = ["", "## Length extrapolation (eval MLM loss / masked-token accuracy, fixed mask)", ""]
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
                cells.append(_loss_accuracy_cell(r))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if summary.get("length_differences"):
        intro = (
            f"Eval-loss differences from {summary['baseline']} (arm - baseline, mean [95% interval over "
            "seeds]; n.s. = the interval includes 0):"
        )
        rows = {
            label: [_difference_cell(by_length[n], 3) if n in by_length else "—" for n in lengths]
            for label, by_length in summary["length_differences"].items()
        }
        lines += _difference_table(intro, [str(n) for n in lengths], rows)
    return lines


def _glue_lines(summary: dict[str, Any]) -> list[str]:
    """Dev score (mean ± std, %) of every arm and GLUE column, then the arms' differences from the baseline."""
    tasks = sorted({t for rows in summary["glue"].values() for t in rows})
    scored = summary.get("glue_scores") or {}
    lines = [
        "",
        "## GLUE (dev, mean ± std over seeds, %)",
        "",
        GLUE_NOTE,
        *(
            ["", "Each task's score: " + "; ".join(f"{t} {' + '.join(m)}" for t, m in scored.items()) + "."]
            if scored
            else []
        ),
        "",
        "| arm | " + " | ".join(tasks) + " |",
        "|---|" + "---:|" * len(tasks),
    ]
    for label, rows in summary["glue"].items():
        cells = [
            f"{100 * rows[t]['score']['mean']:.1f} ± {100 * rows[t]['score']['std']:.1f}" if t in rows else "—"
            for t in tasks
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    baselines = summary.get("glue_baselines") or {}
    if baselines:  # the constant answer's level: a score at or below it learned nothing of the input
        cells = [f"{100 * baselines[t]['score']:.1f}" if t in baselines else "—" for t in tasks]
        lines.append("| *trivial baseline (majority class; training mean: 0)* | " + " | ".join(cells) + " |")
    if summary.get("glue_differences"):
        intro = (
            f"Dev score differences from {summary['glue_baseline']} (points, arm - baseline, mean [95% "
            "interval over seeds]; n.s. = the interval includes 0):"
        )
        rows = {
            label: [_difference_cell(_in_points(columns[t]), 1) if t in columns else "—" for t in tasks]
            for label, columns in summary["glue_differences"].items()
        }
        lines += _difference_table(intro, tasks, rows)
    return lines


def _difference_table(intro: str, headers: list[str], rows: dict[str, list[str]]) -> list[str]:
    """Markdown lines: the intro, then one row of difference cells per arm."""
    table = ["| arm | " + " | ".join(headers) + " |", "|---|" + "---:|" * len(headers)]
    return ["", intro, "", *table, *(f"| {label} | " + " | ".join(cells) + " |" for label, cells in rows.items())]


def _difference_cell(d: dict[str, Any], digits: int) -> str:
    """`+mean [+low, +high]`, `n.s.` where the interval includes 0, and the difference's note (roformer.study.stats)."""
    note = f" ({d['note']})" if d.get("note") else ""
    if d.get("mean") is None and d.get("unreached"):
        return _unreached_cell(d["unreached"])
    if d.get("mean") is None:
        return ("no finite value" if note else "not reached") + note
    cell = f"{d['mean']:+.{digits}f}"
    if d.get("low") is None:
        return cell + note
    cell += f" [{d['low']:+.{digits}f}, {d['high']:+.{digits}f}]"
    return (cell if d["significant"] else cell + " n.s.") + note


def _unreached_cell(unreached: dict[str, list[Any]]) -> str:
    """Whose seeds never reached a target: the arm's (`not reached`), the baseline's, or both."""

    def seeds(values: list[Any]) -> str:
        return f"seed{'s' if len(values) > 1 else ''} {', '.join(str(v) for v in values)}"

    parts = []
    if unreached["arm"]:
        parts.append(f"not reached ({seeds(unreached['arm'])})")
    if unreached["baseline"]:
        parts.append(f"baseline never reached it ({seeds(unreached['baseline'])})")
    return "; ".join(parts)


def _in_points(d: dict[str, Any]) -> dict[str, Any]:
    """A score difference in percentage points."""
    return {**d, **{k: 100 * d[k] for k in ("mean", "low", "high") if d.get(k) is not None}}


def _loss_accuracy_cell(result: dict[str, Any]) -> str:
    """`eval loss / masked-token accuracy` of one evaluation, e.g. `3.412 / 41.3%`."""
    return f"{result['eval_loss']:.3f} / {100 * result['eval_accuracy']:.1f}%"


def _number(value: float | None, digits: int = 3) -> str:
    """`value` with `digits` decimals; `—` for None or NaN."""
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def _tokens(value: float | None) -> str:
    """A token count as `12k tok` or `1.25M tok`; `—` for None."""
    if value is None:
        return "—"
    return f"{value / 1e6:.2f}M tok" if value >= 1e6 else f"{value / 1e3:.0f}k tok"
