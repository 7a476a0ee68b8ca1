"""Model directories on disk: `model.yaml` (architecture + ModelConfig) and `model.safetensors`.

The file format only: it reads and writes state dicts and configs and never builds a model, so the model file
imports this module and not the other way round (`roformer.model.model.load` builds the class). `save_model` writes
both files through temporary names and renames them, so an interrupted save never leaves a directory that loads
half-written weights. `load_weights` fills a model of the saved architecture, or another architecture on the same
backbone (a pretrained `masked_lm` becomes a `sequence_classification` model with a fresh head for fine-tuning), or
the saved architecture with another label count (a classifier fine-tuned for one task starts another: its output
layer is fresh).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from roformer.config import from_dict
from roformer.config_yaml import read_yaml, write_yaml
from roformer.errors import CheckpointError, ConfigError
from roformer.files import atomic_write, verify_manifest, write_manifest
from roformer.model.config import ARCHITECTURE_NAMES, EncoderDecoderConfig, ModelConfig

logger = logging.getLogger(__name__)

MODEL_CONFIG_FILE = "model.yaml"
WEIGHTS_FILE = "model.safetensors"
FORMAT_VERSION = 1


def save_model(model: Any, directory: str | Path) -> None:
    """Write `model.safetensors` and `model.yaml` (with the weights' size and sha256) into `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    atomic_write(directory / WEIGHTS_FILE, lambda tmp: save_file(state, str(tmp), metadata={"format": "pt"}))
    meta = {
        "format_version": FORMAT_VERSION,
        "architecture": model.architecture,
        "config": model.config.to_dict(),
        # a flipped byte inside the tensor data still loads: the checksum is what tells (checkpoints have theirs)
        "weights": write_manifest(directory, [WEIGHTS_FILE])[WEIGHTS_FILE],
    }
    write_yaml(directory / MODEL_CONFIG_FILE, meta)


def read_model_config(directory: str | Path) -> tuple[str, ModelConfig]:
    """Architecture name and ModelConfig of a saved model directory (an `EncoderDecoderConfig` for encoder_decoder).

    Raises:
        CheckpointError: the directory or its `model.yaml` is missing or invalid.
    """
    _, architecture, config = _read_meta(Path(directory))
    return architecture, config


def _read_meta(directory: Path) -> tuple[dict[str, Any], str, ModelConfig]:
    """model.yaml as read (its `weights` entry included), its architecture and its checked ModelConfig."""
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: model directory not found")
    path = directory / MODEL_CONFIG_FILE
    if not path.is_file():
        hint = ""
        if (directory / "config.json").is_file():
            hint = " (it has config.json: an HF checkpoint; use roformer.from_hf or `roformer convert --from-hf`)"
        raise CheckpointError(f"{directory}: no {MODEL_CONFIG_FILE}, not a roformer model directory{hint}")
    try:
        meta = read_yaml(path)
        if not isinstance(meta, dict) or "architecture" not in meta or "config" not in meta:
            raise ConfigError(f"{path}: expected keys 'architecture' and 'config'")
        _check_format_version(path, meta.get("format_version", FORMAT_VERSION))
        architecture = meta["architecture"]
        if architecture not in ARCHITECTURE_NAMES:
            raise ConfigError(f"{path}: unknown architecture {architecture!r} (known: {', '.join(ARCHITECTURE_NAMES)})")
        config_class = EncoderDecoderConfig if architecture == "encoder_decoder" else ModelConfig
        config = from_dict(config_class, meta["config"], source=str(path), prefix="config.")
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
    return meta, architecture, config


def _check_format_version(path: Path, version: Any) -> None:
    """Refuse a model.yaml of a newer format (written by a later roformer) instead of misreading it.

    A directory without `format_version` was written before the field existed: format 1.

    Raises:
        ConfigError: naming the file, its format and the one this version reads.
    """
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ConfigError(f"{path}: format_version must be a positive integer, got {version!r}")
    if version > FORMAT_VERSION:
        raise ConfigError(
            f"{path}: model format {version}, this roformer reads format {FORMAT_VERSION} and older "
            "(upgrade roformer-pytorch to load it)"
        )


def read_model_dir(
    directory: str | Path, architecture: str | None = None, config_overrides: dict[str, Any] | None = None
) -> tuple[str, str, ModelConfig, dict[str, torch.Tensor]]:
    """Everything needed to rebuild a saved model: (saved architecture, wanted architecture, config, weights).

    Args:
        directory: The model directory.
        architecture: The architecture to build; None = the saved one.
        config_overrides: ModelConfig fields to change (e.g. num_labels, dropout).

    Raises:
        CheckpointError: missing or corrupt files, an unknown architecture, an unknown override.
    """
    directory = Path(directory)
    meta, saved_architecture, config = _read_meta(directory)
    architecture = architecture or saved_architecture
    if architecture not in ARCHITECTURE_NAMES:
        raise CheckpointError(f"unknown architecture {architecture!r} (known: {', '.join(ARCHITECTURE_NAMES)})")
    if config_overrides:
        config = _override(config, config_overrides)
    state = _read_weights(directory / WEIGHTS_FILE)  # a truncated file: the reader's own error first
    _verify_weights(directory, meta.get("weights"))
    return saved_architecture, architecture, config, state


def _verify_weights(directory: Path, recorded: list[Any] | None) -> None:
    """Check model.safetensors against its size and sha256 as model.yaml recorded them (None: saved before that).

    Raises:
        CheckpointError: the file differs from what was saved.
    """
    if not recorded:
        return
    problem = verify_manifest(directory, {WEIGHTS_FILE: recorded})
    if problem is not None:
        raise CheckpointError(
            f"{directory}: {problem} in {MODEL_CONFIG_FILE}, so it was damaged or replaced (save or download it "
            f"again, or delete the `weights:` entry of {MODEL_CONFIG_FILE} to load it as it is)"
        )


# Architectures with the same head (the vocabulary head: one predicts masked tokens, the other the next token).
SAME_HEAD = {"masked_lm", "causal_lm"}


def load_weights(
    model: torch.nn.Module,
    state: dict[str, torch.Tensor],
    saved_architecture: str,
    where: Path,
    relabelled: bool = False,
) -> None:
    """Copy saved weights into `model`: all of them for the saved architecture, else the backbone (head fresh, logged).

    A masked LM and a causal LM share their head (SAME_HEAD): it is kept when one is loaded as the other.

    Args:
        model: The model to fill, built from the saved config (with overrides).
        state: The saved weights.
        saved_architecture: The architecture they were saved from.
        where: The model directory, for the messages.
        relabelled: `model`'s num_labels is not the saved one: the head's weights whose shape it changed (the
            output layer) are left as initialised (logged), the others loaded (as `from_hf` does).

    Raises:
        CheckpointError: a shape mismatch (in the backbone, or in the head without a new num_labels), missing or
            unexpected weights.
    """
    architecture = model.architecture
    if architecture == saved_architecture or {architecture, saved_architecture} <= SAME_HEAD:
        fresh = _head_misfits(model, state) if relabelled else []
        _load_state(model, {k: v for k, v in state.items() if k not in fresh}, where, strict=True, fresh=fresh)
        report_fresh(where, architecture, fresh)
        return
    missing = _load_state(model.base_model, _backbone_state(state, saved_architecture), where)
    if model.base_model is model:  # a bare backbone: nothing but what the saved backbone lacked is new
        fresh = missing
    else:
        fresh = [f"backbone.{k}" for k in missing] + [k for k in model.state_dict() if not k.startswith("backbone.")]
    report_fresh(where, architecture, fresh)


def report_fresh(where: str | Path, architecture: str, fresh: list[str]) -> None:
    """Log, in one line, the weights of a model loaded from `where` that start as initialised (none: nothing)."""
    if fresh:
        logger.info("%s: freshly initialised for %s: %s", where, architecture, ", ".join(fresh))


def _head_misfits(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> list[str]:
    """The head's weights in `state` whose shape differs from `model`'s (never the backbone's), in the model's order."""
    if model.base_model is model:  # a bare backbone has no head
        return []
    own = model.state_dict()
    return [k for k, v in own.items() if not k.startswith("backbone.") and k in state and state[k].shape != v.shape]


def _override(config: ModelConfig, overrides: dict[str, Any]) -> ModelConfig:
    if isinstance(config, EncoderDecoderConfig):  # its own fields, or a ModelConfig field on both halves
        try:
            return config.replaced(**overrides)
        except ConfigError as e:
            raise ConfigError(f"model config override: {e}") from None
    fields = config.to_dict()
    for key in overrides:
        if key not in fields:
            raise ConfigError(f"unknown ModelConfig field '{key}'")
    try:
        return replace(config, **overrides)
    except ConfigError as e:
        raise ConfigError(f"model config override: {e}") from None


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise CheckpointError(f"{path}: weights file not found")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path}: corrupt or unreadable safetensors file ({e})") from None


def _backbone_state(state: dict[str, torch.Tensor], architecture: str) -> dict[str, torch.Tensor]:
    if architecture == "backbone":
        return state
    return {k.removeprefix("backbone."): v for k, v in state.items() if k.startswith("backbone.")}


def _load_state(
    module: torch.nn.Module,
    state: dict[str, torch.Tensor],
    where: Path,
    strict: bool = False,
    fresh: list[str] | None = None,
) -> list[str]:
    """Copy `state` into `module`, checking shapes; returns the missing keys (only the pooler's, unless strict).

    `fresh` names weights that may be missing from `state` even when strict (a new output layer).
    """
    own = module.state_dict()
    mismatched = [
        f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}"
        for k, v in state.items()
        if k in own and v.shape != own[k].shape
    ]
    if mismatched:
        raise CheckpointError(f"{where}: shape mismatch (checkpoint vs model): {'; '.join(mismatched[:5])}")
    unexpected = sorted(set(state) - set(own))
    missing = sorted(set(own) - set(state))
    allowed_missing = [k for k in missing if k in (fresh or []) or (not strict and k.startswith("pooler."))]
    if unexpected or set(missing) - set(allowed_missing):
        raise CheckpointError(
            f"{where}: weights do not match the config: missing {sorted(set(missing) - set(allowed_missing))[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    module.load_state_dict(state, strict=False)
    return allowed_missing
