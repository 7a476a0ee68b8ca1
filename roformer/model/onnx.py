"""ONNX export of every model here, for onnxruntime and other ONNX runtimes (what users of the original port asked for).

The exported graph takes `input_ids`, `attention_mask` and `token_type_ids` (int64, (batch, sequence), or (batch,
choices, sequence) for multiple choice) with dynamic batch, choices and sequence axes, and returns `logits` (and
`pooled` when the model has a pooler), float32. It is traced by `torch.export` and converted by `torch.onnx.export`:
the model's compile path (rotary in real arithmetic, no complex numbers) is what gets exported. Position tables (rotary,
sinusoidal) become constants, so they are built first for the longest sequence the file must accept (`max_length`).

A model of more than 2 GiB of weights keeps them in `model.onnx.data` beside the graph (protobuf's limit). What does
not export: `generate()` and the KV cache (a Python loop over a growing cache: export the `causal_lm`
forward and decode in the runtime), `position_ids` (the graph uses 0..T-1), and the losses (no labels input).
"""

from __future__ import annotations

import contextlib
import copy
import sys
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from roformer.errors import CheckpointError
from roformer.model.model import Model
from roformer.model.positions import SinusoidalPositions
from roformer.model.rotary import RotaryEmbedding

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
ONNX_FILE = "model.onnx"
PROTOBUF_LIMIT = 1 << 31  # bytes: a larger model keeps its weights beside the graph, in model.onnx.data


class _Exported(nn.Module):
    """The model's forward as the ONNX graph sees it: three id tensors in, a tuple of float tensors out."""

    def __init__(self, model: Model) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> tuple[Tensor, ...]:
        out = self.model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return (out.logits,) if out.pooled is None else (out.logits, out.pooled)


def output_names(model: Model) -> list[str]:
    """`logits`, and `pooled` when the model has a pooler."""
    return ["logits"] + (["pooled"] if model.base_model.pooler is not None else [])


def export_onnx(model: Model, path: str | Path, max_length: int | None = None, opset: int | None = None) -> Path:
    """Write `model` (a float32 copy, in eval mode, on the CPU) as an ONNX file with dynamic batch and sequence axes.

    Args:
        model: Any model here (backbone, every head).
        path: The .onnx file to write.
        max_length: The longest sequence the file accepts (position tables are built for it); default the model's
            max_position_embeddings.
        opset: ONNX opset; None = the exporter's default.

    Returns:
        The path written.

    Raises:
        CheckpointError: a length the model cannot take (beyond a learned table); an encoder-decoder (its two
            inputs and its decoding loop are not this graph's).
    """
    if model.architecture == "encoder_decoder":
        raise CheckpointError("ONNX export of an encoder_decoder is not supported (export the encoder as a backbone)")
    config = model.config
    max_length = max_length or config.max_position_embeddings
    if max_length < 2:
        raise CheckpointError(f"--max-length must be >= 2, got {max_length}")
    if not config.holds_positions(max_length):
        raise CheckpointError(
            f"{config.position_encoding} positions cover {config.position_limit} tokens: --max-length {max_length} "
            "cannot be exported (rotary, sinusoidal and the relative encodings have no limit)"
        )
    model = copy.deepcopy(model).to("cpu", torch.float32).eval()  # the caller's model keeps its device, dtype, mode
    _build_position_tables(model, max_length)
    choices = model.architecture == "multiple_choice"
    shape = (2, 2, min(8, max_length)) if choices else (2, min(8, max_length))
    example = (
        torch.ones(shape, dtype=torch.long),
        torch.ones(shape, dtype=torch.long),
        torch.zeros(shape, dtype=torch.long),
    )
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    sequence = torch.export.Dim("sequence", min=2, max=max_length)
    axes = (
        {0: batch, 1: torch.export.Dim("choices", min=1, max=1 << 10), 2: sequence}
        if choices
        else {0: batch, 1: sequence}
    )
    path = Path(path)
    with (
        torch.no_grad(),
        contextlib.redirect_stdout(sys.stderr),  # the exporter's progress lines are not output
        warnings.catch_warnings(),
    ):
        # torch 2.13's own decomposition pass deep-copies a pytree spec and warns of its deprecated LeafSpec check
        warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
        # torch.export ties the three inputs' axes together through the shared Dims. The ONNX exporter names the
        # graph's axes from the names given here, and given them for every input it warns that each name after the
        # first is unused (all three share one symbol): they are named once, from input_ids, and apply to all.
        program = torch.export.export(
            _Exported(model).eval(), example, dynamic_shapes={name: axes for name in INPUT_NAMES}, strict=False
        )
        names = {dim: axis.__name__ for dim, axis in axes.items()}
        torch.onnx.export(
            program,
            (),
            str(path),
            dynamo=True,
            dynamic_shapes={name: names if name == "input_ids" else None for name in INPUT_NAMES},
            input_names=list(INPUT_NAMES),
            output_names=output_names(model),
            opset_version=opset,
            external_data=model.num_parameters() * 4 > PROTOBUF_LIMIT,  # one file where protobuf allows it
            verbose=False,
        )
    return path


def _build_position_tables(model: Model, length: int) -> None:
    """Fill the rotary and sinusoidal caches up to `length`: the export stores them as constants."""
    backbone = model.base_model
    if isinstance(backbone.positions, RotaryEmbedding):
        backbone.positions.cos_sin(length, torch.device("cpu"))
    if isinstance(backbone.embeddings.positions, SinusoidalPositions):
        backbone.embeddings.positions.table(length, torch.device("cpu"))
