"""`<out>/report.md` of `roformer experiment`: the comparison's tables and figures, and how to reproduce them.

The report is the compare summary (arms, steps-to-target, differences with 95% intervals over seeds, GLUE and
length tables) with the curves and the length plot embedded, followed by the exact command, the experiment YAML as
read, and every arm's fully resolved pretraining config (what the runs' config.yaml files hold).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

import yaml

from roformer.files import atomic_write_text

GLUE_DIR = "glue"  # <out>/glue/<arm>-seed<k>/<task>/: the GLUE stage's fine-tuning runs
REPORT_FILE = "report.md"


def write_report(out: Path, path: Path, experiment: Any, arms: dict[str, Any], overrides: list[str]) -> Path:
    """Write `<out>/report.md` from `<out>/compare/` (run after compare); returns its path."""
    compare_dir = out / "compare"
    lines = [f"# Experiment report: {path.name}", ""]
    for image, caption in (("curves.png", "MLM loss curves"), ("length.png", "eval loss against length")):
        if (compare_dir / image).is_file():
            lines += [f"![{caption}](compare/{image})", ""]
    lines += [(compare_dir / "summary.md").read_text().replace("\n## ", "\n### "), ""]
    command = ["roformer", "experiment", "--config", str(path), "--output-dir", str(out)]
    command += [arg for item in overrides for arg in ("--set", item)]
    lines += ["## How this was made", "", "```bash", shlex.join(command), "```", "",
              f"Experiment config (`{path}`):", "", "```yaml", path.read_text().rstrip(), "```", ""]  # fmt: skip
    if experiment.glue is not None:
        suite = Path(os.path.normpath(path.parent / experiment.glue.suite))  # configs/glue/x, not configs/y/../glue/x
        lines += [f"GLUE suite (`{suite}`), with overrides {experiment.glue.overrides} and each run's `init` and "
                  "`label`:", "", "```yaml", suite.read_text().rstrip(), "```", ""]  # fmt: skip
    for label, config in arms.items():
        resolved = yaml.safe_dump(config.to_dict(), sort_keys=False).rstrip()
        lines += [f"Arm `{label}`, resolved pretraining config (the seed is each run's):", "", "```yaml", resolved,
                  "```", ""]  # fmt: skip
    target = out / REPORT_FILE
    atomic_write_text(target, "\n".join(lines))
    return target
