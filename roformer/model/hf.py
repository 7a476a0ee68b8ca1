"""Conversion to and from HF transformers' RoFormer and BERT, in both directions.

One table of key patterns (`_BACKBONE_KEYS`, `_HEAD_KEYS`) serves both directions. HF's separate query/key/value
projections become our fused `qkv` (and a decoder's cross-attention key/value our fused `kv`); HF RoFormer's
sinusoidal table (`encoder.embed_positions`) is derived, not learned: on import it is checked against the table our
rotary positions compute (a checkpoint whose table differs is refused) and dropped, and it is rebuilt on export. A
BERT baseline with sinusoidal (or no) positions exports to HF BERT with the scaled table written into
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
from roformer.model.config import ACTIVATION_NAMES, EncoderDecoderConfig, ModelConfig, encodings
from roformer.model.hf_files import checkpoint_directory, read_hf_checkpoint, read_hf_config, read_hf_weights
from roformer.model.model import ARCHITECTURES, EncoderDecoder, Model, convert_rotary_layout
from roformer.model.rotary import rotary_angles
from roformer.model.weights import load_weights, report_fresh

logger = logging.getLogger(__name__)

# transformers releases whose RoFormer decoder builds a bidirectional mask whatever `is_decoder` says, so an exported
# causal model attends to future tokens (huggingface/transformers#48745, fixed by #48760 in 5.18.0; 5.16.1 and 5.17.0
# leak, 5.18.0 does not, in our runs). The weights we write are right; only that HF forward is wrong.
_HF_DECODER_NOT_CAUSAL = ("5.9.0", "5.18.0")

# (HF pattern, our pattern) for backbone keys; {i} is a layer index, {p} a parameter name (weight/bias).
_BACKBONE_KEYS = [
    ("embeddings.word_embeddings.weight", "embeddings.word.weight"),
    ("embeddings.token_type_embeddings.weight", "embeddings.token_type.weight"),
    ("embeddings.position_embeddings.weight", "embeddings.position.weight"),
    ("embeddings.LayerNorm.{p}", "embeddings.norm.{p}"),
    ("embeddings_project.{p}", "embeddings.project.{p}"),
    ("encoder.layer.{i}.attention.self.query.{p}", "layers.{i}.attn.q.{p}"),
    ("encoder.layer.{i}.attention.self.key.{p}", "layers.{i}.attn.k.{p}"),
    ("encoder.layer.{i}.attention.self.value.{p}", "layers.{i}.attn.v.{p}"),
    ("encoder.layer.{i}.attention.output.dense.{p}", "layers.{i}.attn.proj.{p}"),
    ("encoder.layer.{i}.attention.output.LayerNorm.{p}", "layers.{i}.attn_norm.{p}"),
    ("encoder.layer.{i}.intermediate.dense.{p}", "layers.{i}.ffn_in.{p}"),
    ("encoder.layer.{i}.output.dense.{p}", "layers.{i}.ffn_out.{p}"),
    ("encoder.layer.{i}.output.LayerNorm.{p}", "layers.{i}.ffn_norm.{p}"),
    # a decoder's cross-attention (`add_cross_attention`): key and value become our fused `kv`
    ("encoder.layer.{i}.crossattention.self.query.{p}", "layers.{i}.cross.q.{p}"),
    ("encoder.layer.{i}.crossattention.self.key.{p}", "layers.{i}.cross.k.{p}"),
    ("encoder.layer.{i}.crossattention.self.value.{p}", "layers.{i}.cross.v.{p}"),
    ("encoder.layer.{i}.crossattention.output.dense.{p}", "layers.{i}.cross.proj.{p}"),
    ("encoder.layer.{i}.crossattention.output.LayerNorm.{p}", "layers.{i}.cross_norm.{p}"),
    ("pooler.dense.{p}", "pooler.{p}"),
]
# Head keys per (family, architecture), relative to the model root.
_HEAD_KEYS = {
    "masked_lm": [
        ("cls.predictions.transform.dense.{p}", "transform.{p}"),
        ("cls.predictions.transform.LayerNorm.{p}", "transform_norm.{p}"),
        ("cls.predictions.bias", "decoder_bias"),
        ("cls.predictions.decoder.weight", "decoder.weight"),
    ],
    "sequence_classification/mlp": [
        ("classifier.dense.{p}", "dense.{p}"),
        ("classifier.out_proj.{p}", "out.{p}"),
    ],
    "sequence_classification/pooler": [("classifier.{p}", "out.{p}")],
    "token_classification": [("classifier.{p}", "out.{p}")],
    "question_answering": [("qa_outputs.{p}", "out.{p}")],
    "multiple_choice": [("classifier.{p}", "out.{p}")],  # RoFormer's sequence summary has no weights by default
}
_HEAD_KEYS["causal_lm"] = _HEAD_KEYS["masked_lm"]  # the same vocabulary head, predicting the next token
# HF keys that are derived from other weights and carry no information of their own.
_DERIVED_HF_KEYS = re.compile(
    r"(encoder\.embed_positions\.weight|cls\.predictions\.decoder\.bias|embeddings\.position_ids"
    r"|embeddings\.token_type_ids|cls\.seq_relationship\.\w+)$"
)

_HF_CLASSES = {
    ("roformer", "backbone"): "RoFormerModel",
    ("roformer", "masked_lm"): "RoFormerForMaskedLM",
    ("roformer", "sequence_classification"): "RoFormerForSequenceClassification",
    ("bert", "backbone"): "BertModel",
    ("bert", "masked_lm"): "BertForMaskedLM",
    ("bert", "sequence_classification"): "BertForSequenceClassification",
    ("roformer", "token_classification"): "RoFormerForTokenClassification",
    ("roformer", "question_answering"): "RoFormerForQuestionAnswering",
    ("roformer", "multiple_choice"): "RoFormerForMultipleChoice",
    ("bert", "token_classification"): "BertForTokenClassification",
    ("bert", "question_answering"): "BertForQuestionAnswering",
    ("bert", "multiple_choice"): "BertForMultipleChoice",
    ("roformer", "causal_lm"): "RoFormerForCausalLM",
    ("bert", "causal_lm"): "BertLMHeadModel",
}
_EXTRA_HF_IMPORTS = {"BertForPreTraining": ("bert", "masked_lm")}  # NSP head dropped, pooler kept
_ENCODER_DECODER = "encoder-decoder"  # HF EncoderDecoderModel's model_type: our `encoder_decoder`
_PREFIX = {"roformer": "roformer.", "bert": "bert."}


def _compile(pattern: str) -> re.Pattern[str]:
    regex = re.escape(pattern).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{p\}", r"(?P<p>\w+)")
    return re.compile(regex + "$")


def _rename(key: str, table: list[tuple[str, str]], reverse: bool) -> str | None:
    for hf, ours in table:
        source, target = (ours, hf) if reverse else (hf, ours)
        match = _compile(source).match(key)
        if match:
            return target.format(**match.groupdict())
    return None


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
        source: A transformers `RoFormer*` / `Bert*` model instance (see `_HF_CLASSES`) or `EncoderDecoderModel`,
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
        family, arch = _checkpoint_kind(hf_config, state, where)
    else:
        family, arch = _hf_kind(source)
        if _is_v2_config(hf_config):
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
    config = _config_from_hf(hf_config, family, arch, set(state))
    if family == "roformer":
        _check_rotary_table(state, config, where)
    model = ARCHITECTURES[arch](config)
    missing, unexpected = model.load_state_dict(_state_from_hf(state, family, arch, config), strict=False)
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
        if family not in _PREFIX:
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
    family, arch = _checkpoint_kind(hf_config, keys, path)
    target = architecture or arch
    if target not in ARCHITECTURES:
        raise CheckpointError(f"unknown architecture {target!r} (known: {', '.join(ARCHITECTURES)})")
    _refuse_half_as_pair(target, path)
    return ARCHITECTURES[target].adapt_config(_config_from_hf(hf_config, family, arch, set(keys)))


def _encoder_decoder_config_from_hf(hf_config: Any, keys: set[str], where: str) -> EncoderDecoderConfig:
    """The config `from_hf` gives an HF EncoderDecoderModel with tensors `keys`, without converting any weight."""
    halves = {}
    for name, arch in (("encoder", "backbone"), ("decoder", "causal_lm")):
        half = getattr(hf_config, name)
        if half.model_type not in _PREFIX:
            raise CheckpointError(f"{where}: the {name} is {half.model_type!r}, not roformer or bert")
        own = {k.removeprefix(f"{name}.") for k in keys if k.startswith(f"{name}.")}
        halves[name] = _config_from_hf(half, half.model_type, arch, own)
    pad = hf_config.pad_token_id if hf_config.pad_token_id is not None else hf_config.decoder.pad_token_id
    eos = hf_config.eos_token_id if hf_config.eos_token_id is not None else hf_config.decoder.eos_token_id
    return EncoderDecoderConfig(
        encoder=halves["encoder"],
        decoder=halves["decoder"] if pad is None else replace(halves["decoder"], pad_token_id=pad),
        decoder_start_token_id=hf_config.decoder_start_token_id,
        eos_token_id=eos,
    )


def _checkpoint_kind(hf_config: Any, state: dict[str, Any], path: str) -> tuple[str, str]:
    """(family, architecture) a checkpoint was saved as: its `architectures` entry, else read from its keys."""
    family = hf_config.model_type
    if family not in _PREFIX:
        raise CheckpointError(f"{path}: model_type {family!r} is not roformer or bert")
    known = [_hf_class_kind(n) for n in hf_config.architectures or [] if _hf_class_kind(n)]
    if known:
        return known[0]
    heads = {"cls.predictions.decoder.weight": "masked_lm", "qa_outputs.weight": "question_answering"}
    arch = next((a for k, a in heads.items() if k in state), "backbone")
    if arch == "masked_lm" and getattr(hf_config, "is_decoder", False):
        arch = "causal_lm"
    return family, arch


def _hf_class_kind(name: str) -> tuple[str, str] | None:
    for kind, cls_name in _HF_CLASSES.items():
        if cls_name == name:
            return kind
    return _EXTRA_HF_IMPORTS.get(name)


def _hf_kind(model: Any) -> tuple[str, str]:
    kind = _hf_class_kind(type(model).__name__)
    if kind is None:
        supported = ", ".join(list(_HF_CLASSES.values()) + list(_EXTRA_HF_IMPORTS))
        raise CheckpointError(f"cannot convert {type(model).__name__}; supported: {supported}")
    return kind


def _is_v2_config(c: Any) -> bool:
    """A RoFormerV2 config of JunnYu's port: norm_type other than layer_norm, or use_bias false."""
    return getattr(c, "norm_type", "layer_norm") != "layer_norm" or not getattr(c, "use_bias", True)


def _v2_fields(c: Any, family: str, arch: str, keys: set[str]) -> dict[str, Any]:
    """norm_type / use_bias / mlm_head of a checkpoint, from JunnYu's config fields and checked against its tensors.

    Without those fields (a V2 checkpoint with a plain RoFormer config) the tensors decide: no LayerNorm weights
    means the parameter-free norm, no attention biases means no biases; V2's MLM head is then the bare decoder.
    """
    has_norms = any(k.endswith("LayerNorm.weight") for k in keys)
    has_biases = any(k.endswith("attention.self.query.bias") for k in keys)
    norm_type = getattr(c, "norm_type", None) or ("layer_norm" if has_norms else "rms_norm")
    use_bias = getattr(c, "use_bias", None)
    use_bias = has_biases if use_bias is None else bool(use_bias)
    if norm_type not in ("layer_norm", "rms_norm"):
        raise CheckpointError(f"unsupported norm_type {norm_type!r} (layer_norm or rms_norm)")
    if (norm_type == "layer_norm") != has_norms or use_bias != has_biases:
        found = f"{'with' if has_norms else 'without'} LayerNorm weights, {'with' if has_biases else 'without'} biases"
        raise CheckpointError(f"the config says norm_type {norm_type}, use_bias {use_bias}, the weights are {found}")
    if family == "bert" and (norm_type != "layer_norm" or not use_bias):
        raise CheckpointError("BERT checkpoints with rms_norm or without biases are not supported")
    return {"norm_type": norm_type, "use_bias": use_bias, "mlm_head": "transform" if has_norms else "bare"}


def _config_from_hf(c: Any, family: str, arch: str, keys: set[str]) -> ModelConfig:
    """Our ModelConfig for an HF/JunnYu config and the names of its tensors (which say whether there is a pooler)."""
    cross_attention = bool(getattr(c, "add_cross_attention", False))
    if cross_attention and not getattr(c, "is_decoder", False):
        raise CheckpointError("add_cross_attention without is_decoder: HF builds such a model only as a decoder")
    if arch == "question_answering" and c.num_labels != 2:
        raise CheckpointError(f"a question-answering head has a start and an end output, this one {c.num_labels}")
    if not isinstance(c.hidden_act, str) or c.hidden_act not in ACTIVATION_NAMES:
        raise CheckpointError(f"unsupported hidden_act {c.hidden_act!r}")
    position_type = getattr(c, "position_embedding_type", "absolute")
    if family == "bert" and position_type not in (None, "absolute"):
        raise CheckpointError(f"BERT position_embedding_type {position_type!r} is not supported (only absolute)")
    embedding_size = getattr(c, "embedding_size", None) or c.hidden_size
    problem_type = getattr(c, "problem_type", None)
    if problem_type not in (None, "regression", "single_label_classification", "multi_label_classification"):
        raise CheckpointError(f"unsupported problem_type {problem_type!r}")
    pooler_activation = getattr(c, "pooler_activation", "tanh")
    if pooler_activation not in ("tanh", "linear"):
        raise CheckpointError(f"unsupported pooler_activation {pooler_activation!r} (tanh or linear)")
    has_pooler = any(k.endswith("pooler.dense.weight") for k in keys)
    decoder = getattr(c, "is_decoder", False) or arch == "causal_lm"
    # RoFormer-Sim (JunnYu's causal LM, with a pooler) reads its prompt bidirectionally and generates as segment B:
    # the UniLM mask. HF's RoFormerForCausalLM has no pooler and is plainly causal.
    unilm = decoder and family == "roformer" and has_pooler
    return ModelConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_layers=c.num_hidden_layers,
        num_heads=c.num_attention_heads,
        intermediate_size=c.intermediate_size,
        embedding_size=None if embedding_size == c.hidden_size else embedding_size,
        hidden_act=c.hidden_act,
        hidden_dropout=c.hidden_dropout_prob,
        attention_dropout=c.attention_probs_dropout_prob,
        layer_norm_eps=c.layer_norm_eps,
        type_vocab_size=c.type_vocab_size,
        pad_token_id=c.pad_token_id if c.pad_token_id is not None else 0,
        initializer_range=c.initializer_range,
        position_encoding="rotary" if family == "roformer" else "learned",
        max_position_embeddings=c.max_position_embeddings,
        rotary_value=bool(getattr(c, "rotary_value", False)),
        tie_word_embeddings=bool(getattr(c, "tie_word_embeddings", True)),
        num_labels=c.num_labels,
        classifier_head="mlp" if family == "roformer" else "pooler",
        classifier_dropout=getattr(c, "classifier_dropout", None),
        add_pooler=has_pooler,
        pooler_activation=pooler_activation,
        attention_pattern="unilm" if unilm else "causal" if decoder else "bidirectional",
        **_v2_fields(c, family, arch, keys),
        cross_attention=cross_attention,
    )


def _head_table(arch: str, config: ModelConfig) -> list[tuple[str, str]]:
    if arch == "sequence_classification":
        return _HEAD_KEYS[f"{arch}/{config.classifier_head}"]
    return _HEAD_KEYS.get(arch, [])


def _state_from_hf(hf_state: dict[str, torch.Tensor], family: str, arch: str, config: ModelConfig) -> dict:
    prefix = _PREFIX[family] if arch != "backbone" else ""
    ours: dict[str, torch.Tensor] = {}
    for key, value in hf_state.items():
        if _DERIVED_HF_KEYS.search(key) or (config.tie_word_embeddings and key == "cls.predictions.decoder.weight"):
            continue
        if key.startswith(prefix) and (name := _rename(key.removeprefix(prefix), _BACKBONE_KEYS, False)):
            name = name if arch == "backbone" else f"backbone.{name}"
        elif (name := _rename(key, _head_table(arch, config), False)) is None:
            raise CheckpointError(f"unexpected HF key {key!r} for {family} {arch}")
        ours[name] = value.detach().clone()
    return _fuse_qkv(ours)


def _fuse_qkv(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF's query, key, value -> our fused `attn.qkv`; a cross-attention's key, value -> our fused `cross.kv`."""
    fused = {}
    for key, value in state.items():
        match = re.match(r"(.*\.(?:attn|cross)\.)([qkv])\.(\w+)$", key)
        if match is None:
            fused[key] = value
            continue
        root, name, param = match.groups()
        names = "qkv" if root.endswith(".attn.") else "kv"
        if name == names[0]:
            fused[f"{root}{names}.{param}"] = torch.cat([state[f"{root}{n}.{param}"] for n in names], dim=0)
        elif name == "q":  # cross-attention's own query
            fused[key] = value
    return fused


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
    family = _hf_family(model.config)
    if model.config.rotary_layout != "interleaved":
        model = convert_rotary_layout(model, "interleaved")
    config = model.config
    arch = model.architecture
    hf_config = _config_to_hf(config, family, arch)
    hf_model = getattr(transformers, _HF_CLASSES[family, arch])(hf_config)
    if family == "bert" and arch == "backbone" and model.pooler is None:
        hf_model = transformers.BertModel(hf_config, add_pooling_layer=False)
    hf_state = hf_model.state_dict()
    prefix = _PREFIX[family] if arch != "backbone" else ""
    has_pooler = any(k.endswith("pooler.dense.weight") for k in hf_state)  # HF MLM classes have none
    new_state, dropped = {}, []
    for key, value in _split_qkv(model.state_dict()).items():
        if key.endswith("embeddings.sinusoidal.scale"):
            continue  # folded into the exported position table
        if key.startswith("backbone.") or arch == "backbone":
            name = _rename(key.removeprefix("backbone."), _BACKBONE_KEYS, True)
            if name is not None and name.startswith("pooler.") and not has_pooler:
                dropped.append(key)
                continue
            name = name and f"{prefix}{name}"
        else:
            name = _rename(key, _head_table(arch, config), True)
        if name is None:
            raise CheckpointError(f"no HF equivalent for {key!r}")
        new_state[name] = value.detach().clone()
    _fill_derived(new_state, hf_state, model, family, prefix)
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


def _hf_family(config: ModelConfig) -> str:
    """The HF family a model of `config` exports to, as its position encoding declares (`EncodingSpec.hf`).

    Raises:
        CheckpointError: an encoding HF has no model for, in one line naming those that export.
    """
    family = config.encoding.hf
    if family is None:
        exported = [name for name, spec in encodings().items() if spec.hf is not None]
        raise CheckpointError(
            f"HF RoFormer and BERT have no {config.position_encoding} positions: only {', '.join(exported)} export"
        )
    return family


def _config_to_hf(config: ModelConfig, family: str, arch: str) -> Any:
    import transformers

    common = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        intermediate_size=config.intermediate_size,
        hidden_act=config.hidden_act,
        hidden_dropout_prob=config.hidden_dropout,
        attention_probs_dropout_prob=config.attention_dropout,
        max_position_embeddings=config.max_position_embeddings,
        type_vocab_size=config.type_vocab_size,
        initializer_range=config.initializer_range,
        layer_norm_eps=config.layer_norm_eps,
        pad_token_id=config.pad_token_id,
        tie_word_embeddings=config.tie_word_embeddings,
        num_labels=2 if arch == "question_answering" else config.num_labels,  # start and end
    )
    unsupported = {
        "attention": "HF has no linear attention: attention must be softmax to export",
        "rotary_dim": "HF RoFormer rotates whole heads: rotary_dim must be null to export",
        "rope_scaling": "HF RoFormer has no rope_scaling: export the unscaled model (rope_scaling: null)",
    }
    for name, reason in unsupported.items():
        if getattr(config, name) not in (None, "softmax"):
            raise CheckpointError(reason)
    _check_v1(config, family)
    if config.cross_attention and config.attention_pattern != "causal":
        raise CheckpointError("HF has cross-attention in causal decoders only (is_decoder): attention_pattern causal")
    common["is_decoder"] = config.attention_pattern == "causal"
    common["add_cross_attention"] = config.cross_attention
    summarises = arch in ("sequence_classification", "multiple_choice")  # heads that summarise a sequence
    if family == "roformer":
        if summarises and config.classifier_head != "mlp":
            raise CheckpointError(
                f"HF RoFormer has no {config.classifier_head} classifier head: set classifier_head: mlp to export"
            )
        if config.add_pooler:
            raise CheckpointError("HF RoFormer has no pooler: its weights would be lost (export without add_pooler)")
        if config.rotary_base != 10000.0:
            raise CheckpointError(f"HF RoFormer fixes rotary_base at 10000, this model uses {config.rotary_base}")
        return transformers.RoFormerConfig(
            embedding_size=config.embedding_dim, rotary_value=config.rotary_value, **common
        )
    if config.embedding_size is not None:
        raise CheckpointError("HF BERT has no embedding projection: embedding_size must be null to export")
    if config.add_pooler and config.pooler_activation != "tanh":
        raise CheckpointError("HF BERT's pooler is tanh: a linear pooler cannot be exported")
    if summarises and config.classifier_head != "pooler":
        raise CheckpointError(
            f"HF BERT classifies from its pooler, not a {config.classifier_head} head: set classifier_head: pooler "
            "to export"
        )
    return transformers.BertConfig(classifier_dropout=config.classifier_dropout, **common)


def _check_v1(config: ModelConfig, family: str) -> None:
    """Refuse what HF's RoFormer and BERT would load without error and run wrongly: RoFormerV2, the UniLM mask."""
    name = "RoFormer" if family == "roformer" else "BERT"
    v2 = {"norm_type": "layer_norm", "use_bias": True, "mlm_head": "transform"}
    for field, v1_value in v2.items():
        if getattr(config, field) != v1_value:
            raise CheckpointError(
                f"HF {name} cannot express {field}: {getattr(config, field)} (RoFormerV2): it would load the "
                "model without error and with norms and biases it does not have"
            )
    if config.attention_pattern == "unilm":
        raise CheckpointError(f"HF {name} has no UniLM attention mask (attention_pattern: unilm)")


def _split_qkv(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our fused `attn.qkv` and `cross.kv` -> HF's separate projections."""
    split = {}
    for key, value in state.items():
        match = re.match(r"(.*\.(?:attn\.qkv|cross\.kv))\.(\w+)$", key)
        if match is None:
            split[key] = value
            continue
        root, names = match.group(1).rsplit(".", 1)
        for name, part in zip(names, value.chunk(len(names), dim=0), strict=True):
            split[f"{root}.{name}.{match.group(2)}"] = part
    return split


def _fill_derived(new: dict, hf_state: dict, model: Model, family: str, prefix: str) -> None:
    """Add the HF keys that are derived from others: position tables, tied decoder weight and bias."""
    config = model.config
    backbone = model.base_model
    if family == "roformer":
        new[f"{prefix}encoder.embed_positions.weight"] = hf_state[f"{prefix}encoder.embed_positions.weight"]
    elif config.position_encoding in ("sinusoidal", "none"):
        table = torch.zeros(config.max_position_embeddings, config.hidden_size)
        if config.position_encoding == "sinusoidal":
            with torch.no_grad():
                table = backbone.embeddings.positions(
                    config.max_position_embeddings, torch.device("cpu"), torch.float32
                )
        new[f"{prefix}embeddings.position_embeddings.weight"] = table.detach().clone()
    if model.architecture in ("masked_lm", "causal_lm"):
        new["cls.predictions.decoder.bias"] = new["cls.predictions.bias"]
        if config.tie_word_embeddings:
            new["cls.predictions.decoder.weight"] = new[f"{prefix}embeddings.word_embeddings.weight"]
    for key in ("embeddings.position_ids", "embeddings.token_type_ids"):
        if f"{prefix}{key}" in hf_state:
            new[f"{prefix}{key}"] = hf_state[f"{prefix}{key}"]
