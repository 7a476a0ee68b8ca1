"""RoFormer and its BERT baseline by architecture name: the model classes, `load`, and the rotary layouts.

One post-LN encoder whose position encoding the config chooses (any one declared by its module: the table in
docs/baselines.md, built by `roformer.model.positions`), with the heads of HF RoFormer/BERT on top, one class per
architecture: `backbone` (Backbone, no head), `masked_lm` (MaskedLM), `sequence_classification`
(SequenceClassifier), `token_classification` (TokenClassifier), `question_answering` (QuestionAnswering),
`multiple_choice` (MultipleChoice) and `causal_lm` (CausalLM, a decoder); and `encoder_decoder` (EncoderDecoder:
translation, an encoder and a decoder with cross-attention). The rooms below hold them: the backbone and
the base class in `roformer.model.backbone`, the heads in `roformer.model.heads`, the encoder-decoder in
`roformer.model.seq2seq` (its decoding in `roformer.model.beam`), the forward plan in
`roformer.model.plan`, attention in `roformer.model.attention`; every name a user imports from here is here still
(`__all__`). A saved model directory is read through `roformer.model.weights`. Plain PyTorch: no training, logging or
distributed code lives here.

References:
    Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding", arXiv 2104.09864 ("paper").
    Devlin et al. 2019, BERT.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from roformer.errors import CheckpointError
from roformer.model.attention import ForwardInputs
from roformer.model.backbone import Backbone, Model, ModelOutput, pool_states
from roformer.model.config import ARCHITECTURE_NAMES, EncoderDecoderConfig
from roformer.model.heads import (
    IGNORE_INDEX,
    CausalLM,
    LanguageModel,
    MaskedLM,
    MultipleChoice,
    QuestionAnswering,
    SequenceClassifier,
    TokenClassifier,
    token_cross_entropy,
)
from roformer.model.seq2seq import EncoderDecoder, Seq2SeqOutput
from roformer.model.weights import load_weights, read_model_config, read_model_dir

__all__ = [
    "ARCHITECTURES",
    "IGNORE_INDEX",
    "Backbone",
    "CausalLM",
    "EncoderDecoder",
    "ForwardInputs",
    "LanguageModel",
    "MaskedLM",
    "Model",
    "ModelOutput",
    "MultipleChoice",
    "QuestionAnswering",
    "Seq2SeqOutput",
    "SequenceClassifier",
    "TokenClassifier",
    "convert_rotary_layout",
    "load",
    "pool_states",
    "rotary_permutation",
    "token_cross_entropy",
]


ARCHITECTURES: dict[str, type[Model]] = {
    cls.architecture: cls
    for cls in (
        Backbone,
        MaskedLM,
        SequenceClassifier,
        TokenClassifier,
        QuestionAnswering,
        MultipleChoice,
        CausalLM,
        EncoderDecoder,
    )
}
assert tuple(ARCHITECTURES) == ARCHITECTURE_NAMES


def load(
    directory: str | Path,
    architecture: str | None = None,
    device: str | torch.device = "cpu",
    **config_overrides: Any,
) -> Model:
    """Load a model saved with `model.save(directory)`.

    Args:
        directory: The model directory (e.g. a pretraining run's `final/`).
        architecture: `backbone`, `masked_lm`, `sequence_classification`, `token_classification`,
            `question_answering`, `multiple_choice`, `causal_lm` or `encoder_decoder`; None = the saved one. A
            different one keeps the backbone weights and initialises the new head (logged); an encoder-decoder loads
            as itself only.
        device: Where to put the weights.
        **config_overrides: ModelConfig fields to change, e.g. `num_labels=3`, `hidden_dropout=0.0`. A classifier
            saved with another `num_labels` gets a fresh output layer (logged; the rest of its head is kept). Other
            fields that change parameter shapes fail with a shape error. `rotary_layout` permutes the saved q/k
            rows (`convert_rotary_layout`), so the outputs stay the same.

    Returns:
        The model, in eval mode.

    Raises:
        CheckpointError: missing or corrupt files, unknown architecture or a shape mismatch.
    """
    overrides = dict(config_overrides)
    layout = overrides.pop("rotary_layout", None)  # the weights are in the saved layout: loaded so, then permuted
    saved, architecture, config, state = read_model_dir(directory, architecture, overrides)
    if "encoder_decoder" in (saved, architecture) and saved != architecture:
        raise CheckpointError(f"{directory}: a {saved} model cannot be loaded as {architecture}")
    if isinstance(config, EncoderDecoderConfig):
        model = EncoderDecoder(config)
        load_weights(model, state, saved, Path(directory))
        model = model if layout is None else convert_rotary_layout(model, layout)
        return model.to(device).eval()
    rotary = config.encoding.rotates
    if layout is not None and not rotary:
        config = replace(config, rotary_layout=layout)  # no weight depends on it
    model = ARCHITECTURES[architecture](config)
    relabelled = "num_labels" in overrides and overrides["num_labels"] != read_model_config(directory)[1].num_labels
    load_weights(model, state, saved, Path(directory), relabelled)
    if layout is not None and rotary:
        model = convert_rotary_layout(model, layout)
    return model.to(device).eval()


# ----------------------------------------------------------------------------------------------------------------
# Rotary layouts


def rotary_permutation(head_size: int) -> torch.Tensor:
    """Index map from the interleaved to the half layout within one head: half[j] = interleaved[perm[j]].

    Interleaved pairs are (2i, 2i+1), half pairs (i, i + d/2): row 2i goes to i and row 2i+1 to i + d/2, so that
    R_half(P x) = P R_int(x) and attention scores are unchanged.
    """
    return torch.cat((torch.arange(0, head_size, 2), torch.arange(1, head_size, 2)))


def convert_rotary_layout(model: Model, layout: str) -> Model:
    """Return a copy of a rotary `model` using `layout`, with q/k (and v) weight rows permuted per head.

    Only the rotated features of a head (`rotary_dim`) are permuted; the others keep their place.

    With `rotary_value` the values are rotated too, so the output projection's input columns are permuted back. An
    encoder-decoder's rotary halves are permuted, the others only relabelled.
    """
    if isinstance(model, EncoderDecoder):
        return _encoder_decoder_layout(model, layout)
    config = model.config
    if not config.encoding.rotates:
        raise ValueError(
            f"rotary layouts only apply to an encoding that rotates q and k, not {config.position_encoding}"
        )
    if layout == config.rotary_layout:
        return model
    H, D, C = config.num_heads, config.head_size, config.hidden_size
    r = config.rotary_size  # partial rotary: only the first r features of a head are rotated and change layout
    perm = torch.cat((rotary_permutation(r), torch.arange(r, D)))
    if layout == "interleaved":
        perm = torch.argsort(perm)
    per_head = (torch.arange(H)[:, None] * D + perm[None, :]).reshape(-1)  # (C,)
    n_rotated = 3 if config.rotary_value else 2
    rows = torch.cat(
        [per_head + i * C for i in range(n_rotated)] + [torch.arange(C) + i * C for i in range(n_rotated, 3)]
    )
    state = {}
    for key, value in model.state_dict().items():
        if key.endswith("attn.qkv.weight") or key.endswith("attn.qkv.bias"):
            value = value[rows]
        elif config.rotary_value and key.endswith("attn.proj.weight"):
            value = value[:, per_head]
        state[key] = value.clone()
    new = type(model)(replace(config, rotary_layout=layout))
    new.load_state_dict(state)
    return new.train(model.training)


def _encoder_decoder_layout(model: EncoderDecoder, layout: str) -> EncoderDecoder:
    """`convert_rotary_layout` of an encoder-decoder: each rotary half permuted, the whole rebuilt (shared tables kept).

    Raises:
        ValueError: neither half has rotary positions.
    """
    halves = {"encoder": model.encoder, "decoder": model.decoder}
    if not any(h.config.encoding.rotates for h in halves.values()):
        raise ValueError("rotary layouts only apply to an encoding that rotates q and k (in the encoder or decoder)")
    if all(h.config.rotary_layout == layout for h in halves.values()):
        return model
    state, configs = {}, {}
    for name, half in halves.items():
        if half.config.encoding.rotates:
            half = convert_rotary_layout(half, layout)
        configs[name] = replace(half.config, rotary_layout=layout)
        state |= {f"{name}.{k}": v for k, v in half.state_dict().items()}
    state |= {k: v for k, v in model.state_dict().items() if k.startswith("encoder_projection.")}
    new = EncoderDecoder(replace(model.config, **configs))
    new.load_state_dict(state)
    return new.train(model.training)
