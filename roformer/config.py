"""Typed configuration: dataclasses loaded from YAML, with errors that name the key and the file.

One loader for every config file of the project (`load`: a pretraining or fine-tuning run, a GLUE suite, an
experiment): read the YAML, include the files it names, resolve its relative paths against the file's folder, apply
`--set KEY=VALUE` overrides, build the dataclass. Building (`from_dict`) checks every key and value, so an unknown or
mistyped key, a wrong type or an impossible value raises `ConfigError` naming the field and the file it came from.
A config class declares what the loader must know about it in three class attributes:

    INCLUDES      sections that may instead name a YAML file (`model: ../model/roformer-tiny.yaml`)
    PATH_KEYS     dotted keys holding file paths (resolved against the config file's folder)
    NAME_KEYS     those of PATH_KEYS that may also be hub names (`bert-base-uncased`): resolved only when they exist

The configs this project ships (the repository's configs/ folder, installed into the package as roformer/configs)
are found by name as well as by path: `find_config` (`roformer-tiny`, `glue/rte`; a path wins), `shipped_configs`.

Also here, because every recipe and study compares configs: `config_differences` and `flat_config`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import types
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

from roformer.errors import ConfigError
from roformer.files import atomic_write_text

T = TypeVar("T")
MERGE_TAG = "tag:yaml.org,2002:merge"  # the `<<` key of YAML 1.1's merge type


def _refuse_duplicate_keys(root: yaml.Node, loader: yaml.SafeLoader) -> None:
    """Refuse a key given twice in one mapping of a composed YAML document.

    YAML keeps the last value without a word: a second `train:` section would silently replace the first. Checked on
    the nodes as written, before construction, where `<<` merges have not yet added keys that may be overridden.

    Raises:
        yaml.constructor.ConstructorError: naming the key, its first line and the duplicate's place.
    """
    stack, visited = [root], set()
    while stack:
        node = stack.pop()
        if id(node) in visited:  # an anchor's node is shared by its aliases
            continue
        visited.add(id(node))
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, value_node in node.value:
                stack.append(value_node)
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == MERGE_TAG:
                    continue
                key = loader.construct_object(key_node)  # parsed: `yes` and `true` are one key
                if key in seen:
                    duplicate = f"duplicate key {key_node.value!r} (first on line {seen[key] + 1})"
                    raise yaml.constructor.ConstructorError(None, None, duplicate, key_node.start_mark)
                seen[key] = key_node.start_mark.line
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader with `<<` merge keys resolved by our own code, so that no PyYAML release changes a value.

    PyYAML 6.0.4 resolves nested merges differently from every release before it (yaml/pyyaml#953, fix proposed in
    #954): in `c: {<<: *b}`, where `b` overrides a key of its own merge, `c` got the overridden-away value. The
    merge-key spec (https://yaml.org/type/merge.html) is what we implement: a mapping's own keys win over merged
    ones, and of a sequence of merged mappings the earlier wins.
    """

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        """Replace the `<<` entries of `node` by the pairs they merge, placed first so that later (own) keys win."""
        merged: list[tuple[yaml.Node, yaml.Node]] = []
        own: list[tuple[yaml.Node, yaml.Node]] = []
        for key_node, value_node in node.value:
            if key_node.tag != MERGE_TAG:
                if key_node.tag == "tag:yaml.org,2002:value":  # `=` as a key is a plain string, as in PyYAML
                    key_node.tag = "tag:yaml.org,2002:str"
                own.append((key_node, value_node))
                continue
            sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            # construct_mapping keeps the last of equal keys: the first source must come last to win
            for source in reversed(sources):
                merged.extend(self._merged_pairs(node, source))
        node.value = merged + own

    def _merged_pairs(self, node: yaml.MappingNode, source: yaml.Node) -> list[tuple[yaml.Node, yaml.Node]]:
        """The key-value pairs a merge source contributes: its own merges resolved first, then its own keys."""
        if not isinstance(source, yaml.MappingNode):
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"expected a mapping to merge, found {source.id}",
                source.start_mark,
            )
        self.flatten_mapping(source)  # idempotent: an anchor's node is flattened once, then holds no `<<`
        return list(source.value)


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML file; a missing file, a syntax error or a duplicate key raises ConfigError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        with path.open(encoding="utf-8") as f:
            loader = _ConfigLoader(f)
            try:
                root = loader.get_single_node()
                if root is None:  # an empty file
                    return None
                _refuse_duplicate_keys(root, loader)
                return loader.construct_document(root)
            finally:
                loader.dispose()
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        detail = str(e).replace("\n", " ")
        raise ConfigError(f"{path}: not valid YAML: {detail}") from None


def write_yaml(path: str | Path, data: Any) -> None:
    """Write `data` as block-style YAML with keys in the given order, all or nothing (a run's record is rewritten)."""
    atomic_write_text(path, yaml.safe_dump(data, sort_keys=False, default_flow_style=False))


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where a config's values came from: its file, and the `--set KEY=VALUE` items that replaced some of them.

    An error names the one the bad value came from: `--set train.lr=abc: key 'train.lr' must be a number`, not the
    file that holds a good learning rate.
    """

    file: str
    overrides: tuple[tuple[str, str], ...] = ()  # (dotted key, the KEY=VALUE item as given)

    def of(self, key: str) -> str:
        """`--set ITEM` when `key` (or a section above it) was given on the command line, else the file."""
        for overridden, item in reversed(self.overrides):  # the last --set of a key is the one that counts
            if key == overridden or key.startswith((overridden + ".", overridden + "[")):
                return f"--set {item}"
        return self.file

    def of_section(self, prefix: str, message: str) -> str:
        """For a section's own check (a `__post_init__`): the --set of a field of it that the message names."""
        for overridden, item in reversed(self.overrides):
            if not overridden.startswith(prefix):
                continue
            relative = overridden.removeprefix(prefix)
            if any(re.search(rf"\b{re.escape(name)}\b", message) for name in (relative, relative.rpartition(".")[2])):
                return f"--set {item}"
        return self.file

    def __str__(self) -> str:
        return self.file


def _named(source: str | Origin, key: str) -> str:
    return source.of(key) if isinstance(source, Origin) else source


def from_dict(cls: type[T], data: Any, source: str | Origin = "<dict>", prefix: str = "") -> T:
    """Build dataclass `cls` from a mapping, checking every key and value type.

    Args:
        cls: The dataclass to build; fields may themselves be dataclasses (nested sections).
        data: The mapping (e.g. parsed YAML). None means all defaults.
        source: Where the data came from (a file name, or an Origin naming the --set items too), for error messages.
        prefix: Dotted path of this section inside the file, used in error messages.

    Returns:
        The dataclass instance.

    Raises:
        ConfigError: naming the source and the dotted key for unknown keys, wrong types and invalid values.
    """
    section = f"{prefix.rstrip('.')}: " if prefix else ""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{_named(source, prefix.rstrip('.'))}: {section}expected a mapping of keys, got {type(data).__name__}"
        )
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls) if f.init}
    for key in data:
        if key not in known:
            where = _named(source, f"{prefix}{key}")
            raise ConfigError(f"{where}: unknown key '{prefix}{key}' (known keys: {', '.join(sorted(known))})")
    kwargs = {}
    for key, value in data.items():
        kwargs[key] = coerce(value, hints[key], source, f"{prefix}{key}")
    try:
        return cls(**kwargs)
    except ConfigError as e:
        where = source.of_section(prefix, str(e)) if isinstance(source, Origin) else source
        raise ConfigError(f"{where}: {section}{e}") from None


def coerce(value: Any, tp: Any, source: str | Origin, key: str) -> Any:
    """Check `value` against type annotation `tp` and convert where lossless (int -> float, list -> tuple).

    Raises:
        ConfigError: naming `source` and `key` when the value does not fit.
    """

    def fail(expected: str) -> ConfigError:
        return ConfigError(
            f"{_named(source, key)}: key '{key}' must be {expected}, got {value!r} ({type(value).__name__})"
        )

    if tp is Any:
        return value
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None:
            if type(None) in options:
                return None
            raise fail(_type_name(tp))
        present = [option for option in options if option is not type(None)]
        if len(present) == 1:  # X | None: X's own error names the inner key and the problem
            return coerce(value, present[0], source, key)
        for option in present:
            try:
                return coerce(value, option, source, key)
            except ConfigError:
                continue
        raise fail(_type_name(tp))
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise fail("one of " + ", ".join(repr(a) for a in get_args(tp)))
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise fail(f"a list ({_type_name(tp)})")
        args = get_args(tp)
        item_type = args[0] if args else Any
        items = [coerce(v, item_type, source, f"{key}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise fail("a mapping")
        _, value_type = get_args(tp) or (str, Any)
        return {k: coerce(v, value_type, source, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        return from_dict(tp, value, source, prefix=f"{key}.")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise fail("true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise fail("an integer")
    if tp is float:
        number = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads "1e-5" (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise fail("a number")
        if not math.isfinite(number):  # .nan passes every `x <= 0` check and surfaces later as NaN outputs
            raise fail("a finite number")
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        raise fail("a string")
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise fail(_type_name(tp))


def check_types(obj: Any) -> None:
    """Validate (and normalise) the field values of a dataclass built directly in Python, not from YAML."""
    hints = typing.get_type_hints(type(obj))
    for f in fields(obj):
        value = getattr(obj, f.name)
        setattr(obj, f.name, coerce(value, hints[f.name], type(obj).__name__, f.name))


MAX_SEED = 2**32 - 1  # numpy's limit; torch takes more, but a seed feeds both


def check_seed(name: str, value: int) -> None:
    """Refuse a seed that numpy or torch would reject deep inside a run.

    Raises:
        ConfigError: naming the field and the range.
    """
    if not 0 <= value <= MAX_SEED:
        raise ConfigError(f"{name} must be in [0, 2^32 - 1], got {value}")


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def apply_overrides(data: dict[str, Any], overrides: list[str], source: str = "--set") -> dict[str, Any]:
    """Apply `KEY=VALUE` overrides with dotted keys (`train.lr=3e-4`) to a parsed YAML mapping, in place.

    Values are parsed as YAML (`true`, `3e-4`, `[a, b]`, `null`); the types are checked later, against the
    dataclass, like values from the file.

    Raises:
        ConfigError: a malformed override.
    """
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{source}: expected KEY=VALUE, got {item!r}")
        try:
            value = yaml.load(raw, Loader=_ConfigLoader) if raw.strip() else ""
        except yaml.YAMLError as e:
            if raw.strip().startswith(("[", "{", '"', "'")):  # meant as a list, a mapping or a quoted string
                detail = getattr(e, "problem", None) or str(e).splitlines()[0]
                raise ConfigError(f"{source} {item}: not valid YAML ({detail})") from None
            value = raw  # a plain string YAML will not parse (`@host:dir`): kept as written
        node = data
        parts = key.strip().split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{source}: '{key}' goes through '{part}', which is not a section")
            node = child
        node[parts[-1]] = value
    return data


def read_mapping(path: str | Path, sections: str = "sections") -> dict[str, Any]:
    """A YAML file whose top level must be a mapping (an empty file is an empty mapping).

    Raises:
        ConfigError: a missing file, invalid YAML, or a top level that is not a mapping, naming the file.
    """
    data = read_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of {sections}, got {type(data).__name__}")
    return data


def load(cls: type[T], path: str | Path, overrides: list[str] | None = None) -> T:
    """Read the config file `path` into dataclass `cls`.

    Sections named in `cls.INCLUDES` may be the path of another YAML (relative to this file; its content, or its
    section of the same name, is included); the relative paths at `cls.PATH_KEYS` are made absolute against the
    file's folder; then the `--set` overrides apply, their relative paths made absolute against the working directory.

    Raises:
        ConfigError: naming the file and key for a missing file, invalid YAML, unknown keys, wrong types and
            invalid values.
    """
    path = Path(path)
    data = read_mapping(path)
    for section in getattr(cls, "INCLUDES", ()):
        if isinstance(data.get(section), str):
            data[section] = _include(path, section, data[section])
    path_keys, name_keys = list(getattr(cls, "PATH_KEYS", ())), getattr(cls, "NAME_KEYS", ())
    resolve_paths(data, path_keys, path.parent, name_keys)
    apply_overrides(data, overrides or [])
    # paths given on the command line are relative to the working directory: made absolute now, so that the run's
    # config.yaml means the same files wherever it is read from (a resume, eval-mlm, an experiment's later stage)
    overridden = {item.partition("=")[0].strip() for item in overrides or []}
    resolve_paths(data, [key for key in path_keys if key in overridden], Path.cwd(), name_keys)
    origin = Origin(str(path), tuple((item.partition("=")[0].strip(), item) for item in overrides or []))
    return from_dict(cls, data, source=origin)


def _include(path: Path, section: str, name: str) -> Any:
    """The content of the YAML file that section `section` of `path` names (its own `section:` if it has one)."""
    include = config_path(path.parent, name)
    if not include.is_file():
        raise ConfigError(f"{path}: {section}: file not found: {include}")
    content = read_yaml(include) or {}
    return content.get(section, content) if isinstance(content, dict) else content


class _Absent:
    """config_differences: the key is not in that config (e.g. a field added since the config was written)."""

    def __repr__(self) -> str:
        return "<absent>"


ABSENT = _Absent()


def config_differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """{dotted key: (old, new)} for every key whose value differs between two nested configs, in key order.

    A key missing on one side has the value ABSENT there (not None, which a field may hold).
    """
    diffs: dict[str, tuple[Any, Any]] = {}
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, ABSENT), new.get(key, ABSENT)
        if isinstance(a, dict) and isinstance(b, dict):
            diffs.update(config_differences(a, b, f"{prefix}{key}."))
        elif a != b:
            diffs[f"{prefix}{key}"] = (a, b)
    return diffs


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Flatten a nested config for trackers (which want scalar hyperparameters)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flat_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, int | float | str | bool) else str(value)
    return out


def resolve_paths(data: dict[str, Any], keys: list[str], base: Path, maybe_names: tuple[str, ...] = ()) -> None:
    """Make the relative paths at dotted `keys` of a parsed YAML absolute against `base`, in place.

    `load` resolves a file's paths against the file's folder and `--set` paths against the working directory. Keys
    in `maybe_names` may also hold hub names (`bert-base-uncased`, `org/model`): those are resolved only when they
    start with `.` or exist under `base`.
    """
    for key in keys:
        *parents, leaf = key.split(".")
        node = data
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or leaf not in node:
            continue
        value, may_be_name = node[leaf], key in maybe_names
        if isinstance(value, list):
            node[leaf] = [_resolve_path(v, base, may_be_name) for v in value]
        else:
            node[leaf] = _resolve_path(value, base, may_be_name)


def _resolve_path(value: Any, base: Path, may_be_name: bool) -> Any:
    if not isinstance(value, str) or not value or Path(value).is_absolute() or value.startswith("~"):
        return value
    if may_be_name and not (value.startswith(".") or (base / value).exists()):
        return value
    return str(config_path(base, value))


# The shipped configs: in a wheel they are package data (pyproject.toml maps the repository's configs/ folder to
# roformer/configs); in a clone or an editable install they are the repository's configs/ folder.
_PACKAGE_DIR = Path(__file__).resolve().parent
INSTALLED_CONFIGS = _PACKAGE_DIR / "configs"
CHECKOUT_CONFIGS = _PACKAGE_DIR.parent / "configs"


def shipped_configs_dir() -> Path | None:
    """The folder of the shipped configs: the installed package's, else the clone's (None if neither is there)."""
    if INSTALLED_CONFIGS.is_dir():
        return INSTALLED_CONFIGS
    if (CHECKOUT_CONFIGS / "pretrain").is_dir() and (_PACKAGE_DIR.parent / "pyproject.toml").is_file():
        return CHECKOUT_CONFIGS
    return None


def shipped_configs() -> dict[str, Path]:
    """{name: file} of every shipped config, named `folder/stem` (`pretrain/roformer-tiny`), in name order."""
    root = shipped_configs_dir()
    if root is None:
        return {}
    return {p.relative_to(root).with_suffix("").as_posix(): p for p in sorted(root.rglob("*.yaml"))}


def config_summary(path: Path, width: int = 100) -> str:
    """The first sentence of a config file's header comment (without a leading `name:`), at most `width` characters."""
    header = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        header.append(line.lstrip("# ").strip())
    text = " ".join(header).removeprefix(f"{path.stem}: ")
    sentences = re.split(r"(?<=\.)\s+(?=[A-Z])", text)  # not after "et al. 2021" or "sec. 4.4"
    summary = sentences[0].rstrip(".")
    return summary if len(summary) <= width else summary[: width - 3].rstrip() + "..."


# The folders of shipped configs, in the order a stem that several of them have is looked up (`roformer-tiny` is
# pretrain/roformer-tiny before model/roformer-tiny).
SHIPPED_FOLDERS = ("pretrain", "glue", "experiments", "model", "accelerate")


def shipped_config(name: str) -> Path:
    """The shipped config called `name`: its `folder/stem`, or a stem, looked up in SHIPPED_FOLDERS order.

    Raises:
        ConfigError: no shipped config of that name.
    """
    found = _shipped_by_name(name, SHIPPED_FOLDERS)
    if found is None:
        raise ConfigError(f"{name}: no shipped config of that name (`roformer configs` lists them)")
    return found


def _shipped_by_name(name: str, folders: tuple[str, ...]) -> Path | None:
    """The shipped config `name` (`.yaml` and a leading `configs/` optional), else `folder/name` for each folder."""
    configs = shipped_configs()
    name = name.removesuffix(".yaml").removeprefix("configs/")
    for candidate in [name] + [f"{folder}/{name}" for folder in folders]:
        if candidate in configs:
            return configs[candidate]
    return None


def find_config(value: str | Path, folder: str) -> Path:
    """The config file that a `--config` value means: a path if that file exists, else a shipped config's name.

    Names are relative to the shipped configs folder, with or without `.yaml` and the command's own `folder`
    (`roformer-tiny` for `pretrain`, `glue/rte` or `rte` for `glue`); a leading `configs/` is accepted, so the
    repository's documented paths (`configs/pretrain/roformer-tiny.yaml`) also work from an installed package.

    Raises:
        ConfigError: neither a file nor a shipped config's name.
    """
    path = Path(value)
    if path.is_file():
        return path
    if not path.is_absolute() and ".." not in path.parts:  # a name never leaves the configs folder
        found = _shipped_by_name(path.as_posix(), (folder,))
        if found is not None:
            logging.getLogger(__name__).info("%s: no such file, using the shipped config %s", value, found)
            return found
    if path.is_dir():
        raise ConfigError(f"{value}: is a directory, not a config file (nor a shipped config's name)")
    raise ConfigError(
        f"{value}: config file not found, nor a shipped config of that name (`roformer configs` lists them)"
    )


def config_path(folder: Path, value: str | Path) -> Path:
    """A path written in a config file of `folder`, made absolute: relative paths are relative to the file's folder.

    Inside an installed package, a shipped config's path that leaves the configs folder (its data, `runs/`,
    `glue_data/`) is read from the working directory instead, as if the configs folder were `./configs`: from a
    clone's root a config's name and its path then mean the same files, and `init: ../../runs/roformer-base/final`
    finds what `roformer pretrain --config roformer-base` wrote.
    """
    target = (folder / value).resolve()
    installed = INSTALLED_CONFIGS.resolve()
    folder = folder.resolve()
    if folder.is_relative_to(installed) and not target.is_relative_to(installed):
        return Path(os.path.normpath(Path.cwd() / "configs" / folder.relative_to(installed) / value))
    return target
