"""Fine-tuning one task of any type: `roformer finetune --config TASK.yaml` (several tasks: `roformer suite`, in study).

One config fine-tunes one task for every learning rate of `train.lrs` (or `train.lr`), every seed of `train.seeds`
(or `train.seed`) and, for a cross-validated task (`triplet.folds`), every held-out fold, keeping each run's best dev
checkpoint. A run directory holds:

    config.yaml       the resolved config
    metrics.jsonl     train and eval events of every run (with `task`, `peak_lr`, `seed` and any `fold`)
    results.json      per run (peak_lr, seed, and fold when cross-validated): dev metrics of the best checkpoint
                      and its step; per learning rate: mean, std, median and max over its runs; the selected
                      learning rate (best mean dev score); every scored split's trivial baseline (`baseline`)
    results.md        the same for people (roformer.train.results_card): dev and test beside their baselines
    predictions/      per run: dev predictions (index, prediction, label) and test predictions
    submission/       the selected run's submission files (GLUE: the server's SST-2.tsv, MNLI-m.tsv, AX.tsv, ...)
    best/             the selected run's model + tokenizer (roformer.load-able)

This module keeps the grid, the selection and the publishing (one run's recipe is roformer.train.finetune_run);
what depends on the task (its model, splits, batches, predictions, metrics and files) comes from its task object
(roformer.tasks.base.FinetuneTask, looked up once per job).

Token type 1 (the second text of a pair) is never seen in MLM pretraining on single blocks: its embedding starts
fine-tuning untrained, as in any MLM-only recipe (BERT learned it through next-sentence prediction).

The selected run is the best seed of the learning rate with the best mean dev score. Each (lr, seed) run goes
through the training engine (roformer.train.engine) as a recipe: its batches follow the pretraining recipe (step `s`
trains on positions [s*G, (s+1)*G) of seeded per-epoch permutations, every global batch full: a function of the seed
and the step alone, for every task type), so one process and several give the same steps. Evaluation shards the
examples across processes without padding or duplicates and gathers the predictions, so its metrics equal one
process's exactly. `--resume` continues an interrupted job: finished runs are kept (`.progress/<run>/record.json`),
the running one continues from its last checkpoint (or from its start, which gives the same result: every run is
deterministic), also on another number of processes under the same global batch (docs/resuming.md): exactly when
batch_size stays; under another batch_size the losses of token classification and of sentence vectors, which are
computed over a micro-batch (the task's `micro_batch_loss`), change, and the resume says so.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from roformer.config import flat_config
from roformer.data.sampling import global_batch_size
from roformer.data.tokenizer import check_fits, load_tokenizer, segmentation
from roformer.errors import UserError
from roformer.files import atomic_write_text
from roformer.logs import quiet_loggers
from roformer.model.config import EncoderDecoderConfig, ModelConfig
from roformer.model.model import ARCHITECTURES, Model
from roformer.model.pretrained import check_init, load_pretrained, pretrained_config
from roformer.tasks.base import CrossValidates, FinetuneTask, Publishes, ReportsResults, learn_model
from roformer.tasks.baselines import constant_predictions
from roformer.tasks.build import make_task
from roformer.tasks.config import Vocabulary
from roformer.tasks.glue_metrics import ranked, seed_summary
from roformer.train.config import FinetuneConfig
from roformer.train.engine import Engine
from roformer.train.finetune_run import FinetuneRun
from roformer.train.interval import RunState
from roformer.train.launch import check_run_settings, process_state, run_on_main
from roformer.train.predict import EncodedTask, predict, variant_scores
from roformer.train.results_card import RESULTS_MARKDOWN_FILE, results_markdown
from roformer.train.run_dir import (
    BEST_DIR,
    CANDIDATES_DIR,
    CHECKPOINTS_DIR,
    METRICS_FILE,
    PREDICTIONS_DIR,
    PROGRESS_DIR,
    RESULTS_FILE,
    RunDir,
    pretraining_length,
    write_model_dir,
)

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

RECORD_FILE = "record.json"  # .progress/<run>/: the finished run's dev metrics and best step
CANDIDATE_SCORE_FILE = "score.json"  # .candidates/lr<lr>/: the dev score of the model kept there
AVERAGED_DIR = "averaged"  # the selected run's average of its last train.average_last models (beside best/)


# ----------------------------------------------------------------------------------------------------------------
# The job


def task_inputs(config: FinetuneConfig) -> tuple[FinetuneTask, Tokenizer, ModelConfig | EncoderDecoderConfig]:
    """The task (its splits read), its tokenizer (the init's) and its model's config, checked against each other.

    A type that makes its own vocabulary (`TaskSpec.own_vocabulary`) trains from scratch without an init: its
    tokenizer, and the model of the `model:` section; with one (`pretrained_init`), the init's tokenizer as the task
    reads it and the init's model.

    Raises:
        UserError: a missing tokenizer or init, unreadable data, a tokenizer larger than the model's vocabulary.
    """
    spec = config.data.spec
    if config.init:  # every caller (a suite's task, a study's arm) says a missing init in these words
        check_init(config.init)
    if spec.own_vocabulary:
        task = make_task(config.data)
        if not config.init:  # trained from scratch: the task's own vocabulary, the model: section
            tokenizer = task.tokenizer()
            model_config = config.scratch_model(Vocabulary.of(tokenizer))
            if isinstance(model_config, ModelConfig):
                model_config = replace(model_config, num_labels=task.num_labels)
            return task, tokenizer, model_config
        tokenizer = task.pretrained_tokenizer(Path(config.init))
    else:
        tokenizer = load_tokenizer(Path(config.init))
        # the tasks read a decided data.jieba: the tokenizer's (config.data stays as written: config.yaml, resume)
        task = make_task(replace(config.data, jieba=segmentation(tokenizer, config.data.jieba, config.init)))
    model_config = pretrained_config(config.init, task.architecture, task.num_labels, **config.model)
    check_fits(tokenizer, vocabulary_size(model_config), config.init)
    return task, tokenizer, model_config


def vocabulary_size(config: ModelConfig | EncoderDecoderConfig) -> int:
    """The ids a model's embeddings hold: an encoder-decoder's tokenizer (one joint vocabulary) must fit both halves."""
    if isinstance(config, EncoderDecoderConfig):
        return min(config.encoder.vocab_size, config.decoder.vocab_size)
    return config.vocab_size


def learned_length(config: ModelConfig | EncoderDecoderConfig) -> int | None:
    """The longest input a learned position table holds (the shorter of an encoder-decoder's), None without one."""
    halves = [config.encoder, config.decoder] if isinstance(config, EncoderDecoderConfig) else [config]
    tables = [half.position_limit for half in halves if half.position_limit is not None]
    return min(tables) if tables else None


def check_before_writing(config: FinetuneConfig, task: FinetuneTask | None = None) -> None:
    """Check what would fail only once training starts, before a run directory is written (or deleted).

    The init loads as the task's model, and the accelerator would accept the run settings: --overwrite must not
    delete the job it would replace for a run that cannot start.

    Args:
        config: The task's config.
        task: Its task, when the job has read it already; else `task_inputs` reads and checks it here too (a GLUE
            suite writes its directory before its tasks read their data).

    Raises:
        UserError: an init that does not load (a truncated weights file, shapes the overrides change), a tracker,
            launcher or precision the accelerator refuses, and without `task`, what `task_inputs` refuses.
    """
    check_run_settings(config.train)
    if task is None:
        task = task_inputs(config)[0]
    if not config.init:
        return  # nothing to load: the model starts from its config
    with quiet_loggers("roformer.model.weights"):  # the run's own load says which weights start fresh, once
        load_pretrained(config.init, task.architecture, task.num_labels, **config.model)


class Finetuner:
    """All runs (learning rates x seeds, x folds for a cross-validated task) of one task in one run directory."""

    def __init__(
        self, config: FinetuneConfig, output_dir: str | Path, overwrite: bool = False, resume: bool = False
    ) -> None:
        self.config = config
        self.out = Path(output_dir)
        self.run_dir = RunDir(self.out, overwrite, resume)  # before any data work
        self._recorded = False
        if resume:
            self.run_dir.check_resume(config.to_dict(), finished_runs=self._count_finished_runs())
        # a missing or unreadable init or data fails here, before any training
        self.task, self.tokenizer, model_config = task_inputs(config)
        self.model_config = model_config
        self.classifier_head = getattr(model_config, "classifier_head", None)  # an encoder-decoder has none
        facts = learn_model(self.task, model_config)  # before encoding: translation's targets end with its eos
        # k of a cross-validated task's folds (its grid's third axis), None for every other
        self.folds = self.task.cross_validation_folds if self.task.spec.declares(CrossValidates) else None
        self.max_length = self._max_length(model_config)
        if resume:
            self._check_progress_layout()
        encoded = self.task.encode(self.tokenizer, self.max_length, facts)
        self.data = EncodedTask(self.task, encoded, self.tokenizer.pad_token_id, self.max_length)

    def _check_progress_layout(self) -> None:
        """A resumed cross-validated job's runs must be of folds: one started when a seed chose its fold is refused.

        Raises:
            UserError: .progress/ holds runs without a fold (they would be retrained and their files left behind).
        """
        if not self.folds:
            return
        old = sorted(p.name for p in (self.out / PROGRESS_DIR).glob("*") if p.is_dir() and "-fold" not in p.name)
        if old:
            raise UserError(
                f"{self.out / PROGRESS_DIR}: runs {old} were started before folds were a grid axis (the run of seed s "
                "held out fold s): finish them with the version that started them, or start again in a new directory"
            )

    def load_model(self) -> torch.nn.Module:
        """The task's model: the init's backbone, a head drawn from the torch RNG unless the init has it.

        Without an init, the whole model is drawn from the torch RNG (the run's seed).
        """
        if not self.config.init:
            return ARCHITECTURES[self.task.architecture](self.model_config).train()
        return load_pretrained(self.config.init, self.task.architecture, self.task.num_labels, **self.config.model)

    def _max_length(self, model: ModelConfig | EncoderDecoderConfig) -> int:
        """data.max_length, capped at the pretraining length (unless lifted) and at a learned position table."""
        length, data = self.config.data.max_length, self.config.data
        pretrained = pretraining_length(Path(self.config.init)) if self.config.init else None
        if pretrained is not None and length > pretrained and not data.beyond_pretraining_length:
            logger.info("max_length %d capped at the pretraining length %d", length, pretrained)
            length = pretrained
        table = learned_length(model)
        return length if table is None else min(length, table)

    def run(self) -> dict[str, Any]:
        """Fine-tune every (lr, seed), then write results.json, predictions, submission/ and best/.

        Returns:
            The results (in the main process; other processes return an empty dict).
        """
        if self.run_dir.resume and (self.out / RESULTS_FILE).is_file():
            logger.info("%s: finished already", self.out)
            results = run_on_main(self.finished_results)
            return results or {}
        if not self.run_dir.resume:
            check_before_writing(self.config, self.task)
        run_on_main(lambda: self.run_dir.prepare(self.config.to_dict()))
        runs = []
        for lr, seed, fold in self.grid:
            record = self.progress_dir(lr, seed, fold) / RECORD_FILE
            if record.is_file():
                runs.append(self._finished_run(record))
            else:
                runs.append(self._run_one(lr, seed, fold))
                if len(self.grid) > 1:  # a grid's progress on the console: each run's result as it ends
                    logger.info(run_finished_line(self.task.name, runs[-1], len(runs), len(self.grid)))
        self._record_resumed_config()
        results = run_on_main(lambda: self.publish(self.select(runs)))
        return results or {}

    def _record_resumed_config(self) -> None:
        """Once per resumed job, after its first checks passed: config.yaml records what it goes on under."""
        if self.run_dir.resume and not self._recorded:
            run_on_main(lambda: self.run_dir.record(self.config.to_dict()))
            self._recorded = True

    def _count_finished_runs(self) -> int:
        """Runs of this directory that have finished: all of a published job's, else those with a record."""
        results = self.out / RESULTS_FILE
        if results.is_file():
            return len(json.loads(results.read_text()).get("runs", []))
        return len(list((self.out / PROGRESS_DIR).glob(f"*/{RECORD_FILE}")))

    def _finished_run(self, path: Path) -> dict[str, Any]:
        """The record of a run finished before a resume; it must have trained with this job's global batch.

        Raises:
            UserError: it was trained with another global batch (batch_size x processes x grad_accum).
        """
        record = json.loads(path.read_text())
        train = self.config.train
        current = global_batch_size(train.batch_size, process_state().num_processes, train.grad_accum)
        if record.get("global_batch", current) != current:
            raise UserError(
                f"{path.parent}: finished with a global batch of {record['global_batch']} examples, now {current} "
                "(same batch_size x processes x grad_accum needed to resume a grid)"
            )
        return record

    @property
    def grid(self) -> list[tuple[float, int, int | None]]:
        """(peak lr, seed, held-out fold) of every run, in order: the fold None without cross-validation."""
        held_out = list(range(self.folds)) if self.folds else [None]
        return [(lr, seed, fold) for lr, seed in self.config.train.grid for fold in held_out]

    def progress_dir(self, lr: float, seed: int, fold: int | None = None) -> Path:
        """Where a run keeps its checkpoints while it trains, and its record once it has finished."""
        return self.out / PROGRESS_DIR / run_tag(lr, seed, fold)

    def run_data(self, fold: int | None) -> EncodedTask:
        """The encoded splits of a run: the job's, or those of its held-out fold (a cross-validated task)."""
        if not self.task.spec.declares(CrossValidates):
            return self.data
        splits = self.task.splits_for_run(self.data.splits, fold)
        return self.data if splits is self.data.splits else replace(self.data, splits=splits)

    def _run_one(self, lr: float, seed: int, fold: int | None) -> dict[str, Any]:
        """One fine-tune (resumed from its last checkpoint if it has one); returns and writes its record."""
        train, tag = self.config.train, run_tag(lr, seed, fold)
        tags = {"task": self.task.name, "peak_lr": lr, "seed": seed, **fold_column(fold)}
        progress = self.progress_dir(lr, seed, fold)
        engine = Engine(train, self.out, seed, progress / CHECKPOINTS_DIR, self.out / METRICS_FILE, tags)
        data = self.run_data(fold)
        torch.manual_seed(seed)  # the head's initialisation
        model = self.load_model()
        averaging = (train.average_last, train.average_every, train.patience)
        # made before the set-up: token batches decide the steps of an epoch
        run = FinetuneRun(engine, seed, data, train.eval_size, self.config.data.group_by_length, *averaging)
        steps = train.max_steps if train.max_steps is not None else math.ceil(train.epochs * run.steps_per_epoch())
        engine.setup(model, lr, steps)
        run.start()
        state = RunState()
        if self.run_dir.resume:
            state = engine.resume(run)
            self._record_resumed_config()
        config = {**flat_config(self.config.to_dict()), "run": tag}
        engine.start_logging(self.task.tracker_project, config, tracker_prefix=f"{tag}/")
        if steps == 0:
            engine.evaluate(run, state)
        state = engine.fit(run, state, checkpoint_at_end=False, desc=f"{self.task.name} {tag}")
        splits = self.task.dev_splits + self.task.test_splits
        scored = [s for s in self.task.test_splits if data.splits[s].labelled]
        averaged = run.averaged_state()
        averaged_predictions, averaged_record = None, None
        if averaged is not None:  # scored like the best checkpoint, on every dev and test split
            engine.load_full_state_dict(averaged)
            averaged_predictions = {s: predict(engine, data, s, train.eval_size) for s in splits}
            averaged_record = {
                "points": sorted(run.snapshots),
                "dev": {s: self.task.evaluate(data.splits[s], averaged_predictions[s]) for s in self.task.dev_splits},
                **(
                    {"test": {s: self.task.evaluate(data.splits[s], averaged_predictions[s]) for s in scored}}
                    if scored
                    else {}
                ),
            }
        engine.load_full_state_dict(run.best["state"])
        kept = run.best.get("predictions") or {}  # the best evaluation's (a resumed run's checkpoint has none)
        predictions = {s: kept[s] if s in kept else predict(engine, data, s, train.eval_size) for s in splits}
        record = {
            "peak_lr": lr,
            "seed": seed,
            **fold_column(fold),
            "best_step": run.best["step"],
            "steps": steps,
            **({"stopped_at": state.step} if state.step < steps else {}),  # train.patience ended it early
            "dev": run.best["dev"],
            "global_batch": engine.global_batch,
        }
        if scored:  # labelled test sets (FewCLUE's public test, CoNLL-2003's test): the best checkpoint's metrics
            record["test"] = {s: self.task.evaluate(data.splits[s], predictions[s]) for s in scored}
            for split, variants in variant_scores(engine, data, run.best["state"], scored, train.eval_size).items():
                record["test"][split]["extensions"] = variants  # the same model under test-time extension methods
        baselines = {s: self.task.baseline(data.splits, s) for s in self.task.dev_splits + scored}
        record["baseline"] = {s: b for s, b in baselines.items() if b is not None}
        warn_if_trivial(f"{self.task.name} {tag}", predictions, record)
        if averaged_record is not None:
            record["averaged"] = averaged_record

        def write() -> None:  # the main process: predictions, the candidate model, the run's record
            folder = self.out / PREDICTIONS_DIR / tag
            folder.mkdir(parents=True, exist_ok=True)
            self.task.write_predictions(folder, data.splits, predictions)
            bare = engine.bare_model()
            best = type(bare)(bare.config)
            best.load_state_dict(run.best["state"])
            average = None
            if averaged is not None:
                (folder / AVERAGED_DIR).mkdir(exist_ok=True)
                self.task.write_predictions(folder / AVERAGED_DIR, data.splits, averaged_predictions)
                average = type(bare)(bare.config)
                average.load_state_dict(averaged)
            self._keep_candidate(best, lr, run.best["score"], average)
            progress.mkdir(parents=True, exist_ok=True)
            atomic_write_text(progress / RECORD_FILE, json.dumps(record))
            shutil.rmtree(progress / CHECKPOINTS_DIR, ignore_errors=True)

        engine.finish()
        run_on_main(write)
        return record

    def _keep_candidate(self, model: Model, lr: float, score: float, averaged: Model | None = None) -> None:
        """Keep the model of the best seed so far of this learning rate (at most one model per lr on disk).

        With `averaged` (the run's average of its last models), that one is kept beside it, as the same seed's.
        """
        directory = self.out / CANDIDATES_DIR / f"lr{lr:g}"
        marker = directory / CANDIDATE_SCORE_FILE
        if marker.is_file() and ranked(json.loads(marker.read_text())["score"]) >= ranked(score):
            return
        average_dir = averaged_candidate(directory)
        shutil.rmtree(average_dir, ignore_errors=True)  # another seed's, or a stale one
        for target, weights in ((directory, model), (average_dir, averaged)):
            if weights is not None:
                self._write_model(weights, target)
        atomic_write_text(marker, json.dumps({"score": score}))

    def _write_model(self, model: Model, directory: Path) -> None:
        """A fine-tuned model, its tokenizer and what it needs to be used without the run's config."""
        write_model_dir(model, self.tokenizer, directory)
        if not self.task.spec.declares(Publishes):
            return
        # what using it needs (the outputs' names, the pooling, a translation model's search): no run config
        for name, text in self.task.model_files(self.config.train.eval_size).items():
            atomic_write_text(directory / name, text)

    def select(self, runs: list[dict[str, Any]]) -> dict[str, Any]:
        """The results of the finished runs, computed from their records alone (reads and writes nothing).

        Per learning rate: every dev metric summarised over its runs (seeds, and folds of a cross-validated task);
        selected: the learning rate with the best mean dev score of the first dev split, and its best run.
        `max_length` is the length the examples were cut to (data.max_length after its caps): the model card of
        `roformer push` reports it.
        """
        split = self.task.dev_splits[0]
        by_lr: dict[str, Any] = {}
        for lr in dict.fromkeys(r["peak_lr"] for r in runs):
            chosen = [r for r in runs if r["peak_lr"] == lr]
            names = list(chosen[0]["dev"][split])
            by_lr[f"{lr:g}"] = {
                s: {m: seed_summary([r["dev"][s][m] for r in chosen]) for m in names} for s in self.task.dev_splits
            }
        best_lr = max(by_lr, key=lambda k: ranked(by_lr[k][split]["score"]["mean"]))
        candidates = [r for r in runs if f"{r['peak_lr']:g}" == best_lr]
        selected = max(candidates, key=lambda r: ranked(r["dev"][split]["score"]))
        return {
            "task": self.task.name,
            "label": self.config.label,
            "init": self.config.init,
            "classifier_head": self.classifier_head,
            "max_length": self.max_length,
            "metrics": list(self.task.metrics),
            "selection_split": split,
            "runs": runs,
            "by_lr": by_lr,
            "selected": {
                "peak_lr": selected["peak_lr"],
                "seed": selected["seed"],
                **fold_column(selected.get("fold")),
                "best_step": selected["best_step"],
            },
            "summary": by_lr[best_lr],
            **self._test_summary([r for r in runs if f"{r['peak_lr']:g}" == best_lr]),
            **({"averaged": selected["averaged"]} if "averaged" in selected else {}),
            "baseline": selected.get("baseline", {}),  # the trivial baseline of every scored split
            **(self.task.result_notes(selected) if self.task.spec.declares(ReportsResults) else {}),
        }

    @staticmethod
    def _test_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
        """`test`: every labelled test split's metrics over the selected learning rate's seeds (none: {})."""
        if "test" not in runs[0]:
            return {}

        def over_runs(values: list[dict[str, Any]]) -> dict[str, Any]:  # a split's metrics (and its variants')
            first = values[0]
            out = {m: seed_summary([v[m] for v in values]) for m in first if m != "extensions"}
            shared = [k for k in first.get("extensions", {}) if all(k in v.get("extensions", {}) for v in values)]
            if shared:  # the methods every run was scored under (a job resumed across a change may differ)
                out["extensions"] = {k: over_runs([v["extensions"][k] for v in values]) for k in shared}
            return out

        return {"test": {split: over_runs([r["test"][split] for r in runs]) for split in runs[0]["test"]}}

    def finished_results(self) -> dict[str, Any]:
        """The results.json of a finished job (leftovers of a publish interrupted after writing it removed)."""
        self.clean_up()
        return json.loads((self.out / RESULTS_FILE).read_text())

    def publish(self, results: dict[str, Any]) -> dict[str, Any]:
        """Write submission/, best/ and results.json of the selected run, then drop what only a resume needed.

        Safe to run again after an interruption at any point: results.json is written last but the clean-up, so a
        resume finds the records and publishes again; every step before it can be repeated.
        """
        selected = results["selected"]
        submission = self.out / self.task.spec.submission_folder
        submission.mkdir(exist_ok=True)
        selected_run = self.out / PREDICTIONS_DIR / run_tag(selected["peak_lr"], selected["seed"], selected.get("fold"))
        self.task.write_submission(selected_run, submission)
        candidate = self.out / CANDIDATES_DIR / f"lr{selected['peak_lr']:g}"
        average = averaged_candidate(candidate)
        if average.is_dir():  # moved first: the best one's move below marks a finished publish
            shutil.rmtree(self.out / AVERAGED_DIR, ignore_errors=True)
            average.rename(self.out / AVERAGED_DIR)
        if candidate.is_dir():  # not yet moved (a first publish, or one interrupted before the move)
            (candidate / CANDIDATE_SCORE_FILE).unlink(missing_ok=True)
            shutil.rmtree(self.out / BEST_DIR, ignore_errors=True)
            candidate.rename(self.out / BEST_DIR)
        atomic_write_text(self.out / RESULTS_MARKDOWN_FILE, results_markdown(results))  # before: results.json ends
        atomic_write_text(self.out / RESULTS_FILE, json.dumps(results, indent=2))
        self.clean_up()
        return results

    def clean_up(self) -> None:
        """Remove the candidates and the progress records (a finished job's results.json holds what they held)."""
        shutil.rmtree(self.out / CANDIDATES_DIR, ignore_errors=True)
        shutil.rmtree(self.out / PROGRESS_DIR, ignore_errors=True)


def run_finished_line(task: str, record: dict[str, Any], done: int, total: int) -> str:
    """`rte lr 2e-05 seed 1 finished (3/6): dev score 61.37 at step 230` (the first dev split's, in %)."""
    split = next(iter(record["dev"]))
    where = f"lr {record['peak_lr']:g} seed {record['seed']}" + (f" fold {record['fold']}" if "fold" in record else "")
    score = record["dev"][split]["score"]
    return f"{task} {where} finished ({done}/{total}): {split} score {score:.4g} at step {record['best_step']}"


def warn_if_trivial(run: str, predictions: dict[str, list[Any]], record: dict[str, Any]) -> None:
    """A warning per scored split whose predictions are all one answer, or whose score is at or below its baseline.

    A degenerate run (one class everywhere: small models on RTE) otherwise reads like a result.
    """
    for split, baseline in record["baseline"].items():
        metrics = record["dev"].get(split) or record.get("test", {}).get(split)
        if metrics is None:
            continue
        if constant_predictions(predictions[split]):
            logger.warning(
                "%s: every %s prediction is the same (%r): the model learned one answer",
                run,
                split,
                predictions[split][0],
            )
        elif ranked(metrics["score"]) <= ranked(baseline["score"]):
            logger.warning(
                "%s: %s score %.4g is at or below its %s baseline (%.4g)",
                run,
                split,
                metrics["score"],
                baseline["kind"].replace("_", " "),
                baseline["score"],
            )


def averaged_candidate(candidate: Path) -> Path:
    """Where the averaged model of a learning rate's kept seed waits for publishing, beside its best model."""
    return candidate.with_name(f"{candidate.name}-{AVERAGED_DIR}")


def run_tag(lr: float, seed: int, fold: int | None = None) -> str:
    """The name of a run in predictions/ and .progress/: `lr2e-05-seed0`, with `-fold3` when cross-validated."""
    return f"lr{lr:g}-seed{seed}" + (f"-fold{fold}" if fold is not None else "")


def fold_column(fold: int | None) -> dict[str, int]:
    """A run's `fold` (its held-out fold) in its record, metrics events and selection; nothing without folds."""
    return {} if fold is None else {"fold": fold}


def finetune(
    config: FinetuneConfig, output_dir: str | Path, overwrite: bool = False, resume: bool = False
) -> dict[str, Any]:
    """Fine-tune one task (every lr and seed); returns the results (also written to results.json)."""
    return Finetuner(config, output_dir, overwrite, resume).run()
