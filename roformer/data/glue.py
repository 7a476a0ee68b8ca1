"""GLUE data for fine-tuning: the task's splits, tokenized examples and padded batches.

The `data:` section is roformer.data.config.GlueDataConfig.
Task metadata and the readers of the three sources (official TSV layout, hub, local files) are in
roformer.data.glue_tasks; the official metrics in roformer.data.glue_metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from roformer.data.config import GlueDataConfig
from roformer.data.glue_tasks import Example, get_task, read_files, read_glue_dir, read_hub
from roformer.errors import UserError

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer


def load_splits(data: GlueDataConfig) -> dict[str, list[Example]]:
    """All splits of the configured task and source (train labelled, dev labelled, test splits unlabelled)."""
    task = get_task(data.task)
    if data.source == "glue_dir":
        splits = read_glue_dir(task, data.glue_dir)
    elif data.source == "hub":
        splits = read_hub(task, data.hub_name)
    else:
        given = [
            (task.dev, data.validation_file, data.validation_mismatched_file),
            (task.test, data.test_file, data.test_mismatched_file),
        ]
        files = {"train": data.train_file}
        for splits_of_kind, first, second in given:
            for split, path in zip(splits_of_kind, (first, second)):
                if path:
                    files[split.name] = path
        splits = read_files(task, files, data.text_columns, data.label_column)
    if not splits["train"]:
        raise UserError(f"{task.name}: the training split is empty")
    if data.max_train_examples is not None:
        splits["train"] = splits["train"][: data.max_train_examples]
    if data.max_eval_examples is not None:
        splits = {k: v if k == "train" else v[: data.max_eval_examples] for k, v in splits.items()}
    return splits


@dataclass
class Encoded:
    """Token ids and types of a split, ragged (padding happens per batch)."""

    ids: list[list[int]]
    types: list[list[int]]
    labels: list[int | float | None]
    index: list[str]


def encode(examples: list[Example], tokenizer: Tokenizer, max_length: int) -> Encoded:
    """Tokenize single sentences or pairs (`[CLS] A [SEP] B [SEP]`, token types 0/1), truncated longest-first."""
    if not examples:
        return Encoded([], [], [], [])
    first = [e.texts[0] for e in examples]
    second = [e.texts[1] for e in examples] if len(examples[0].texts) > 1 else None
    out = tokenizer(first, second, truncation=True, max_length=max_length, return_token_type_ids=True)
    return Encoded(out["input_ids"], out["token_type_ids"], [e.label for e in examples], [e.index for e in examples])


def padded_length(longest: int, multiple: int, cap: int | None = None) -> int:
    """`longest` rounded up to a multiple of `multiple`, but not past `cap` (unless `longest` already is).

    Tensor cores and the fused attention kernels want multiples of 8; the cap is the longest length the model
    accepts (a learned position table).
    """
    rounded = -(-longest // multiple) * multiple
    return rounded if cap is None else max(longest, min(rounded, cap))


def collate(
    encoded: Encoded, rows: list[int], pad_id: int, regression: bool, multiple: int = 1, cap: int | None = None
) -> dict[str, torch.Tensor]:
    """Pad the chosen rows to their longest, rounded up to `multiple`; labels when the split has them."""
    length = padded_length(max(len(encoded.ids[r]) for r in rows), multiple, cap)
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
