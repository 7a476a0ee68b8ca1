"""Paths in config files: relative to the file's folder, `${NAME}` environment variables, shipped configs' names.

A path may start from an environment variable (`${ROFORMER_DATA}/glue`, `${SCRATCH}/corpus`): the shipped configs'
data paths start from the data root, ROFORMER_DATA (roformer.catalogue.data_root: set once, with a default). A config
file named inside another (`include:`, a section's file, an experiment's arms, a suite's tasks) is a path relative to
the naming file, or a shipped config's name (`config_file`: `glue/rte`, `translation/multi30k-cpu`). `resolve_paths`
makes the paths at a parsed config's dotted keys absolute: roformer.config.load resolves a file's paths against the
file's folder and the `--set` paths against the working directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from roformer import catalogue
from roformer.errors import ConfigError


def resolve_paths(data: dict[str, Any], keys: list[str], base: Path, maybe_names: tuple[str, ...] = ()) -> None:
    """Make the relative paths at dotted `keys` of a parsed YAML absolute against `base`, in place.

    `load` resolves a file's paths against the file's folder and `--set` paths against the working directory. Keys
    in `maybe_names` may also hold hub names (`bert-base-uncased`, `org/model`): those are resolved only when they
    start with `.` or exist under `base`.
    """
    for key in keys:
        head, each, rest = key.partition("[].")
        if each:  # every item of a list of sections
            items = resolve_key(data, head)
            for item in items if isinstance(items, list) else []:
                if isinstance(item, dict):
                    resolve_paths(item, [rest], base, tuple(k.partition("[].")[2] for k in maybe_names))
            continue
        *parents, leaf = key.split(".")
        node = data
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or leaf not in node:
            continue
        value, may_be_name = node[leaf], key in maybe_names
        try:
            if isinstance(value, list):
                node[leaf] = [_resolve_path(v, base, may_be_name) for v in value]
            else:
                node[leaf] = _resolve_path(value, base, may_be_name)
        except ConfigError as e:
            raise ConfigError(f"{key}: {e}") from None


def resolve_key(data: Any, key: str) -> Any:
    """The value at dotted `key` of nested mappings, or None."""
    for part in key.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _resolve_path(value: Any, base: Path, may_be_name: bool) -> Any:
    if isinstance(value, str) and VARIABLE.search(value):
        return os.path.normpath(expand_variables(value))
    if not isinstance(value, str) or not value or Path(value).is_absolute() or value.startswith("~"):
        return value
    if may_be_name and not (value.startswith(".") or (base / value).exists()):
        return value
    return str(config_path(base, value))


VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")  # `${NAME}` in a path: an environment variable


def expand_variables(value: str) -> str:
    """A path written in a config with each `${NAME}` replaced by the environment variable NAME.

    `${ROFORMER_DATA}` is the data root (roformer.catalogue.data_root), set or not: the shipped configs' data paths
    start from it. Any other variable must be set.

    Raises:
        ConfigError: a variable that is not set, naming it.
    """

    def value_of(match: re.Match[str]) -> str:
        name = match.group(1)
        if name == catalogue.DATA_ROOT_VARIABLE:
            return str(catalogue.data_root())
        if name not in os.environ:
            raise ConfigError(f"{value}: the environment variable {name} is not set")
        return os.environ[name]

    return VARIABLE.sub(value_of, value)


def config_path(folder: Path, value: str | Path) -> Path:
    """A path written in a config file of `folder`, made absolute: relative paths are relative to the file's folder.

    `${NAME}` is an environment variable (`${ROFORMER_DATA}/glue`: the data root, see expand_variables). Inside an
    installed package, a shipped config's path that leaves the configs folder (`init: ../../runs/roformer-base/final`)
    is read from the working directory instead, as if the configs folder were `./configs`: from a clone's root a
    config's name and its path then mean the same files, and that init finds what `roformer pretrain --config
    roformer-base` wrote.

    Raises:
        ConfigError: `value` names an environment variable that is not set.
    """
    if VARIABLE.search(str(value)):
        return Path(os.path.normpath(expand_variables(str(value))))
    target = (folder / value).resolve()
    installed = catalogue.INSTALLED_CONFIGS.resolve()  # read at each call: tests install the configs elsewhere
    folder = folder.resolve()
    if folder.is_relative_to(installed) and not target.is_relative_to(installed):
        return Path(os.path.normpath(Path.cwd() / "configs" / folder.relative_to(installed) / value))
    return target


def config_file(folder: Path, value: str | Path, preferred: str | None = None) -> Path:
    """The config file that a config file in `folder` names: a file relative to `folder`, else a shipped config's name.

    What an `include:`, a section given as a file (`model: ../model/roformer-tiny.yaml`), an experiment's arms and a
    suite's tasks mean: the path relative to the naming file's folder when that file exists (a path wins), else the
    shipped config of that name (`glue/rte`, `translation/multi30k-cpu`; a stem is looked up in the `preferred`
    folder first, then in roformer.catalogue.SHIPPED_FOLDERS order), used without a word: a name is given on purpose.
    Neither: the path, for the caller's own not-found error.

    Raises:
        ConfigError: `value` names an environment variable that is not set.
    """
    path = config_path(folder, value)
    if path.is_file():
        return path
    folders = tuple(dict.fromkeys([preferred, *catalogue.SHIPPED_FOLDERS] if preferred else catalogue.SHIPPED_FOLDERS))
    return catalogue.named_config(value, folders) or path
