"""Conversion to and from HF transformers' RoFormer and BERT, in both directions: `from_hf`, `to_hf`.

The key and config correspondence both directions use is `roformer.model.hf_mapping`. HF RoFormer's sinusoidal
table (`encoder.embed_positions`) is derived, not learned: on import it is checked against the table our rotary
positions compute (a checkpoint whose table differs is refused) and dropped, and it is rebuilt on export. A BERT
baseline with sinusoidal (or no) positions exports to HF BERT with the scaled table written into
`position_embeddings`, exact up to `max_position_embeddings`. HF's `EncoderDecoderModel` (a RoFormerModel or
BertModel encoder, a RoFormerForCausalLM or BertLMHeadModel decoder with `add_cross_attention`) is our
`EncoderDecoder`: each half converts as the single models do, `enc_to_dec_proj` is `encoder_projection`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from roformer.errors import CheckpointError, ConfigError
from roformer.model.config import EncoderDecoderConfig, ModelConfig
from roformer.model.hf_files import checkpoint_directory, read_hf_checkpoint, read_hf_config, read_hf_weights
from roformer.model.hf_mapping import (
    BACKBONE_KEYS,
    HF_CLASSES,
    PREFIX,
    checkpoint_kind,
    config_from_hf,
    config_to_hf,
    fill_derived,
    head_table,
    hf_family,
    hf_kind,
    is_v2_config,
    rename,
    split_qkv,
    state_from_hf,
)
from roformer.model.model import ARCHITECTURES, EncoderDecoder, Model, convert_rotary_layout
from roformer.model.rotary import rotary_angles
from roformer.model.weights import load_weights, report_fresh

logger = logging.getLogger(__name__)

# transformers releases whose RoFormer decoder builds a bidirectional mask whatever `is_decoder` says, so an exported
# causal model attends to future tokens (huggingface/transformers#48745, fixed by #48760 in 5.18.0; 5.16.1 and 5.17.0
# leak, 5.18.0 does not, in our runs). The weights we write are right; only that HF forward is wrong.
_HF_DECODER_NOT_CAUSAL = ("5.9.0", "5.18.0")

_ENCODER_DECODER = "encoder-decoder"  # HF EncoderDecoderModel's model_type: our `encoder_decoder`


# ----------------------------------------------------------------------------------------------------------------
# HF -> ours


def from_hf(
    source: Any,
    architecture: str | None = None,
    rotary_layout: str = "interleaved",
    **overrides: Any,
) -> Model:
    """Convert an HF RoFormer or BERT model (an instance, a `save_pretrained` directory or a hub name) into ours.

    A directory (or hub name) is read from its files, not through transformers' classes, so that what HF RoFormer
    cannot hold survives: a pooler and its `pooler_activation` (JunnYu's port, RoFormer-Sim), RoFormerV2
    (`norm_type: rms_norm`, no biases: HF would load it without error and with freshly initialised norms and biases)
    and RoFormer-Sim's UniLM decoding. V2 is recognised from `norm_type` / `use_bias` or, without them, from missing
    LayerNorm or bias tensors; it is never read as V1.

    An HF `EncoderDecoderModel` (instance or directory) becomes our `EncoderDecoder` (`_encoder_decoder_from_hf`).

    Args:
        source: A transformers `RoFormer*` / `Bert*` model instance (see `HF_CLASSES`) or `EncoderDecoderModel`,
            or a path / hub name.
        architecture: The model to build (`backbone`, `masked_lm`, `sequence_classification`,
            `token_classification`, `question_answering`, `multiple_choice` or `causal_lm`); None = the checkpoint's
            own. Another one keeps the backbone (and pooler) and initialises the new head. An encoder-decoder
            converts as `encoder_decoder` only.
        rotary_layout: `interleaved` (as HF) or `half`: q/k weights are permuted so that scores are unchanged.
        **overrides: ModelConfig fields to change (e.g. `num_labels=3`: a classifier saved with another count gets
            a fresh output layer; `attention_pattern="causal"`).

    Returns:
        Our model, in eval mode, with identical outputs.

    Raises:
        CheckpointError: the source cannot be read or has features we do not support.
    """
    where = str(source) if isinstance(source, str | Path) else type(source).__name__
    if isinstance(source, str | Path):
        hf_config, state = read_hf_checkpoint(where)
    else:
        hf_config, state = source.config, source.state_dict()
    if getattr(hf_config, "model_type", None) == _ENCODER_DECODER:
        model = _encoder_decoder_from_hf(hf_config, state, architecture, overrides, where)
        return (model if rotary_layout == "interleaved" else convert_rotary_layout(model, rotary_layout)).eval()
    if isinstance(source, str | Path):
        family, arch = checkpoint_kind(hf_config, state, where)
    else:
        family, arch = hf_kind(source)
        if is_v2_config(hf_config):
            raise CheckpointError(
                "this transformers model was built from a RoFormerV2 config (norm_type/use_bias): transformers gave "
                "it LayerNorms and biases V2 does not have; convert the checkpoint directory instead"
            )
    model = _converted(hf_config, state, family, arch, where)
    model = _retargeted(model, architecture or arch, overrides, where)
    if rotary_layout != model.config.rotary_layout:
        model = convert_rotary_layout(model, rotary_layout)
    return model.eval()


def _converted(hf_config: Any, state: dict[str, torch.Tensor], family: str, arch: str, where: str) -> Model:
    """Our model of architecture `arch` holding an HF RoFormer or BERT model's config and weights."""
    config = config_from_hf(hf_config, family, arch, set(state))
    if family == "roformer":
        _check_rotary_table(state, config, where)
    model = ARCHITECTURES[arch](config)
    missing, unexpected = model.load_state_dict(state_from_hf(state, family, arch, config), strict=False)
    if missing or unexpected:
        raise CheckpointError(f"HF conversion left missing keys {missing[:5]} and unexpected keys {unexpected[:5]}")
    return model


def _check_rotary_table(state: dict[str, torch.Tensor], config: ModelConfig, where: str) -> None:
    """HF RoFormer's saved sinusoidal table is the one our rotary positions compute, or the checkpoint is refused.

    We do not read the table: our rotation computes its angles from the head size and the base. A checkpoint whose
    table is not that sinusoid (edited, or trained) would convert into another model without a word. HF's layout is
    sin of every angle, then cos (`RoFormerSinusoidalPositionalEmbedding`); compared at the default tolerances of the
    table's dtype (fp32's for an fp32 checkpoint). A checkpoint without the table is HF's own sinusoid when loaded.

    Raises:
        CheckpointError: naming the key, the largest difference and where it is.
    """
    key = next((k for k in state if k.endswith("encoder.embed_positions.weight")), None)
    if key is None:
        return
    table = state[key].detach().cpu()
    angles = rotary_angles(config.max_position_embeddings, config.head_size, config.rotary_base)  # float64
    expected = torch.cat([angles.sin(), angles.cos()], dim=1).to(table.dtype)
    if table.shape == expected.shape:
        try:
            torch.testing.assert_close(table, expected)
            return
        except AssertionError:
            pass
        gap = (table.double() - expected.double()).abs()
        position, feature = divmod(int(gap.argmax()), gap.shape[1])
        found = f"differs by up to {float(gap.max()):.3g} (position {position}, feature {feature})"
    else:
        found = f"is {tuple(table.shape)}, not {tuple(expected.shape)}"
    raise CheckpointError(
        f"{where}: {key} {found} from the sinusoidal table of rotary positions (base {config.rotary_base:g}, head "
        f"size {config.head_size}): it would convert into another model"
    )


def _encoder_decoder_from_hf(
    hf_config: Any, state: dict[str, torch.Tensor], architecture: str | None, overrides: dict[str, Any], where: str
) -> EncoderDecoder:
    """Our EncoderDecoder of an HF EncoderDecoderModel's config and weights: each half converted as its own model.

    The top-level ids (`decoder_start_token_id`, `eos_token_id`, `pad_token_id`, else the decoder's) become the
    config's; the target padding id is the decoder's `pad_token_id` (HF shifts labels and pads generated rows with
    the top-level one). The two word tables stay two (HF has no embedding-only sharing).
    """
    if architecture not in (None, "encoder_decoder"):
        raise CheckpointError(f"{where}: an HF EncoderDecoderModel converts as encoder_decoder, not {architecture}")
    if getattr(hf_config, "tie_encoder_decoder", False):
        raise CheckpointError(
            f"{where}: tie_encoder_decoder (every encoder weight shared with the decoder) is not supported"
        )
    halves = {}
    for name, arch in (("encoder", "backbone"), ("decoder", "causal_lm")):
        half_config = getattr(hf_config, name)
        family = half_config.model_type
        if family not in PREFIX:
            raise CheckpointError(f"{where}: the {name} is {family!r}, not roformer or bert")
        half_state = {k.removeprefix(f"{name}."): v for k, v in state.items() if k.startswith(f"{name}.")}
        halves[name] = _converted(half_config, half_state, family, arch, f"{where} ({name})")
    decoder = hf_config.decoder

    def token(name: str) -> int | None:
        value = getattr(hf_config, name, None)
        return getattr(decoder, name, None) if value is None else value

    pad = token("pad_token_id")
    config = EncoderDecoderConfig(
        encoder=halves["encoder"].config,
        decoder=halves["decoder"].config if pad is None else replace(halves["decoder"].config, pad_token_id=pad),
        decoder_start_token_id=token("decoder_start_token_id"),
        eos_token_id=token("eos_token_id"),
    )
    model = EncoderDecoder(config)
    ours = {f"{name}.{k}": v for name, half in halves.items() for k, v in half.state_dict().items()}
    ours |= {
        k.replace("enc_to_dec_proj.", "encoder_projection.", 1): v
        for k, v in state.items()
        if k.startswith("enc_to_dec_proj.")
    }
    _load_exactly(model, ours)
    if overrides:  # dropout and the like: the same shapes, so every converted weight fits
        new = EncoderDecoder(_with_overrides(config, overrides, where))
        _load_exactly(new, model.state_dict())
        model = new
    return model


def _with_overrides(config: EncoderDecoderConfig, overrides: dict[str, Any], where: str) -> EncoderDecoderConfig:
    try:
        return config.replaced(**overrides)
    except ConfigError as e:
        raise CheckpointError(f"{where}: {e}") from None


def _load_exactly(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load `state` into `model`: every key and shape must fit.

    Raises:
        CheckpointError: naming the first keys that do not.
    """
    own = model.state_dict()
    misfits = [
        f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}"
        for k, v in state.items()
        if k in own and v.shape != own[k].shape
    ]
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if misfits or missing or unexpected:
        raise CheckpointError(
            f"HF conversion: missing {missing[:5]}, unexpected {unexpected[:5]}, shapes {misfits[:3]}"
        )
    model.load_state_dict(state)


def _retargeted(model: Model, architecture: str, overrides: dict[str, Any], where: str) -> Model:
    """`model` as another architecture and/or config.

    Another architecture keeps the backbone (`load_weights`: the new head fresh, logged). The same architecture
    keeps every weight whose shape still fits (a classifier saved for another task gets a fresh output layer).
    """
    if architecture not in ARCHITECTURES:
        raise CheckpointError(f"unknown architecture {architecture!r} (known: {', '.join(ARCHITECTURES)})")
    _refuse_half_as_pair(architecture, where)
    if architecture == model.architecture and not overrides:
        return model
    unknown = [k for k in overrides if k not in model.config.to_dict()]
    if unknown:
        raise CheckpointError(f"unknown ModelConfig field {unknown[0]!r}")
    new = ARCHITECTURES[architecture](replace(model.config, **overrides))
    if architecture != model.architecture:
        load_weights(new, model.state_dict(), model.architecture, Path(where))
        return new
    _check_only_the_output_layer_changes(model, new, overrides, where)
    fits = new.state_dict()
    kept = {k: v for k, v in model.state_dict().items() if fits[k].shape == v.shape}
    new.load_state_dict(kept, strict=False)
    report_fresh(where, architecture, [k for k in fits if k not in kept])  # as `load` says it of our classifiers
    return new


def _refuse_half_as_pair(architecture: str, where: str) -> None:
    """An encoder-decoder comes from HF's EncoderDecoderModel only, not from one RoFormer or BERT model.

    Raises:
        CheckpointError: `architecture` is encoder_decoder.
    """
    if architecture == "encoder_decoder":
        raise CheckpointError(
            f"{where}: one RoFormer or BERT model does not make an encoder_decoder (convert an HF EncoderDecoderModel)"
        )


def _check_only_the_output_layer_changes(model: Model, new: Model, overrides: dict[str, Any], where: str) -> None:
    """Refuse overrides that would leave converted weights behind (or random ones in their place).

    Only a new `num_labels` may replace weights: those of the task head's output layer, whose shape it sets.

    Raises:
        CheckpointError: naming the weights that would be lost and the overrides that lose them.
    """
    old, fits = model.state_dict(), new.state_dict()
    relabelled = overrides.get("num_labels", model.config.num_labels) != model.config.num_labels
    lost = sorted(set(old) ^ set(fits))
    lost += [
        f"{k} {tuple(v.shape)} -> {tuple(fits[k].shape)}"
        for k, v in old.items()
        if k in fits and fits[k].shape != v.shape and not (relabelled and not k.startswith("backbone."))
    ]
    if lost:
        raise CheckpointError(
            f"{where}: the overrides ({', '.join(sorted(overrides))}) change weights the checkpoint holds "
            f"({'; '.join(lost[:3])}); overrides must keep its shapes (num_labels may replace a task head's output)"
        )


def hf_model_config(path: str, architecture: str | None = None) -> ModelConfig:
    """Our ModelConfig of an HF checkpoint loaded as `architecture`, as `from_hf` gives it.

    Read from config.json and the tensor names: a safetensors checkpoint's weights are not read. An HF
    EncoderDecoderModel's is its `EncoderDecoderConfig` (built with fresh weights here, not loaded).
    """
    directory = checkpoint_directory(path)
    hf_config, keys = read_hf_config(str(directory)), read_hf_weights(directory, names_only=True)
    if getattr(hf_config, "model_type", None) == _ENCODER_DECODER:
        if architecture not in (None, "encoder_decoder"):
            raise CheckpointError(f"{path}: an HF EncoderDecoderModel converts as encoder_decoder, not {architecture}")
        return _encoder_decoder_config_from_hf(hf_config, set(keys), path)
    family, arch = checkpoint_kind(hf_config, keys, path)
    target = architecture or arch
    if target not in ARCHITECTURES:
        raise CheckpointError(f"unknown architecture {target!r} (known: {', '.join(ARCHITECTURES)})")
    _refuse_half_as_pair(target, path)
    return ARCHITECTURES[target].adapt_config(config_from_hf(hf_config, family, arch, set(keys)))


def _encoder_decoder_config_from_hf(hf_config: Any, keys: set[str], where: str) -> EncoderDecoderConfig:
    """The config `from_hf` gives an HF EncoderDecoderModel with tensors `keys`, without converting any weight."""
    halves = {}
    for name, arch in (("encoder", "backbone"), ("decoder", "causal_lm")):
        half = getattr(hf_config, name)
        if half.model_type not in PREFIX:
            raise CheckpointError(f"{where}: the {name} is {half.model_type!r}, not roformer or bert")
        own = {k.removeprefix(f"{name}.") for k in keys if k.startswith(f"{name}.")}
        halves[name] = config_from_hf(half, half.model_type, arch, own)
    pad = hf_config.pad_token_id if hf_config.pad_token_id is not None else hf_config.decoder.pad_token_id
    eos = hf_config.eos_token_id if hf_config.eos_token_id is not None else hf_config.decoder.eos_token_id
    return EncoderDecoderConfig(
        encoder=halves["encoder"],
        decoder=halves["decoder"] if pad is None else replace(halves["decoder"], pad_token_id=pad),
        decoder_start_token_id=hf_config.decoder_start_token_id,
        eos_token_id=eos,
    )


# ----------------------------------------------------------------------------------------------------------------
# ours -> HF


def to_hf(model: Model) -> Any:
    """Convert our model into the matching HF transformers model (RoFormer for rotary, BERT otherwise).

    Sinusoidal and `none` positions become a fixed BERT position table (exact up to max_position_embeddings).

    Returns:
        A transformers model in eval mode whose outputs equal ours (a causal RoFormer: on transformers >= 5.18;
        5.9-5.17 run it without its causal mask, and this logs a warning there).

    Raises:
        CheckpointError: features HF cannot express (e.g. a pooler head on RoFormer). A BERT masked or causal LM's
            pooler, which HF's classes for them lack, is left out with a warning (as HF drops it on loading).
    """
    import transformers

    if isinstance(model, EncoderDecoder):
        return _encoder_decoder_to_hf(model)
    family = hf_family(model.config)
    if model.config.rotary_layout != "interleaved":
        model = convert_rotary_layout(model, "interleaved")
    config = model.config
    arch = model.architecture
    hf_config = config_to_hf(config, family, arch)
    hf_model = getattr(transformers, HF_CLASSES[family, arch])(hf_config)
    if family == "bert" and arch == "backbone" and model.pooler is None:
        hf_model = transformers.BertModel(hf_config, add_pooling_layer=False)
    hf_state = hf_model.state_dict()
    prefix = PREFIX[family] if arch != "backbone" else ""
    has_pooler = any(k.endswith("pooler.dense.weight") for k in hf_state)  # HF MLM classes have none
    new_state, dropped = {}, []
    for key, value in split_qkv(model.state_dict()).items():
        if key.endswith("embeddings.sinusoidal.scale"):
            continue  # folded into the exported position table
        if key.startswith("backbone.") or arch == "backbone":
            name = rename(key.removeprefix("backbone."), BACKBONE_KEYS, True)
            if name is not None and name.startswith("pooler.") and not has_pooler:
                dropped.append(key)
                continue
            name = name and f"{prefix}{name}"
        else:
            name = rename(key, head_table(arch, config), True)
        if name is None:
            raise CheckpointError(f"no HF equivalent for {key!r}")
        new_state[name] = value.detach().clone()
    fill_derived(new_state, hf_state, model, family, prefix)
    missing, unexpected = hf_model.load_state_dict(new_state, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"HF export left missing keys {missing[:5]} and unexpected keys {unexpected[:5]}")
    if dropped:  # as HF itself does when it loads a checkpoint with a pooler into this class
        logger.warning("HF %s has no pooler: %s not exported", type(hf_model).__name__, ", ".join(dropped))
    if family == "roformer" and hf_config.is_decoder:
        _warn_if_hf_decoder_is_not_causal(transformers.__version__)
    return hf_model.eval()


def _encoder_decoder_to_hf(model: EncoderDecoder) -> Any:
    """HF's EncoderDecoderModel of our EncoderDecoder: each half exported as its own model, then put together.

    A shared word table is written twice (HF has no embedding-only sharing; the outputs are the same).
    """
    import transformers

    encoder, decoder = to_hf(model.encoder), to_hf(model.decoder)
    config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(encoder.config, decoder.config)
    config.decoder_start_token_id = model.config.decoder_start_token_id
    config.eos_token_id = model.config.eos_token_id
    config.pad_token_id = model.config.decoder.pad_token_id
    state = {
        f"{name}.{k}": v
        for name, half in (("encoder", encoder), ("decoder", decoder))
        for k, v in half.state_dict().items()
    }
    if model.encoder_projection is not None:
        state |= {f"enc_to_dec_proj.{k}": v.detach().clone() for k, v in model.encoder_projection.state_dict().items()}
    hf_model = transformers.EncoderDecoderModel(config=config)
    # HF builds its BERT encoder with a pooler: without one of ours it keeps HF's (unused by the decoder)
    missing, unexpected = hf_model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("encoder.pooler.")]
    if missing or unexpected:
        raise CheckpointError(f"HF export left missing keys {missing[:5]} and unexpected keys {unexpected[:5]}")
    for name in ("decoder_start_token_id", "eos_token_id", "pad_token_id"):
        setattr(hf_model.generation_config, name, getattr(config, name))
    return hf_model.eval()


def _warn_if_hf_decoder_is_not_causal(version: str) -> None:
    """Warn that this transformers release runs an exported RoFormer decoder without its causal mask."""
    release = tuple(int(n) for n in re.findall(r"\d+", version)[:3])
    first, fixed = (tuple(int(n) for n in v.split(".")) for v in _HF_DECODER_NOT_CAUSAL)
    if first <= release < fixed:
        logger.warning(
            "transformers %s runs RoFormerForCausalLM without a causal mask (huggingface/transformers#48745): the "
            "exported weights are right, but its outputs differ from ours until transformers >= %s",
            version,
            _HF_DECODER_NOT_CAUSAL[1],
        )
