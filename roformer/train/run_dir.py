"""Run directories: every file name in one place, the metrics log, and the model + tokenizer writer.

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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from roformer.data.tokenizer import save_tokenizer
from roformer.errors import UserError
from roformer.files import atomic_write_text, staged_output_dir

RUN_CONFIG_FILE = "config.yaml"  # the fully resolved config of a run (a model directory has model.yaml instead)
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS_DIR = "checkpoints"
TRAINER_STATE_FILE = "trainer_state.json"  # inside a checkpoint: step, counters, data position
FINAL_DIR = "final"
TOKENIZER_DIR = "tokenizer"
RESULTS_FILE = "results.json"  # fine-tuning: dev metrics per run and per learning rate
PREDICTIONS_DIR = "predictions"
SUBMISSION_DIR = "submission"
BEST_DIR = "best"
CANDIDATES_DIR = ".candidates"  # fine-tuning: the best model so far of each learning rate
PROGRESS_DIR = ".progress"  # fine-tuning: finished runs' records and the running one's checkpoints (for --resume)
PRETRAINING_FILE = "pretraining.json"  # in a pretrained model directory: the block length and vocabulary it saw
LENGTH_FILE = "length_extrapolation.json"  # written by roformer eval-mlm next to a run's final/


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


def pretraining_summary(run: Path) -> str:
    """One line for the console at the end of `roformer pretrain`: the final evaluation, the run's pace, the model."""
    events = read_metrics(run / METRICS_FILE)
    evals = [e for e in events if e.get("event") == "eval"]
    trains = [e for e in events if e.get("event") == "train"]
    lines = []
    if evals:
        last = evals[-1]
        accuracy = f", masked-token accuracy {100 * last['eval_accuracy']:.1f}%" if "eval_accuracy" in last else ""
        lines.append(f"final eval loss {last['eval_loss']:.3f}{accuracy} at step {last['step']}")
    if trains:
        last = trains[-1]
        seconds = last.get("elapsed_sec") or 0.0
        rate = last.get("tokens_seen", 0) / seconds if seconds else 0.0
        lines.append(f"{last['step']} steps in {seconds / 60:.1f} min, {last.get('tokens_seen', 0):,} tokens "
                     f"({rate:,.0f} tokens/s)")  # fmt: skip
    lines.append(f"model: {run / FINAL_DIR} (roformer.load, roformer convert --to-hf)")
    return "pretraining finished: " + "; ".join(lines)


def keep_metrics(path: Path, keep: Callable[[dict[str, Any]], bool]) -> None:
    """Drop the events for which `keep` is false (a resumed run writes them again), rewriting the file atomically."""
    if path.is_file():
        events = [e for e in read_metrics(path) if keep(e)]
        atomic_write_text(path, "".join(json.dumps(e) + "\n" for e in events))


def write_model_dir(model: Any, tokenizer: Any, directory: Path, pretraining: dict[str, Any] | None = None) -> None:
    """Write a model (`model.save`), its tokenizer and what it was pretrained on into `directory`, all or nothing."""
    with staged_output_dir(directory, overwrite=True) as staging:
        model.save(staging)
        save_tokenizer(tokenizer, staging)
        if pretraining is not None:
            (staging / PRETRAINING_FILE).write_text(json.dumps(pretraining, indent=2))


def pretraining_length(model_dir: Path) -> int | None:
    """The block length a model directory was pretrained at, None when unknown (e.g. an HF checkpoint).

    Read from its pretraining.json or, for the `final/` of a run written before that file, the run's config.yaml.
    """
    record = model_dir / PRETRAINING_FILE
    if record.is_file():
        return json.loads(record.read_text()).get("max_seq_len")
    run_config = model_dir.parent / RUN_CONFIG_FILE
    if model_dir.name == FINAL_DIR and run_config.is_file():
        from roformer.config import read_yaml

        data = (read_yaml(run_config) or {}).get("data") or {}
        return data.get("max_seq_len") if isinstance(data, dict) else None
    return None


def config_differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """`key: old -> new` for every dotted key whose value differs between two nested configs."""
    diffs = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs += config_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            diffs.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return diffs


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten a nested config for trackers (which want scalar hyperparameters)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flat_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, int | float | str | bool) else str(value)
    return out
