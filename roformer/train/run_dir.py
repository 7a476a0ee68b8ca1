"""Run directories: their lifecycle, every file name in one place, the metrics log, the model + tokenizer writer.

`RunDir` is the lifecycle of every recipe's directory: checked before any work, created fresh, cleared on
`--overwrite`, or resumed under one policy (RESUME_MAY_CHANGE) for pretraining and fine-tuning alike.
Written by `roformer pretrain` and `roformer finetune` (through the engine), read by `roformer compare`,
`experiment` and `eval-mlm`. Imports no torch, so reporting on finished runs stays light.

    config.yaml        the fully resolved config of the run (RUN_CONFIG_FILE)
    metrics.jsonl      one JSON object per event, flushed at once (METRICS_FILE)
    tokenizer/         the run's tokenizer (pretraining)
    checkpoints/       step-N: complete training states (roformer.train.checkpoints)
    final/             pretraining: model + tokenizer, loadable with roformer.load
    results.json, predictions/, submission/, best/: fine-tuning (see roformer.train.finetune)
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from roformer.config import ABSENT, config_differences, field_keys
from roformer.config_yaml import read_yaml, write_yaml
from roformer.data.tokenizer import Tokenizer, save_tokenizer
from roformer.errors import UserError
from roformer.files import atomic_write_text, check_output_dir, staged_output_dir
from roformer.logs import MAIN_ONLY
from roformer.train.config import FinetuneConfig, PretrainConfig

logger = logging.getLogger(__name__)

RUN_CONFIG_FILE = "config.yaml"  # the fully resolved config of a run (a model directory has model.yaml instead)
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS_DIR = "checkpoints"
TRAINER_STATE_FILE = "trainer_state.json"  # inside a checkpoint: step, counters, data position
FINAL_DIR = "final"
STAGES_DIR = "stages"  # pretraining in stages: stages/<name>/, the model (and optimizer state) at a stage's end
TOKENIZER_DIR = "tokenizer"
RESULTS_FILE = "results.json"  # fine-tuning: dev metrics per run and per learning rate
PREDICTIONS_DIR = "predictions"
SUBMISSION_DIR = "submission"
BEST_DIR = "best"
CANDIDATES_DIR = ".candidates"  # fine-tuning: the best model so far of each learning rate
PROGRESS_DIR = ".progress"  # fine-tuning: finished runs' records and the running one's checkpoints (for --resume)
PRETRAINING_FILE = "pretraining.json"  # in a pretrained model directory: the block length and vocabulary it saw
TOKENIZATION_FILE = "tokenization.json"  # a pretraining run's training text as its tokenizer reads it (TokenStore)
LENGTH_FILE = "length_extrapolation.json"  # written by roformer eval-mlm next to a run's final/
PROBES_DIR = "probes"  # an experiment's probe stage: <run>/probes/<probe>-<scaling>.json (roformer probe's files)


# What a resumed run may change in its config.yaml: one policy for every recipe, written on the fields of the run
# configs (roformer.config: MAY_CHANGE_ON_RESUME and the others). A resume continues the computation the checkpoint
# holds (weights, optimizer, schedule, data order, masks, RNG) and, for a fine-tuning grid, joins runs that have
# finished: any field that enters that computation is refused, by name, with both values.
RUN_CONFIGS = (PretrainConfig, FinetuneConfig)


def resume_keys(name: str, value: Any) -> tuple[str, ...]:
    """The dotted keys of the run configs' fields whose metadata has `name: value`, each once, in field order.

    The task types' settings sections are not read (their modules would load torch into every reporting command):
    they all enter the computation, so none of their keys may change on resume.
    """
    keys = (key for config in RUN_CONFIGS for key in field_keys(config, name, value, declared=False))
    return tuple(dict.fromkeys(keys))


RESUME_MAY_CHANGE = resume_keys("resume", "may_change")  # what only watches or keeps the run (logged as a warning)
RESUME_MAY_CHANGE_UNTIL_A_RUN_FINISHES = resume_keys("resume", "until_a_run_finishes")  # the same for a whole grid
RESUME_UNLOGGED = resume_keys("resume_warning", False)  # display only: not worth a warning


class RunDir:
    """A run directory's lifecycle: checked before any work, then created fresh, cleared and recreated, or resumed.

    Args:
        path: The run directory.
        overwrite: Replace a non-empty directory (`--overwrite`).
        resume: Continue what the directory holds (`--resume`).
        record_required: A resume needs the directory's config.yaml (a GLUE suite written before suites had one
            adopts its directory instead).

    Raises:
        UserError: both flags, nothing to resume, or a directory that cannot be used (roformer.files).
    """

    def __init__(
        self, path: str | Path, overwrite: bool = False, resume: bool = False, record_required: bool = True
    ) -> None:
        self.path, self.resume = Path(path), resume
        if resume and overwrite:
            raise UserError("--resume and --overwrite exclude each other")
        if resume and record_required and not self.config_file.is_file():
            raise UserError(f"{self.path}: nothing to resume (no {RUN_CONFIG_FILE})")
        check_output_dir(self.path, overwrite, resume)
        if overwrite and any(self.path.glob("*")) and not self._holds_a_run(record_required):
            # --overwrite deletes the directory: never a folder of someone's files (a corpus, notes) given by mistake
            raise UserError(
                f"{self.path}: --overwrite replaces a run directory, and this one holds no {RUN_CONFIG_FILE} of a "
                "run: choose a new or empty directory"
            )

    def _holds_a_run(self, record_required: bool) -> bool:
        """Whether the directory is a run's.

        It holds its config.yaml (or the temporary file of a write of it that was killed), or, for a suite written
        before suites had one, a task's.
        """
        if self.config_file.is_file() or self.config_file.with_name(RUN_CONFIG_FILE + ".tmp").is_file():
            return True
        return not record_required and any(RunDir.started(child) for child in self.path.iterdir() if child.is_dir())

    @staticmethod
    def started(path: str | Path) -> bool:
        """A run was started in `path` (it has its config.yaml): continue it rather than start over."""
        return (Path(path) / RUN_CONFIG_FILE).is_file()

    @property
    def config_file(self) -> Path:
        """The run's config.yaml."""
        return self.path / RUN_CONFIG_FILE

    def check_resume(self, config: dict[str, Any], saved: dict[str, Any] | None = None, finished_runs: int = 0) -> None:
        """Refuse a resume whose config differs from the saved one beyond the policy; warn about the rest.

        Args:
            config: The resumed run's resolved config (`to_dict()`).
            saved: The saved config, if the recipe has already read (and completed) it; None reads config.yaml.
            finished_runs: Runs of this directory that have finished (a fine-tuning grid's records): the run length
                and evaluation schedule may change only while there are none.

        Raises:
            UserError: naming the first field that may not change, its two values, and what may change.
        """
        diffs = config_differences(read_yaml(self.config_file) if saved is None else saved, config)
        allowed = RESUME_MAY_CHANGE + (() if finished_runs else RESUME_MAY_CHANGE_UNTIL_A_RUN_FINISHES)
        added = [key for key, (old, _) in diffs.items() if old is ABSENT]  # fields newer than the run's config.yaml
        for key in added:
            logger.warning(
                "%s: %s is newer than this run's config.yaml; resuming with %r",
                self.path,
                key,
                diffs[key][1],
                extra=MAIN_ONLY,
            )
        refused = [key for key in diffs if key not in allowed and key not in added]
        if refused:
            key = refused[0]
            old, new = diffs[key]
            why = (
                f"{finished_runs} run(s) finished with {old!r}" if key in RESUME_MAY_CHANGE_UNTIL_A_RUN_FINISHES else ""
            )
            raise UserError(
                f"{self.path}: cannot resume with a changed {key} ({old!r} -> {new!r}{'; ' + why if why else ''}): "
                f"a resume may change only {', '.join(allowed)}"
            )
        for key, (old, new) in diffs.items():
            if key not in RESUME_UNLOGGED and key not in added:
                logger.warning("resuming with a changed setting: %s: %r -> %r", key, old, new, extra=MAIN_ONLY)

    def prepare(self, config: dict[str, Any], write_more: Callable[[Path], None] | None = None) -> None:
        """Start a fresh run's directory: clear it, create it, write config.yaml and `write_more(path)`.

        A resumed run's directory is left as it is (a directory without its config.yaml gets one; `record` updates
        it once the resume is accepted). For the main process (roformer.train.launch.run_on_main: the others wait
        and share its outcome).

        Args:
            config: The resolved config to record.
            write_more: Further files of a fresh run (e.g. the tokenizer).
        """
        if self.resume:
            if not self.config_file.is_file():
                self.path.mkdir(parents=True, exist_ok=True)
                write_yaml(self.config_file, config)
            return
        if self.path.exists():
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True)
        write_yaml(self.config_file, config)
        if write_more is not None:
            write_more(self.path)

    def record(self, config: dict[str, Any]) -> None:
        """Rewrite config.yaml with the config a resumed run goes on under, once its checkpoint has been accepted.

        What the resume policy let change (an extended max_steps, a new log_every) is then what a later plain
        `--resume` continues with; a refused resume has not touched the record. For the main process.
        """
        write_yaml(self.config_file, config)


class MetricsWriter:
    """Append-only JSONL: one JSON object per event, flushed at once so a crash loses nothing written."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def write(self, event: dict[str, Any]) -> None:
        """Write one event (numbers, strings, lists; 0-d tensors are converted to Python numbers)."""
        clean = {k: (v.item() if hasattr(v, "item") else v) for k, v in event.items()}
        self._file.write(json.dumps(clean) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        self._file.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def mlm_evaluation_words(event: dict[str, Any]) -> str:
    """A pretraining eval event in words: `eval loss 3.773, masked-token accuracy 35.9% at step 600`."""
    accuracy = f", masked-token accuracy {100 * event['eval_accuracy']:.1f}%" if "eval_accuracy" in event else ""
    return f"eval loss {event['eval_loss']:.3f}{accuracy} at step {event['step']}"


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All events of a metrics.jsonl; a torn last line (a run killed mid-write) is skipped.

    Raises:
        UserError: a malformed line elsewhere, naming the file and line.
    """
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    events = []
    for number, line in enumerate(lines, start=1):
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines):
                raise UserError(f"{path}:{number}: not a JSON line") from None
    return events


def keep_metrics(path: Path, keep: Callable[[dict[str, Any]], bool]) -> None:
    """Drop the events for which `keep` is false (a resumed run writes them again), rewriting the file atomically."""
    if path.is_file():
        events = [e for e in read_metrics(path) if keep(e)]
        atomic_write_text(path, "".join(json.dumps(e) + "\n" for e in events))


def write_model_dir(
    model: Any,
    tokenizer: Tokenizer,
    directory: Path,
    pretraining: dict[str, Any] | None = None,
    write_more: Callable[[Path], None] | None = None,
) -> None:
    """Write a model (`model.save`), its tokenizer and what it was pretrained on into `directory`, all or nothing.

    `write_more` writes further files into the staged directory (a stage folder's optimizer state).
    """
    with staged_output_dir(directory, overwrite=True) as staging:
        model.save(staging)
        save_tokenizer(tokenizer, staging)
        if pretraining is not None:
            (staging / PRETRAINING_FILE).write_text(json.dumps(pretraining, indent=2))
        if write_more is not None:
            write_more(staging)


def pretraining_length(model_dir: Path) -> int | None:
    """The block length a model directory was pretrained at, None when unknown (e.g. an HF checkpoint).

    Read from its pretraining.json or, for the `final/` of a run written before that file, the run's config.yaml.
    """
    record = model_dir / PRETRAINING_FILE
    if record.is_file():
        return json.loads(record.read_text()).get("max_seq_len")
    run_config = model_dir.parent / RUN_CONFIG_FILE
    if model_dir.name == FINAL_DIR and run_config.is_file():
        data = (read_yaml(run_config) or {}).get("data") or {}
        return data.get("max_seq_len") if isinstance(data, dict) else None
    return None
