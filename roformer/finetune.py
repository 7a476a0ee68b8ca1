"""GLUE fine-tuning recipe: `roformer finetune --config configs/glue/<task>.yaml`, and the suite `roformer glue`.

One config fine-tunes one task for every learning rate of `train.lrs` (or `train.lr`) and every seed of
`train.seeds` (or `train.seed`), keeping each run's best dev checkpoint. A run directory holds:

    config.yaml       the resolved config
    metrics.jsonl     train and eval events of every run (with `peak_lr` and `seed`)
    results.json      per run: dev metrics of the best checkpoint and its step; per learning rate: mean, std,
                      median and max over seeds; the selected learning rate (best mean dev score)
    predictions/      per run: dev predictions (index, prediction, label) and test predictions
    submission/       the GLUE server's files (SST-2.tsv, MNLI-m.tsv, AX.tsv, ...) of the selected run
    best/             the selected run's model + tokenizer (roformer.load-able)

The selected run is the best seed of the learning rate with the best mean dev score.

Batches follow the pretraining recipe: step `s` trains on positions [s*G, (s+1)*G) of seeded per-epoch
permutations, every global batch full, so one process and several give the same steps. Evaluation shards the
examples across processes without padding or duplicates and gathers the predictions, so its metrics equal one
process's exactly.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch

from roformer.config import (
    ConfigError,
    apply_overrides,
    check_types,
    from_dict,
    read_mapping,
    read_yaml,
    resolve_paths,
    write_yaml,
)
from roformer.errors import UserError
from roformer.glue_tasks import Example, Task, get_task, read_files, read_glue_dir, read_hub
from roformer.metrics import compute
from roformer.model import Model, SequenceClassifier
from roformer.tokenizer import load_tokenizer, save_tokenizer
from roformer.training import (
    CONFIG_FILE,
    METRICS_FILE,
    EpochSampler,
    MetricsWriter,
    finish_micro_step,
    flat_config,
    make_accelerator,
    make_optimizer,
    process_state,
    share,
)
from roformer.utils import check_output_dir, staged_output_dir

logger = logging.getLogger(__name__)

RESULTS_FILE = "results.json"
SUBMISSION_DIR = "submission"
PREDICTIONS_DIR = "predictions"
BEST_DIR = "best"


@dataclass
class GlueDataConfig:
    """Where the task's examples come from.

    Attributes:
        task: cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte or wnli.
        source: `glue_dir` (official TSV layout), `hub` (datasets) or `files` (local csv/tsv/json/jsonl).
        glue_dir: The GLUE directory (holding CoLA/, SST-2/, ...); relative to the config file.
        hub_name: The hub dataset for `hub`.
        train_file: `files`: the training file (text columns named as on the hub, e.g. sentence1/sentence2).
        validation_file: `files`: the dev file.
        test_file: `files`: an unlabelled test file (optional).
        text_columns: `files`: the text column names, if not the hub's.
        label_column: `files`: the label column (names or ids).
        max_length: Tokens per example (pair) including specials; capped by a learned position table.
        max_train_examples: Use only the first N training examples (quick runs).
        max_eval_examples: Use only the first N examples of each dev/test split.
    """

    task: str = ""
    source: Literal["glue_dir", "hub", "files"] = "glue_dir"
    glue_dir: str | None = None
    hub_name: str = "nyu-mll/glue"
    train_file: str | None = None
    validation_file: str | None = None
    test_file: str | None = None
    text_columns: list[str] | None = None
    label_column: str = "label"
    max_length: int = 512
    max_train_examples: int | None = None
    max_eval_examples: int | None = None

    def __post_init__(self) -> None:
        check_types(self)
        if not self.task:
            raise ConfigError("task is required (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli)")
        get_task(self.task)
        if self.source == "glue_dir" and not self.glue_dir:
            raise ConfigError("source: glue_dir needs glue_dir")
        if self.source == "files" and not (self.train_file and self.validation_file):
            raise ConfigError("source: files needs train_file and validation_file")
        if self.max_length < 8:
            raise ConfigError(f"max_length must be >= 8, got {self.max_length}")


@dataclass
class FinetuneTrainConfig:
    """Optimisation and evaluation of each fine-tuning run (BERT's recipe by default: 3 epochs, batch 32).

    Attributes:
        epochs: Training epochs (fractional allowed); ignored when max_steps is set.
        max_steps: Optimizer steps (overrides epochs); 0 = evaluate the initial model only.
        lr: Peak learning rate (when lrs is empty).
        lrs: A learning-rate grid: one run per lr and seed, the lr selected by mean dev score.
        batch_size: Examples per device per micro-batch.
        grad_accum: Micro-batches per optimizer step.
        seed: The seed (when seeds is empty).
        seeds: One fine-tune per seed (head init, data order, dropout).
        warmup_fraction: Linear warmup as a fraction of the steps, then linear decay to 0.
        weight_decay: AdamW decay on >= 2-D weights.
        adam_beta1: AdamW beta1.
        adam_beta2: AdamW beta2.
        adam_eps: AdamW epsilon.
        max_grad_norm: Gradient clipping; null = none.
        mixed_precision: `no`, `bf16` or `fp16` (GPU).
        eval_every: Evaluate every N steps; 0 = at the end of every epoch (and at the last step).
        eval_batch_size: Examples per device in evaluation; null = 2 x batch_size.
        log_every: Steps between train events.
        report_to: accelerate trackers besides metrics.jsonl.
        progress: tqdm progress bars.
    """

    epochs: float = 3.0
    max_steps: int | None = None
    lr: float = 2e-5
    lrs: list[float] = field(default_factory=list)
    batch_size: int = 32
    grad_accum: int = 1
    seed: int = 0
    seeds: list[int] = field(default_factory=list)
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-6
    max_grad_norm: float | None = 1.0
    mixed_precision: Literal["no", "bf16", "fp16"] = "no"
    eval_every: int = 0
    eval_batch_size: int | None = None
    log_every: int = 50
    report_to: list[str] = field(default_factory=list)
    progress: bool = True

    def __post_init__(self) -> None:
        check_types(self)
        if self.epochs <= 0 and self.max_steps is None:
            raise ConfigError(f"epochs must be > 0, got {self.epochs}")
        if self.max_steps is not None and self.max_steps < 0:
            raise ConfigError(f"max_steps must be >= 0, got {self.max_steps}")
        for name in ("batch_size", "grad_accum", "log_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if any(lr <= 0 for lr in self.lrs + [self.lr]):
            raise ConfigError("learning rates must be > 0")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ConfigError(f"warmup_fraction must be in [0, 1), got {self.warmup_fraction}")

    @property
    def grid(self) -> list[tuple[float, int]]:
        """(peak lr, seed) of every run, in order."""
        return [(lr, seed) for lr in (self.lrs or [self.lr]) for seed in (self.seeds or [self.seed])]


@dataclass
class FinetuneConfig:
    """A fine-tuning job: `init` (the model to start from), `data`, `train`, ModelConfig overrides in `model`.

    `init` is a `final/` of `roformer pretrain`, any `roformer.load`-able directory, or an HF `save_pretrained`
    directory (converted with `from_hf`); it must hold a tokenizer. `model` changes fields such as hidden_dropout
    or classifier_dropout (num_labels comes from the task).
    """

    init: str = ""
    data: GlueDataConfig = field(default_factory=GlueDataConfig)
    train: FinetuneTrainConfig = field(default_factory=FinetuneTrainConfig)
    model: dict[str, Any] = field(default_factory=dict)
    label: str | None = None

    def __post_init__(self) -> None:
        if not self.init:
            raise ConfigError("init is required: the model directory to fine-tune")

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (YAML-ready)."""
        return {
            "init": self.init,
            "label": self.label,
            "model": dict(self.model),
            "data": asdict(self.data),
            "train": asdict(self.train),
        }


def load_finetune_config(path: str | Path, overrides: list[str] | None = None) -> FinetuneConfig:
    """Read a fine-tuning YAML with `--set` overrides; relative paths are resolved against the file's folder.

    Raises:
        ConfigError: naming the file and key for unknown keys, wrong types and invalid values.
    """
    path = Path(path)
    data = read_mapping(path, "init/data/train sections")
    keys = ["init", "data.glue_dir", "data.train_file", "data.validation_file", "data.test_file"]
    resolve_paths(data, keys, path.parent, maybe_names=("init",))
    apply_overrides(data, overrides or [])
    return from_dict(FinetuneConfig, data, source=str(path))


# ----------------------------------------------------------------------------------------------------------------
# Data and model


def load_splits(data: GlueDataConfig) -> dict[str, list[Example]]:
    """All splits of the configured task and source (train labelled, dev labelled, test splits unlabelled)."""
    task = get_task(data.task)
    if data.source == "glue_dir":
        splits = read_glue_dir(task, data.glue_dir)
    elif data.source == "hub":
        splits = read_hub(task, data.hub_name)
    else:
        files = {"train": data.train_file, task.dev[0].name: data.validation_file}
        if data.test_file:
            files[task.test[0].name] = data.test_file
        splits = read_files(task, files, data.text_columns, data.label_column)
    if not splits["train"]:
        raise UserError(f"{task.name}: the training split is empty")
    if data.max_train_examples is not None:
        splits["train"] = splits["train"][: data.max_train_examples]
    if data.max_eval_examples is not None:
        splits = {k: v if k == "train" else v[: data.max_eval_examples] for k, v in splits.items()}
    return splits


def load_init_tokenizer(init: str) -> Any:
    """The tokenizer saved with the model to fine-tune.

    Raises:
        UserError: the directory has no tokenizer files.
    """
    path = Path(init)
    if path.is_dir() and not any((path / f).is_file() for f in ("tokenizer.json", "vocab.txt")):
        raise UserError(f"{path}: the model directory has no tokenizer (tokenizer.json or vocab.txt)")
    return load_tokenizer(path)


def load_init_model(init: str, task: Task, overrides: dict[str, Any]) -> SequenceClassifier:
    """A sequence classifier with `task.num_labels` outputs from a roformer or HF directory (backbone kept).

    Raises:
        UserError: no model at `init`, or an override that does not fit.
    """
    from roformer.checkpoint import CONFIG_FILE as MODEL_CONFIG_FILE
    from roformer.checkpoint import load
    from roformer.hf import from_hf

    path = Path(init)
    arch = "sequence_classification"
    if (path / MODEL_CONFIG_FILE).is_file():
        model = load(path, architecture=arch, num_labels=task.num_labels)
    elif (path / "config.json").is_file() or not path.exists():
        model = from_hf(init, architecture=arch, num_labels=task.num_labels)
    else:
        raise UserError(f"{path}: no model here (neither {MODEL_CONFIG_FILE} nor an HF config.json)")
    if model.config.num_labels != task.num_labels:  # an HF classifier saved for another task
        model = _rebuild(model, replace(model.config, num_labels=task.num_labels), keep_head=False)
    if overrides:
        unknown = [k for k in overrides if k not in model.config.to_dict()]
        if unknown:
            raise ConfigError(f"model: unknown ModelConfig field '{unknown[0]}'")
        model = _rebuild(model, replace(model.config, **overrides), keep_head=True)
    return model.train()


def _rebuild(model: Model, config: Any, keep_head: bool) -> SequenceClassifier:
    """A classifier with `config` carrying `model`'s weights (the output layer re-initialised unless keep_head)."""
    fresh = SequenceClassifier(config)
    state = {k: v for k, v in model.state_dict().items() if keep_head or not k.startswith("out.")}
    fresh.load_state_dict(state, strict=False)
    return fresh


@dataclass
class Encoded:
    """Token ids and types of a split, ragged (padding happens per batch)."""

    ids: list[list[int]]
    types: list[list[int]]
    labels: list[int | float | None]
    index: list[str]


def encode(examples: list[Example], tokenizer: Any, max_length: int) -> Encoded:
    """Tokenize single sentences or pairs (`[CLS] A [SEP] B [SEP]`, token types 0/1), truncated longest-first."""
    if not examples:
        return Encoded([], [], [], [])
    first = [e.texts[0] for e in examples]
    second = [e.texts[1] for e in examples] if len(examples[0].texts) > 1 else None
    out = tokenizer(first, second, truncation=True, max_length=max_length, return_token_type_ids=True)
    return Encoded(out["input_ids"], out["token_type_ids"], [e.label for e in examples], [e.index for e in examples])


def collate(encoded: Encoded, rows: list[int], pad_id: int, regression: bool) -> dict[str, torch.Tensor]:
    """Pad the chosen rows to their longest (dynamic padding); labels when the split has them."""
    length = max(len(encoded.ids[r]) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    types = torch.zeros((len(rows), length), dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(encoded.ids[r])
        ids[i, :n] = torch.tensor(encoded.ids[r])
        types[i, :n] = torch.tensor(encoded.types[r])
        mask[i, :n] = 1
    batch = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
    if encoded.labels[rows[0]] is not None:
        batch["labels"] = torch.tensor(
            [encoded.labels[r] for r in rows], dtype=torch.float if regression else torch.long
        )
    return batch


# ----------------------------------------------------------------------------------------------------------------
# The job


class Finetuner:
    """All runs (learning rates x seeds) of one task in one run directory."""

    def __init__(self, config: FinetuneConfig, output_dir: str | Path, overwrite: bool = False) -> None:
        self.config = config
        self.out = Path(output_dir)
        check_output_dir(self.out, overwrite)
        self.overwrite = overwrite
        self.task = get_task(config.data.task)
        self.tokenizer = load_init_tokenizer(config.init)
        self.splits = load_splits(config.data)
        probe = load_init_model(config.init, self.task, config.model)  # fails early on a bad init
        self.max_length = config.data.max_length
        if probe.config.position_encoding == "learned":
            self.max_length = min(self.max_length, probe.config.max_position_embeddings)
        self.encoded = {name: encode(ex, self.tokenizer, self.max_length) for name, ex in self.splits.items()}

    @property
    def eval_splits(self) -> list[str]:
        """Dev split names (the first one selects checkpoints and learning rates)."""
        return [s.name for s in self.task.dev]

    @property
    def test_splits(self) -> list[Any]:
        """Test splits present in the data (with their submission file names)."""
        return [s for s in self.task.test + self.task.extra_tests if s.name in self.encoded]

    def run(self) -> dict[str, Any]:
        """Fine-tune every (lr, seed), then write results.json, predictions, submission/ and best/.

        Returns:
            The results (in the main process; other processes return an empty dict).
        """
        state = process_state()
        if state.is_main_process:
            if self.out.exists():
                shutil.rmtree(self.out)
            self.out.mkdir(parents=True)
            write_yaml(self.out / CONFIG_FILE, self.config.to_dict())
        state.wait_for_everyone()
        metrics = MetricsWriter(self.out / METRICS_FILE) if state.is_main_process else None
        runs = [self._run_one(lr, seed, metrics) for lr, seed in self.config.train.grid]
        results = {}
        if state.is_main_process:
            metrics.close()
            results = self._summarise(runs)
        state.wait_for_everyone()
        return results

    def _run_one(self, lr: float, seed: int, metrics: MetricsWriter | None) -> dict[str, Any]:
        """One fine-tune; returns its record (dev metrics of the best checkpoint, its step)."""
        from tqdm.auto import tqdm

        train = self.config.train
        acc = make_accelerator(train.mixed_precision, train.grad_accum, train.report_to, self.out)
        torch.manual_seed(seed)  # the head's initialisation
        model = load_init_model(self.config.init, self.task, self.config.model)
        n = len(self.encoded["train"].ids)
        global_batch = train.batch_size * acc.num_processes * train.grad_accum
        steps = train.max_steps if train.max_steps is not None else math.ceil(train.epochs * n / global_batch)
        steps_per_epoch = n / global_batch
        warmup = int(train.warmup_fraction * steps)
        betas = (train.adam_beta1, train.adam_beta2)
        optimizer, scheduler = make_optimizer(model, lr, train.weight_decay, betas, train.adam_eps, warmup, steps)
        model, optimizer = acc.prepare(model, optimizer)
        tag = f"lr{lr:g}-seed{seed}"
        acc.init_trackers(f"roformer-glue-{self.task.name}", config={**flat_config(self.config.to_dict()), "run": tag})
        sampler = EpochSampler(n, global_batch, seed)
        eval_steps = self._eval_steps(steps, steps_per_epoch)
        best: dict[str, Any] = {"score": -math.inf, "step": 0, "state": None, "dev": None}
        record = {"event": "eval", "task": self.task.name, "peak_lr": lr, "seed": seed}
        if steps == 0:
            best = self._consider(acc, model, 0, best, metrics, record)
        bar = tqdm(total=steps, desc=f"{self.task.name} {tag}", disable=not (acc.is_main_process and train.progress))
        elapsed, losses = 0.0, []
        for step in range(steps):
            t0 = time.perf_counter()
            loss, grad_norm, step_lr = self._train_step(acc, model, optimizer, scheduler, sampler, step, seed)
            elapsed += time.perf_counter() - t0
            losses.append(loss)
            bar.update(1)
            done = step + 1
            if done % train.log_every == 0 or done == steps:
                mean = acc.reduce(torch.stack(losses), "mean").mean().item()
                event = {"event": "train", "task": self.task.name, "peak_lr": lr, "seed": seed, "step": done,
                         "epoch": round(done / steps_per_epoch, 4), "loss": mean, "lr": step_lr,
                         "grad_norm": grad_norm, "elapsed_sec": elapsed}  # fmt: skip
                losses = []
                bar.set_postfix(loss=f"{mean:.4f}")
                if acc.is_main_process:
                    metrics.write(event)
                acc.log({f"{tag}/train/loss": mean}, step=done)
            if done in eval_steps:
                best = self._consider(
                    acc, model, done, best, metrics, {**record, "epoch": round(done / steps_per_epoch, 4)}
                )
        bar.close()
        acc.unwrap_model(model).load_state_dict(best["state"])
        self._write_predictions(acc, model, tag)
        if acc.is_main_process:
            self._keep_candidate(acc.unwrap_model(model), lr, best["score"])
        for tracker in acc.trackers:  # not acc.end_training(): that also destroys the process group, needed later
            tracker.finish()
        acc.wait_for_everyone()
        return {"peak_lr": lr, "seed": seed, "best_step": best["step"], "steps": steps, "dev": best["dev"]}

    def _eval_steps(self, steps: int, steps_per_epoch: float) -> set[int]:
        every = self.config.train.eval_every
        if every:
            points = set(range(every, steps + 1, every))
        else:
            points = {
                min(steps, math.ceil(k * steps_per_epoch)) for k in range(1, math.ceil(steps / steps_per_epoch) + 1)
            }
        return points | {steps} if steps else set()

    def _train_step(self, acc, model, optimizer, scheduler, sampler: EpochSampler, step: int, seed: int):
        train = self.config.train
        indices = sampler.indices(step).tolist()
        lr = scheduler.get_last_lr()[0]  # the rate this step uses
        torch.manual_seed((seed << 32) + step * 4096 + acc.process_index)  # dropout: a function of the step
        model.train()
        total = torch.zeros((), device=acc.device)
        grad_norm = 0.0
        for micro in range(train.grad_accum):
            rows = share(indices, micro, acc.process_index, acc.num_processes, train.batch_size)
            batch = collate(self.encoded["train"], rows, self.tokenizer.pad_token_id, self.task.is_regression)
            with acc.accumulate(model):
                out = model(**{k: v.to(acc.device) for k, v in batch.items()})
                acc.backward(out.loss)  # every micro-batch has batch_size examples: the mean of means is exact
                total += out.loss.detach().float() / train.grad_accum
                norm = finish_micro_step(acc, model, optimizer, scheduler, train.max_grad_norm)
                grad_norm = grad_norm if norm is None else norm
        return total, grad_norm, lr

    def _consider(self, acc, model, step: int, best: dict, metrics: MetricsWriter | None, record: dict) -> dict:
        """Evaluate on the dev splits; keep the weights when the first split's score improves."""
        dev = {}
        for split in self.eval_splits:
            predictions = self.predict(acc, model, split)
            dev[split] = compute(self.task.metrics, predictions, self.encoded[split].labels)
            if acc.is_main_process:
                metrics.write({**record, "step": step, "split": split, **dev[split]})
        score = dev[self.eval_splits[0]]["score"]
        if score > best["score"]:
            state = {k: v.detach().cpu().clone() for k, v in acc.unwrap_model(model).state_dict().items()}
            return {"score": score, "step": step, "state": state, "dev": dev}
        return best

    @torch.no_grad()
    def predict(self, acc, model, split: str) -> list[int | float]:
        """Predictions for every example of `split`: a contiguous share per process, gathered (no duplicates)."""
        from accelerate.utils import gather_object

        model.eval()
        encoded = self.encoded[split]
        rows = list(range(len(encoded.ids)))
        shares = [part.tolist() for part in torch.tensor(rows, dtype=torch.long).tensor_split(acc.num_processes)]
        mine = shares[acc.process_index]
        size = self.config.train.eval_batch_size or 2 * self.config.train.batch_size
        predictions: list[int | float] = []
        for start in range(0, len(mine), size):
            chunk = mine[start : start + size]
            batch = collate(encoded, chunk, self.tokenizer.pad_token_id, self.task.is_regression)
            batch.pop("labels", None)
            logits = model(**{k: v.to(acc.device) for k, v in batch.items()}).logits.float()
            values = logits.squeeze(-1) if self.task.is_regression else logits.argmax(-1)
            predictions += values.cpu().tolist()
        gathered = gather_object([predictions]) if acc.num_processes > 1 else [predictions]
        return [p for part in gathered for p in part]

    def _write_predictions(self, acc, model, tag: str) -> None:
        folder = self.out / PREDICTIONS_DIR / tag
        results = {split: self.predict(acc, model, split) for split in self.eval_splits}
        tests = {split.name: self.predict(acc, model, split.name) for split in self.test_splits}
        if not acc.is_main_process:
            return
        folder.mkdir(parents=True, exist_ok=True)
        for split, predictions in results.items():
            encoded = self.encoded[split]
            rows = zip(encoded.index, map(self._label_name, predictions), map(self._label_name, encoded.labels))
            _write_tsv(folder / f"{split}.tsv", ["index", "prediction", "label"], rows)
        for split in self.test_splits:
            rows = zip(self.encoded[split.name].index, map(self._label_name, tests[split.name]))
            _write_tsv(folder / split.submission, ["index", "prediction"], rows)

    def _label_name(self, value: int | float) -> str:
        """Server format: class names for classification, the score (3 decimals, clipped to [0, 5]) for STS-B."""
        if self.task.labels is None:
            return f"{min(5.0, max(0.0, float(value))):.3f}"
        return self.task.labels[int(value)]

    def _keep_candidate(self, model: Model, lr: float, score: float) -> None:
        """Keep the model of the best seed so far of this learning rate (at most one model per lr on disk)."""
        directory = self.out / ".candidates" / f"lr{lr:g}"
        marker = directory / "score.json"
        if marker.is_file() and json.loads(marker.read_text())["score"] >= score:
            return
        with staged_output_dir(directory, overwrite=True) as staging:
            getattr(model, "_orig_mod", model).save(staging)
            save_tokenizer(self.tokenizer, staging)
            (staging / "score.json").write_text(json.dumps({"score": score}))

    def _summarise(self, runs: list[dict[str, Any]]) -> dict[str, Any]:
        split = self.eval_splits[0]
        by_lr: dict[str, Any] = {}
        for lr in dict.fromkeys(r["peak_lr"] for r in runs):
            chosen = [r for r in runs if r["peak_lr"] == lr]
            names = list(chosen[0]["dev"][split])
            by_lr[f"{lr:g}"] = {
                s: {m: summary([r["dev"][s][m] for r in chosen]) for m in names} for s in self.eval_splits
            }
        best_lr = max(by_lr, key=lambda k: by_lr[k][split]["score"]["mean"])
        candidates = [r for r in runs if f"{r['peak_lr']:g}" == best_lr]
        selected = max(candidates, key=lambda r: r["dev"][split]["score"])
        results = {
            "task": self.task.name,
            "label": self.config.label,
            "init": self.config.init,
            "metrics": list(self.task.metrics),
            "selection_split": split,
            "runs": runs,
            "by_lr": by_lr,
            "selected": {"peak_lr": selected["peak_lr"], "seed": selected["seed"], "best_step": selected["best_step"]},
            "summary": by_lr[best_lr],
        }
        tag = f"lr{selected['peak_lr']:g}-seed{selected['seed']}"
        submission = self.out / SUBMISSION_DIR
        submission.mkdir(exist_ok=True)
        for test in self.test_splits:
            shutil.copy2(self.out / PREDICTIONS_DIR / tag / test.submission, submission / test.submission)
        candidates_dir = self.out / ".candidates"
        (candidates_dir / f"lr{best_lr}" / "score.json").unlink()
        (candidates_dir / f"lr{best_lr}").rename(self.out / BEST_DIR)
        shutil.rmtree(candidates_dir)
        (self.out / RESULTS_FILE).write_text(json.dumps(results, indent=2))
        return results


def summary(values: list[float]) -> dict[str, float]:
    """mean, std (sample; 0 for one value), median, max and the values themselves."""
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "median": statistics.median(values),
        "max": max(values),
        "values": list(values),
    }


def _write_tsv(path: Path, header: list[str], rows: Any) -> None:
    with path.open("w", encoding="utf-8") as f:
        f.write("\t".join(header) + "\n")
        for row in rows:
            f.write("\t".join(str(c) for c in row) + "\n")


def finetune(config: FinetuneConfig, output_dir: str | Path, overwrite: bool = False) -> dict[str, Any]:
    """Fine-tune one GLUE task (every lr and seed); returns the results (also written to results.json)."""
    return Finetuner(config, output_dir, overwrite).run()


# ----------------------------------------------------------------------------------------------------------------
# The suite: several tasks, one table


@dataclass
class SuiteConfig:
    """`roformer glue`: task configs run one after another, with shared overrides, into one table.

    Attributes:
        tasks: Task config files (relative to the suite file), e.g. [cola.yaml, sst2.yaml].
        overrides: `--set` style overrides applied to every task (e.g. `init=runs/roformer-base/final`).
    """

    tasks: list[str] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_types(self)
        if not self.tasks:
            raise ConfigError("tasks: list at least one task config")


def load_suite_config(path: str | Path) -> SuiteConfig:
    """Read a suite YAML and check that every task config it lists loads.

    Raises:
        ConfigError: a bad suite file or task config.
    """
    path = Path(path)
    suite = from_dict(SuiteConfig, read_yaml(path), source=str(path))
    for task in suite.tasks:
        load_finetune_config(path.parent / task, suite.overrides)
    return suite


def run_suite(path: str | Path, output_dir: str | Path, overrides: list[str] | None = None, overwrite: bool = False):
    """Fine-tune every task of a suite config into output_dir/<task>/ and write one table and one submission.

    Writes results.json, results.md and submission/ (every task's server files, ready to zip).

    Raises:
        ConfigError, UserError: a bad suite or task config (all task configs are checked before any training).
    """
    path, out = Path(path), Path(output_dir)
    suite = load_suite_config(path)
    check_output_dir(out, overwrite)
    configs = [load_finetune_config(path.parent / t, suite.overrides + list(overrides or [])) for t in suite.tasks]
    state = process_state()
    if state.is_main_process and out.exists():
        shutil.rmtree(out)
    state.wait_for_everyone()
    results = {}
    for config in configs:
        results[config.data.task] = finetune(config, out / config.data.task)
    if state.is_main_process:
        (out / SUBMISSION_DIR).mkdir(exist_ok=True)
        for task in results:
            for file in (out / task / SUBMISSION_DIR).iterdir():
                shutil.copy2(file, out / SUBMISSION_DIR / file.name)
        (out / RESULTS_FILE).write_text(json.dumps({t: r["summary"] for t, r in results.items()}, indent=2))
        (out / "results.md").write_text(results_table(results))
    state.wait_for_everyone()
    return results


def results_table(results: dict[str, dict[str, Any]]) -> str:
    """Markdown: one row per task and metric (mean +- std over seeds, median, max, selected lr, seeds)."""
    lines = [
        "| task | split | metric | mean ± std | median | max | lr | seeds |",
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
                lr, seeds = r["selected"]["peak_lr"], len(s["values"])
                lines.append(f"| {task} | {split} | {name} | {numbers} | {lr:g} | {seeds} |")
    return "\n".join(lines) + "\n"
