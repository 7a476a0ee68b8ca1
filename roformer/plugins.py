"""Declarations found, not listed: every module of a package that assigns a tuple of declarations at its top level.

How task types (`SPECS` in roformer.tasks) and position encodings (`ENCODINGS` in roformer.model) are collected, so
that a new one is a new module and no edit elsewhere. Importing a package's modules in name order keeps the
collection the same on every machine.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any


def declarations(package: ModuleType, attribute: str) -> Iterator[tuple[str, Any]]:
    """(module name, declaration) for every entry of `attribute` in every module of `package`, modules by name."""
    for module in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        for declaration in getattr(importlib.import_module(f"{package.__name__}.{module.name}"), attribute, ()):
            yield module.name, declaration


def declared_constants(folders: Sequence[str], attribute: str, declaration: str, keywords: Sequence[str]) -> set[str]:
    """The strings that declarations give for `keywords`, read from the modules' source, not run.

    `folders` is a package's `__path__` (the folders `declarations` finds its modules in). The calls read are those
    in a module's top-level `attribute = (...)` and every call of `declaration` (a helper
    that fills in part of one: retrieval's `ranking_type`). What a config may name before the modules are imported
    (they import torch): the task types' settings sections and folders under `data:` (`section="tagging"`,
    `folders=("beir_dir",)`), so a mistyped key is refused at once.
    """
    found: set[str] = set()
    for tree in parsed_modules(tuple(folders)):
        listed = [n.value for n in tree.body if isinstance(n, ast.Assign) and _assigns(n, attribute)]
        calls = [c for node in listed for c in ast.walk(node) if isinstance(c, ast.Call)]
        calls += [c for c in ast.walk(tree) if isinstance(c, ast.Call) and getattr(c.func, "id", None) == declaration]
        for keyword in (k for call in calls for k in call.keywords if k.arg in keywords):
            strings = (c.value for c in ast.walk(keyword.value) if isinstance(c, ast.Constant))
            found.update(value for value in strings if isinstance(value, str))
    return found


def declared_section_fields(folders: Sequence[str], attribute: str, declaration: str) -> dict[str, frozenset[str]]:
    """{section: the field names of its settings dataclass}, read from the modules' source, not run.

    A declaration that gives `section="x"` and `settings=SomeConfig` names a dataclass defined in one of the
    package's modules (the type's own, or one it imports from): its annotated fields (and those of the classes it
    derives from, found alike) are the keys `data.x` may hold, so a mistyped key inside a type's section is refused
    before the type's module (and torch) is imported. A section whose class is not found is left out (to `load`).
    """
    trees = parsed_modules(tuple(folders))
    classes = {node.name: node for tree in trees for node in tree.body if isinstance(node, ast.ClassDef)}

    def field_names(name: str, seen: frozenset[str] = frozenset()) -> set[str] | None:
        node = classes.get(name)
        if node is None or name in seen:
            return None
        names = {
            statement.target.id
            for statement in node.body
            if isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and "ClassVar" not in ast.unparse(statement.annotation)
        }
        for base in node.bases:
            inherited = field_names(base.id, seen | {name}) if isinstance(base, ast.Name) else None
            names |= inherited or set()
        return names

    found: dict[str, frozenset[str]] = {}
    for tree in trees:
        listed = [n.value for n in tree.body if isinstance(n, ast.Assign) and _assigns(n, attribute)]
        calls = [c for node in listed for c in ast.walk(node) if isinstance(c, ast.Call)]
        calls += [c for c in ast.walk(tree) if isinstance(c, ast.Call) and getattr(c.func, "id", None) == declaration]
        for call in calls:
            keywords = {k.arg: k.value for k in call.keywords}
            section, settings = keywords.get("section"), keywords.get("settings")
            if isinstance(section, ast.Constant) and isinstance(settings, ast.Name):
                names = field_names(settings.id)
                if names is not None:
                    found[section.value] = frozenset(names)
    return found


@cache
def parsed_modules(folders: tuple[str, ...]) -> tuple[ast.Module, ...]:
    """The syntax trees of the modules in `folders`, by name: parsed once, whatever each reading looks for."""
    return tuple(
        ast.parse(path.read_text()) for path in sorted(p for folder in folders for p in Path(folder).glob("*.py"))
    )


def _assigns(node: ast.Assign, name: str) -> bool:
    return any(isinstance(target, ast.Name) and target.id == name for target in node.targets)
