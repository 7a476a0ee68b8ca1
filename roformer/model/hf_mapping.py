"""What corresponds between HF transformers' RoFormer / BERT and our models: state-dict keys and configs.

One table of key patterns (`BACKBONE_KEYS`, and the heads' `_HEAD_KEYS`) serves both directions. HF's separate
query/key/value projections become our fused `qkv` (and a decoder's cross-attention key/value our fused `kv`), and
back (`split_qkv`). HF keys derived from other weights (the sinusoidal table, a tied decoder) are dropped on import
and rebuilt on export (`fill_derived`). An HF config becomes our ModelConfig (`config_from_hf`: RoFormerV2 read from
its fields or its tensors) and ours an HF one (`config_to_hf`, refusing what HF cannot express). The user-facing
conversions that use these are `roformer.model.hf`.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from roformer.errors import CheckpointError
from roformer.model.config import ACTIVATION_NAMES, ModelConfig, encodings
from roformer.model.model import Model

# (HF pattern, our pattern) for backbone keys; {i} is a layer index, {p} a parameter name (weight/bias).
BACKBONE_KEYS = [
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

HF_CLASSES = {
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
PREFIX = {"roformer": "roformer.", "bert": "bert."}  # the backbone's key prefix in HF's classes with a head


def _compile(pattern: str) -> re.Pattern[str]:
    regex = re.escape(pattern).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{p\}", r"(?P<p>\w+)")
    return re.compile(regex + "$")


def rename(key: str, table: list[tuple[str, str]], reverse: bool) -> str | None:
    """`key` renamed by the first (HF, ours) pattern of `table` it matches (ours -> HF if `reverse`); None if none."""
    for hf, ours in table:
        source, target = (ours, hf) if reverse else (hf, ours)
        match = _compile(source).match(key)
        if match:
            return target.format(**match.groupdict())
    return None


# ----------------------------------------------------------------------------------------------------------------
# HF -> ours


def checkpoint_kind(hf_config: Any, state: dict[str, Any], path: str) -> tuple[str, str]:
    """(family, architecture) a checkpoint was saved as: its `architectures` entry, else read from its keys."""
    family = hf_config.model_type
    if family not in PREFIX:
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
    for kind, cls_name in HF_CLASSES.items():
        if cls_name == name:
            return kind
    return _EXTRA_HF_IMPORTS.get(name)


def hf_kind(model: Any) -> tuple[str, str]:
    """(family, architecture) of a transformers model instance, by its class (`HF_CLASSES`)."""
    kind = _hf_class_kind(type(model).__name__)
    if kind is None:
        supported = ", ".join(list(HF_CLASSES.values()) + list(_EXTRA_HF_IMPORTS))
        raise CheckpointError(f"cannot convert {type(model).__name__}; supported: {supported}")
    return kind


def is_v2_config(c: Any) -> bool:
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


def config_from_hf(c: Any, family: str, arch: str, keys: set[str]) -> ModelConfig:
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


def head_table(arch: str, config: ModelConfig) -> list[tuple[str, str]]:
    """The (HF, ours) key patterns of architecture `arch`'s head (none for a backbone)."""
    if arch == "sequence_classification":
        return _HEAD_KEYS[f"{arch}/{config.classifier_head}"]
    return _HEAD_KEYS.get(arch, [])


def state_from_hf(hf_state: dict[str, torch.Tensor], family: str, arch: str, config: ModelConfig) -> dict:
    """Our state dict of an HF one: keys renamed, derived keys dropped, q/k/v fused."""
    prefix = PREFIX[family] if arch != "backbone" else ""
    ours: dict[str, torch.Tensor] = {}
    for key, value in hf_state.items():
        if _DERIVED_HF_KEYS.search(key) or (config.tie_word_embeddings and key == "cls.predictions.decoder.weight"):
            continue
        if key.startswith(prefix) and (name := rename(key.removeprefix(prefix), BACKBONE_KEYS, False)):
            name = name if arch == "backbone" else f"backbone.{name}"
        elif (name := rename(key, head_table(arch, config), False)) is None:
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


def hf_family(config: ModelConfig) -> str:
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


def config_to_hf(config: ModelConfig, family: str, arch: str) -> Any:
    """The transformers RoFormerConfig or BertConfig of `config`, refusing what HF cannot express."""
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
    if config.intermediate_size == 0:
        raise CheckpointError(f"HF {name} has a feed-forward layer in every block: intermediate_size 0 cannot export")
    if config.norm_position == "pre":
        raise CheckpointError(f"HF {name} is post-LN: norm_position pre cannot export")


def split_qkv(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
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


def fill_derived(new: dict, hf_state: dict, model: Model, family: str, prefix: str) -> None:
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
