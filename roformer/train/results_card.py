"""results.md: what a fine-tuning job exists for, in one page beside its results.json (and on the console).

Every task type gets its selected run, its dev scores over seeds and its labelled test splits, each split beside its
trivial baseline (roformer.tasks.baselines; a synthetic task's position-blind floor), so that a score is read against
the level a model that learned nothing reaches. Translation ends as `fairseq-generate` does: the final BLEU and
chrF++ of the best and the averaged model on every split, the search that made them and sacreBLEU's signatures.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

RESULTS_MARKDOWN_FILE = "results.md"


def results_markdown(results: dict[str, Any]) -> str:
    """The page: a header, the dev table, the test table, the averaged model and the type's own section."""
    scale = 1.0 if results.get("metrics_in_percent") else 100.0
    parts = [_header(results), _dev_table(results, scale)]
    if results.get("test") and "translation" not in results:  # translation's own section has its test splits
        parts.append(_test_table(results, scale))
        if extensions := _extensions_table(results["test"], scale):
            parts.append(extensions)
    if "translation" in results:
        parts.append(_translation_section(results["translation"]))
    elif results.get("averaged"):
        parts.append(_averaged_table(results["averaged"], scale))
    return "\n".join(part for part in parts if part)


def _header(results: dict[str, Any]) -> str:
    selected = results["selected"]
    run = next(
        (r for r in results["runs"] if r["peak_lr"] == selected["peak_lr"] and r["seed"] == selected["seed"]), {}
    )
    steps = f" of {run['steps']}" if "steps" in run else ""
    stopped = f", stopped at step {run['stopped_at']} (train.patience)" if "stopped_at" in run else ""
    start = f"fine-tuned from `{results['init']}`" if results.get("init") else "trained from scratch"
    return (
        f"# {results['task']}: {start}\n\n"
        f"Selected: lr {selected['peak_lr']:g}, seed {selected['seed']}, the best dev checkpoint at step "
        f"{selected['best_step']}{steps}{stopped}. Scores in %"
        + ("" if results.get("metrics_in_percent") else " (correlations x 100)")
        + "; the trivial baseline of each split is the constant answer of a model that learned nothing of the input.\n"
    )


def split_baseline(results: dict[str, Any], split: str) -> dict[str, Any] | None:
    """A split's baseline: the task's trivial one (`baseline`), or a synthetic task's position-blind floor."""
    return results.get("baseline", {}).get(split) or results.get("splits", {}).get(split, {}).get("baseline")


def _dev_table(results: dict[str, Any], scale: float) -> str:
    first = next(iter(results["summary"].values()))
    seeds, lr = len(first["score"]["values"]), results["selected"]["peak_lr"]
    title = f"## Dev (lr {lr:g}: mean ± std over {seeds} run(s), each at its best checkpoint)"
    return _over_seeds_table(title, results["summary"], results, scale)


def _test_table(results: dict[str, Any], scale: float) -> str:
    title = "## Test (the selected lr's runs, each at its best dev checkpoint)"
    return _over_seeds_table(title, results["test"], results, scale)


def _over_seeds_table(title: str, splits: dict[str, Any], results: dict[str, Any], scale: float) -> str:
    """A split a row (mean ± std of each metric over the runs), each followed by its baseline's row."""
    metrics = [m for m in next(iter(splits.values())) if m != "extensions"]
    lines = [f"{title}\n", *_head(metrics)]
    for split, values in splits.items():
        lines.append(_row(split, [_mean_std(values[m], scale) for m in metrics]))
        lines += _baseline_row(results, split, metrics, scale)
    return "\n".join(lines) + "\n"


def _extensions_table(test: dict[str, Any], scale: float) -> str:
    """Accuracy at every test split as trained and under each test-time extension method (none: no table)."""
    methods = list(dict.fromkeys(m for values in test.values() for m in values.get("extensions", {})))
    if not methods:
        return ""
    lines = [
        "## Test-time extensions (accuracy; the same weights, no training: roformer.tasks.extensions)\n",
        "| split | as trained | " + " | ".join(methods) + " |",
        "|---|" + "---:|" * (len(methods) + 1),
    ]
    for split, values in test.items():
        extensions = values.get("extensions", {})
        cells = [_mean_std(values["accuracy"], scale)]
        cells += [_mean_std(extensions[m]["accuracy"], scale) if m in extensions else "-" for m in methods]
        lines.append(_row(split, cells))
    return "\n".join(lines) + "\n"


def _averaged_table(averaged: dict[str, Any], scale: float) -> str:
    splits = {**averaged.get("dev", {}), **averaged.get("test", {})}
    if not splits:
        return ""
    metrics = list(next(iter(splits.values())))
    lines = [f"## Averaged model (the selected run's models at steps {averaged['points']})\n", *_head(metrics)]
    lines += [_row(split, [_number(values.get(m), scale) for m in metrics]) for split, values in splits.items()]
    return "\n".join(lines) + "\n"


def _translation_section(translation: dict[str, Any]) -> str:
    columns = [("bleu", "BLEU"), ("chrf", "chrF++"), ("bleu_tok_lc", "BLEU tok. lc"), ("loss", "loss/token")]
    lines = [
        f"## Translation ({translation['languages']})\n",
        "| model | split | " + " | ".join(name for _, name in columns) + " |",
        "|---|---|" + "---:|" * len(columns),
    ]
    for model in ("best", "averaged"):
        for split, scores in translation.get(model, {}).items():
            cells = [_number(scores.get(key), 1.0, digits=3 if key == "loss" else 2) for key, _ in columns]
            lines.append(f"| {model} | {split} | " + " | ".join(cells) + " |")
    search = ", ".join(
        f"{k} {v}"
        for k, v in translation["search"].items()
        if k not in ("batch_size", "pad_to_multiple_of", "too_long")
    )
    signatures = translation.get("signatures", {})
    lines += ["", f"Search: {search} (dev BLEU during training: beam {translation.get('eval_beam', 1)})."]
    lines += [f"sacreBLEU {name}: `{signature}`" for name, signature in signatures.items()]
    recipe = next((s.get("bleu_tok_lc_recipe") for s in translation.get("best", {}).values()), None)
    if recipe:
        lines.append(f"BLEU tok. lc: {recipe}.")
    return "\n".join(lines) + "\n"


def _baseline_row(results: dict[str, Any], split: str, metrics: Sequence[str], scale: float) -> list[str]:
    baseline = split_baseline(results, split)
    if baseline is None:
        return []
    kind = baseline["kind"].replace("_", " ")
    return [_row(f"{split}: {kind} (baseline)", [_number(baseline.get(m), scale) for m in metrics])]


def _head(metrics: Sequence[str]) -> list[str]:
    return ["| split | " + " | ".join(metrics) + " |", "|---|" + "---:|" * len(metrics)]


def _row(name: str, cells: Sequence[str]) -> str:
    return f"| {name} | " + " | ".join(cells) + " |"


def _mean_std(summary: dict[str, Any], scale: float) -> str:
    if len(summary["values"]) == 1:
        return _number(summary["mean"], scale)
    return f"{_number(summary['mean'], scale)} ± {_number(summary['std'], scale)}"


def _number(value: Any, scale: float, digits: int = 2) -> str:
    """A metric in the page's scale; `-` where the split has none. A loss is never scaled."""
    if not isinstance(value, int | float):
        return "-"
    return f"{value * scale:.{digits}f}"


def result_line(results: dict[str, Any]) -> str:
    """A finished job on one console line (a suite's task, a study's run): its scores beside their baselines.

    `dev score 61.4 (majority class 52.7); test_1x 91.3 (position blind 16.0), test_2x ...`, in the page's scale; a
    translation's final test BLEU of each model instead.
    """
    scale = 1.0 if results.get("metrics_in_percent") else 100.0
    if "translation" in results:
        scores = results["translation"]
        cells = [
            f"{model} {split} BLEU {values['bleu']:.2f}"
            for model in ("best", "averaged")
            for split, values in scores.get(model, {}).items()
        ]
        return "; ".join(cells)
    dev = results["selection_split"]
    cells = [f"{dev} score {_against(results['summary'][dev]['score']['mean'], split_baseline(results, dev), scale)}"]
    for split, values in (results.get("test") or {}).items():
        cell = f"{split} {_against(values['score']['mean'], split_baseline(results, split), scale)}"
        if extensions := values.get("extensions"):
            cell += " [" + ", ".join(f"{m} {v['score']['mean'] * scale:.1f}" for m, v in extensions.items()) + "]"
        cells.append(cell)
    return "; ".join(cells)


def _against(score: float, baseline: dict[str, Any] | None, scale: float) -> str:
    if baseline is None or "score" not in baseline:
        return f"{score * scale:.1f}"
    return f"{score * scale:.1f} ({baseline['kind'].replace('_', ' ')} {baseline['score'] * scale:.1f})"
