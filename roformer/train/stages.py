"""Pretraining in stages (`stages:` in a pretraining config): which stage a step is in, its batches and its lr.

A stage changes its data (block length, corpus, mask rate and split), the rotary base and scaling, the batch size or
the learning-rate phase (roformer.train.config.Stage). Everything stays a function of the run's step, so a resume
inside a stage or across a boundary continues exactly:
- the batches of a stage are an `MLMBatches` over its block source; stages whose blocks are the same (their data
  differs in masking only) share one source and read its seeded order on, with no block skipped or read twice,
  whatever their global batches;
- the masks are seeded by the run's step, a mask-rate schedule runs over its stage's steps;
- the learning rate is the run's schedule over all steps, or for a stage with its own phase, that stage's schedule
  over its steps (`lr_multiplier_for`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import MISSING, fields, replace
from typing import Any

import torch

from roformer.config import field_keys
from roformer.data.config import DataConfig
from roformer.data.mlm import BlockSource, MLMBatches
from roformer.data.tokenizer import Tokenizer
from roformer.train.config import ResolvedStage, TrainConfig
from roformer.train.optim import lr_multiplier


def blocks_key(data: DataConfig) -> DataConfig:
    """`data` with what decides the masks alone (its MASKS_ONLY fields) at their defaults.

    Stages with equal keys read the same blocks (one source).
    """
    masks_only = field_keys(DataConfig, "masks_only", declared=False)
    defaults = {
        f.name: f.default if f.default_factory is MISSING else f.default_factory()
        for f in fields(DataConfig)
        if f.name in masks_only
    }
    return replace(data, **defaults)


def source_groups(stages: list[ResolvedStage]) -> list[int]:
    """For each stage, the index of its block source: stages with equal `blocks_key` share one, first come first."""
    keys: list[DataConfig] = []
    groups = []
    for stage in stages:
        key = blocks_key(stage.data)
        if key not in keys:
            keys.append(key)
        groups.append(keys.index(key))
    return groups


def stage_index(stages: Sequence[ResolvedStage], step: int) -> int:
    """The index of the stage that trains step `step` (0-based; the last stage for a step past the end)."""
    return min(bisect.bisect_right([stage.end for stage in stages], step), len(stages) - 1)


class StagedBatches:
    """The masked global batch of every step of a run in stages (a run without stages is one stage).

    Args:
        stages: The run's stages, resolved.
        sources: The block sources, one per group of `source_groups`.
        tokenizer: The run's tokenizer.
        seed: Seed of the orders and masks.
        num_processes: Processes.
    """

    def __init__(
        self,
        stages: list[ResolvedStage],
        sources: list[BlockSource],
        tokenizer: Tokenizer,
        seed: int,
        num_processes: int = 1,
    ) -> None:
        self.stages, self.sources, self.groups = stages, sources, source_groups(stages)
        read = [0] * len(sources)  # blocks of each source read by the stages before
        self.batches = []
        for stage, group in zip(stages, self.groups, strict=True):
            train = stage.train
            batches = MLMBatches(
                sources[group],
                tokenizer,
                stage.data,
                seed,
                train.batch_size,
                num_processes,
                train.grad_accum,
                stage.steps,
                stage.start,
                read[group],
            )
            read[group] += stage.steps * batches.global_batch
            self.batches.append(batches)

    def of(self, step: int) -> MLMBatches:
        """The batches of the stage that trains `step`."""
        return self.batches[stage_index(self.stages, step)]

    @property
    def global_batch(self) -> int:
        """Blocks per step of the first stage (the run's, without stages)."""
        return self.batches[0].global_batch

    def describe(self) -> str:
        """A few words on the data for the log."""
        return "; ".join(dict.fromkeys(batches.describe() for batches in self.batches))

    def step(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Masked (G, T) ids and labels of `step` (G and T those of its stage)."""
        return self.of(step).step(step)

    def rate_of(self, step: int) -> float:
        """The mask rate `step` selects with."""
        return self.of(step).rate_of(step)

    def maskable(self, ids: torch.Tensor, labels: torch.Tensor) -> int:
        """Tokens of a masked batch that could have been selected (`MLMBatches.maskable`)."""
        return self.batches[0].maskable(ids, labels)

    def epoch_of(self, step: int) -> float:
        """Epochs completed after `step` steps, of the source of the stage that trained the last of them."""
        return self.of(max(step - 1, 0)).epoch_of(step)

    def steps_per_epoch(self) -> float | None:
        """Optimizer steps in one epoch: the run's without stages; None in stages (epochs of several sources)."""
        return self.batches[0].steps_per_epoch() if len(self.batches) == 1 else None

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds to continue exactly: the sources' positions (a stream's; nothing when packed).

        Without stages, the one source's state as before stages existed: old checkpoints resume, new ones load there.
        """
        if len(self.stages) == 1:
            return self.batches[0].state_dict()
        return {"sources": [source.state_dict() for source in self.sources]}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        """Continue after `step` steps: each source at the blocks its stages had read by then."""
        if len(self.stages) == 1:
            self.batches[0].load_state_dict(state, step)
            return
        for group, source in enumerate(self.sources):
            read = sum(
                min(max(step - stage.start, 0), stage.steps) * batches.global_batch
                for stage, batches, g in zip(self.stages, self.batches, self.groups, strict=True)
                if g == group
            )
            source.load_state_dict(state["sources"][group], read)


def lr_multiplier_for(stages: list[ResolvedStage], train: TrainConfig) -> Callable[[int], float]:
    """The learning-rate factor of every step (of the run's `train.lr`) of a run in stages.

    A stage with its own learning-rate phase (`Stage.own_lr_phase`) runs its schedule over its steps, peaking at its
    lr; the others follow the run's schedule over the whole run (a WSD run whose last stage is its decay needs none).
    """
    total = train.max_steps

    def multiplier(step: int) -> float:
        stage = stages[stage_index(stages, step)]
        if not stage.own_lr_phase:
            return lr_multiplier(
                step, train.warmup_for(total), total, train.schedule, train.decay_for(total), train.decay_shape
            )
        own, n = stage.train, stage.steps
        factor = lr_multiplier(
            step - stage.start, own.warmup_for(n), n, own.schedule, own.decay_for(n), own.decay_shape
        )
        return own.lr / train.lr * factor

    return multiplier


def stage_event(stage: ResolvedStage, layout_batch: int) -> dict[str, Any]:
    """The `stage` event of metrics.jsonl at a stage's first step: what it trains with."""
    data = stage.data
    rate = data.mask_rate if isinstance(data.mask_rate, float) else vars(data.mask_rate)
    return {
        "event": "stage",
        "stage": stage.name,
        "index": stage.index,
        "step": stage.start + 1,  # its first step (train events count the steps done)
        "steps": stage.steps,
        "max_seq_len": data.max_seq_len,
        "mask_rate": rate,
        "mask_split": list(data.mask_split),
        "global_batch": layout_batch,
        "rotary_base": stage.model.rotary_base,
        "rope_scaling": None if stage.model.rope_scaling is None else vars(stage.model.rope_scaling),
    }
