"""One (lr, seed) fine-tuning run as a recipe of the training engine: its steps, evaluations and averaged models.

`FinetuneRun` gives the engine (roformer.train.engine) what one run of a fine-tuning job trains and evaluates: the
step plans (`train.batch_size` examples from seeded per-epoch permutations, or a task's fixed token batches), the dev
evaluation and the best checkpoint so far, the models of the last evaluations for `train.average_last`, the early
stop of `train.patience`, and what its checkpoints hold beyond the engine's. The job around it (the grid, selection
and publishing) is roformer.train.finetune.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from roformer.data.sampling import EpochSampler, LengthGroupedSampler, share
from roformer.tasks.base import TokenBatches
from roformer.tasks.glue_metrics import ranked
from roformer.train.averaging import average_states, last_points
from roformer.train.engine import Engine
from roformer.train.predict import EncodedTask, predict
from roformer.train.recipe import ProcessLayout, Unstaged, to_device

BEST_WEIGHTS_FILE = "best.safetensors"  # inside a fine-tuning checkpoint: the best dev weights so far


def snapshot_file(step: int) -> str:
    """Inside a fine-tuning checkpoint: the weights after step `step`, one of those averaged at the end."""
    return f"average-step-{step}.safetensors"


# ----------------------------------------------------------------------------------------------------------------
# One (lr, seed) run: a recipe of the engine


@dataclass(frozen=True)
class RowSizes:
    """What a step's throughput and padding figures read of the training split's rows."""

    lengths: list[int]
    tokens: list[int]
    sequences: int


class _FinetuneStep:
    """One step's examples; each process pads and trains on its rows of every micro-batch.

    Args:
        indices: The global batch's training examples, in order.
        rows: The training split's rows (lengths, real tokens and sequences per row, read once per run).
        batch_of: The padded batch of a list of examples.
        padded_length: The padded length of a batch whose longest example has this many tokens.
        layout: This process's share of the step.
        task_loss: The task's loss of a model and a batch (`FinetuneTask.loss`).
    """

    mask = None  # no masked-token rate: the engine logs one for MLM steps alone

    def __init__(
        self,
        indices: list[int],
        rows: RowSizes,
        batch_of: Callable[[list[int]], dict[str, torch.Tensor]],
        padded_length: Callable[[int], int],
        layout: ProcessLayout,
        task_loss: Callable[[torch.nn.Module, dict[str, torch.Tensor]], torch.Tensor],
    ) -> None:
        self.indices, self.batch_of, self.layout, self.task_loss = indices, batch_of, layout, task_loss
        self.tokens = sum(rows.tokens[i] for i in indices)  # real tokens, padding excluded
        lengths = [rows.lengths[i] for i in indices]
        size = layout.batch_size  # every (micro-batch, process) chunk is padded on its own
        chunks = [lengths[start : start + size] for start in range(0, len(lengths), size)]
        self.padded_tokens = rows.sequences * sum(len(c) * padded_length(max(c)) for c in chunks)

    def micro(self, micro: int) -> dict[str, torch.Tensor]:
        layout = self.layout
        rows = share(self.indices, micro, layout.rank, layout.num_processes, layout.batch_size)
        return {k: to_device(v, layout.device) for k, v in self.batch_of(rows).items()}

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        loss = self.task_loss(model, batch)
        # every micro-batch has batch_size examples: the mean of the means is the global batch's mean
        return loss, loss.detach().float() / self.layout.grad_accum / self.layout.num_processes


class _TokenBatchStep:
    """One step of token batches: processes x grad_accum batches of the task's, one per micro-batch and process.

    Batch k of the step is micro-batch k // processes of process k % processes, as `share` spreads examples, so the
    same batches train a step under any layout of the same processes x grad_accum. Each batch's loss (a mean over
    its terms, e.g. target tokens) is weighted by its share of the step's terms: the step's loss is the mean over
    all of them (fairseq's normalisation), and the gradients of processes and micro-batches add up to its gradient.

    Args:
        batches: The step's batches of training rows, in order.
        batch_of: The padded batch of a list of rows.
        weight_of: The terms a batch's loss averages over (`FinetuneTask.loss_weight`).
        padded_of: The positions a batch computes, padding included (`FinetuneTask.padded_tokens`).
        tokens: Real tokens of every training row.
        layout: This process's share of the step.
        task_loss: The task's loss of a model and a batch.
    """

    mask = None  # no masked-token rate: the engine logs one for MLM steps alone

    def __init__(
        self,
        batches: list[list[int]],
        batch_of: Callable[[list[int]], dict[str, torch.Tensor]],
        weight_of: Callable[[list[int]], int],
        padded_of: Callable[[list[int]], int],
        tokens: list[int],
        layout: ProcessLayout,
        task_loss: Callable[[torch.nn.Module, dict[str, torch.Tensor]], torch.Tensor],
    ) -> None:
        self.batches, self.batch_of, self.layout, self.task_loss = batches, batch_of, layout, task_loss
        self.tokens = sum(tokens[i] for rows in batches for i in rows)
        self.padded_tokens = sum(padded_of(rows) for rows in batches)
        weights = [weight_of(rows) for rows in batches]
        total = max(1, sum(weights))
        # a batch's weight: its share of the step's terms, times the batches (accelerate divides the loss by
        # grad_accum and DDP averages the gradients over processes: the weights average to 1 over the step)
        self.weights = [w * len(batches) / total for w in weights]

    def micro(self, micro: int) -> tuple[dict[str, torch.Tensor], float]:
        """This process's batch of micro-batch `micro`, on the device, and its loss weight."""
        layout = self.layout
        index = micro * layout.num_processes + layout.rank
        batch = {k: to_device(v, layout.device) for k, v in self.batch_of(self.batches[index]).items()}
        return batch, self.weights[index]

    def loss(
        self, model: torch.nn.Module, weighted: tuple[dict[str, torch.Tensor], float]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, weight = weighted
        loss = self.task_loss(model, batch) * weight
        return loss, loss.detach().float() / len(self.batches)


class FinetuneRun(Unstaged):
    """The batches, evaluation and best-checkpoint keeping of one fine-tuning run.

    Args:
        engine: The run's engine, set up with its model.
        seed: The run's seed (the order of its training examples).
        data: The task and its encoded splits.
        eval_size: Examples per prediction batch and process.
        group_by_length: Training batches of similar-length examples (data.group_by_length).
        average_last: Models averaged at the end (train.average_last; 0: none).
        average_every: Steps between them (train.average_every; None: the evaluation points).
        patience: Evaluations without a better first dev score after which the run stops (train.patience; None:
            it runs to its last step).
    """

    def __init__(
        self,
        engine: Engine,
        seed: int,
        data: EncodedTask,
        eval_size: int,
        group_by_length: bool,
        average_last: int = 0,
        average_every: int | None = None,
        patience: int | None = None,
    ) -> None:
        self.engine, self.data, self.eval_size = engine, data, eval_size
        train = data.splits["train"]
        self.rows = RowSizes(train.lengths, train.tokens, train.sequences)  # computed once: every step reads them
        self.lengths = self.rows.lengths
        by_tokens = data.task.spec.declares(TokenBatches)  # translation: batches by tokens, else of batch_size rows
        self.token_batches = data.task.token_batches(train, data.max_length) if by_tokens else None
        if self.token_batches is not None:  # the task's batches by tokens, processes x grad_accum of them a step
            chunks = engine.global_batch // engine.args.batch_size
            self.sampler: EpochSampler = EpochSampler(len(self.token_batches), chunks, seed)
        elif group_by_length:
            self.sampler = LengthGroupedSampler(self.lengths, engine.global_batch, seed)
        else:
            self.sampler = EpochSampler(len(self.lengths), engine.global_batch, seed)
        self.best: dict[str, Any] = {"score": -math.inf, "step": 0, "state": None, "dev": None}
        self.average_last, self.average_every, self.patience = average_last, average_every, patience
        self.average_points: list[int] = []  # set by `start`, once the run's length is known
        self.snapshots: dict[int, dict[str, torch.Tensor]] = {}  # the weights at those points, as they are passed
        self.evaluation_points: list[int] = []  # set by `start`: where `converged` counts evaluations

    def start(self) -> None:
        """Decide the steps whose weights are averaged (the engine is set up: the run's length is known).

        A run that may stop early (`patience`) cannot know its last models in advance: it takes one at every
        candidate point and keeps the newest `average_last` (`snapshot`); the others are fixed here.
        """
        every, total = self.average_every, self.engine.total_steps
        self.evaluation_points = sorted(self.engine.eval_points(self))
        candidates = set(self.evaluation_points) if every is None else set(range(every, total + 1, every))
        candidates |= {total} if total else set()
        kept = len(candidates) if self.patience is not None and self.average_last else self.average_last
        self.average_points = last_points(candidates, kept)

    def snapshot_points(self) -> set[int]:
        """The steps after which the engine calls `snapshot`: those whose weights are averaged at the end."""
        return set(self.average_points)

    def snapshot(self, step: int) -> None:
        """Keep the weights after `step` (gathered by every process under FSDP), for the average at the end.

        Only the newest `average_last` are kept (with `patience`, points are taken all along the run).
        """
        self.snapshots[step] = {k: v.detach().cpu().clone() for k, v in self.engine.full_state_dict().items()}
        for old in sorted(self.snapshots)[: -self.average_last]:
            del self.snapshots[old]

    def converged(self, step: int) -> bool:
        """Whether the run stops after `step`: `patience` evaluations in a row without a better first dev score."""
        if self.patience is None or self.best["state"] is None:
            return False
        since_best = [p for p in self.evaluation_points if self.best["step"] < p <= step]
        return len(since_best) >= self.patience

    def plan(self, step: int) -> _FinetuneStep | _TokenBatchStep:
        layout, task = self.engine.layout, self.data.task
        if self.token_batches is not None:
            train = self.data.splits["train"]
            batches = [self.token_batches[b] for b in self.sampler.indices(step).tolist()]
            cap = self.data.max_length
            return _TokenBatchStep(
                batches,
                partial(self.data.batch, "train"),
                partial(task.loss_weight, train),
                lambda rows: task.padded_tokens(train, rows, cap),
                self.rows.tokens,
                layout,
                task.loss,
            )
        indices = self.sampler.indices(step).tolist()
        batch_of = partial(self.data.batch, "train")
        return _FinetuneStep(indices, self.rows, batch_of, self.data.padded_length, layout, task.loss)

    def evaluate(self, step: int) -> list[dict[str, Any]]:
        """Dev metrics of every dev split; the weights are kept when the first split's score improves."""
        task, dev, predicted = self.data.task, {}, {}
        for split in task.dev_splits:
            predicted[split] = predict(self.engine, self.data, split, self.eval_size)
            dev[split] = task.evaluate(self.data.splits[split], predicted[split])
        score = dev[task.dev_splits[0]]["score"]
        if ranked(score) > ranked(self.best["score"]) or self.best["state"] is None:  # NaN: below every score
            # gathered by every process (FSDP/ZeRO-3 shards), complete at least on the main process
            state = {k: v.detach().cpu().clone() for k, v in self.engine.full_state_dict().items()}
            # the dev predictions are kept too: the run's prediction files need not predict dev again
            self.best = {"score": score, "step": step, "state": state, "dev": dev, "predictions": predicted}
        return [{"split": split, **metrics} for split, metrics in dev.items()]

    def averaged_state(self) -> dict[str, torch.Tensor] | None:
        """The mean of the weights kept at the average points (None: averaging is off, or no point was reached)."""
        states = [self.snapshots[step] for step in sorted(self.snapshots)]
        return average_states(states) if states else None

    def epoch_of(self, step: int) -> float:
        return step / self.steps_per_epoch()

    def steps_per_epoch(self) -> float:
        if self.token_batches is not None:
            return len(self.token_batches) / self.sampler.global_batch
        return len(self.lengths) / self.engine.global_batch

    def save_checkpoint_state(self, directory: Path) -> dict[str, Any]:
        if self.best["state"] is not None:
            save_file({k: v.contiguous() for k, v in self.best["state"].items()}, str(directory / BEST_WEIGHTS_FILE))
        for step, state in self.snapshots.items():
            save_file({k: v.contiguous() for k, v in state.items()}, str(directory / snapshot_file(step)))
        kept = {k: v for k, v in self.best.items() if k not in ("state", "predictions")}  # predictions: redone
        return {**kept, "snapshots": sorted(self.snapshots)}

    def load_checkpoint_state(self, directory: Path, state: dict[str, Any], step: int) -> None:
        weights = directory / BEST_WEIGHTS_FILE
        snapshots = state.pop("snapshots", [])
        self.best = {**state, "state": load_file(str(weights)) if weights.is_file() else None}
        self.snapshots = {point: load_file(str(directory / snapshot_file(point))) for point in snapshots}

    def micro_batch_loss(self) -> str | None:
        return self.data.task.micro_batch_loss
