"""The task types, collected from their modules' declarations, and `make_task`: a config's task by its type.

Every module of roformer.tasks that ends in `SPECS = (TaskSpec(...), ...)` (roformer.tasks.base.TaskSpec) declares
its types: a new type is a new module, and nothing here or elsewhere lists it. The modules are imported on first use,
not when this one is: a config file is read without torch until a fine-tuning config asks for its sections.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from roformer.catalogue import missing_data_hint
from roformer.errors import ConfigError, UserError
from roformer.plugins import declarations, declared_constants, declared_section_fields

if TYPE_CHECKING:
    from roformer.tasks.base import FinetuneTask, TaskSpec
    from roformer.tasks.config import FinetuneDataConfig


@cache
def specs() -> dict[str, TaskSpec]:
    """Every declared task type by name, sorted by name.

    Raises:
        RuntimeError: two declarations of one type, or of one settings section (a programming error).
    """
    import roformer.tasks

    found: dict[str, TaskSpec] = {}
    sections: dict[str, str] = {}
    folders: set[str] = set()
    for module, spec in declarations(roformer.tasks, "SPECS"):
        if spec.name in found:
            raise RuntimeError(f"task type {spec.name!r} is declared twice ({module})")
        if spec.section and sections.setdefault(spec.section, spec.name) != spec.name:
            raise RuntimeError(f"data.{spec.section} is declared by {sections[spec.section]} and {spec.name}")
        folders.update(spec.folders)
        found[spec.name] = spec
    if folders & set(sections):
        raise RuntimeError(f"data.{min(folders & set(sections))} is both a settings section and a folder")
    return dict(sorted(found.items()))


def declared_keys() -> frozenset[str]:
    """The keys under `data:` the types declare (settings sections, folders), read from their modules' source.

    Equal to those of `settings_sections()` without importing a type's module (tested): what lets a command refuse
    a mistyped `data:` key before torch is imported.
    """
    import roformer.tasks

    return _declared_keys(tuple(roformer.tasks.__path__))


@cache
def _declared_keys(folders: tuple[str, ...]) -> frozenset[str]:
    return frozenset(declared_constants(folders, "SPECS", "TaskSpec", ("section", "folders")))


def declared_section_keys() -> dict[str, frozenset[str]]:
    """{settings section under `data:`: its keys}, read from the types' source (see `declared_keys`)."""
    import roformer.tasks

    return _declared_section_keys(tuple(roformer.tasks.__path__))


@cache
def _declared_section_keys(folders: tuple[str, ...]) -> dict[str, frozenset[str]]:
    return declared_section_fields(folders, "SPECS", "TaskSpec")


def spec_of(name: str) -> TaskSpec:
    """The declaration of type `name`.

    Raises:
        ConfigError: an unknown type, listing the known ones.
    """
    known = specs()
    if name not in known:
        raise ConfigError(f"type: unknown {name!r} (known: {', '.join(known)})")
    return known[name]


def settings_sections() -> dict[str, type]:
    """Every type's own keys under data:: its settings section (`tagging` -> TaggingConfig) and its folders (-> str)."""
    folders = {key: str for s in specs().values() for key in s.folders}
    return {**{s.section: s.settings for s in specs().values() if s.section and s.settings is not None}, **folders}


def make_task(data: FinetuneDataConfig) -> FinetuneTask:
    """The task of a fine-tuning config's data: section, its splits read.

    Raises:
        UserError: missing or unreadable data files, bad rows (naming file and line), an empty training split.
    """
    from roformer.tasks.base import check_capabilities

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


TABLE_START = "<!-- task types: generated by roformer.tasks.registry.types_table -->"
TABLE_END = "<!-- end of task types -->"


def types_table() -> str:
    """The task types as a markdown table (docs/fine-tuning.md holds it between TABLE_START and TABLE_END)."""
    lines = [
        "| `data.type` | settings | model head | `data.metrics` may name (default) | dev predictions | page |",
        "|---|---|---|---|---|---|",
    ]
    for spec in specs().values():
        section = ", ".join(f"`data.{key}`" for key in ([spec.section] if spec.section else []) + list(spec.folders))
        known = ", ".join(spec.metrics) or "the task's own"
        default = ", ".join(spec.default_metrics) or "from the data"
        page = f"[{spec.docs.partition('#')[0].removesuffix('.md')}]({spec.docs})"
        name = f"`{spec.name}`: {spec.summary}"
        row = [name, section, spec.architecture, f"{known} ({default})", spec.predictions, page]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join([TABLE_START, *lines, TABLE_END])
