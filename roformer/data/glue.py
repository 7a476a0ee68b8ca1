"""GLUE data for fine-tuning: the `data:` section, the task's splits, tokenized examples and padded batches.

Task metadata and the readers of the three sources (official TSV layout, hub, local files) are in
roformer.data.glue_tasks; the official metrics in roformer.data.glue_metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from roformer.config import check_types
from roformer.data.glue_tasks import Example, get_task, read_files, read_glue_dir, read_hub
from roformer.errors import ConfigError, UserError


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
        validation_mismatched_file: `files`, MNLI: the mismatched dev file (optional; `validation_file` is matched).
        test_mismatched_file: `files`, MNLI: the mismatched test file (optional).
        text_columns: `files`: the text column names, if not the hub's.
        label_column: `files`: the label column (names or ids).
        pad_to_multiple_of: Batches are padded to their longest example rounded up to this (8: what tensor cores and
            the fused attention kernels want; fewer distinct shapes for torch.compile). 1 = no rounding.
        group_by_length: Training batches of similar-length examples (windows of 50 global batches sorted by length,
            batch order shuffled): less padding, a little less randomness. Off by default, as in HF.
        max_length: Tokens per example (pair) including specials. Capped at the length the model was pretrained
            at when its directory records it (position rows or angles beyond it were never trained; the learned
            arm's table rows past it are random) and by a learned position table.
        beyond_pretraining_length: Lift the first cap (e.g. to study rotary extrapolation in fine-tuning).
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
    validation_mismatched_file: str | None = None
    test_mismatched_file: str | None = None
    text_columns: list[str] | None = None
    label_column: str = "label"
    max_length: int = 512
    pad_to_multiple_of: int = 8
    group_by_length: bool = False
    beyond_pretraining_length: bool = False
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
        mismatched = self.validation_mismatched_file or self.test_mismatched_file
        if mismatched and (self.source != "files" or len(get_task(self.task).dev) < 2):
            raise ConfigError("validation_mismatched_file / test_mismatched_file are for MNLI with source: files")
        if self.pad_to_multiple_of < 1:
            raise ConfigError(f"pad_to_multiple_of must be >= 1, got {self.pad_to_multiple_of}")
        if self.max_length < 8:
            raise ConfigError(f"max_length must be >= 8, got {self.max_length}")


def load_splits(data: GlueDataConfig) -> dict[str, list[Example]]:
    """All splits of the configured task and source (train labelled, dev labelled, test splits unlabelled)."""
    task = get_task(data.task)
    if data.source == "glue_dir":
        splits = read_glue_dir(task, data.glue_dir)
    elif data.source == "hub":
        splits = read_hub(task, data.hub_name)
    else:
        given = [(task.dev, data.validation_file, data.validation_mismatched_file),
                 (task.test, data.test_file, data.test_mismatched_file)]  # fmt: skip
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


def encode(examples: list[Example], tokenizer: Any, max_length: int) -> Encoded:
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
