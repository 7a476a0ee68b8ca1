"""Model directories: `model.yaml` (architecture + ModelConfig) and `model.safetensors`.

`save_model` writes both through temporary names and renames them, so an interrupted save never leaves a
directory that loads half-written weights. `load` rebuilds the saved class, or another architecture on the same
backbone (a pretrained `masked_lm` becomes a `sequence_classification` model with a fresh head for fine-tuning).
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from roformer.config import ModelConfig, from_dict, read_yaml, write_yaml
from roformer.errors import CheckpointError, ConfigError
from roformer.model import ARCHITECTURES, Model

logger = logging.getLogger(__name__)

CONFIG_FILE = "model.yaml"
WEIGHTS_FILE = "model.safetensors"
FORMAT_VERSION = 1


def save_model(model: Model, directory: str | Path) -> None:
    """Write `model.yaml` and `model.safetensors` into `directory` (created if needed)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    meta = {"format_version": FORMAT_VERSION, "architecture": model.architecture, "config": model.config.to_dict()}
    _atomic(directory / WEIGHTS_FILE, lambda tmp: save_file(state, str(tmp), metadata={"format": "pt"}))
    _atomic(directory / CONFIG_FILE, lambda tmp: write_yaml(tmp, meta))


def _atomic(path: Path, write: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def read_model_config(directory: str | Path) -> tuple[str, ModelConfig]:
    """Architecture name and ModelConfig of a saved model directory.

    Raises:
        CheckpointError: the directory or its `model.yaml` is missing or invalid.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: model directory not found")
    path = directory / CONFIG_FILE
    if not path.is_file():
        hint = ""
        if (directory / "config.json").is_file():
            hint = " (it has config.json: an HF checkpoint; use roformer.from_hf or `roformer convert --from-hf`)"
        raise CheckpointError(f"{directory}: no {CONFIG_FILE}, not a roformer model directory{hint}")
    try:
        meta = read_yaml(path)
        if not isinstance(meta, dict) or "architecture" not in meta or "config" not in meta:
            raise ConfigError(f"{path}: expected keys 'architecture' and 'config'")
        architecture = meta["architecture"]
        if architecture not in ARCHITECTURES:
            raise ConfigError(f"{path}: unknown architecture {architecture!r} (known: {', '.join(ARCHITECTURES)})")
        config = from_dict(ModelConfig, meta["config"], source=str(path), prefix="config.")
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
    return architecture, config


def load(
    directory: str | Path,
    architecture: str | None = None,
    device: str | torch.device = "cpu",
    **config_overrides: Any,
) -> Model:
    """Load a model saved with `model.save(directory)`.

    Args:
        directory: The model directory (e.g. a pretraining run's `final/`).
        architecture: `backbone`, `masked_lm` or `sequence_classification`; None = the saved one. A different one
            keeps the backbone weights and initialises the new head (logged).
        device: Where to put the weights.
        **config_overrides: ModelConfig fields to change, e.g. `num_labels=3`, `hidden_dropout=0.0`. Fields that
            change parameter shapes of the saved backbone fail with a shape error.

    Returns:
        The model, in eval mode.

    Raises:
        CheckpointError: missing or corrupt files, unknown architecture or a shape mismatch.
    """
    directory = Path(directory)
    saved_architecture, config = read_model_config(directory)
    architecture = architecture or saved_architecture
    if architecture not in ARCHITECTURES:
        raise CheckpointError(f"unknown architecture {architecture!r} (known: {', '.join(ARCHITECTURES)})")
    if config_overrides:
        config = _override(config, config_overrides)
    state = _read_weights(directory / WEIGHTS_FILE)
    model = ARCHITECTURES[architecture](config)
    if architecture == saved_architecture:
        _load_state(model, state, directory, strict=True)
    else:
        backbone = model if architecture == "backbone" else model.backbone
        missing = _load_state(backbone, _backbone_state(state, saved_architecture), directory)
        fresh = [f"backbone.{k}" for k in missing] + [k for k in model.state_dict() if not k.startswith("backbone.")]
        if fresh:
            logger.info("%s: freshly initialised for %s: %s", directory, architecture, ", ".join(fresh))
    return model.to(device).eval()


def _override(config: ModelConfig, overrides: dict[str, Any]) -> ModelConfig:
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
    module: torch.nn.Module, state: dict[str, torch.Tensor], where: Path, strict: bool = False
) -> list[str]:
    """Copy `state` into `module`, checking shapes; returns the missing keys (only the pooler's, unless strict)."""
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
    allowed_missing = [] if strict else [k for k in missing if k.startswith("pooler.")]
    if unexpected or set(missing) - set(allowed_missing):
        raise CheckpointError(
            f"{where}: weights do not match the config: missing {sorted(set(missing) - set(allowed_missing))[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    module.load_state_dict(state, strict=False)
    return allowed_missing
