"""Typed configuration: dataclasses loaded from YAML, with errors that name the key and the file.

One loader for every config file of the project (`load`: a pretraining or fine-tuning run, a GLUE suite, an
experiment): read the YAML, include the files it names, resolve its relative paths against the file's folder, apply
`--set KEY=VALUE` overrides, build the dataclass. Building (`from_dict`) checks every key and value, so an unknown or
mistyped key, a wrong type or an impossible value raises `ConfigError` naming the field and the file it came from.

What the loader (and the resume policy, roformer.train.run_dir) must know about a field is written on the field
itself, in its dataclass metadata, and read back as dotted keys by `field_keys`:

    PATH          a file path, resolved against the folder of the config file that holds it
    PATH_OR_NAME  a path that may also be a hub name (`bert-base-uncased`): resolved only when it exists
    INCLUDE       a section that may instead name a YAML file (`model: ../model/roformer-tiny.yaml`)
    MAY_CHANGE_ON_RESUME, MAY_CHANGE_ON_RESUME_QUIETLY, MAY_CHANGE_UNTIL_A_RUN_FINISHES: see roformer.train.run_dir

A config class with `INCLUDE_FILE = True` (the run configs) lets a file start from another: `include: recipe.yaml`
at its top takes that file's keys (its paths resolved against its own folder, its own includes followed), and the
including file's keys win: mappings merge key by key, any other value replaces the included one.

The YAML itself is roformer.config_yaml's (`read_yaml`, `write_yaml`, the `--set` values parsed by
`apply_overrides`); what a path in a config means (relative to its file, `${ROFORMER_DATA}` and other environment
variables, a shipped config's name: `config_file`) is roformer.config_paths'.

`check_keys` reads a file's keys only, before the heavy imports of a command, so that a mistyped key costs a fraction
of a second; an unknown key's error names the nearest known one.

The shipped configs and their names are roformer.catalogue's (`find_config` and the other names it re-exports here).
Also here, because every recipe and study compares configs: `config_differences` and `flat_config`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

# the catalogue's names that callers import from here, where they lived before it had a module of its own
from roformer.catalogue import find_config, shipped_config, shipped_configs, shipped_configs_dir  # noqa: F401
from roformer.config_paths import config_file, resolve_paths
from roformer.config_yaml import apply_overrides, read_mapping, read_yaml
from roformer.errors import ConfigError

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where a config's values came from: its file, the files it included, the `--set KEY=VALUE` items given.

    An error names the one the bad value came from: `--set train.lr=abc: key 'train.lr' must be a number`, not the
    file that holds a good learning rate; `recipe.yaml: key 'train.lr' ...` for a value a task config included.
    """

    file: str
    overrides: tuple[tuple[str, str], ...] = ()  # (dotted key, the KEY=VALUE item as given)
    included: tuple[tuple[str, str], ...] = ()  # (dotted key, the included file that holds its value)

    def of(self, key: str) -> str:
        """`--set ITEM` when `key` (or a section above it) was given on the command line, else the file holding it."""
        for overridden, item in reversed(self.overrides):  # the last --set of a key is the one that counts
            if _within(key, overridden):
                return f"--set {item}"
        for included, file in self.included:
            if _within(key, included):
                return file
        return self.file

    def of_section(self, prefix: str, message: str) -> str:
        """For a section's own check (a `__post_init__`): the --set, else the file, of a field the message names.

        A section given whole on the command line (`--set stages=[...]`, `--set data.mixture=[...]`) is that --set's.
        """
        for overridden, item in reversed(self.overrides):
            if prefix and _within(prefix.rstrip("."), overridden):
                return f"--set {item}"
            if overridden.startswith(prefix) and _names(message, overridden.removeprefix(prefix)):
                return f"--set {item}"
        for included, file in self.included:
            if included.startswith(prefix) and _names(message, included.removeprefix(prefix)):
                return file
        return self.file

    def __str__(self) -> str:
        return self.file


def _within(key: str, section: str) -> bool:
    """`key` is `section` or lies inside it (a field of it, an item of its list)."""
    return key == section or key.startswith((section + ".", section + "["))


def _names(message: str, relative: str) -> bool:
    """An error message names the field at dotted key `relative` (by its whole key or its last part)."""
    return any(re.search(rf"\b{re.escape(name)}\b", message) for name in (relative, relative.rpartition(".")[2]))


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
    declared = declared_sections(cls)
    holder = next((f.name for f in fields(cls) if f.metadata.get("sections")), None)
    known = {f.name for f in fields(cls) if f.init and f.name != holder} | set(declared)
    for key in data:
        if key not in known:
            raise unknown_key(source, prefix, key, known)
    kwargs: dict[str, Any] = {}
    sections: dict[str, Any] = {}
    for key, value in data.items():
        if key in declared:  # a section declared elsewhere (a task type's settings): held in one dict field
            sections[key] = coerce(value, declared[key] | None, source, f"{prefix}{key}")
        else:
            kwargs[key] = coerce(value, hints[key], source, f"{prefix}{key}")
    if holder is not None:
        kwargs[holder] = sections
    for missing in _required_fields(cls) - set(kwargs):
        where = _named(source, f"{prefix}{missing}")
        raise ConfigError(f"{where}: {section}missing key '{prefix}{missing}' (it has no default)")
    try:
        return cls(**kwargs)
    except ConfigError as e:
        where = source.of_section(prefix, str(e)) if isinstance(source, Origin) else source
        raise ConfigError(f"{where}: {section}{e}") from None


def unknown_key(source: str | Origin, prefix: str, key: Any, known: set[str]) -> ConfigError:
    """The error of key `key` of section `prefix`, not among `known`: the nearest known key first, then all of them."""
    where = _named(source, f"{prefix}{key}")
    nearest = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
    hint = f"did you mean '{prefix}{nearest[0]}'? " if nearest else ""
    return ConfigError(f"{where}: unknown key '{prefix}{key}' ({hint}known keys: {', '.join(sorted(known))})")


def _required_fields(cls: type) -> set[str]:
    """The fields of dataclass `cls` that a mapping must give (no default, no default factory)."""
    return {
        f.name
        for f in fields(cls)
        if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }


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
        sections = [option for option in present if dataclasses.is_dataclass(option)]
        if len(present) == 1 or (isinstance(value, dict) and len(sections) == 1):
            # X | None, or a mapping for the one section of a union (a number or a schedule): its own error names
            # the inner key and the problem
            return coerce(value, sections[0] if isinstance(value, dict) and sections else present[0], source, key)
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


# What the loader and the resume policy know about a field, written on the field: `field(..., metadata=PATH)`.
PATH = {"path": True}  # a file path: made absolute against the folder of the config file that holds it
PATH_OR_NAME = {"path": True, "hub_name": True}  # a path, or a hub name kept as written unless such a path exists
INCLUDE = {"include": True}  # a section that may instead name a YAML file (its content, or its section of that name)
# roformer.train.run_dir's resume policy: what a resumed run may change in its config.yaml (everything else enters the
# computation its checkpoint holds and is refused)
MAY_CHANGE_ON_RESUME = {"resume": "may_change"}  # only watches or keeps the run: a warning says it changed
MAY_CHANGE_ON_RESUME_QUIETLY = {"resume": "may_change", "resume_warning": False}  # display only: not worth a warning
MAY_CHANGE_UNTIL_A_RUN_FINISHES = {"resume": "until_a_run_finishes"}  # where a run ends and what it selects

# what a pretraining stage may set over the run's sections (roformer.train.config.Stage); the rest is the run's
STAGE = {"stage": True}
STAGE_LR_PHASE = {"stage": True, "lr_phase": True}  # one of these in a stage runs a learning-rate phase of its own
MASKS_ONLY = {"stage": True, "masks_only": True}  # decides the masks, not the blocks: stages differing in it share them

INCLUDE_KEY = "include"  # the top-level key of a file that starts from another (classes with INCLUDE_FILE = True)


def declared_sections(cls: type) -> dict[str, type]:
    """Keys of dataclass `cls` declared elsewhere, {key: dataclass or str}: `cls.declared_sections()`, if it has one.

    A class whose sections are not known when it is written (the fine-tuning data: section, whose task types each
    declare their own settings) holds them in one field marked `{"sections": True}`; the loader reads and checks each
    under its own key, as if it were a field. A declared key of type `str` is a folder's path (resolved as PATH).
    """
    declared = getattr(cls, "declared_sections", None)
    return declared() if declared is not None else {}


def field_keys(cls: type, name: str, value: Any = True, declared: bool = True) -> tuple[str, ...]:
    """Dotted keys of the fields of dataclass `cls`, nested sections included, whose metadata has `name: value`.

    In field order, a section's keys where the section is (`field_keys(PretrainConfig, "path")`: `data.paths`, ...);
    declared sections (`declared_sections`) last, unless `declared` is false (they load the task types' modules).
    """
    hints = typing.get_type_hints(cls)
    keys: list[str] = []
    for f in fields(cls):
        if f.metadata.get(name) == value:
            keys.append(f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            keys += [f"{f.name}.{key}" for key in field_keys(hints[f.name], name, value, declared)]
        item = get_args(hints[f.name])[0] if get_origin(hints[f.name]) is list else None
        if dataclasses.is_dataclass(item):  # a list of sections: `stages[].data.paths`, every item's
            keys += [f"{f.name}[].{key}" for key in field_keys(item, name, value, declared)]
    keys += [key for key, meta in getattr(cls, "UNTYPED_KEYS", {}).items() if meta.get(name) == value]
    for section, settings in (declared_sections(cls) if declared else {}).items():
        if not dataclasses.is_dataclass(settings):  # a declared key that is no section is a folder: a path
            keys += [section] if PATH.get(name) == value else []
            continue
        keys += [f"{section}.{key}" for key in field_keys(settings, name, value)]
    return tuple(keys)


def load(cls: type[T], path: str | Path, overrides: list[str] | None = None) -> T:
    """Read the config file `path` into dataclass `cls`.

    With `cls.INCLUDE_FILE`, an `include:` key names a file whose keys this file's own keys then override (mappings
    merge key by key). Sections whose field is marked INCLUDE may be the path of another YAML (relative to the file;
    its content, or its section of the same name, is included); the relative paths of PATH fields are made absolute
    against the folder of the file they are written in; then the `--set` overrides apply, their relative paths made
    absolute against the working directory.

    Raises:
        ConfigError: naming the file and key for a missing file, invalid YAML, unknown keys, wrong types and
            invalid values.
    """
    path = Path(path)
    data, origin = _read_with_overrides(cls, path, overrides or [], declared=True)
    return from_dict(cls, data, source=origin)


def check_keys(cls: type, path: str | Path, overrides: list[str] | None = None) -> None:
    """Refuse what `load(cls, path, overrides)` would refuse as an unknown key, reading only the files and the fields.

    No task type's module is imported (their settings sections under `data:` are left to `load`), so a command
    checks its config this way before it imports torch: a mistyped key costs a fraction of a second, not the
    imports. The values are `load`'s to check.

    Raises:
        ConfigError: a file that does not read, or an unknown key (the error names the nearest known one).
    """
    data, origin = _read_with_overrides(cls, Path(path), overrides or [], declared=False)
    _check_section_keys(cls, data, origin, "")


def check_override_keys(cls: type, overrides: list[str], source: str = "--set") -> None:
    """Refuse a `--set KEY=VALUE` whose key `cls` does not have (an experiment's or a suite's overrides of every run).

    Raises:
        ConfigError: a malformed override, or an unknown key (naming the nearest known one).
    """
    data = apply_overrides({}, overrides, source)
    origin = Origin(source, tuple((item.partition("=")[0].strip(), item) for item in overrides))
    _check_section_keys(cls, data, origin, "")


def _read_with_overrides(cls: type, path: Path, overrides: list[str], declared: bool) -> tuple[dict[str, Any], Origin]:
    """The mapping of config file `path` with the `--set` overrides applied, every path resolved, and its Origin."""
    data, sources = _read_config_file(cls, path, (), declared)
    apply_overrides(data, overrides)
    # paths given on the command line are relative to the working directory: made absolute now, so that the run's
    # config.yaml means the same files wherever it is read from (a resume, eval-mlm, an experiment's later stage)
    overridden = {item.partition("=")[0].strip() for item in overrides}
    path_keys = [
        key
        for key in field_keys(cls, "path", declared=declared)
        if any(_within(key.replace("[]", ""), o) for o in overridden)
    ]
    try:
        resolve_paths(data, path_keys, Path.cwd(), field_keys(cls, "hub_name", declared=declared))
    except ConfigError as e:
        raise ConfigError(f"--set {e}") from None
    included = tuple((key, file) for key, file in sources.items() if file != str(path))
    origin = Origin(str(path), tuple((item.partition("=")[0].strip(), item) for item in overrides), included)
    return data, origin


def _check_section_keys(cls: type, data: Any, source: Origin, prefix: str) -> None:
    """The unknown-key check of `from_dict`, alone, through every nested section of `data` (keys only)."""
    if not isinstance(data, dict):
        return  # not a mapping: from_dict says so
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls) if f.init and not f.metadata.get("sections")}
    # keys declared by modules not imported here (a task type's section): their names are known from the modules'
    # source, what they hold is load's to check
    declared = cls.declared_names() if hasattr(cls, "declared_names") else set()
    for key, value in data.items():
        if key in declared and key not in known:  # a type's own section: its keys as its module's source declares
            inner = cls.declared_section_keys().get(key) if hasattr(cls, "declared_section_keys") else None
            unknown = [name for name in value if name not in inner] if inner and isinstance(value, dict) else []
            if unknown:
                raise unknown_key(source, f"{prefix}{key}.", unknown[0], set(inner))
            continue
        if key not in known:
            raise unknown_key(source, prefix, key, known | set(declared))
        for section, mapping, where in _sections_in(hints[key], value, f"{prefix}{key}"):
            _check_section_keys(section, mapping, source, f"{where}.")


def _sections_in(tp: Any, value: Any, key: str) -> list[tuple[type, Any, str]]:
    """(dataclass, its mapping, its dotted key) of each section that `coerce` would build from `value` of type `tp`."""
    origin, args = get_origin(tp), get_args(tp)
    if dataclasses.is_dataclass(tp):
        return [(tp, value, key)] if isinstance(value, dict) else []
    if origin in (Union, types.UnionType):
        present = [a for a in args if a is not type(None)]
        sections = [a for a in present if dataclasses.is_dataclass(a)]
        if len(present) == 1:
            return _sections_in(present[0], value, key)
        return [(sections[0], value, key)] if isinstance(value, dict) and len(sections) == 1 else []
    if origin in (list, tuple) and isinstance(value, list | tuple) and args:
        return [s for i, item in enumerate(value) for s in _sections_in(args[0], item, f"{key}[{i}]")]
    if origin is dict and isinstance(value, dict) and len(args) == 2:
        return [s for k, item in value.items() for s in _sections_in(args[1], item, f"{key}.{k}")]
    return []


def _read_config_file(
    cls: type, path: Path, including: tuple[Path, ...], declared: bool = True
) -> tuple[dict[str, Any], dict[str, str]]:
    """The mapping of config file `path`, its included file merged under it, its relative paths made absolute.

    Args:
        cls: The config's dataclass.
        path: The file.
        including: The files including this one (a file that includes itself is refused).
        declared: Resolve the paths of the declared sections too (it imports the task types' modules).

    Returns:
        The mapping, and {dotted key of each value: the file it was written in}.

    Raises:
        ConfigError: a bad file, an `include:` that is neither a file's path nor a shipped config's name, a file
            that includes itself, a path naming an environment variable that is not set.
    """
    data = read_mapping(path)
    base: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if getattr(cls, "INCLUDE_FILE", False) and INCLUDE_KEY in data:
        included = _included_file(path, data.pop(INCLUDE_KEY), including)
        base, sources = _read_config_file(cls, included, (*including, path), declared)
    for section in (f.name for f in fields(cls) if f.metadata.get("include")):
        if isinstance(data.get(section), str):
            data[section] = _include(path, section, data[section])
    keys = field_keys(cls, "path", declared=declared)
    try:
        resolve_paths(data, list(keys), path.parent, field_keys(cls, "hub_name", declared=declared))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
    sources.update(dict.fromkeys(_leaf_keys(data), str(path)))
    return merge_config(base, data), sources


def _included_file(path: Path, name: Any, including: tuple[Path, ...]) -> Path:
    """The file that `include: name` of config file `path` means (relative to `path`'s folder, or a shipped name)."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{path}: include: expected the path of a YAML file, got {name!r}")
    include = config_file(path.parent, name)
    if not include.is_file():
        raise ConfigError(f"{path}: include: file not found: {include} (nor a shipped config's name)")
    if any(include.resolve() == p.resolve() for p in (*including, path)):
        raise ConfigError(f"{path}: include: {include} is already being included (the files include each other)")
    return include


def merge_config(base: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """`base` under `own`: mappings merge key by key (recursively), any other value of `own` replaces `base`'s."""
    merged = dict(base)
    for key, value in own.items():
        both_mappings = isinstance(merged.get(key), dict) and isinstance(value, dict)
        merged[key] = merge_config(merged[key], value) if both_mappings else value
    return merged


def _leaf_keys(data: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys of a nested mapping's values that are not themselves non-empty mappings."""
    keys: list[str] = []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            keys += _leaf_keys(value, f"{prefix}{key}.")
        else:
            keys.append(f"{prefix}{key}")
    return keys


def _include(path: Path, section: str, name: str) -> Any:
    """The content of the YAML file that section `section` of `path` names (its own `section:` if it has one)."""
    include = config_file(path.parent, name, section)
    if not include.is_file():
        raise ConfigError(f"{path}: {section}: file not found: {include} (nor a shipped config's name)")
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
