"""`roformer suite` (`roformer glue`): several tasks of any type fine-tuned one after another into one table."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from roformer.config import check_types, load
from roformer.config_paths import config_file
from roformer.errors import ConfigError
from roformer.files import atomic_copy, atomic_write_text
from roformer.study.markdown import glue_suite_table
from roformer.study.outputs import SUITE_TABLE_FILE
from roformer.train.config import FinetuneConfig
from roformer.train.finetune import check_before_writing, finetune
from roformer.train.launch import process_state, run_on_main
from roformer.train.results_card import result_line
from roformer.train.run_dir import RESULTS_FILE, SUBMISSION_DIR, RunDir

logger = logging.getLogger(__name__)


@dataclass
class SuiteTask:
    """A task of a suite with overrides of its own: the `{config: ..., set: [...]}` form of an entry of `tasks:`.

    Its `set` comes after the suite's `overrides` (a task may keep what the suite sets for all: a cross-validated
    task its folds' seeds), and command-line overrides after both.
    """

    config: str = ""
    set: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.config:
            raise ConfigError("a task mapping needs config: (a fine-tuning YAML)")


@dataclass
class SuiteConfig:
    """`roformer suite`: task configs run one after another, with shared overrides, into one table.

    Attributes:
        tasks: Task config files (relative to the suite file), e.g. [cola.yaml, sst2.yaml], or `{config: YAML, set:
            [overrides of this task]}`.
        overrides: `--set` style overrides applied to every task (e.g. `init=runs/roformer-base/final`).
    """

    tasks: list[str | SuiteTask] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_types(self)
        if not self.tasks:
            raise ConfigError("tasks: list at least one task config")

    def task_specs(self) -> list[SuiteTask]:
        """Every task as a SuiteTask (a plain entry has no overrides of its own)."""
        return [task if isinstance(task, SuiteTask) else SuiteTask(config=task) for task in self.tasks]


def load_suite(path: str | Path, overrides: list[str] | None = None) -> tuple[SuiteConfig, list[FinetuneConfig]]:
    """A suite YAML and every task config it lists, loaded with the suite's overrides, then `overrides`.

    Raises:
        ConfigError: a bad suite file or task config.
    """
    path = Path(path)
    suite = load(SuiteConfig, path)
    given = list(overrides or [])
    configs = [
        load(FinetuneConfig, config_file(path.parent, task.config, "glue"), suite.overrides + task.set + given)
        for task in suite.task_specs()
    ]
    names = [config.data.task for config in configs]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:  # each task writes <out>/<task>/
        raise ConfigError(f"{path}: tasks share the name {repeated[0]!r} (give one its own with set: [data.task=...])")
    return suite, configs


def load_suite_config(path: str | Path) -> SuiteConfig:
    """Read a suite YAML and check that every task config it lists loads.

    Raises:
        ConfigError: a bad suite file or task config.
    """
    return load_suite(path)[0]


def run_suite(
    path: str | Path,
    output_dir: str | Path,
    overrides: list[str] | None = None,
    overwrite: bool = False,
    resume: bool = False,
) -> dict[str, Any]:
    """Fine-tune every task of a suite config into output_dir/<task>/ and write one table and one submission.

    Writes results.json, results.md (roformer.study.markdown.glue_suite_table) and submission/ (every GLUE task's
    server files, ready to zip; another task's files in submission/<task>/). With `resume`, an
    interrupted suite continues: finished tasks are read back, a started one continues its grid (roformer.train.
    finetune), the others start.

    Returns:
        Every task's results (in the main process; other processes return an empty dict).

    Raises:
        ConfigError, UserError: a bad suite or task config (all task configs are checked before any training).
    """
    path, out = Path(path), Path(output_dir)
    suite, configs = load_suite(path, overrides)  # each task config built once, with every override
    run_dir = RunDir(out, overwrite, resume, record_required=False)  # older suites: no config.yaml
    extra = suite.overrides + list(overrides or [])
    if not resume:  # before the suite's directory is written (or --overwrite deletes the one it replaces)
        for config in configs:
            check_before_writing(config)  # the task's data too: nothing has read it yet
    # the suite's own record; a resume is checked task by task (each task directory holds its resolved config)
    record = {"suite": str(path.resolve()), "tasks": [asdict(t) for t in suite.task_specs()], "overrides": extra}
    run_on_main(lambda: run_dir.prepare(record))
    results, flat = {}, {}
    for config in configs:
        flat[config.data.task] = config.data.type == "glue"  # the GLUE server wants its files in one folder
        task_dir = out / config.data.task
        started = resume and RunDir.started(task_dir)
        results[config.data.task] = finetune(config, task_dir, resume=started, overwrite=resume and not started)
        if results[config.data.task]:  # the main process: each task's result as it ends
            logger.info("%s: finished: %s", task_dir, result_line(results[config.data.task]))

    def write() -> None:  # the main process: one submission folder and one table
        (out / SUBMISSION_DIR).mkdir(exist_ok=True)
        for task in results:
            target = out / SUBMISSION_DIR if flat[task] else out / SUBMISSION_DIR / task  # other tasks: test.tsv each
            for file in (out / task / SUBMISSION_DIR).iterdir():
                target.mkdir(exist_ok=True)
                atomic_copy(file, target / file.name)
        atomic_write_text(out / RESULTS_FILE, json.dumps({t: r["summary"] for t, r in results.items()}, indent=2))
        atomic_write_text(out / SUITE_TABLE_FILE, glue_suite_table(results))

    if resume:
        run_on_main(lambda: run_dir.record(record))  # what the finished suite ran with
    run_on_main(write)
    return results if process_state().is_main_process else {}  # the others' task results are empty
