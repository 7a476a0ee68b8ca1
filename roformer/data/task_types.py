"""`make_task`: the fine-tuning task (roformer.data.tasks.FinetuneTask) of a config's `data:` section, by its type."""

from __future__ import annotations

import importlib

from roformer.data.config import FinetuneDataConfig
from roformer.data.tasks import FinetuneTask

# type -> the module and class of its task: imported when a config asks for it (a GLUE job never loads QA's metric)
TASK_CLASSES = {
    "glue": "roformer.data.glue:GlueTask",
    "classification": "roformer.data.classify:TextTask",
    "regression": "roformer.data.classify:TextTask",
    "multi_label_classification": "roformer.data.classify:TextTask",
    "token_classification": "roformer.data.tagging:TaggingTask",
    "question_answering": "roformer.data.qa:QATask",
    "multiple_choice": "roformer.data.choices:ChoicesTask",
    "similarity": "roformer.data.similarity:SimilarityTask",
    "triplet": "roformer.data.triplet:TripletTask",
}


def make_task(data: FinetuneDataConfig) -> FinetuneTask:
    """The task of a fine-tuning config's data: section, its splits read.

    Raises:
        UserError: missing or unreadable data files, bad rows (naming file and line), an empty training split.
    """
    module, _, name = TASK_CLASSES[data.type].partition(":")
    return getattr(importlib.import_module(module), name).from_config(data)
