"""Reading finished run directories, without torch.

Pretraining runs (metrics.jsonl, config.yaml, tokenization.json, eval-mlm results) and GLUE runs (results.json; a
`roformer glue` suite folder stands for its task runs); runs sharing a label form an arm (its seeds).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roformer.config_yaml import read_yaml
from roformer.errors import UserError
from roformer.files import read_json
from roformer.train.run_dir import (
    FINAL_DIR,
    LENGTH_FILE,
    METRICS_FILE,
    RESULTS_FILE,
    RUN_CONFIG_FILE,
    TOKENIZATION_FILE,
    read_metrics,
)

# The data fields that decide which tokens an eval loss is measured on and how they are masked: runs that differ in
# any of them are scored on different tests (roformer compare says so).
EVAL_SETUP = (
    "source",
    "paths",
    "validation_paths",
    "validation_fraction",
    "split_seed",
    "max_seq_len",
    "eval_mask_rate",  # a run written before it existed evaluated at its mask_rate (read so)
    "whole_word_mask",
    "eval_mask_seed",
    "max_eval_blocks",
)


@dataclass
class PretrainRun:
    """The metrics of one pretraining run."""

    path: Path
    label: str
    position_encoding: str
    train: list[dict[str, Any]]
    eval: list[dict[str, Any]]
    lengths: list[dict[str, Any]] = field(default_factory=list)  # roformer eval-mlm results, when present
    vocab_hash: str | None = None  # data.vocab_hash of config.yaml (None: a run from before the hash was recorded)
    seed: int | None = None  # train.seed of config.yaml
    eval_setup: dict[str, Any] = field(default_factory=dict)  # what defines the eval set and its mask (EVAL_SETUP)
    tokenization: dict[str, Any] | None = None  # tokenization.json: tokens per character of its training text


@dataclass
class GlueRun:
    """The results.json of one fine-tuning run."""

    path: Path
    label: str
    task: str
    results: dict[str, Any]
    pretraining_seed: int | None = None  # train.seed of the pretraining run whose final/ was fine-tuned, if known


@dataclass
class Arm:
    """An arm as run: the pretraining runs (its seeds) sharing a label (what made them: experiment_config.ArmSpec)."""

    label: str
    position_encoding: str
    runs: list[PretrainRun] = field(default_factory=list)


def load_runs(paths: list[str | Path]) -> tuple[list[PretrainRun], list[GlueRun]]:
    """Read run directories: pretraining runs (metrics.jsonl with eval events) and GLUE runs (results.json).

    A `roformer glue` suite folder stands for its task runs.

    Raises:
        UserError: a directory that is neither, a pretraining run without evaluations, a damaged results file.
    """
    pretrain, glue = [], []
    for raw in paths:
        path = Path(raw)
        if (path / RESULTS_FILE).is_file():
            glue.extend(_load_glue_runs(path))
        elif (path / METRICS_FILE).is_file():
            pretrain.append(_load_pretrain_run(path))
        else:
            raise UserError(f"{path}: not a run directory (no {METRICS_FILE} or {RESULTS_FILE})")
    return pretrain, glue


def _load_glue_runs(path: Path) -> list[GlueRun]:
    """A fine-tuning run, or the task runs of a `roformer glue` suite folder.

    A suite's results.json is keyed by task name, and each task's run is in the folder of that name.

    Raises:
        UserError: a results.json that is neither, a task without its folder, a damaged file; each named.
    """
    results = _read_results(path / RESULTS_FILE)
    if "task" in results:
        return [_glue_run(path, results)]
    if not results:
        raise UserError(f"{path / RESULTS_FILE}: neither a fine-tuning run's results (no task) nor a suite's")
    runs = []
    for task in results:
        run = _read_results(path / task / RESULTS_FILE)
        if "task" not in run:
            raise UserError(
                f"{path / task / RESULTS_FILE}: not a fine-tuning run's results (no task), though the "
                f"suite's {path / RESULTS_FILE} lists {task!r}"
            )
        runs.append(_glue_run(path / task, run))
    return runs


def _glue_run(path: Path, results: dict[str, Any]) -> GlueRun:
    init = results.get("init") or ""
    label = results.get("label") or _label_from_init(init)
    return GlueRun(path, label, results["task"], results, _seed_of_init(init))


def _read_results(file: Path) -> dict[str, Any]:
    """A results.json as a dict (one-line errors for a missing, damaged or non-object file)."""
    if not file.is_file():
        raise UserError(f"{file}: missing")
    results = read_json(file)
    if not isinstance(results, dict):
        raise UserError(f"{file}: expected a JSON object, got {type(results).__name__}")
    return results


def _load_pretrain_run(path: Path) -> PretrainRun:
    events = read_metrics(path / METRICS_FILE)
    train = [e for e in events if e.get("event", "train") == "train" and "loss" in e]
    evals = [e for e in events if "eval_loss" in e]
    if not evals:
        raise UserError(f"{path}: {METRICS_FILE} has no eval events (eval_loss)")
    config = read_yaml(path / RUN_CONFIG_FILE) if (path / RUN_CONFIG_FILE).is_file() else {}
    model = (config or {}).get("model") or {}
    encoding = model.get("position_encoding", "unknown") if isinstance(model, dict) else "unknown"
    label = (config or {}).get("label") or encoding
    data = (config or {}).get("data") or {}
    digest = data.get("vocab_hash") if isinstance(data, dict) else None
    lengths = []
    if (path / LENGTH_FILE).is_file():
        results = read_json(path / LENGTH_FILE).get("results", [])
        # the model as trained: rows of `eval-mlm --rope-scaling` with other tables are a study of their own (files
        # written before rows said `as_trained`: the rows without a scaling method)
        as_trained = [r for r in results if r.get("as_trained", r.get("rope_scaling", "none") == "none")]
        first: dict[int, dict[str, Any]] = {}  # one row per length: `none`, `linear x1`, `ntk x1` are one model
        for row in as_trained:
            first.setdefault(row["seq_len"], row)
        lengths = list(first.values())
    setup = {key: data.get(key) for key in EVAL_SETUP} if isinstance(data, dict) else {}
    if setup and setup["eval_mask_rate"] is None:  # before eval_mask_rate: the eval mask was at the training rate
        setup["eval_mask_rate"] = data.get("mask_rate")
    tokenization = read_json(path / TOKENIZATION_FILE) if (path / TOKENIZATION_FILE).is_file() else None
    seed = _train_seed(config)
    return PretrainRun(path, str(label), str(encoding), train, evals, lengths, digest, seed, setup, tokenization)


def first_reaching(evals: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first eval event with eval_loss <= target (events in step order), or None."""
    for event in sorted(evals, key=lambda e: e["step"]):
        if event["eval_loss"] <= target:
            return event
    return None


def check_same_vocabulary(runs: list[PretrainRun]) -> None:
    """Refuse runs trained with different tokenizers: their per-token MLM losses measure different things.

    Raises:
        UserError: naming two runs whose vocabulary hashes differ.
    """
    hashed = [r for r in runs if r.vocab_hash is not None]
    for run in hashed[1:]:
        if run.vocab_hash != hashed[0].vocab_hash:
            raise UserError(
                f"{hashed[0].path} and {run.path} were trained with different tokenizers (vocabulary hash "
                f"{hashed[0].vocab_hash} vs {run.vocab_hash}): their MLM losses are not comparable"
            )


def check_one_vocabulary_per_arm(runs: list[PretrainRun]) -> None:
    """Refuse an arm whose runs (its seeds) were trained with different tokenizers; arms may differ from each other.

    Raises:
        UserError: naming two runs of one arm whose vocabulary hashes differ.
    """
    for arm in group_arms(runs):
        check_same_vocabulary(arm.runs)


def _init_run_config(init: str) -> dict[str, Any] | None:
    """The config.yaml of the pretraining run whose final/ is `init`; None for a hub id or another model folder."""
    model = Path(init)
    config = model.parent / RUN_CONFIG_FILE
    if not init or model.name != FINAL_DIR or not config.is_file():
        return None
    loaded = read_yaml(config)
    return loaded if isinstance(loaded, dict) else None


def _seed_of_init(init: str) -> int | None:
    config = _init_run_config(init)
    return _train_seed(config) if config else None


def _train_seed(config: Any) -> int | None:
    """`train.seed` of a parsed run config.yaml, None where it has none."""
    train = (config or {}).get("train") if isinstance(config, dict) else None
    return train.get("seed") if isinstance(train, dict) else None


def glue_columns(run: GlueRun) -> dict[str, str]:
    """{dev split: table column}: the task, or GLUE's names for a task with several dev splits (mnli-m, mnli-mm)."""
    summary = run.results["summary"]
    if len(summary) == 1:
        return {split: run.task for split in summary}
    return {
        s: {"dev_matched": f"{run.task}-m", "dev_mismatched": f"{run.task}-mm"}.get(s, f"{run.task}-{s}")
        for s in summary
    }


def run_key(record: dict[str, Any]) -> int | str:
    """What pairs a fine-tuning run with another job's: its seed, or `seed0-fold3` in a cross-validated task."""
    return record["seed"] if "fold" not in record else f"seed{record['seed']}-fold{record['fold']}"


def glue_seed_scores(run: GlueRun) -> dict[str, dict[int | str, float]]:
    """{column: {run key (seed, and fold): dev score}} at the selected learning rate ({} for results without runs)."""
    if "selected" not in run.results or "runs" not in run.results:
        return {}
    lr = run.results["selected"]["peak_lr"]
    chosen = [r for r in run.results["runs"] if r["peak_lr"] == lr]
    columns = glue_columns(run).items()
    return {column: {run_key(r): r["dev"][split]["score"] for r in chosen} for split, column in columns}


def _label_from_init(init: str) -> str:
    """The label of the pretraining run whose final/ was fine-tuned (its config.yaml), else its folder's name.

    A hub id or another model folder: the model's name.
    """
    label = (_init_run_config(init) or {}).get("label")
    if label:
        return str(label)
    model = Path(init)
    return (model.parent.name if model.name == FINAL_DIR else model.name) or init


def group_arms(runs: list[PretrainRun]) -> list[Arm]:
    """Arms in order of first appearance."""
    arms: dict[str, Arm] = {}
    for run in runs:
        arms.setdefault(run.label, Arm(run.label, run.position_encoding)).runs.append(run)
    return list(arms.values())


def tokens_at(run: PretrainRun, step: int) -> float | None:
    """tokens_seen at `step` (from the train event of that step, else proportional to the nearest one)."""
    events = [e for e in run.train if "tokens_seen" in e]
    for e in events:
        if e["step"] == step:
            return float(e["tokens_seen"])
    if not events:
        return None
    nearest = min(events, key=lambda e: abs(e["step"] - step))
    return nearest["tokens_seen"] * step / nearest["step"]


def arm_label(model_dir: Path) -> tuple[str, int | None]:
    """(the arm label, the seed) of a pretraining run's `final/` (its config.yaml), else (the folder's name, None)."""
    config = model_dir / ".." / RUN_CONFIG_FILE
    if model_dir.name == FINAL_DIR and config.is_file():
        saved = read_yaml(config) or {}
        label = saved.get("label") or (saved.get("model") or {}).get("position_encoding") or model_dir.parent.name
        return str(label), (saved.get("train") or {}).get("seed")
    return model_dir.name, None


def read_probe_file(path: Path) -> dict[str, Any] | None:
    """The results `roformer probe --out` wrote, or None when `path` is not such a file (a run directory).

    Raises:
        UserError: a .json file that is damaged or not a probe's results.
    """
    if not (path.is_file() and path.suffix == ".json"):
        return None
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not readable as JSON ({e})") from None
    if not isinstance(result, dict) or "probe" not in result or not isinstance(result.get("rows"), list):
        raise UserError(f"{path}: not the results of roformer probe (no probe and rows)")
    return result


def run_seconds(directory: Path) -> float:
    """How long a run trained: the largest `elapsed_sec` of its metrics.jsonl events (a resumed run's count goes on)."""
    return max((e.get("elapsed_sec", 0.0) for e in read_metrics(directory / METRICS_FILE)), default=0.0)
