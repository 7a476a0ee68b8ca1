"""Declarations found, not listed: every module of a package that assigns a tuple of declarations at its top level.

How task types (`SPECS` in roformer.tasks) and position encodings (`ENCODINGS` in roformer.model) are collected, so
that a new one is a new module and no edit elsewhere. Importing a package's modules in name order keeps the
collection the same on every machine.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from types import ModuleType
from typing import Any


def declarations(package: ModuleType, attribute: str) -> Iterator[tuple[str, Any]]:
    """(module name, declaration) for every entry of `attribute` in every module of `package`, modules by name."""
    for module in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        for declaration in getattr(importlib.import_module(f"{package.__name__}.{module.name}"), attribute, ()):
            yield module.name, declaration
