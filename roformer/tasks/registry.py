"""`make_task`: the fine-tuning task (roformer.tasks.base.FinetuneTask) of a config's `data:` section, by its type."""

from __future__ import annotations

import importlib

from roformer.tasks.base import FinetuneTask
from roformer.tasks.config import FinetuneDataConfig

# type -> the module and class of its task: imported when a config asks for it (a GLUE job never loads QA's metric)
TASK_CLASSES = {
    "glue": "roformer.tasks.glue:GlueTask",
    "classification": "roformer.tasks.classify:TextTask",
    "regression": "roformer.tasks.classify:TextTask",
    "multi_label_classification": "roformer.tasks.classify:TextTask",
    "token_classification": "roformer.tasks.tagging:TaggingTask",
    "question_answering": "roformer.tasks.qa:QATask",
    "multiple_choice": "roformer.tasks.choices:ChoicesTask",
    "similarity": "roformer.tasks.similarity:SimilarityTask",
    "triplet": "roformer.tasks.triplet:TripletTask",
}


def make_task(data: FinetuneDataConfig) -> FinetuneTask:
    """The task of a fine-tuning config's data: section, its splits read.

    Raises:
        UserError: missing or unreadable data files, bad rows (naming file and line), an empty training split.
    """
    module, _, name = TASK_CLASSES[data.type].partition(":")
    return getattr(importlib.import_module(module), name).from_config(data)
