"""An HF checkpoint on disk: a `save_pretrained` directory or a hub name, its config and its weight files.

Read without building a model: transformers' config, and the state dict (model.safetensors or pytorch_model.bin,
sharded or not) or only its tensor names. Every failure is one `CheckpointError` line. The conversion to our models
is `roformer.model.hf`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from roformer.errors import CheckpointError


def read_hf_checkpoint(path: str) -> tuple[Any, dict[str, torch.Tensor]]:
    """(transformers config, state dict) of a `save_pretrained` directory or a hub name, without building a model.

    Weights come from model.safetensors or pytorch_model.bin (sharded or not); a hub name is downloaded first.
    """
    directory = checkpoint_directory(path)
    return read_hf_config(str(directory)), read_hf_weights(directory)


def checkpoint_directory(path: str) -> Path:
    """A checkpoint directory: `path` itself, or a hub name's download."""
    directory = Path(path)
    return directory if directory.is_dir() else _download(path)


def _download(name: str) -> Path:
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.bin", "*.txt", "*.model"]
    try:
        return Path(snapshot_download(name, allow_patterns=patterns))
    except Exception as e:  # noqa: BLE001 - the hub raises many types; the user needs one line
        raise CheckpointError(f"{name}: not a directory, and the hub download failed ({_first_line(e)})") from None


def read_hf_config(path: str) -> Any:
    """The HF config (`AutoConfig`) of a checkpoint directory or hub name."""
    import transformers

    try:
        return transformers.AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot read an HF config ({_first_line(e)})") from None


def _first_line(error: Exception) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0]


def _weight_files(directory: Path) -> list[Path]:
    """The files holding a checkpoint's weights: model.safetensors, else pytorch_model.bin, or their shards."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        index = directory / f"{name}.index.json"
        files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else [name]
        if all((directory / f).is_file() for f in files):
            return [directory / f for f in files]
    raise CheckpointError(f"{directory}: no model.safetensors or pytorch_model.bin")


def read_hf_weights(directory: Path, names_only: bool = False) -> dict[str, Any]:
    """The state dict of a checkpoint directory; with `names_only`, its tensor names (safetensors: no data read)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    files = _weight_files(directory)
    state: dict[str, Any] = {}
    try:
        for f in files:
            if f.suffix != ".safetensors":
                state.update(torch.load(f, map_location="cpu", weights_only=True))
            elif names_only:
                with safe_open(f, "pt") as opened:
                    state.update(dict.fromkeys(opened.keys()))
            else:
                state.update(load_file(f))
    except Exception as e:  # noqa: BLE001 - a corrupt file raises whatever its reader raises
        raise CheckpointError(f"{directory}: cannot read {files[0].name} ({_first_line(e)})") from None
    return state
