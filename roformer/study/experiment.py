"""`roformer experiment --config configs/experiments/rope-vs-bert-<size>.yaml`: both arms, several seeds, compared.

Every arm is a pretraining config; the experiment runs each (arm, seed) into `<out>/<arm>-seed<k>/` and then
`roformer compare` into `<out>/compare/`. What makes it a controlled comparison:

- the arms' `data` and `train` sections must be identical (checked), so both see the same corpus, tokenizer (one
  cache entry), batch order and masks for a given seed; `vary: [data.jieba]` (or another tokenization field) lets
  arms read the corpus with other tokenizers, and their MLM losses are then set apart (roformer.study.compare);
- their models may differ only in position-encoding fields (checked; `vary` names other model fields under
  comparison, e.g. `attention`), and with the same seed they start from the same initial weights wherever the
  parameters coincide (every parameter, for rotary vs fixed sinusoidal);
- the seed of run k is `seeds[k]` for every arm;
- the order of the arms alternates between seeds, so one-time warm-up costs do not always hit the same arm.

Optional stages after pretraining: `glue:` fine-tunes every final model on the tasks of a `roformer glue` suite
(into `<out>/glue/<arm>-seed<k>/<task>/`), `length:` evaluates every final model at several lengths
(`<run>/length_extrapolation.json`). Then `<out>/compare/` and `<out>/report.md` (roformer.study.report): curves,
steps-to-target, GLUE and length tables with intervals over seeds, and the exact command and configs.

The config is a roformer.study.experiment_config.PretrainExperimentConfig; a file with `tasks:` is a task study
instead (a TaskStudyConfig, run by roformer.study.task_study).

Resumable at every stage: a run with a `final/` is done and skipped, a started run continues from its last
checkpoint (exactly, see roformer.train.pretrain), a missing one starts; finished GLUE tasks and length files are
kept, a started GLUE grid resumes; the comparison and the report are redone at the end.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from roformer.config import load
from roformer.config_paths import config_file, config_path
from roformer.config_yaml import read_yaml
from roformer.errors import ConfigError, UserError, naming
from roformer.files import check_output_dir
from roformer.model.config import position_fields
from roformer.model.weights import WEIGHTS_FILE
from roformer.study.compare import compare
from roformer.study.experiment_config import (
    TOKENIZATION_FIELDS,
    LengthStage,
    PretrainExperimentConfig,
    ProbeStage,
    TaskStudyConfig,
    load_experiment_config,
)
from roformer.study.length_eval import default_device, evaluate_lengths, write_results
from roformer.study.outputs import COMPARE_DIR, GLUE_DIR
from roformer.study.probes import haystack_documents, mlm_key_ids, run_probe
from roformer.study.report import write_report
from roformer.study.runs import PretrainRun, check_same_vocabulary, load_runs
from roformer.study.suite import load_suite, run_suite
from roformer.study.task_study import check_task_runs, load_task_arms, run_task_study
from roformer.tasks.build import make_task
from roformer.train.config import PretrainConfig
from roformer.train.launch import check_run_settings, process_state, run_on_main
from roformer.train.pretrain import build_data, pretrain
from roformer.train.run_dir import (
    FINAL_DIR,
    LENGTH_FILE,
    METRICS_FILE,
    PROBES_DIR,
    RUN_CONFIG_FILE,
    RunDir,
    mlm_evaluation_words,
    read_metrics,
)

logger = logging.getLogger(__name__)

# Model fields an arm may change: the position encoding and what belongs to it (marked on ModelConfig's fields).
POSITION_FIELDS = frozenset(position_fields())


def load_experiment(
    path: str | Path, overrides: list[str] | None = None
) -> tuple[PretrainExperimentConfig | TaskStudyConfig, dict[str, Any]]:
    """The experiment config, of its kind, and each arm's resolved config (label set to the arm's name).

    A pretraining experiment's arms are {arm: its pretraining config}; a task study's (`tasks:`, a TaskStudyConfig)
    are {task: {arm: its fine-tuning config}} (roformer.study.task_study.load_task_arms).

    Raises:
        ConfigError: a bad experiment or arm config, or arms that differ in more than the position encoding and the
            fields named in `vary`.
    """
    path = Path(path)
    experiment = load_experiment_config(path)  # the kind its keys say: a task study with `tasks:`
    if isinstance(experiment, TaskStudyConfig):  # {task: {arm: its fine-tuning config}}
        return experiment, load_task_arms(experiment, path, overrides)
    arms = {}
    for label, arm in experiment.arms.items():
        config = load(
            PretrainConfig,
            config_file(path.parent, arm.config, "pretrain"),
            arm.set + experiment.overrides + list(overrides or []),
        )
        arms[label] = replace(config, label=label)
    check_controlled(arms, str(path), set(experiment.vary))
    return experiment, arms


def check_controlled(arms: dict[str, PretrainConfig], source: str, vary: set[str] | None = None) -> None:
    """Arms must share data and train sections and differ in the model only in position-encoding fields.

    `vary` names the other fields that may differ: model fields by name, tokenization fields as `data.<field>`.

    Raises:
        ConfigError: naming the first arm and field that differ.
    """
    (first_label, first), *rest = arms.items()
    reference = first.to_dict()
    for label, config in rest:
        other = config.to_dict()
        for section in ("data", "train"):
            for key in reference[section]:
                if f"{section}.{key}" in (vary or set()):
                    continue
                if reference[section][key] != other[section][key]:
                    raise ConfigError(
                        f"{source}: arms {first_label!r} and {label!r} differ in {section}.{key} "
                        f"({reference[section][key]!r} vs {other[section][key]!r}); only the position encoding may "
                        "(and the fields named in vary)"
                    )
        if reference.get("init") != other.get("init"):
            raise ConfigError(f"{source}: arms {first_label!r} and {label!r} start from different init models")
        if reference.get("stages") != other.get("stages") and "stages" not in (vary or set()):
            raise ConfigError(
                f"{source}: arms {first_label!r} and {label!r} differ in stages; only the position encoding may "
                "(and the fields named in vary)"
            )
        allowed = POSITION_FIELDS | (vary or set())
        for key in reference["model"]:
            if key not in allowed and reference["model"][key] != other["model"][key]:
                raise ConfigError(
                    f"{source}: arms {first_label!r} and {label!r} differ in model.{key}; only position-encoding "
                    f"fields may differ ({', '.join(sorted(POSITION_FIELDS))}) and those named in vary"
                )


def arm_run_path(out: Path, label: str, seed: int) -> Path:
    """Where the pretraining run of an arm and seed lives: `<out>/<label>-seed<seed>/`."""
    return out / f"{label}-seed{seed}"


def run_experiment(
    path: str | Path, out: str | Path, overrides: list[str] | None = None, compare_only: bool = False
) -> dict[str, Any]:
    """Run (or continue) every arm and seed and the optional stages, then compare and report; returns the summary.

    Raises:
        UserError: `compare_only` for a pretraining experiment (its comparison runs at its end, `roformer compare`
            reads runs), or for a task study with no run yet.
    """
    path, out = Path(path), Path(out)
    check_output_dir(out, overwrite=False, resume=True)  # an experiment continues what its directory holds
    experiment, arms = load_experiment(path, overrides)
    if compare_only and not isinstance(experiment, TaskStudyConfig):
        raise UserError(f"{path}: --compare-only is for a task study (tasks:); `roformer compare RUN...` reads runs")
    if compare_only and not out.is_dir():
        raise UserError(f"{out}: no such directory: --compare-only tabulates the runs of a study that has started")
    if isinstance(experiment, TaskStudyConfig):
        if not compare_only:
            check_task_runs(arms)  # every arm, before the first trains
        out.mkdir(parents=True, exist_ok=True)
        return run_task_study(experiment, path, out, overrides, compare_only=compare_only)
    check_stage_inputs(experiment, path, arms)  # before hours of pretraining
    out.mkdir(parents=True, exist_ok=True)
    runs = pretrain_arms(experiment, arms, out)
    glue_dirs = finetune_runs(experiment, path, runs, out) if experiment.glue is not None else []
    if experiment.length is not None:
        run_on_main(lambda: evaluate_run_lengths(experiment.length, runs))
    probe_files = run_on_main(lambda: probe_runs(experiment.probes, path, runs)) if experiment.probes else []
    results = glue_dirs + (probe_files or [])  # each run's fine-tuning folders and probe files
    if not _is_main_process():
        return {}
    summary = compare(
        runs + results, out / COMPARE_DIR, baseline=experiment.baseline, targets=experiment.targets, overwrite=True
    )
    for name, comparison in experiment.comparisons.items():
        mine = [run for run in runs if _label_of(run) in comparison.arms]
        theirs = [result for result in results if _label_of(_run_of(result)) in comparison.arms]
        compare(mine + theirs, out / f"{COMPARE_DIR}-{name}", baseline=comparison.baseline, overwrite=True)
    write_report(out, path, experiment, arms, list(overrides or []))
    return summary


def check_stage_inputs(experiment: PretrainExperimentConfig, path: Path, arms: dict[str, PretrainConfig]) -> None:
    """What the stages after pretraining read, checked before the first arm trains instead of after hours of it.

    GLUE: every task config loads with the stage's overrides, its run settings are accepted and its data files are
    read and checked as its run will read them (tokenizing waits for the pretrained tokenizer). Probes: the haystack
    folder holds text, and passkey-mlm's ten digits are tokens of every arm's tokenizer (made now as the first run of
    that tokenization makes it; its run then finds it in the data cache).

    Raises:
        UserError: naming the stage, and the task, file or arm at fault.
    """
    if experiment.glue is not None:
        stage = experiment.glue
        extra = [f"data.glue_dir={config_path(path.parent, stage.glue_dir)}"] if stage.glue_dir is not None else []
        _, configs = load_suite(config_file(path.parent, stage.suite, "glue"), stage.overrides + extra)
        for config in configs:
            with naming(f"glue: task {config.data.task}"):
                check_run_settings(config.train)
                make_task(replace(config.data, jieba=bool(config.data.jieba)))
    if experiment.probes is not None:
        stage = experiment.probes
        with naming("probes.haystack"):
            haystack_documents(str(config_path(path.parent, stage.haystack)) if stage.haystack else None)
        if "passkey-mlm" in stage.probes:
            tokenizations: dict[tuple, tuple[str, PretrainConfig]] = {}  # the first arm of each tokenization
            for label, arm in arms.items():
                tokenizations.setdefault(tuple(getattr(arm.data, f) for f in TOKENIZATION_FIELDS), (label, arm))
            for label, arm in tokenizations.values():
                with naming(f"probes: passkey-mlm on arm {label!r}"):
                    mlm_key_ids(build_data(arm.data).tokenizer)


def _run_of(result: Path) -> Path:
    """The run folder a result belongs to: `<out>/glue/<run>/<task>` or `<out>/<run>/probes/<file>.json`."""
    return result.parent.parent if result.is_file() else result.parent


def _label_of(run: Path) -> str:
    """The arm of a pretraining run directory (or of its GLUE folder, `<out>/glue/<run>/`): `<label>-seed<k>`."""
    return run.name.rpartition("-seed")[0]


def pretrain_arms(experiment: PretrainExperimentConfig, arms: dict[str, PretrainConfig], out: Path) -> list[Path]:
    """Every (arm, seed) pretraining run, done, resumed or started; returns their directories."""
    runs = []
    for index, seed in enumerate(experiment.seeds):
        # Alternate the arm order between seeds: the first run in a process pays one-time warm-up costs (thread
        # pools, kernel selection), which would otherwise always land on the same arm's wall-clock.
        order = list(arms.items()) if index % 2 == 0 else list(reversed(arms.items()))
        for label, arm in order:
            config = replace(arm, train=replace(arm.train, seed=seed))  # the arm's config stays as loaded
            directory = arm_run_path(out, label, seed)
            runs.append(directory)
            if (directory / FINAL_DIR / WEIGHTS_FILE).is_file():
                logger.info("%s: done, skipped", directory)
                continue
            resume = RunDir.started(directory)
            logger.info("%s: %s", directory, "resuming" if resume else "starting")
            pretrain(config, directory, resume=resume, overwrite=not resume)
            logger.info("%s: finished: %s", directory, final_evaluation(directory))
            # one tokenization, one tokenizer: every process stops at the first run that disagrees
            run_on_main(lambda: check_tokenizers(load_runs(runs)[0], arms))
    return runs


def final_evaluation(run: Path) -> str:
    """A pretraining run's last evaluation in words (what its arm's line says when it ends)."""
    metrics = run / METRICS_FILE
    events = read_metrics(metrics) if metrics.is_file() else []
    evals = [e for e in events if e.get("event") == "eval" and "eval_loss" in e]
    return mlm_evaluation_words(evals[-1]) if evals else "no evaluation"


def check_tokenizers(runs: list[PretrainRun], arms: dict[str, PretrainConfig]) -> None:
    """Runs of arms with the same tokenization fields must have made the same tokenizer (vocabulary hash).

    Raises:
        UserError: naming two such runs whose vocabularies differ (a changed cache, an unpinned tokenizer file).
    """
    key = {label: tuple(getattr(arm.data, name) for name in TOKENIZATION_FIELDS) for label, arm in arms.items()}
    for tokenization in set(key.values()):
        check_same_vocabulary([run for run in runs if key.get(run.label) == tokenization])


def finetune_runs(experiment: PretrainExperimentConfig, path: Path, runs: list[Path], out: Path) -> list[Path]:
    """The GLUE suite on every run's final model (`<out>/glue/<run>/<task>/`); returns the task directories."""
    stage = experiment.glue
    task_dirs = []
    for directory in runs:
        label = read_yaml(directory / RUN_CONFIG_FILE)["label"]
        target = out / GLUE_DIR / directory.name
        extra = [f"init={directory / FINAL_DIR}", f"label={label}"]
        if stage.glue_dir is not None:
            extra.append(f"data.glue_dir={config_path(path.parent, stage.glue_dir)}")
        logger.info("%s: GLUE suite %s", target, stage.suite)
        results = run_suite(
            config_file(path.parent, stage.suite, "glue"), target, stage.overrides + extra, resume=target.exists()
        )
        task_dirs += [target / task for task in results] if results else []
    return task_dirs


def probe_runs(stage: ProbeStage, path: Path, runs: list[Path]) -> list[Path]:
    """Probe every run's final model with each probe and scaling (`roformer probe`; a file there is kept)."""
    haystack = str(config_path(path.parent, stage.haystack)) if stage.haystack else None
    files = []
    for directory in runs:
        rotary = read_yaml(directory / RUN_CONFIG_FILE)["model"].get("position_encoding") == "rotary"
        for probe in stage.probes:
            for scaling in stage.scalings if rotary else ["none"]:
                target = directory / PROBES_DIR / f"{probe}-{scaling}.json"
                files.append(target)
                if target.is_file():
                    continue
                logger.info("%s: probe %s (%s) at lengths %s", directory, probe, scaling, stage.lengths)
                target.parent.mkdir(exist_ok=True)
                run_probe(directory / FINAL_DIR, stage.settings(probe, scaling, haystack), target)
    return files


def evaluate_run_lengths(stage: LengthStage, runs: list[Path]) -> None:
    """eval-mlm of every run's final model at the stage's lengths (a run that has its file is kept)."""
    device = default_device()
    for directory in runs:
        target = directory / LENGTH_FILE
        if target.is_file():
            continue
        logger.info("%s: evaluating at lengths %s", directory, stage.seq_lens)
        results = evaluate_lengths(directory / FINAL_DIR, directory, stage.settings(), device)
        write_results(target, directory / FINAL_DIR, results)


def _is_main_process() -> bool:
    return process_state().is_main_process
