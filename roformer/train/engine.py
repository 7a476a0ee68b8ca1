"""The one training engine: accelerate set-up, the optimizer, the loop, evaluation points, checkpoints, metrics.

Pretraining and fine-tuning are recipes of this engine (roformer.train.pretrain, roformer.train.finetune): a recipe
(roformer.train.recipe: `Recipe`) says what a step trains on and how its loss is computed (`StepPlan`), how to
evaluate, and what else a checkpoint must hold; everything else is written once here, so determinism, exact resume,
metrics, progress and the accelerate calls (`prepare`, `accumulate`, `save_state`/`load_state`, `reduce`) behave the
same in both.

Determinism (what makes `--resume` exact and launches interchangeable): the data of step `s` is a function of
(seed, step) alone (the recipe's plan), never of the process layout; each process takes its rows of it
(roformer.data.sampling.share: micro-batch m of process r is chunk m x processes + r of the global batch); the global
torch RNG (dropout) is reseeded from (seed, step, chunk) before every micro-batch, so a chunk of examples gets the
same masks wherever it runs; and a recipe's loss is normalised over the whole global batch, so one process with
batch 2B, two with B, or one with B and grad_accum 2 take the same step (dropout aside: its masks are drawn per
chunk of batch_size examples).

Elastic resume: a checkpoint written by N processes continues on M (same global batch: batch_size x processes x
grad_accum). Model and optimizer are full tensors (accelerate's files) or, under FSDP2, DCP shards that reshard on load
(roformer.train.sharded); the schedule is indexed by step; accelerate's micro-step counter is set from the step, so
the accumulation phase fits the new grad_accum; a process without an RNG file of its rank needs none (the RNG is
reseeded every micro-batch); the train-event sums of the processes that wrote the checkpoint are summed onto the
main process. With the same batch_size (grad_accum taking up the change of processes) the continuation is exact,
dropout included; under another batch_size the dropout masks (and the task losses defined over a micro-batch) are
new draws, which the resume says in one line (`layout_notice`). docs/resuming.md lists what was tested.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from roformer.data.sampling import global_batch_size
from roformer.errors import Diverged, Preempted, UserError, WriteFailed
from roformer.files import describe_write_error, read_json, write_errors
from roformer.logs import MAIN_ONLY, evaluation_line
from roformer.model.model import Model
from roformer.train.checkpoints import CheckpointManager, first_problem
from roformer.train.config import ResolvedStage, TrainArgs
from roformer.train.faults import GracefulStop
from roformer.train.interval import Interval, Pace, RunState, StepResult
from roformer.train.launch import (
    agree_on_errors,
    any_process,
    broadcast_from_main,
    gather,
    make_accelerator,
    run_on_main,
    set_torch_flags,
)
from roformer.train.optim import finish_micro_step, make_optimizer
from roformer.train.recipe import (
    ProcessLayout,
    Recipe,
    dropout_seed,
    interval_of,
    layout_notice,
    saved_layout,
)
from roformer.train.run_dir import TRAINER_STATE_FILE, MetricsWriter, keep_metrics
from roformer.train.sharded import SHARDED_DIR, is_sharded, load_sharded_state, save_sharded_state
from roformer.train.stages import stage_event, stage_index

logger = logging.getLogger(__name__)


def load_full_state(model: torch.nn.Module, state: dict[str, torch.Tensor], sharded: bool) -> None:
    """Load a full state dict (plain tensors, names without wrapper prefixes) into `model`, FSDP-sharded or not.

    A sharded model takes it through torch's distributed state-dict API (broadcast from the main process, then
    sharded), which replaces the values of the dict it is given with the shards it makes: it gets a copy, so
    `state` stays full tensors for whoever reads it next (fine-tuning saves the best weights from it afterwards;
    found on an H200 under `configs/accelerate/fsdp.yaml`).
    """
    if not sharded:
        model.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, dict(state), options=options)


class Engine:
    """One training run: an accelerator, a prepared model and optimizer, the loop, its checkpoints and metrics.

    Args:
        args: The shared training fields.
        out: The run directory (accelerate's project dir; trackers write there).
        seed: Seed of this run's dropout stream (the data order and masks are the recipe's).
        checkpoint_dir: Where `step-N` checkpoints go.
        metrics: The metrics.jsonl of the run (appended to; written by the main process only).
        tags: Fields added to every event (e.g. a fine-tuning run's task, peak_lr and seed).
    """

    def __init__(
        self,
        args: TrainArgs,
        out: Path,
        seed: int,
        checkpoint_dir: Path,
        metrics: Path,
        tags: dict[str, Any] | None = None,
    ) -> None:
        self.args = args
        self.out = out
        self.seed = seed
        self.tags = dict(tags or {})
        set_torch_flags(args)
        self.accelerator = make_accelerator(args, out)
        self.checkpoints = CheckpointManager(checkpoint_dir, args.keep_checkpoints)
        self.metrics_path = metrics
        self.metrics: MetricsWriter | None = None
        self.tracker_prefix = ""
        self.stage: ResolvedStage | None = None  # the stage being trained, None before the first (or without stages)
        self.stage_tags: dict[str, Any] = {}  # its name, in train and eval events (not a run tag: resume ignores it)

    # -- set-up ------------------------------------------------------------------------------------------------

    @property
    def is_main_process(self) -> bool:
        return self.accelerator.is_main_process

    def setup(
        self, model: Model, lr: float, total_steps: int, multiplier: Callable[[int], float] | None = None
    ) -> None:
        """AdamW and its schedule over `total_steps` (or `multiplier`), torch.compile if asked, accelerate's prepare."""
        args = self.args
        optimizer, self.scheduler = make_optimizer(
            model,
            lr,
            args.weight_decay,
            (args.adam_beta1, args.adam_beta2),
            args.adam_eps,
            args.warmup_for(total_steps),
            total_steps,
            args.schedule,
            decay_steps=args.decay_for(total_steps),
            decay_shape=args.decay_shape,
            multiplier=multiplier,
        )
        model.set_gradient_checkpointing(args.gradient_checkpointing)
        model.set_unpadding(args.unpadding_on())
        if args.compile:
            model = torch.compile(model)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.interval = Interval()  # sums since the last train event: part of every checkpoint
        self.accelerator.register_for_checkpointing(self.scheduler)
        self.total_steps = total_steps

    def start_logging(self, project: str, config: dict[str, Any], tracker_prefix: str = "") -> None:
        """Open metrics.jsonl (main process) and the accelerate trackers."""
        self.metrics = run_on_main(lambda: MetricsWriter(self.metrics_path))
        self.tracker_prefix = tracker_prefix
        self.accelerator.init_trackers(project, config=config)

    def finish(self) -> None:
        """Close trackers and metrics.

        Not accelerator.end_training(): that destroys the process group, which the next run in this process (a
        fine-tuning grid, an experiment) still needs.
        """
        for tracker in self.accelerator.trackers:
            tracker.finish()
        if self.metrics is not None:
            self.metrics.close()
        self.accelerator.wait_for_everyone()

    def bare_model(self) -> torch.nn.Module:
        """The model without accelerate's and torch.compile's wrappers (same parameters)."""
        model = self.accelerator.unwrap_model(self.model)
        return getattr(model, "_orig_mod", model)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's weights gathered from every process (FSDP/ZeRO shards), keys without compile prefixes."""
        state = self.accelerator.get_state_dict(self.model)
        return {k.removeprefix("_orig_mod."): v for k, v in state.items()}

    def load_full_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load weights from `full_state_dict` into the prepared model on every process.

        Under FSDP only the main process holds the full dict: it is broadcast and sharded by torch's distributed
        state-dict API. Elsewhere every process has it and loads it directly.
        """
        from accelerate.utils import DistributedType

        sharded = self.accelerator.distributed_type == DistributedType.FSDP
        load_full_state(self.model if sharded else self.bare_model(), state, sharded)

    # -- the loop ----------------------------------------------------------------------------------------------

    def fit(
        self,
        recipe: Recipe,
        state: RunState,
        checkpoint_at_end: bool = True,
        desc: str | None = None,
        report_throughput: bool = False,
    ) -> RunState:
        """Train from `state.step` to the last step: log, evaluate, checkpoint on schedule. Returns the final state.

        `report_throughput` ends a run that reached its last step with a `throughput` event (`Pace.event`): the
        tokens/s it kept of its own training steps' and what the rest of the wall time went to.

        Raises:
            Preempted: SIGTERM/SIGINT arrived; the step finished and a checkpoint was written.
            Diverged: `max_bad_steps` consecutive non-finite steps.
            WriteFailed: a checkpoint could not be written.
        """
        from tqdm.auto import tqdm

        args, total = self.args, self.total_steps
        evaluate_at = self.eval_points(recipe)
        keep_at = recipe.snapshot_points()  # the steps whose weights it keeps (fine-tuning's train.average_last)
        stage_ends = {stage.end: stage for stage in recipe.stages if stage.name}
        show = self.is_main_process and args.progress
        if state.step and recipe.converged(state.step):  # resumed after the step where it stopped early
            return state
        bar = tqdm(total=total, initial=state.step, desc=desc, disable=not show)
        interval = self.interval
        pace = Pace()
        with GracefulStop() as stop:
            for step in range(state.step, total):
                self._enter_stage_of(recipe, step)
                args = self.args  # a stage may change the batch layout
                result = self.train_step(recipe, step)
                pace.add(result)
                state.step, done = step + 1, step + 1
                state.tokens_seen += result.tokens
                state.elapsed_sec += result.step_sec
                interval.add(result)
                bar.update(1)
                self._count_bad_step(result, state)
                ended = stage_ends.get(done)
                with pace.spent("log"):
                    if done % args.log_every == 0 or done == total or ended:
                        event = interval.event(self.accelerator.reduce, state)
                        bar.set_postfix(loss=f"{event['loss']:.4f}", tok_s=f"{event['tokens_per_sec']:.0f}")
                        record = {"event": "train", **self.tags, **self.stage_tags, "step": done, **event}
                        self.log({**record, "epoch": _epoch(recipe, done)})
                with pace.spent("eval"):
                    if done in evaluate_at or ended:
                        self.evaluate(recipe, state)
                with pace.spent("checkpoint"):  # before this step's checkpoint, which then holds it
                    if done in keep_at:
                        recipe.snapshot(done)
                with pace.spent("stage"):
                    end_event = recipe.end_stage(ended, state) if ended else None
                saved = (
                    (args.save_every and done % args.save_every == 0)
                    or (done == total and checkpoint_at_end)
                    or ended is not None
                )
                with pace.spent("checkpoint"):
                    if saved:
                        path = self.save_checkpoint(recipe, state)
                if end_event is not None:
                    where = {"checkpoint": str(path.relative_to(self.out)), **end_event}
                    self.log({"event": "stage_end", **self.tags, "stage": ended.name, "step": done, **where})
                if any_process(stop.requested):  # every process stops after the same step
                    self._stop(recipe, state, stop.signal_name or "a signal on another process", already_saved=saved)
                if done in evaluate_at and done < total and recipe.converged(done):
                    self._end_early(recipe, state, already_saved=saved or not checkpoint_at_end)
                    break
        bar.close()
        if report_throughput and pace.steps and state.step == total:
            self.log({"event": "throughput", **self.tags, "step": total, **pace.event()})
        return state

    def _enter_stage_of(self, recipe: Recipe, step: int, resuming: bool = False) -> None:
        """Train `step` as its stage says (nothing for a recipe without stages): batch layout, model, tags.

        Entering a named stage at its first step logs its `stage` event; `resuming` enters without one (the
        checkpoint's layout, to check the global batch it was written with).
        """
        if not recipe.stages:
            return
        stage = recipe.stages[stage_index(recipe.stages, step)]
        if stage is self.stage:
            return
        t0 = time.perf_counter()
        self.stage = stage
        layout = stage.train
        self.args = replace(self.args, batch_size=layout.batch_size, grad_accum=layout.grad_accum)
        self.accelerator.gradient_accumulation_steps = layout.grad_accum
        self.accelerator.step = 0  # micro-steps counted anew: the next step's last micro-batch is its update
        recipe.enter_stage(stage)
        self.stage_tags = {"stage": stage.name} if stage.name else {}
        if stage.name and step == stage.start and not resuming:
            switch = {"switch_sec": time.perf_counter() - t0}  # what entering cost (its data was built at the start)
            self.log({**stage_event(stage, self.global_batch), **self.tags, **switch})

    def _count_bad_step(self, result: StepResult, state: RunState) -> None:
        """Log a skipped (non-finite) update; stop the run after max_bad_steps of them in a row."""
        if not result.skipped:
            state.bad_steps = 0
            return
        state.skipped_steps += 1
        state.bad_steps += 1
        loss = self.accelerator.reduce(result.loss.clone(), "sum").item()
        self.log({"event": "skipped", **self.tags, "step": state.step, "loss": loss, "grad_norm": result.grad_norm})
        if state.bad_steps >= self.args.max_bad_steps:
            latest = self.checkpoints.latest()
            last = f"the last good checkpoint is {latest[1]}" if latest else "there is no checkpoint"
            raise Diverged(
                f"{state.bad_steps} consecutive steps with a non-finite loss or gradient norm (up to step "
                f"{state.step}, train.max_bad_steps={self.args.max_bad_steps}); {last}"
            )

    def _end_early(self, recipe: Recipe, state: RunState, already_saved: bool) -> None:
        """Log a run's early end (`Recipe.converged`) and checkpoint it, so that a resume ends it too."""
        self.log({"event": "converged", **self.tags, "step": state.step, "of_steps": self.total_steps})
        if not already_saved:
            self.save_checkpoint(recipe, state)

    def _stop(self, recipe: Recipe, state: RunState, reason: str, already_saved: bool) -> None:
        """Checkpoint (unless this step just was) and raise Preempted."""
        if not already_saved:
            self.save_checkpoint(recipe, state)
        self.log({"event": "stopped", **self.tags, "step": state.step, "reason": reason})
        path = self.checkpoints.directory / f"step-{state.step}"
        raise Preempted(f"stopped by {reason} after step {state.step}; checkpoint {path} (continue with --resume)")

    def eval_points(self, recipe: Recipe) -> set[int]:
        """Steps after which to evaluate: every eval_every steps (0: none), or every epoch's end (null); the last."""
        every, total = self.args.eval_every, self.total_steps
        if every is None:
            per_epoch = recipe.steps_per_epoch()
            if per_epoch is None:
                raise UserError("train.eval_every: null (every epoch) needs data of known length; give a step count")
            points = {min(total, math.ceil(k * per_epoch)) for k in range(1, math.ceil(total / per_epoch) + 1)}
        else:
            points = set(range(every, total + 1, every)) if every else set()
        return points | {total} if total else set()

    def train_step(self, recipe: Recipe, step: int) -> StepResult:
        """One optimizer step over the recipe's plan for `step` (all micro-batches)."""
        acc = self.accelerator
        lr = self.scheduler.get_last_lr()[0]  # the rate this step uses (logged with its loss)
        t0 = time.perf_counter()
        plan = recipe.plan(step)
        data_sec = time.perf_counter() - t0
        self.model.train()
        local = torch.zeros((), device=acc.device)
        grad_norm, skipped = 0.0, False
        guard = acc.mixed_precision != "fp16"  # fp16 loss scaling skips non-finite steps itself
        for micro in range(self.args.grad_accum):
            t1 = time.perf_counter()
            batch = plan.micro(micro)
            data_sec += time.perf_counter() - t1
            torch.manual_seed(dropout_seed(self.seed, step, micro * acc.num_processes + acc.process_index))
            with acc.accumulate(self.model):
                loss, share = plan.loss(self.model, batch)
                acc.backward(loss)
                local += share
                norm, skipped = finish_micro_step(
                    acc, self.model, self.optimizer, self.scheduler, self.args.max_grad_norm, guard
                )
                grad_norm = grad_norm if norm is None else norm
        elapsed = time.perf_counter() - t0
        # an MLM plan's MaskCounts (the rate asked for and realised are logged), or None
        return StepResult(local, grad_norm, lr, data_sec, elapsed, plan.tokens, skipped, plan.padded_tokens, plan.mask)

    def evaluate(self, recipe: Recipe, state: RunState) -> None:
        """Run the recipe's evaluation after `state.step` steps and log its events."""
        for event in recipe.evaluate(state.step):
            record = {"event": "eval", **self.tags, **self.stage_tags, "step": state.step, **event}
            record = {**record, "epoch": _epoch(recipe, state.step), "elapsed_sec": state.elapsed_sec}
            self.log(record)
            if self.is_main_process:  # as HF Trainer and fairseq print each validation: the result where it is made
                logger.info(evaluation_line(record, [tag for tag in self.tags if tag != "task"]))

    def log(self, event: dict[str, Any]) -> None:
        """Write an event to metrics.jsonl (main process) and its numbers to the trackers.

        Raises:
            WriteFailed: metrics.jsonl could not be written (disk full); the last checkpoint is intact.
        """
        metrics = self.metrics

        def write() -> None:
            try:
                metrics.write(event)
            except OSError as e:
                latest = self.checkpoints.latest()
                kept = f"the last checkpoint {latest[1]} is intact" if latest else "there is no checkpoint"
                message = f"cannot write {self.metrics_path}: {describe_write_error(e, self.out)}; {kept}"
                raise WriteFailed(message) from None

        agree_on_errors(write if metrics is not None else None)  # the main process writes; all learn of a failure
        skip = {"step", "event", *self.tags}
        numbers = {k: v for k, v in event.items() if isinstance(v, int | float) and k not in skip}
        prefix = self.tracker_prefix + ("eval/" if event.get("event") == "eval" else "train/")
        self.accelerator.log({prefix + k.removeprefix("eval_"): v for k, v in numbers.items()}, step=event["step"])

    # -- checkpoints -------------------------------------------------------------------------------------------

    def save_checkpoint(self, recipe: Recipe, state: RunState) -> Path:
        """Write the complete training state of `state.step` (model, optimizer, schedule, RNG, counters, recipe).

        Raises:
            WriteFailed: any process failed to write (disk full, unwritable); the unfinished checkpoint is
                removed and the previous one is intact.
        """
        acc, step = self.accelerator, state.step
        tmp = self.checkpoints.tmp_path(step)
        failure = self._attempt(lambda: self.checkpoints.begin(step), main_only=True)
        # every process writes its files (RNG states, FSDP shards) before the checkpoint is committed
        failure = failure or self._attempt(lambda: self._save_state(tmp))
        intervals = gather(self.interval.state_dict())
        stage_batches = self.stage_batches(recipe)
        if failure is None:

            def commit() -> None:
                trainer_state = {
                    **asdict(state),
                    "global_batch": self.global_batch,
                    **({"stage_batches": stage_batches} if stage_batches else {}),
                    "layout": self.layout_summary(),
                    "data_state": recipe.save_checkpoint_state(tmp),
                    "intervals": intervals,  # per process: the sums since the last train event
                }
                (tmp / TRAINER_STATE_FILE).write_text(json.dumps(trainer_state))
                self.checkpoints.commit(step)

            failure = self._attempt(commit, main_only=True)
        if failure is not None:
            if acc.is_main_process:
                self.checkpoints.discard(step)
            latest = self.checkpoints.latest()
            kept = f"the previous checkpoint {latest[1]} is intact" if latest else "no earlier checkpoint exists"
            raise WriteFailed(f"cannot write checkpoint {tmp.parent / f'step-{step}'}: {failure}; {kept}")
        return self.checkpoints.directory / f"step-{step}"

    def _save_state(self, directory: Path) -> None:
        """Model, optimizer, schedule, RNG (and fp16 loss scale) of every process into `directory`.

        Unsharded, accelerate's `save_state`: full tensors, which any process layout loads. Sharded (FSDP2), the model
        and optimizer through torch.distributed.checkpoint into `sharded/`, which any number of processes loads
        (roformer.train.sharded; accelerate's own FSDP files are tied to its loader), the rest through accelerate's
        writers under their usual names.
        """
        acc = self.accelerator
        if not is_sharded(self.model):
            acc.save_state(str(directory))
            return
        from accelerate.checkpointing import save_accelerator_state, save_custom_state

        save_sharded_state(self.model, self.optimizer, directory / SHARDED_DIR)
        save_accelerator_state(str(directory), [], [], [], [], acc.process_index, acc.step, acc.scaler)
        save_custom_state(self.scheduler, str(directory), 0)

    def _load_state(self, directory: Path) -> None:
        """Load what `_save_state` wrote (a checkpoint with `sharded/` through DCP, resharded to this launch)."""
        acc = self.accelerator
        if not (directory / SHARDED_DIR).is_dir():
            acc.load_state(str(directory))
            return
        from accelerate.checkpointing import load_accelerator_state, load_custom_state

        load_sharded_state(self.model, self.optimizer, directory / SHARDED_DIR)
        # the RNG file of this rank (none for a rank the writing launch did not have: not needed, see train_step)
        load_accelerator_state(str(directory), [], [], [], [], acc.process_index, acc.scaler)
        load_custom_state(self.scheduler, str(directory), 0)

    def _attempt(self, write: Callable[[], Any], main_only: bool = False) -> str | None:
        """Run a write (on the main process only, or on all); None if it succeeded everywhere, else the error.

        A write error on one process must not leave the others waiting at a barrier: every process learns of it.
        """
        error = None
        if self.is_main_process or not main_only:
            try:
                write()
            except write_errors() as e:  # ENOSPC and friends, as Python, torch.save or safetensors report them
                error = describe_write_error(e, self.checkpoints.directory)
        failed = any_process(error is not None)
        return (error or "another process could not write") if failed else None

    @property
    def layout(self) -> ProcessLayout:
        """This process's place in every step (rank, processes, batch size, micro-batches, device)."""
        acc, args = self.accelerator, self.args
        return ProcessLayout(acc.process_index, acc.num_processes, args.batch_size, args.grad_accum, acc.device)

    def stage_batches(self, recipe: Recipe) -> dict[str, int]:
        """Each named stage's global batch under this launch (empty for a recipe without stages)."""
        processes = self.accelerator.num_processes
        return {
            stage.name: global_batch_size(stage.train.batch_size, processes, stage.train.grad_accum)
            for stage in recipe.stages
            if stage.name
        }

    def layout_summary(self) -> dict[str, int]:
        """The process layout of this launch, as a checkpoint records it (processes, batch_size, grad_accum)."""
        processes, args = self.accelerator.num_processes, self.args
        return {"processes": processes, "batch_size": args.batch_size, "grad_accum": args.grad_accum}

    @property
    def global_batch(self) -> int:
        """Examples per optimizer step over all processes and micro-batches."""
        return global_batch_size(self.args.batch_size, self.accelerator.num_processes, self.args.grad_accum)

    def resume(self, recipe: Recipe) -> RunState:
        """Continue from the newest complete checkpoint, or from step 0 when there is none.

        This run's events after the checkpoint (all of them without one) are dropped from metrics.jsonl: the resumed
        run writes them again. Events of other runs sharing the file (other tags) are kept.
        """
        state = self._load_latest_checkpoint(recipe)
        if state is None:
            logger.info("no complete checkpoint in %s: starting from step 0", self.checkpoints.directory)
        last = state.step if state is not None else -1
        mine = self.tags.items()

        def kept(event: dict[str, Any]) -> bool:  # other runs' events, and this run's up to the checkpoint
            return any(event.get(k) != v for k, v in mine) or event.get("step", 0) <= last

        run_on_main(lambda: keep_metrics(self.metrics_path, kept))
        return state or RunState()

    def _load_latest_checkpoint(self, recipe: Recipe) -> RunState | None:
        """Load the newest complete checkpoint into model, optimizer, schedule, RNG and recipe; None if there is none.

        Raises:
            UserError: the checkpoint was written with another global batch.
        """
        latest = self.checkpoints.latest_intact(
            load=self._load_state,
            agree=lambda problem: first_problem(gather(problem)),
            share=broadcast_from_main,
        )
        if latest is None:
            return None
        step, path = latest
        saved = read_json(path / TRAINER_STATE_FILE, f"delete {path} to resume from an older checkpoint")
        self._enter_stage_of(recipe, max(step - 1, 0), resuming=True)  # the layout the checkpoint was written in
        if saved.get("global_batch", self.global_batch) != self.global_batch:
            raise UserError(
                f"{path}: saved with a global batch of {saved['global_batch']} examples, now {self.global_batch} "
                f"(same batch_size x processes x grad_accum needed to resume{self._batch_hint(saved['global_batch'])})"
            )
        now = self.stage_batches(recipe)
        changed = [name for name, size in saved.get("stage_batches", {}).items() if now.get(name, size) != size]
        if changed:  # a later stage would train on another global batch than the run was started with
            name = changed[0]
            raise UserError(
                f"{path}: stage {name!r} was to train with a global batch of {saved['stage_batches'][name]} examples, "
                f"now {now[name]} (same batch_size x processes x grad_accum in every stage)"
            )
        if step > self.total_steps:  # it would train nothing and report the shorter run
            raise UserError(
                f"{path}: the checkpoint is at step {step}, past this run's last step {self.total_steps}: resume "
                f"with train.max_steps >= {step}"
            )
        recipe.load_checkpoint_state(path, saved.get("data_state", {}), step)
        # accelerate counts micro-steps to know which one ends an accumulation: restored from the checkpoint, the count
        # of another grad_accum would put the update in the middle of a step (seen: losses off by 5e-3 after a resume
        # from 2 processes x grad_accum 1 at step 5 onto 1 process x grad_accum 2)
        self.accelerator.step = step * self.args.grad_accum
        logger.info("resumed from %s (step %d)", path, step)
        notice = layout_notice(saved_layout(saved), self.layout_summary(), self._draws_dropout(), recipe)
        if notice:
            logger.warning("%s: %s", path, notice, extra=MAIN_ONLY)
        if saved.get("intervals"):
            mine = interval_of(saved["intervals"], self.accelerator.process_index, self.accelerator.num_processes)
            self.interval.load_state_dict(mine, self.accelerator.device)
        counters = {k: saved[k] for k in ("tokens_seen", "elapsed_sec", "skipped_steps", "bad_steps") if k in saved}
        return RunState(step=step, **counters)

    def _batch_hint(self, saved_batch: int) -> str:
        """How to get the checkpoint's global batch on this launch, keeping batch_size (the exact way), if possible."""
        per_accumulation = self.args.batch_size * self.accelerator.num_processes
        if saved_batch % per_accumulation:
            return ""
        return f": --set train.grad_accum={saved_batch // per_accumulation} gives it here"

    def _draws_dropout(self) -> bool:
        """Whether the model draws dropout masks in training (any dropout module or attention dropout above 0)."""
        model = self.bare_model()
        config = getattr(model, "config", None)
        if config is not None and getattr(config, "attention_dropout", 0.0) > 0:
            return True
        return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


def _epoch(recipe: Recipe, step: int) -> float:
    return round(recipe.epoch_of(step), 4)
