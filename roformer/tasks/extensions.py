"""Test-time context extension: a trained model evaluated past its trained length under each method, no training.

`data.synthetic.extensions` lists methods as `roformer eval-mlm --rope-scaling` takes them, each with an optional
factor (`linear`, `yarn:4`):

    linear       position interpolation (Chen et al. 2023): every position divided by the factor, so that a row of
                 factor x the trained length sees the trained range of positions. It is defined for every encoding
                 that computes its terms from real positions (EncodingSpec.real_positions: rotary, p_rope,
                 sinusoidal, ALiBi, FIRE): for rotary it is `rope_scaling: linear` exactly (tested); a learned
                 table, Shaw's clipped distances and T5's buckets read integer rows and refuse it.
    ntk          NTK-aware scaling (bloc97 2023): RoPE's base raised so that its lowest frequency is interpolated.
    yarn         YaRN (Peng et al. 2023): RoPE's frequencies interpolated by band, q.k sharpened.
    self_extend  SelfExtend (Jin et al. 2024): distances beyond a window of half the trained length grouped.
                 These three are `model.rope_scaling`, which rescales or regroups RoPE's own frequencies: rotary
                 alone (p-RoPE's zeroed frequencies and every other encoding have no such frequencies to rescale).
    log_scale    log-length attention scale (Su 2021; `model.attention_log_scale`): a row of n > n0 tokens scales its
                 logits by log n / log n0, n0 the trained length. Any encoding with softmax attention; no factor.

The default factor is the one a user would pick for the length: the split's length over the trained one (the test
multiple m of `test_<m>x`; self_extend: the smallest group that keeps every distance within the trained length). At
the trained length it is 1, the model itself; a fixed factor (`linear:8`) measures what a method costs there too.
The trained length is the longest training row with [CLS] and [SEP] (the log-length scale's n0); for the position
methods, with randomized positions, it is the range the positions were drawn from (`randomized_positions`), which
holds every test row, so the default factor is 1 there: a
model trained on positions up to L has nothing beyond them to extend to (a fixed factor still applies, as a
compression of positions it has seen). With ALiBi's asymmetric form, `linear` divides the distances but not the half
step that sets the left keys apart.

`EvalVariant` is what a fine-tuning run evaluates beside the model (roformer.train.finetune): the model config it
evaluates under and how a batch's positions change.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from roformer.errors import ConfigError
from roformer.model.config import ModelConfig, RopeScaling

ROPE_SCALINGS = ("linear", "ntk", "yarn", "self_extend")  # `model.rope_scaling`'s types (linear: see `positions`)
FREQUENCY_METHODS = ROPE_SCALINGS[1:]  # those applied through rope_scaling: RoPE's own frequencies, rotary alone
EXTENSION_METHODS = (*ROPE_SCALINGS, "log_scale")


@dataclass(frozen=True)
class EvalVariant:
    """A model evaluated otherwise than it was trained: its config, and its positions divided by `position_divisor`.

    Attributes:
        config: The model config to evaluate under (the trained weights load into it unchanged).
        position_divisor: Every position of a batch is divided by this (position interpolation); 1: unchanged.
    """

    config: ModelConfig
    position_divisor: float = 1.0

    def batch(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`batch` with its positions divided (as real numbers), given as `position_ids` (0..T-1 where it had none)."""
        if self.position_divisor == 1.0:
            return batch
        ids = batch["input_ids"]
        positions = batch.get("position_ids")
        if positions is None:  # one grid for every row, expanded, not copied: the model computes its terms once
            grid = torch.arange(ids.shape[1], device=ids.device).float() / self.position_divisor
            return {**batch, "position_ids": grid.expand_as(ids)}
        return {**batch, "position_ids": positions.float() / self.position_divisor}


@dataclass(frozen=True)
class Extension:
    """One entry of `data.synthetic.extensions`: a method and its factor (None: the one for each length).

    Attributes:
        method: One of EXTENSION_METHODS.
        factor: The fixed factor (>= 1; self_extend: the group size), or None.
    """

    method: str
    factor: float | None = None

    @classmethod
    def parse(cls, text: str) -> Extension:
        """`linear`, `yarn:4` -> Extension.

        The one reading of a method and its factor: `data.synthetic.extensions` and `eval-mlm --rope-scaling` both.

        Raises:
            ConfigError: an unknown method, a factor that is not a number >= 1, or a factor for log_scale (the
                message names the entry; the caller says where it was written).
        """
        name, _, factor = str(text).strip().partition(":")
        if name not in EXTENSION_METHODS:
            raise ConfigError(f"unknown method {name!r} (known: {', '.join(EXTENSION_METHODS)})")
        if not factor:
            return cls(name)
        try:
            value = float(factor)
        except ValueError:
            raise ConfigError(f"{text!r}: the factor after ':' must be a number") from None
        if not value >= 1 or math.isinf(value):
            raise ConfigError(f"{text!r}: the factor must be a finite number >= 1")
        if name == "log_scale":
            raise ConfigError(f"{text!r}: log_scale takes no factor (its n0 is the trained length)")
        if name == "self_extend" and not value.is_integer():
            raise ConfigError(f"{text!r}: self_extend's factor is its group size, a whole number")
        return cls(name, value)

    @property
    def label(self) -> str:
        """The name results.json gives it: the method, with its factor when fixed (`linear:8`)."""
        return self.method if self.factor is None else f"{self.method}:{self.factor:g}"

    def refusal(self, config: ModelConfig) -> str | None:
        """Why the method is not defined for the model `config` describes, or None where it is."""
        spec = config.encoding
        if self.method == "linear" and not spec.real_positions:
            return (
                f"linear (position interpolation) divides positions, which {spec.name} reads as table rows, "
                "buckets or not at all; it applies to rotary, p_rope, sinusoidal, alibi and fire"
            )
        if self.method in FREQUENCY_METHODS and spec.name != "rotary":
            return f"{self.method} rescales RoPE's frequencies (model.rope_scaling): rotary alone, not {spec.name}"
        if self.method == "log_scale" and config.attention == "linear":
            return "log_scale scales softmax logits: not with attention: linear"
        if self.method == "log_scale" and config.attention_log_scale is not None:
            return "the model was trained with attention_log_scale: it is not a test-time extension of it"
        if self.method in FREQUENCY_METHODS and config.rope_scaling is not None:
            return "the model was trained with rope_scaling: another one would replace it, not extend it"
        return None

    def variant(self, config: ModelConfig, trained: int, length: int, positions: int | None = None) -> EvalVariant:
        """The model config and positions of this method at rows of `length` tokens, trained on `trained`.

        Args:
            config: The trained model's config.
            trained: The longest trained row, in tokens (the log-length scale's n0).
            length: The rows' length in tokens.
            positions: The range of positions trained on, where it is not `trained` (randomized positions): the
                position methods scale from it.

        Raises:
            ConfigError: the scaled config is one the model cannot take (ModelConfig's own checks).
        """
        if self.method == "log_scale":
            return EvalVariant(dataclasses.replace(config, attention_log_scale=trained))
        if self.method == "linear":
            return EvalVariant(config, position_divisor=self.factor_at(length, positions or trained))
        return EvalVariant(dataclasses.replace(config, rope_scaling=self.rope_scaling(length, positions or trained)))

    def factor_at(self, length: int, trained: int) -> float:
        """The factor at rows of `length` tokens after training on `trained`: the fixed one, or `default_factor`."""
        return self.factor if self.factor is not None else default_factor(self.method, length, trained)

    def rope_scaling(self, length: int, trained: int) -> RopeScaling:
        """RoPE's own form of the method at `length` (`model.rope_scaling`).

        Linear: RoPE's frequencies over the factor, equal to the positions over it up to rounding.
        """
        return RopeScaling(type=self.method, factor=self.factor_at(length, trained), original_max_position=trained)


def default_factor(method: str, length: int, trained: int) -> float:
    """The factor a user would choose to run at `length`: length / trained, or for self_extend the smallest group.

    SelfExtend's farthest distance is window + (length - 1 - window) / group, window = trained // 2: the group keeps
    it within the trained distances (trained - 1).
    """
    if method != "self_extend":
        return max(1.0, length / trained)
    window = max(1, trained // 2)
    return float(max(1, math.ceil((length - 1 - window) / max(1, trained - 1 - window))))


def parse_extensions(entries: list[str]) -> list[Extension]:
    """Every entry parsed; two entries of one label are refused.

    Raises:
        ConfigError: a bad entry, or one given twice.
    """
    try:
        parsed = [Extension.parse(entry) for entry in entries]
    except ConfigError as e:
        raise ConfigError(f"extensions: {e}") from None
    labels = [e.label for e in parsed]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ConfigError(f"extensions: {', '.join(repeated)} given twice")
    return parsed
