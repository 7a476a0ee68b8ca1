"""Typed configuration: dataclasses loaded from YAML, with errors that name the key and the file.

`ModelConfig` describes one encoder for both arms of the comparison: RoFormer (rotary positions) and the BERT
baseline (sinusoidal or learned absolute positions). Everything else about the two is the same by construction.

The loader is generic (`from_dict`) so that the training recipes' configs (`train:`, `data:` sections) get the same
checks: an unknown or mistyped key, a wrong type or an impossible value raises `ConfigError` naming the field and
the file it came from.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import yaml

from roformer.errors import ConfigError

T = TypeVar("T")

# Activation names accepted in `hidden_act`: every parameter-free activation that HF BERT/RoFormer configs use.
# The implementations live in `roformer.model.ACTIVATIONS`; this list is the config-level contract.
ACTIVATION_NAMES = (
    "gelu",
    "gelu_python",
    "gelu_new",
    "gelu_fast",
    "gelu_accurate",
    "gelu_pytorch_tanh",
    "gelu_python_tanh",
    "gelu_10",
    "quick_gelu",
    "relu",
    "relu2",
    "relu6",
    "leaky_relu",
    "silu",
    "swish",
    "mish",
    "tanh",
    "sigmoid",
    "hardswish",
    "laplace",
    "sqrtsoftplus",
    "linear",
)

PositionEncoding = Literal["rotary", "sinusoidal", "learned", "none"]


@dataclass
class ModelConfig:
    """Shape and behaviour of the encoder. One config for RoFormer and the BERT baseline.

    Attributes:
        vocab_size: Number of token ids.
        hidden_size: Width of the residual stream.
        num_layers: Number of post-LN transformer blocks.
        num_heads: Attention heads; hidden_size must be divisible by it.
        intermediate_size: Width of the feed-forward layer.
        embedding_size: Width of the token embeddings; None means hidden_size, otherwise a linear projection maps
            embeddings to hidden_size (HF RoFormer `embeddings_project`, ALBERT-style factorisation).
        hidden_act: Activation of the feed-forward layer and the MLM transform (an HF activation name).
        hidden_dropout: Dropout on embeddings and residual branches.
        attention_dropout: Dropout on attention probabilities.
        layer_norm_eps: LayerNorm epsilon (BERT uses 1e-12).
        type_vocab_size: Number of token types (segments).
        pad_token_id: Padding id; its embedding row starts at zero and gets no gradient (as in HF).
        initializer_range: Std of the normal init of linear and embedding weights (BERT init).
        position_encoding: `rotary` (RoFormer), `sinusoidal` or `learned` absolute positions (BERT), or `none`
            (an ablation: a bag of tokens).
        max_position_embeddings: Rows of the learned position table; unused by the other encodings, which have no
            length limit. Kept for HF conversion.
        rotary_base: Base of the rotary frequencies, theta_i = base^(-2i/d) (paper eq. 15).
        rotary_layout: `interleaved` pairs (x1,x2),(x3,x4),... as in the paper and HF; `half` pairs (x_i, x_{i+d/2})
            as in GPT-NeoX/LLaMA.
        rotary_value: Also rotate the values (HF RoFormer `rotary_value`).
        sinusoidal_scale: Multiplier of the sinusoidal table added to the token embeddings. None picks the default
            that keeps the table at the scale of the token embedding init (see `resolved_sinusoidal_scale`).
        sinusoidal_scale_learned: Make that multiplier a learned scalar (Cramming-style), initialised at the value.
        tie_word_embeddings: The MLM decoder reuses the word embedding matrix.
        num_labels: Outputs of the sequence classification head; 1 means regression (MSE).
        classifier_head: `pooler` (BERT: tanh pooler on x[:,0], then a linear layer) or `mlp` (HF RoFormer:
            dropout, dense, hidden_act, dropout, linear on x[:,0]); None picks the HF head of the architecture.
        classifier_dropout: Dropout in the classification head; None means hidden_dropout.
        add_pooler: The backbone carries a BERT pooler (needed by the `pooler` head; kept for HF BertModel).
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    embedding_size: int | None = None
    hidden_act: str = "gelu"
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    type_vocab_size: int = 2
    pad_token_id: int = 0
    initializer_range: float = 0.02
    position_encoding: PositionEncoding = "rotary"
    max_position_embeddings: int = 512
    rotary_base: float = 10000.0
    rotary_layout: Literal["interleaved", "half"] = "interleaved"
    rotary_value: bool = False
    sinusoidal_scale: float | None = None
    sinusoidal_scale_learned: bool = False
    tie_word_embeddings: bool = True
    num_labels: int = 2
    classifier_head: Literal["pooler", "mlp"] | None = None
    classifier_dropout: float | None = None
    add_pooler: bool = False

    def __post_init__(self) -> None:
        check_types(self)
        self._validate()

    def _validate(self) -> None:
        positive = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size", "type_vocab_size")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.embedding_size is not None and self.embedding_size <= 0:
            raise ConfigError(f"embedding_size must be > 0 or null, got {self.embedding_size}")
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})")
        if self.position_encoding == "rotary" and self.head_size % 2:
            raise ConfigError(f"rotary needs an even head size, got hidden_size/num_heads = {self.head_size}")
        if self.position_encoding == "sinusoidal" and self.embedding_dim % 2:
            raise ConfigError(f"sinusoidal positions need an even embedding size, got {self.embedding_dim}")
        if self.rotary_value and self.position_encoding != "rotary":
            raise ConfigError("rotary_value is only meaningful with position_encoding: rotary")
        if self.hidden_act not in ACTIVATION_NAMES:
            raise ConfigError(f"hidden_act '{self.hidden_act}' is not one of: {', '.join(ACTIVATION_NAMES)}")
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.classifier_dropout is not None and not 0.0 <= self.classifier_dropout < 1.0:
            raise ConfigError(f"classifier_dropout must be in [0, 1) or null, got {self.classifier_dropout}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ConfigError(f"pad_token_id ({self.pad_token_id}) must be in [0, vocab_size={self.vocab_size})")
        if self.layer_norm_eps <= 0 or self.initializer_range <= 0:
            raise ConfigError("layer_norm_eps and initializer_range must be > 0")
        if self.max_position_embeddings <= 0:
            raise ConfigError(f"max_position_embeddings must be > 0, got {self.max_position_embeddings}")
        if self.rotary_base <= 1.0:
            raise ConfigError(f"rotary_base must be > 1, got {self.rotary_base}")
        if self.num_labels <= 0:
            raise ConfigError(f"num_labels must be > 0, got {self.num_labels}")
        if self.sinusoidal_scale is not None and not math.isfinite(self.sinusoidal_scale):
            raise ConfigError(f"sinusoidal_scale must be finite, got {self.sinusoidal_scale}")
        if self.classifier_head is None:
            # The HF head of each architecture: RoFormer has no pooler, BERT uses its tanh pooler.
            self.classifier_head = "mlp" if self.position_encoding == "rotary" else "pooler"

    @property
    def head_size(self) -> int:
        """Per-head width d of queries, keys and values."""
        return self.hidden_size // self.num_heads

    @property
    def embedding_dim(self) -> int:
        """Width of the token embeddings (embedding_size, or hidden_size when that is None)."""
        return self.embedding_size or self.hidden_size

    @property
    def resolved_sinusoidal_scale(self) -> float:
        """Multiplier of the sinusoidal table.

        The raw table has entries in [-1, 1] (RMS 1/sqrt(2)) while BERT-initialised token embeddings have std
        `initializer_range` (0.02): added raw, positions drown the tokens (see README, "A fair sinusoidal
        baseline"). The default scales the table to RMS `initializer_range`, the scale of a learned table at init.
        """
        if self.sinusoidal_scale is not None:
            return self.sinusoidal_scale
        return self.initializer_range * math.sqrt(2.0)

    @classmethod
    def from_yaml(cls, path: str | Path) -> ModelConfig:
        """Load a config from a YAML file (a mapping of field names, or one under a `model:` key)."""
        data = read_yaml(path)
        if isinstance(data, dict) and set(data) == {"model"}:
            data = data["model"]
        return from_dict(cls, data, source=str(path))

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of all fields (YAML-safe)."""
        return dataclasses.asdict(self)

    def to_yaml(self, path: str | Path) -> None:
        """Write all fields to a YAML file."""
        write_yaml(path, self.to_dict())


# ----------------------------------------------------------------------------------------------------------------
# Generic, typed dataclass loading


def read_yaml(path: str | Path) -> Any:
    """Parse a YAML file; a missing file or a syntax error raises ConfigError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        with path.open(encoding="utf-8") as f:
            return yaml.safe_load(f)
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        detail = str(e).replace("\n", " ")
        raise ConfigError(f"{path}: not valid YAML: {detail}") from None


def write_yaml(path: str | Path, data: Any) -> None:
    """Write `data` as block-style YAML with keys in the given order."""
    with Path(path).open("w", encoding="utf-8") as f:
        yaml.safe_dump(data, f, sort_keys=False, default_flow_style=False)


def from_dict(cls: type[T], data: Any, source: str = "<dict>", prefix: str = "") -> T:
    """Build dataclass `cls` from a mapping, checking every key and value type.

    Args:
        cls: The dataclass to build; fields may themselves be dataclasses (nested sections).
        data: The mapping (e.g. parsed YAML). None means all defaults.
        source: Where the data came from (a file name), used in error messages.
        prefix: Dotted path of this section inside the file, used in error messages.

    Returns:
        The dataclass instance.

    Raises:
        ConfigError: naming the source and the dotted key for unknown keys, wrong types and invalid values.
    """
    where = f"{source}: " + (f"{prefix.rstrip('.')}: " if prefix else "")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}expected a mapping of keys, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls) if f.init}
    for key in data:
        if key not in known:
            raise ConfigError(f"{source}: unknown key '{prefix}{key}' (known keys: {', '.join(sorted(known))})")
    kwargs = {}
    for key, value in data.items():
        kwargs[key] = coerce(value, hints[key], source, f"{prefix}{key}")
    try:
        return cls(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{where}{e}") from None


def coerce(value: Any, tp: Any, source: str, key: str) -> Any:
    """Check `value` against type annotation `tp` and convert where lossless (int -> float, list -> tuple).

    Raises:
        ConfigError: naming `source` and `key` when the value does not fit.
    """

    def fail(expected: str) -> ConfigError:
        return ConfigError(f"{source}: key '{key}' must be {expected}, got {value!r} ({type(value).__name__})")

    if tp is Any:
        return value
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None:
            if type(None) in options:
                return None
            raise fail(_type_name(tp))
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return coerce(value, option, source, key)
            except ConfigError as e:
                errors.append(e)
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
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "1e-5" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise fail("a number")
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
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
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


def load_config(cls: type[T], path: str | Path, overrides: list[str] | None = None) -> T:
    """Read a YAML config file into dataclass `cls`, with `--set` style overrides applied first.

    Raises:
        ConfigError: naming the file (or `--set`) and the key for every kind of bad input.
    """
    data = read_mapping(path)
    apply_overrides(data, overrides or [])
    return from_dict(cls, data, source=str(path))


def resolve_paths(data: dict[str, Any], keys: list[str], base: Path, maybe_names: tuple[str, ...] = ()) -> None:
    """Make the relative paths at dotted `keys` of a parsed YAML absolute against `base` (the file's folder), in place.

    Applied before `--set` overrides, so paths in a file are relative to the file and paths given on the command
    line relative to the working directory. Keys in `maybe_names` may also hold hub names (`bert-base-uncased`,
    `org/model`): those are resolved only when they start with `.` or exist under `base`.
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
    return str((base / value).resolve())
