"""`make_task`: the fine-tuning task (roformer.data.tasks.FinetuneTask) of a config's `data:` section, by its type."""

from __future__ import annotations

from roformer.data.choices import ChoicesTask
from roformer.data.classify import TextTask
from roformer.data.config import FinetuneDataConfig
from roformer.data.glue import GlueTask
from roformer.data.qa import QATask
from roformer.data.tagging import TaggingTask
from roformer.data.tasks import FinetuneTask

TASK_CLASSES = {
    "glue": GlueTask,
    "classification": TextTask,
    "regression": TextTask,
    "multi_label_classification": TextTask,
    "token_classification": TaggingTask,
    "question_answering": QATask,
    "multiple_choice": ChoicesTask,
}


def make_task(data: FinetuneDataConfig) -> FinetuneTask:
    """The task of a fine-tuning config's data: section, its splits read.

    Raises:
        UserError: missing or unreadable data files, bad rows (naming file and line), an empty training split.
    """
    return TASK_CLASSES[data.type].from_config(data)
