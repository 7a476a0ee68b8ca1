"""The YAML of config files: read, written, and the `--set KEY=VALUE` overrides parsed into a mapping.

Every config file is read by `read_yaml` (`read_mapping` for one whose top level must be a mapping): PyYAML's safe
loader with `<<` merge keys resolved by our own code (the same values whatever PyYAML release is installed) and a key
given twice in one mapping refused; a missing file, a syntax error or a duplicate key raises ConfigError naming the
file. A run's record is written by `write_yaml`, all or nothing. `apply_overrides` parses each `--set` value with the
same loader and puts it at its dotted key; the types are roformer.config's to check, like the file's values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from roformer.errors import ConfigError
from roformer.files import atomic_write_text

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
