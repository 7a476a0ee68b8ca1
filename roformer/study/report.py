"""`<out>/report.md` of `roformer experiment`: the comparison's tables and figures, and how to reproduce them.

The report is the compare summary (arms, steps-to-target, differences with 95% intervals over seeds, GLUE and
length tables) with the curves and the length plot embedded, followed by the exact command, the experiment YAML as
read, and every arm's fully resolved pretraining config (what the runs' config.yaml files hold). This module
gathers those sources; roformer.study.markdown.experiment_report_markdown lays them out.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from roformer.files import atomic_write_text
from roformer.study.markdown import experiment_report_markdown
from roformer.study.outputs import COMPARE_DIR, CURVES_PLOT_FILE, LENGTH_PLOT_FILE, REPORT_FILE, SUMMARY_MARKDOWN_FILE

FIGURES = ((CURVES_PLOT_FILE, "MLM loss curves"), (LENGTH_PLOT_FILE, "eval loss against length"))  # with captions


def _comparisons(out: Path, experiment: Any) -> str:
    """The experiment's further comparisons (`comparisons:`), each its summary under a heading."""
    parts = []
    for name, comparison in getattr(experiment, "comparisons", {}).items():
        summary = out / f"{COMPARE_DIR}-{name}" / SUMMARY_MARKDOWN_FILE
        if summary.is_file():
            heading = f"## Comparison `{name}`: {', '.join(comparison.arms)} against {comparison.baseline}"
            parts.append(f"\n\n{heading}\n\n{summary.read_text()}")
    return "".join(parts)


def write_report(out: Path, path: Path, experiment: Any, arms: dict[str, Any], overrides: list[str]) -> Path:
    """Write `<out>/report.md` from `<out>/compare/` (run after compare); returns its path."""
    compare_dir = out / COMPARE_DIR
    figures = [(f"{COMPARE_DIR}/{image}", caption) for image, caption in FIGURES if (compare_dir / image).is_file()]
    command = ["roformer", "experiment", "--config", str(path), "--output-dir", str(out)]
    command += [arg for item in overrides for arg in ("--set", item)]
    glue_suite = None
    if experiment.glue is not None:
        suite = Path(os.path.normpath(path.parent / experiment.glue.suite))  # configs/glue/x, not configs/y/../glue/x
        glue_suite = (suite, suite.read_text(), experiment.glue.overrides)
    text = experiment_report_markdown(
        config_path=path,
        config_text=path.read_text(),
        command=command,
        figures=figures,
        summary=(compare_dir / SUMMARY_MARKDOWN_FILE).read_text() + _comparisons(out, experiment),
        resolved_arms={label: yaml.safe_dump(config.to_dict(), sort_keys=False) for label, config in arms.items()},
        glue_suite=glue_suite,
    )
    target = out / REPORT_FILE
    atomic_write_text(target, text)
    return target
