"""Predicting a fine-tuning task's splits with a trained model: the best checkpoint, its average, its variants.

`predict` gives every row's prediction of a split, each process predicting a contiguous share of the rows in order
of length and the shares gathered, so that several processes predict exactly what one does. `variant_scores` scores
the test splits under a task's test-time variants (a synthetic task's context extensions,
roformer.tasks.extensions): the same weights in another model config, the batches' positions changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from roformer.tasks.base import EncodedSplit, FinetuneTask, ScoresVariants
from roformer.train.evaluate import eval_chunks
from roformer.train.recipe import to_device

if TYPE_CHECKING:
    from collections.abc import Callable

    from roformer.train.engine import Engine


@dataclass(frozen=True)
class EncodedTask:
    """A task with its splits encoded for one tokenizer and length: what every run of a grid batches and predicts.

    Attributes:
        task: The task.
        splits: Its splits, encoded.
        pad_id: The tokenizer's padding id.
        max_length: The length the examples were cut to, also the longest a batch is padded to.
    """

    task: FinetuneTask
    splits: dict[str, EncodedSplit]
    pad_id: int
    max_length: int

    def batch(self, split: str, rows: list[int]) -> dict[str, torch.Tensor]:
        """The padded batch of `rows` of `split` (training and prediction pad alike, within max_length)."""
        return self.task.collate(self.splits[split], rows, self.pad_id, self.max_length)

    def padded_length(self, longest: int) -> int:
        """The padded length of a batch whose longest example has `longest` tokens."""
        return self.task.padded_length(longest, self.max_length)


@torch.no_grad()
def predict(
    engine: Engine,
    data: EncodedTask,
    split: str,
    eval_size: int,
    model: torch.nn.Module | None = None,
    change: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
) -> list[Any]:
    """The task's prediction of every row of `split`: a contiguous share per process, gathered (no duplicates).

    Rows are batched in order of length (little padding) and the predictions put back in split order.

    Args:
        engine: The run's engine: its accelerator, and its model unless `model` is given.
        data: The encoded task.
        split: The split predicted.
        eval_size: Rows per forward.
        model: Another model to predict with, on this process alone: every row, nothing gathered (a variant,
            which the main process scores; under autocast as the run's model computes).
        change: What changes a batch before the forward (a variant's positions), or None.
    """
    from accelerate.utils import gather_object

    acc = engine.accelerator
    alone = model is not None
    model = engine.model if model is None else model
    model.eval()
    encoded = data.splits[split]
    lengths = encoded.lengths
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    predictions: list[Any] = []
    rank, processes = (0, 1) if alone else (acc.process_index, acc.num_processes)
    for chunk in eval_chunks(len(lengths), eval_size, rank, processes):
        rows = [0] if chunk is None else [order[i] for i in chunk.tolist()]  # None: keeps FSDP in step
        batch = data.batch(split, rows)
        batch = batch if change is None else change(batch)
        outputs = data.task.outputs(model, {k: to_device(v, acc.device) for k, v in batch.items()}, encoded)
        if chunk is not None:  # logits in float32; a task's own outputs (decoded targets) as they are
            logits = outputs.float() if isinstance(outputs, torch.Tensor) else outputs
            predictions += data.task.predictions(logits, encoded, rows)
    gathered = gather_object([predictions]) if processes > 1 else [predictions]
    by_length = [p for part in gathered for p in part]
    in_order: list[Any] = [None] * len(by_length)
    for position, example in enumerate(order):
        in_order[example] = by_length[position]
    return in_order


def variant_scores(
    engine: Engine, data: EncodedTask, state: dict[str, torch.Tensor], splits: list[str], eval_size: int
) -> dict[str, dict[str, dict[str, float]]]:
    """{split: {label: metrics}}: the model of `state` scored on each split under each of the task's test variants.

    Each variant is the bare model's class built from the variant's config, `state` loaded into it (the same
    weights), on the run's device, under the run's autocast; a split without variants is left out. The main process
    scores them (under sharded training `state` is whole there alone) and every process gets the scores.
    """
    from accelerate.utils import broadcast_object_list

    if not data.task.spec.declares(ScoresVariants):  # alike on every process: the same declaration
        return {}
    acc, bare = engine.accelerator, engine.bare_model()
    scores: dict[str, dict[str, dict[str, float]]] = {}
    variants = {split: data.task.test_variants(bare.config, split) for split in splits}
    if acc.is_main_process:
        for split, named in variants.items():
            for label, variant in named.items():
                model = type(bare)(variant.config)
                model.load_state_dict(state)
                model.to(acc.device)
                with acc.autocast():
                    predictions = predict(engine, data, split, eval_size, model=model, change=variant.batch)
                scores.setdefault(split, {})[label] = data.task.evaluate(data.splits[split], predictions)
    if acc.num_processes > 1 and any(variants.values()):
        scores = broadcast_object_list([scores])[0]
    return scores
