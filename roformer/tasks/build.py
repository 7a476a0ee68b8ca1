"""The task of a fine-tuning config's data: section: its local data checked present, its type's builder called.

Apart from the registry of declarations (roformer.tasks.registry), which the data: section's checks read: the
declarations sit below the config module, the building of a task above it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from roformer.catalogue import missing_data_hint
from roformer.errors import UserError
from roformer.tasks.registry import spec_of

if TYPE_CHECKING:
    from roformer.tasks.base import FinetuneTask
    from roformer.tasks.config import FinetuneDataConfig


def make_task(data: FinetuneDataConfig) -> FinetuneTask:
    """The task of a fine-tuning config's data: section, its splits read.

    Raises:
        UserError: missing or unreadable data files, bad rows (naming file and line), an empty training split.
    """
    from roformer.tasks.base import check_capabilities  # torch: not when a config is only read or checked

    check_data_present(data)
    spec = spec_of(data.type)
    task = spec.builder(data)
    check_capabilities(spec, task)  # what the recipe asks of the type is what its module declares
    return task


FILE_KEYS = ("train_file", "validation_file", "test_file", "validation_mismatched_file", "test_mismatched_file")
PREFIX_KEYS = ("train_prefix", "validation_prefix", "test_prefix")  # PREFIX.<lang>: their folder must be there


def check_data_present(data: FinetuneDataConfig) -> None:
    """Refuse local data that is not there before any is read, in one line naming the key to set.

    The line names `--set data.KEY=...`, the data root when the path lies under it (the shipped configs' data
    paths start there: ROFORMER_DATA), and `data.source=hub` where the config names a hub dataset (GLUE always).

    Raises:
        UserError: the first missing folder or file that this config's source reads.
    """
    for key, path, kind in _local_data(data):
        if not (path.is_dir() if kind == "folder" else path.is_file()):
            hint = missing_data_hint(path, f"data.{key}", hub=data.source != "hub" and bool(data.hub_name))
            raise UserError(f"data.{key}: {path}: no such {kind}; {hint}")


def _local_data(data: FinetuneDataConfig) -> list[tuple[str, Path, str]]:
    """(key, path, `folder` or `file`) of every local path the source of `data` reads (a prefix: its folder)."""
    found: list[tuple[str, Path, str]] = []
    if data.source == "glue_dir" and data.glue_dir:
        found.append(("glue_dir", Path(data.glue_dir), "folder"))
    if data.source == "files":
        found += [(key, Path(getattr(data, key)), "file") for key in FILE_KEYS if getattr(data, key)]
        found += [(key, Path(getattr(data, key)).parent, "folder") for key in PREFIX_KEYS if getattr(data, key)]
    found += [(key, Path(data.sections[key]), "folder") for key in data.spec.folders if data.sections.get(key)]
    return found
