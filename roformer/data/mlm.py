"""MLM batches for pretraining: the masked batch of every step and the fixed evaluation mask.

Batches are a deterministic function of the step, whatever feeds them:
- a block source gives the (G, T) unmasked blocks of step `s`: `PackedBlocks` (in memory: positions [s*G, (s+1)*G)
  of a seeded per-epoch permutation) or `StreamedBlocks` (the next G blocks of a stream, its position checkpointed);
- `MLMBatches` masks the whole global batch with one generator seeded by (seed, step), identically in every
  process, and hands each process its rows of each micro-batch.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from roformer.data.config import DataConfig, RateSchedule
from roformer.data.masking import IGNORE_INDEX, continuation_table, mask_tokens
from roformer.data.sampling import EpochSampler, global_batch_size
from roformer.data.streaming import StreamingMLMData, StreamPacker
from roformer.data.tokenizer import Tokenizer, jieba_presegmenter


class BlockSource(Protocol):
    """Unmasked training blocks by step."""

    global_batch: int

    def describe(self) -> str: ...
    def epoch_of(self, step: int) -> float: ...
    def steps_per_epoch(self) -> float | None: ...
    def blocks_of(self, step: int) -> torch.Tensor: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any], step: int) -> None: ...


class PackedBlocks:
    """In-memory (N, T) blocks, step `s` taking positions [s*G, (s+1)*G) of seeded per-epoch permutations."""

    def __init__(self, blocks: torch.Tensor, global_batch: int, seed: int) -> None:
        self.blocks = blocks
        self.global_batch = global_batch
        self.sampler = EpochSampler(len(blocks), global_batch, seed)

    def describe(self) -> str:
        return f"{len(self.blocks)} train blocks"

    def epoch_of(self, step: int) -> float:
        return self.sampler.epoch_of(step)

    def steps_per_epoch(self) -> float | None:
        return len(self.blocks) / self.global_batch

    def indices(self, step: int) -> torch.Tensor:
        """(G,) block indices of `step` (see EpochSampler)."""
        return self.sampler.indices(step)

    def blocks_of(self, step: int) -> torch.Tensor:
        return self.blocks[self.indices(step)]

    def state_dict(self) -> dict[str, Any]:
        return {}  # the data position is a function of the step

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        pass


class StreamedBlocks:
    """Blocks read from a stream (data.streaming): steps come in order; the stream position is checkpointed."""

    def __init__(self, packer: StreamPacker, global_batch: int) -> None:
        self.packer = packer
        self.global_batch = global_batch
        self.next_step = 0

    def describe(self) -> str:
        return "streamed training blocks"

    def epoch_of(self, step: int) -> float:
        return float(self.packer.epoch)  # a whole number: a stream's length is unknown

    def steps_per_epoch(self) -> float | None:
        return None

    def blocks_of(self, step: int) -> torch.Tensor:
        if step != self.next_step:
            raise RuntimeError(f"streamed batches come in order: expected step {self.next_step}, got {step}")
        self.next_step += 1
        return self.packer.blocks(self.global_batch)

    def state_dict(self) -> dict[str, Any]:
        return self.packer.state_dict()

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        self.packer.load_state_dict(state)
        self.next_step = step


class MLMBatches:
    """The masked global batch of every optimizer step (each process takes its rows with sampling.share).

    Args:
        source: Where the unmasked blocks of a step come from.
        tokenizer: The tokenizer (special ids, [MASK], vocabulary size, `##` continuations).
        data: The data config (mask rate, whole-word masking).
        seed: Seed of the masks.
        batch_size: Blocks per process per micro-batch.
        num_processes: Processes.
        grad_accum: Micro-batches per step.
        total_steps: The run's steps: where a mask-rate schedule ends (null: a constant rate needs none).
    """

    def __init__(
        self,
        source: BlockSource,
        tokenizer: Tokenizer,
        data: DataConfig,
        seed: int,
        batch_size: int,
        num_processes: int = 1,
        grad_accum: int = 1,
        total_steps: int | None = None,
    ) -> None:
        self.source = source
        self.seed = seed
        self.batch_size = batch_size
        self.num_processes = num_processes
        self.grad_accum = grad_accum
        self.global_batch = global_batch_size(batch_size, num_processes, grad_accum)
        if source.global_batch != self.global_batch:
            raise ValueError(f"the block source serves {source.global_batch} blocks a step, not {self.global_batch}")
        self.mask_args = {**mlm_mask_args(tokenizer, data), "split": tuple(data.mask_split)}
        if isinstance(data.mask_rate, RateSchedule) and total_steps is None:
            raise ValueError("a mask-rate schedule needs the run's total_steps")
        self.rate, self.total_steps = data.mask_rate, total_steps or 1
        self.special = torch.zeros(max(len(tokenizer), 1), dtype=torch.bool)
        self.special[self.mask_args["special_ids"]] = True

    def describe(self) -> str:
        """A few words on the data for the log."""
        return self.source.describe()

    def epoch_of(self, step: int) -> float:
        """Epochs completed at the start of `step`."""
        return self.source.epoch_of(step)

    def steps_per_epoch(self) -> float | None:
        """Optimizer steps in one epoch (None for a stream, whose length is unknown)."""
        return self.source.steps_per_epoch()

    def rate_of(self, step: int) -> float:
        """The mask rate `step` selects with (data.mask_rate, or its schedule's value at that step)."""
        return rate_at(self.rate, step, self.total_steps)

    def step(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Masked (G, T) ids and labels of `step`, identical in every process."""
        generator = torch.Generator().manual_seed((self.seed << 32) + step)
        return mask_tokens(self.source.blocks_of(step), generator=generator, rate=self.rate_of(step), **self.mask_args)

    def maskable(self, ids: torch.Tensor, labels: torch.Tensor) -> int:
        """Tokens of a masked batch that could have been selected (not special): its realised rate's denominator.

        A selected position was one (its [MASK] is special now); an unselected one is as it was.
        """
        special = self.special[ids.clamp(max=len(self.special) - 1)]
        return int(((labels != IGNORE_INDEX) | ~special).sum())

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold to continue the data exactly (a stream's position; nothing for packed)."""
        return self.source.state_dict()

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        """Continue after `step` steps."""
        self.source.load_state_dict(state, step)


def mlm_mask_args(tokenizer: Tokenizer, data: DataConfig) -> dict[str, Any]:
    """Keyword arguments of `mask_tokens` for a tokenizer and a data config (without ids, rate and generator)."""
    return {
        "mask_token_id": tokenizer.mask_token_id,
        "vocab_size": len(tokenizer),
        "special_ids": sorted(set(tokenizer.all_special_ids)),
        "continuation": continuation_table(tokenizer) if data.whole_word_mask else None,
    }


def eval_batch(blocks: torch.Tensor, tokenizer: Tokenizer, data: DataConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The validation blocks under the one fixed evaluation mask: data.eval_mask_rate, BERT's split, seeded.

    The same for every training rate, schedule and split, so eval losses compare across mask recipes.
    """
    generator = torch.Generator().manual_seed(data.eval_mask_seed)
    return mask_tokens(blocks, generator=generator, rate=data.eval_mask_rate, **mlm_mask_args(tokenizer, data))


def rate_at(rate: float | RateSchedule, step: int, total_steps: int) -> float:
    """The mask rate of `step` (0-based) of a run of `total_steps`: the constant, or the schedule's value there."""
    if isinstance(rate, RateSchedule):
        return rate.at(step / max(1, total_steps - 1))
    return rate


def train_batches(
    data: Any,
    config: DataConfig,
    seed: int,
    batch_size: int,
    num_processes: int = 1,
    grad_accum: int = 1,
    total_steps: int | None = None,
) -> MLMBatches:
    """The masked training batches of every step over the packed blocks (`data.train`), or over the stream.

    Args:
        data: The built data: roformer.data.store.MLMData or roformer.data.streaming.StreamingMLMData.
        config: The data config (block length, masking, jieba).
        seed: Seed of the batch order and the masks.
        batch_size: Blocks per process per micro-batch.
        num_processes: Processes.
        grad_accum: Micro-batches per step.
        total_steps: The run's steps (where a mask-rate schedule ends).
    """
    global_batch = global_batch_size(batch_size, num_processes, grad_accum)
    if isinstance(data, StreamingMLMData):
        transform = jieba_presegmenter(data.tokenizer) if config.jieba else None
        packer = StreamPacker(data.documents, seed, data.tokenizer, config.max_seq_len, transform)
        source: Any = StreamedBlocks(packer, global_batch)
    else:
        source = PackedBlocks(data.train, global_batch, seed)
    return MLMBatches(source, data.tokenizer, config, seed, batch_size, num_processes, grad_accum, total_steps)
