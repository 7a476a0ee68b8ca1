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
    """Unmasked training blocks in one seeded order: the blocks at positions [start, start + count) of it.

    A step of G blocks takes the next G: a run (or its stages sharing one source) reads the order without a gap or a
    repeat whatever its global batch, which may change from stage to stage.
    """

    def describe(self) -> str: ...
    def epoch_at(self, position: int) -> float: ...
    def blocks_per_epoch(self) -> int | None: ...
    def take(self, start: int, count: int) -> torch.Tensor: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any], position: int) -> None: ...


class PackedBlocks:
    """In-memory (N, T) blocks, step `s` taking positions [s*G, (s+1)*G) of seeded per-epoch permutations."""

    def __init__(self, blocks: torch.Tensor, global_batch: int, seed: int) -> None:
        self.blocks = blocks
        self.global_batch = global_batch
        self.sampler = EpochSampler(len(blocks), global_batch, seed)

    def describe(self) -> str:
        return f"{len(self.blocks)} train blocks"

    def epoch_at(self, position: int) -> float:
        return self.sampler.epoch_at(position)

    def blocks_per_epoch(self) -> int | None:
        return len(self.blocks)

    def indices(self, step: int) -> torch.Tensor:
        """(G,) block indices of `step` (see EpochSampler)."""
        return self.sampler.indices(step)

    def blocks_of(self, step: int) -> torch.Tensor:
        """(G, T) blocks of `step` of a run that reads this source alone at one global batch."""
        return self.take(step * self.global_batch, self.global_batch)

    def take(self, start: int, count: int) -> torch.Tensor:
        return self.blocks[self.sampler.at(start, count)]

    def state_dict(self) -> dict[str, Any]:
        return {}  # the data position is a function of the step

    def load_state_dict(self, state: dict[str, Any], position: int) -> None:
        pass


class StreamedBlocks:
    """Blocks read from a stream (data.streaming): taken in order; the stream position is checkpointed."""

    def __init__(self, packer: StreamPacker) -> None:
        self.packer = packer
        self.next_block = 0

    def describe(self) -> str:
        return "streamed training blocks"

    def epoch_at(self, position: int) -> float:
        return float(self.packer.epoch)  # a whole number: a stream's length is unknown

    def blocks_per_epoch(self) -> int | None:
        return None

    def take(self, start: int, count: int) -> torch.Tensor:
        if start != self.next_block:
            raise RuntimeError(f"streamed blocks come in order: expected block {self.next_block}, got {start}")
        self.next_block += count
        return self.packer.blocks(count)

    def state_dict(self) -> dict[str, Any]:
        return self.packer.state_dict()

    def load_state_dict(self, state: dict[str, Any], position: int) -> None:
        self.packer.load_state_dict(state)
        self.next_block = position


class MixtureBlocks:
    """Blocks drawn from several sources in proportion to their weights (`data.mixture`).

    The order is laid out in windows of `window` blocks: in each, source c has its quota of slots (w_c / sum w of the
    window, largest remainders rounded up), in a seeded random order. Position p's source and its place in that
    source's own order follow from p alone, so a resume (and a stage that reads on) needs no state but the position;
    each source is read in its own order, without a gap or a repeat.
    """

    def __init__(self, sources: list[BlockSource], weights: list[float], seed: int, window: int = 1000) -> None:
        self.sources, self.seed, self.window = sources, seed, window
        shares = [w / sum(weights) * window for w in weights]
        quotas = [int(s) for s in shares]
        for i in sorted(range(len(shares)), key=lambda i: quotas[i] - shares[i])[: window - sum(quotas)]:
            quotas[i] += 1  # largest remainders first
        self.quotas = quotas
        self._layout: tuple[int, torch.Tensor, torch.Tensor] | None = None

    def describe(self) -> str:
        return "a mixture of " + ", ".join(
            f"{s.describe()} ({q / self.window:.0%})" for s, q in zip(self.sources, self.quotas, strict=True)
        )

    def layout(self, window: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(source of each slot, its place among the window's slots of that source) of window `window`."""
        if self._layout is None or self._layout[0] != window:
            slots = torch.cat([torch.full((q,), c, dtype=torch.long) for c, q in enumerate(self.quotas)])
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + window + 7_777)
            slots = slots[torch.randperm(len(slots), generator=generator)]
            rank = torch.zeros_like(slots)
            for c in range(len(self.quotas)):
                mine = slots == c
                rank[mine] = torch.arange(int(mine.sum()))
            self._layout = (window, slots, rank)
        return self._layout[1], self._layout[2]

    def places(self, start: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(source, place in its own order) of mixture positions [start, start + count)."""
        sources, places = [], []
        for p in range(start, start + count):
            window, slot = divmod(p, self.window)
            source, rank = self.layout(window)
            c = int(source[slot])
            sources.append(c)
            places.append(window * self.quotas[c] + int(rank[slot]))
        return torch.tensor(sources), torch.tensor(places)

    def take(self, start: int, count: int) -> torch.Tensor:
        source, place = self.places(start, count)
        rows: list[torch.Tensor | None] = [None] * count
        for c, blocks in enumerate(self.sources):
            mine = (source == c).nonzero().squeeze(1)
            if len(mine):  # consecutive places of source c: one read
                taken = blocks.take(int(place[mine[0]]), len(mine))
                for row, block in zip(mine.tolist(), taken, strict=True):
                    rows[row] = block
        return torch.stack(rows)  # type: ignore[arg-type]

    def epoch_at(self, position: int) -> float:
        """Epochs of the first source (each source runs its own)."""
        return self.sources[0].epoch_at(self.read_of(0, position))

    def blocks_per_epoch(self) -> int | None:
        return None  # each source has its own epochs

    def read_of(self, c: int, position: int) -> int:
        """Blocks of source c among mixture positions [0, position)."""
        window, slot = divmod(position, self.window)
        source, _ = self.layout(window)
        return window * self.quotas[c] + int((source[:slot] == c).sum())

    def state_dict(self) -> dict[str, Any]:
        return {"sources": [source.state_dict() for source in self.sources]}

    def load_state_dict(self, state: dict[str, Any], position: int) -> None:
        for c, source in enumerate(self.sources):
            source.load_state_dict(state["sources"][c], self.read_of(c, position))


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
        total_steps: The steps these batches serve (a run's, or its stage's): where a mask-rate schedule ends (null:
            a constant rate needs none).
        first_step: The run's step these batches start at (a stage's first; the masks are seeded by the run's step).
        offset: Blocks of `source` read before `first_step` (by earlier stages sharing it).
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
        first_step: int = 0,
        offset: int = 0,
    ) -> None:
        self.source = source
        self.seed = seed
        self.batch_size = batch_size
        self.num_processes = num_processes
        self.grad_accum = grad_accum
        self.global_batch = global_batch_size(batch_size, num_processes, grad_accum)
        self.first_step, self.offset = first_step, offset
        self.mask_args = {**mlm_mask_args(tokenizer, data), "split": tuple(data.mask_split)}
        if isinstance(data.mask_rate, RateSchedule) and total_steps is None:
            raise ValueError("a mask-rate schedule needs the run's total_steps")
        self.rate, self.total_steps = data.mask_rate, total_steps or 1
        self.special = torch.zeros(max(len(tokenizer), 1), dtype=torch.bool)
        self.special[self.mask_args["special_ids"]] = True

    def describe(self) -> str:
        """A few words on the data for the log."""
        return self.source.describe()

    def position(self, step: int) -> int:
        """Blocks of the source read before `step` (a run's step)."""
        return self.offset + (step - self.first_step) * self.global_batch

    def epoch_of(self, step: int) -> float:
        """Epochs (of the source) completed at the start of `step`."""
        return self.source.epoch_at(self.position(step))

    def steps_per_epoch(self) -> float | None:
        """Optimizer steps in one epoch (None for a stream, whose length is unknown)."""
        blocks = self.source.blocks_per_epoch()
        return None if blocks is None else blocks / self.global_batch

    def rate_of(self, step: int) -> float:
        """The mask rate `step` selects with (data.mask_rate, or its schedule's value at that step of these batches)."""
        return rate_at(self.rate, step - self.first_step, self.total_steps)

    def step(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Masked (G, T) ids and labels of `step`, identical in every process."""
        generator = torch.Generator().manual_seed((self.seed << 32) + step)
        blocks = self.source.take(self.position(step), self.global_batch)
        return mask_tokens(blocks, generator=generator, rate=self.rate_of(step), **self.mask_args)

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
        self.source.load_state_dict(state, self.position(step))


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


def block_source(data: Any, config: DataConfig, seed: int, global_batch: int) -> BlockSource:
    """The unmasked training blocks of built data: its packed blocks (`data.train`) in seeded order, or its stream.

    Args:
        data: The built data: roformer.data.store.MLMData or roformer.data.streaming.StreamingMLMData.
        config: The data config (block length, jieba).
        seed: Seed of the order.
        global_batch: Blocks per optimizer step (the order does not depend on it; `PackedBlocks.blocks_of` does).
    """
    if isinstance(data, StreamingMLMData):
        transform = jieba_presegmenter(data.tokenizer) if config.jieba else None
        return StreamedBlocks(StreamPacker(data.documents, seed, data.tokenizer, config.max_seq_len, transform))
    return PackedBlocks(data.train, global_batch, seed)


def train_batches(
    data: Any,
    config: DataConfig,
    seed: int,
    batch_size: int,
    num_processes: int = 1,
    grad_accum: int = 1,
    total_steps: int | None = None,
) -> MLMBatches:
    """The masked training batches of every step of a run over its data (packed blocks or a stream).

    Args:
        data: The built data: roformer.data.store.MLMData or roformer.data.streaming.StreamingMLMData.
        config: The data config (block length, masking, jieba).
        seed: Seed of the batch order and the masks.
        batch_size: Blocks per process per micro-batch.
        num_processes: Processes.
        grad_accum: Micro-batches per step.
        total_steps: The run's steps (where a mask-rate schedule ends).
    """
    source = block_source(data, config, seed, global_batch_size(batch_size, num_processes, grad_accum))
    return MLMBatches(source, data.tokenizer, config, seed, batch_size, num_processes, grad_accum, total_steps)
