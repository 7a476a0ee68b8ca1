"""`ModelConfig`: the shape and behaviour of one encoder for both arms of the comparison, and the position encodings.

RoFormer (rotary positions) and the BERT baseline (sinusoidal or learned absolute positions) share every other field,
so a comparison changes nothing else. Loaded from YAML with the strict loader of `roformer.config`: an unknown or
mistyped key, a wrong type or an impossible value raises `ConfigError` naming the field and the file.

The position encodings are found as the task types are: every module of `roformer.model` that ends in
`ENCODINGS = (EncodingSpec(...), ...)` declares its encodings, and `encodings()` collects them. What the config accepts
for `position_encoding`, which fields belong to which encoding, which attention each refuses and the table of them in
docs/baselines.md (`encodings_table`) come from those declarations; a new encoding is a new module
(docs/adding-a-position-encoding.md). The declaring modules are imported when the first config is checked, not when
this one is: it imports no torch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal, Self

from roformer.config import STAGE, check_types, from_dict
from roformer.config_yaml import read_yaml, write_yaml
from roformer.errors import ConfigError
from roformer.plugins import declarations

# Activation names accepted in `hidden_act`: every parameter-free activation that HF BERT/RoFormer configs use.
# The implementations live in `roformer.model.layers.ACTIVATIONS`; this list is the config-level contract.
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

# Metadata of the ModelConfig fields that make up a model's position encoding (`position_fields()`): the fields in
# which two arms of an experiment may differ, everything else being equal.
POSITION = {"position": True}


@dataclass
class RopeScaling:
    """RoPE context scaling: run a rotary model at lengths beyond the one it was trained at.

    Attributes:
        type: `linear`: position interpolation (Chen et al. 2023), every frequency divided by `factor`; `ntk`: the
            NTK-aware base change (bloc97 2023), base * factor^(d / (d - 2)), which keeps the highest frequency and
            interpolates the lowest; `yarn` (Peng et al. 2023): frequencies with fewer than `beta_slow` rotations
            over the original length are interpolated, those with more than `beta_fast` kept, a linear ramp
            between, and the attention logits scaled by `attention_factor`^2; `self_extend` (SelfExtend, Jin et al.
            2024): training-free, every query sees its `window` nearest keys at their true distances and farther
            keys at distances divided by `factor` (grouped positions floor(m / factor)), shifted to continue after
            the window, so no distance exceeds what the model was trained at.
        factor: Target length / trained length (>= 1); for `self_extend` the group size.
        original_max_position: The length the model was trained at (yarn's ramp counts rotations over it).
        beta_fast: yarn: rotations above which a frequency is kept (extrapolated).
        beta_slow: yarn: rotations below which a frequency is interpolated.
        attention_factor: yarn: the magnitude of the rotation table (q and k are both scaled, so logits by its
            square); None = 0.1 ln(factor) + 1 (YaRN eq. 22).
        window: self_extend: the neighbour window (keys this close keep their true distance); None = half the
            trained length (`original_max_position`).
    """

    type: Literal["linear", "ntk", "yarn", "self_extend"] = "linear"
    factor: float = 1.0
    original_max_position: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    window: int | None = None

    def __post_init__(self) -> None:
        check_types(self)
        if self.type == "self_extend" and self.window is None and not self.original_max_position:
            raise ConfigError("rope_scaling self_extend needs window or original_max_position (the trained length)")
        if self.window is not None and self.window < 1:
            raise ConfigError(f"rope_scaling.window must be >= 1, got {self.window}")
        if not self.factor >= 1.0:
            raise ConfigError(f"rope_scaling.factor must be >= 1 (target length / trained length), got {self.factor}")
        if self.type == "yarn" and not self.original_max_position:
            raise ConfigError("rope_scaling.original_max_position is required for yarn (the trained length)")
        if self.original_max_position is not None and self.original_max_position <= 0:
            raise ConfigError(f"rope_scaling.original_max_position must be > 0, got {self.original_max_position}")
        if self.beta_fast <= self.beta_slow or self.beta_slow <= 0:
            raise ConfigError(
                f"rope_scaling needs beta_fast > beta_slow > 0, got {self.beta_fast} and {self.beta_slow}"
            )
        if self.attention_factor is not None and self.attention_factor <= 0:
            raise ConfigError(f"rope_scaling.attention_factor must be > 0, got {self.attention_factor}")


# Model classes a model directory may hold (`roformer.model.model.ARCHITECTURES` maps them to the classes).
ARCHITECTURE_NAMES = (
    "backbone",
    "masked_lm",
    "sequence_classification",
    "token_classification",
    "question_answering",
    "multiple_choice",
    "causal_lm",
    "encoder_decoder",
)
# How a sentence vector is read from the last hidden states (roformer.model.model.pool_states)
POOLINGS = ("cls", "mean", "pooler", "last")


@dataclass(frozen=True)
class EncodingSpec:
    """The declaration of one position encoding: all that the rest of the package knows of it.

    A module of `roformer.model` declares its encodings at its end, `ENCODINGS = (EncodingSpec(...), ...)`, and
    `encodings()` finds them: the config's accepted names and checks, the forward's module, HF export and the table
    of encodings come from here.

    Attributes:
        name: The value of `position_encoding`.
        summary: One line for the table of encodings (docs/baselines.md).
        acts: Where it enters. `embeddings`: `build` makes a module that `layers.Embeddings` registers under its
            `attribute` and adds, called as module(length, device, dtype, position_ids) -> (T, E) or (B, T, E).
            `attention`: `build` makes an `AttentionPositions` (`roformer.model.terms`) that the backbone registers
            under its `attribute`. `nothing`: no positions at all.
        relative: Its attention terms depend on two tokens' positions through their distance alone: shifting every
            position by one amount changes no output.
        hf: The HF family it converts to (`roformer`, `bert`), or None: `to_hf` refuses it in one line.
        kernel: The attention kernel its terms need, a key of `roformer.model.attention.ATTENTION_KERNELS` (an
            encoding that acts in attention; the module's own `kernel` says the same).
        folds_bias: Its terms are a float bias of the logits, computed once per forward and folded into the mask
            (`roformer.model.terms.FoldedBias`).
        refuses: The `attention` types it cannot run with (linear attention has no logits to add a bias to).
        fields: The ModelConfig fields that belong to it: any other encoding refuses a value other than their
            default.
        settings: A dataclass of settings of its own, given under `position_settings: {<name>: {...}}` (filled with
            its defaults when left out), or None.
        rotates: It rotates q and k in the pairs of `rotary_layout`: changing the layout permutes its q/k rows.
        limited: Its positions are the rows of a table of `max_position_embeddings` (`ModelConfig.position_limit`).
        real_positions: It computes its terms from positions as real numbers, not table rows or buckets, so it takes
            float `position_ids` (random float positions, `data.synthetic.randomized_kind: float`; position
            interpolation as positions / factor, `data.synthetic.extensions: [linear]`).
        build: config -> its module (None when it acts on nothing).
        check: config -> None: raises ConfigError for what it cannot compute (an odd head size, say), or None.
        paper: Where it comes from (authors and year), for the table.
    """

    name: str
    summary: str
    acts: Literal["embeddings", "attention", "nothing"]
    relative: bool
    hf: str | None
    kernel: str | None = None
    folds_bias: bool = False
    refuses: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()
    settings: type | None = None
    rotates: bool = False
    limited: bool = False
    real_positions: bool = False
    build: Callable[[ModelConfig], Any] | None = None
    check: Callable[[ModelConfig], None] | None = None
    paper: str = ""

    def __post_init__(self) -> None:
        if (self.build is None) != (self.acts == "nothing"):
            raise ValueError(f"encoding {self.name!r}: a module to build exactly when it acts on something")
        if (self.kernel is None) != (self.acts != "attention"):
            raise ValueError(f"encoding {self.name!r}: a kernel exactly when it acts inside attention")

    @property
    def adds_to_logits(self) -> bool:
        """It adds to the attention logits (a folded bias, or each layer's own terms): no variable-length kernel."""
        return self.folds_bias or self.kernel == "biased"


class YamlFile:
    """A model config's YAML file: `from_yaml` (a mapping of its fields, or one under a `model:` key), `to_yaml`."""

    @classmethod
    def from_yaml(cls, path: str | Path) -> Self:
        """Load a config from a YAML file (a mapping of field names, or one under a `model:` key)."""
        data = read_yaml(path)
        if isinstance(data, dict) and set(data) == {"model"}:
            data = data["model"]
        return from_dict(cls, data, source=str(path))

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of all fields, nested sections as dicts (YAML-safe)."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def to_yaml(self, path: str | Path) -> None:
        """Write all fields to a YAML file."""
        write_yaml(path, self.to_dict())


@dataclass
class ModelConfig(YamlFile):
    """Shape and behaviour of the encoder. One config for RoFormer and the BERT baseline.

    Attributes:
        vocab_size: Number of token ids.
        hidden_size: Width of the residual stream.
        num_layers: Number of post-LN transformer blocks.
        num_heads: Attention heads; hidden_size must be divisible by it.
        intermediate_size: Width of the feed-forward layer; 0 for blocks without one (attention alone, Zoology's).
        embedding_size: Width of the token embeddings; None means hidden_size, otherwise a linear projection maps
            embeddings to hidden_size (HF RoFormer `embeddings_project`, ALBERT-style factorisation).
        hidden_act: Activation of the feed-forward layer and the MLM transform (an HF activation name).
        hidden_dropout: Dropout on embeddings and residual branches.
        attention_dropout: Dropout on attention probabilities.
        layer_norm_eps: LayerNorm epsilon (BERT uses 1e-12).
        type_vocab_size: Number of token types (segments).
        pad_token_id: Padding id; its embedding row starts at zero and gets no gradient (as in HF).
        initializer_range: Std of the normal init of linear and embedding weights (BERT init).
        position_encoding: The position encoding, by the name its module declares (`EncodingSpec`): `rotary`
            (RoFormer, the default), BERT's absolute ones, the relative baselines the paper names (sec. 2.3) and
            the encodings after it. Every one is a row of the table in docs/baselines.md ("Every position
            encoding"), generated from the declarations (`encodings_table`).
        max_position_embeddings: Rows of the learned position table; unused by the other encodings, which have no
            length limit (`position_limit`). Kept for HF conversion.
        rotary_base: Base of the rotary frequencies, theta_i = base^(-2i/d) (paper eq. 15).
        rotary_layout: `interleaved` pairs (x1,x2),(x3,x4),... as in the paper and HF; `half` pairs (x_i, x_{i+d/2})
            as in GPT-NeoX/LLaMA.
        rotary_value: Also rotate the values (HF RoFormer `rotary_value`).
        rotary_dim: Rotate only the first `rotary_dim` features of each head (partial rotary, GPT-NeoX: 25% there);
            None = the whole head. Frequencies are those of a `rotary_dim`-wide head, theta_i = base^(-2i/rotary_dim).
        rope_scaling: Context scaling of the rotary frequencies (RopeScaling: linear, ntk, yarn), e.g. to evaluate or
            continue training at lengths beyond the pretraining length. None = the paper's RoPE.
        relative_max_distance: `shaw`: the clipping distance k (distances beyond +-k share an embedding; 2k + 1
            embeddings). 128 by default, not the paper's 16: 16 is Shaw et al.'s choice for translation with sentences
            of ~30 tokens; an encoder pretrained on 128-512 token blocks would see most of its pairs clipped.
            `t5_bias`: T5's max_distance (the largest distance with its own log-spaced bucket; 128 as in T5).
        relative_num_buckets: `t5_bias`: distance buckets (32 as in T5; half per direction, bidirectional).
        alibi_form: `alibi`: `symmetric` (-slope_h |i - j|, this project's default for an encoder: it cannot tell
            a key on the left from one on the right without anchors such as [CLS] and [SEP]) or `asymmetric` (Ruoss
            et al. 2023's bidirectional ALiBi, as their code: keys before the query half a step closer,
            -slope_h (|i - j| - 0.5) for j < i, the query itself and later keys as in the symmetric form).
        attention_log_scale: The trained length n0 of the log-length attention scale (Su 2021, "entropy-invariant
            attention"; YaRN's temperature, Peng et al. 2023, is the same idea for a rotary model under
            `rope_scaling: yarn`): a token whose row (or document) has n > n0 real tokens scales its query by
            log n / log n0, so its attention is as peaked as at the trained length; at n <= n0 nothing changes.
            None = off. Softmax attention only.
        shaw_values: `shaw`: also add an embedding of the clipped distance to the values (Shaw et al. eq. 3).
        shaw_shared_layers: `shaw`: one set of distance embeddings for all layers; false = one per layer (as the
            paper's tensor2tensor implementation). Either way they are shared by the heads (the paper, sec. 3.1).
        attention: `softmax` (scaled dot-product attention) or `linear` (paper sec. 3.3, eq. 19: elu+1 feature map,
            RoPE on the features in the numerator only, O(T) memory; attention dropout does not apply).
        sinusoidal_scale: Multiplier of the sinusoidal table added to the token embeddings. None picks the default
            that keeps the table at the scale of the token embedding init (see `resolved_sinusoidal_scale`).
        sinusoidal_scale_learned: Make that multiplier a learned scalar (Cramming-style), initialised at the value.
        position_settings: The settings of an encoding that declares its own (`EncodingSpec.settings`), under its
            name: `{p_rope: {unrotated_fraction: 0.25}}`. Filled with that encoding's defaults when left out; the
            settings of another encoding are refused.
        tie_word_embeddings: The MLM decoder reuses the word embedding matrix.
        num_labels: Outputs of the sequence classification head; 1 means regression (MSE).
        classifier_head: `mlp` (HF RoFormer: dropout, dense, hidden_act, dropout, linear on x[:,0]), `pooler`
            (BERT: tanh pooler on x[:,0], dropout, linear) or `mean` (the RoFormer authors' CAIL2019-SCM head: the
            mean of the last hidden states over the real tokens, dropout, linear; HF has none). One default for every
            position encoding, so that a comparison fine-tunes the same head on both arms (MLM pretraining trains
            neither); HF conversion sets `pooler` for BERT checkpoints, whose pooler was pretrained.
        classifier_dropout: Dropout in the classification head; None means hidden_dropout.
        add_pooler: The backbone carries a pooler (needed by the `pooler` head; kept for HF BertModel); its output
            is returned as `ModelOutput.pooled` by every model.
        pooler_activation: `tanh` (BERT's pooler: tanh(dense(x[:, 0]))) or `linear` (dense(x[:, 0]) only, as
            RoFormer-Sim's pooler, whose output ranks paraphrases by cosine similarity).
        attention_pattern: Which keys a token attends to. `bidirectional` (an encoder: all of them); `causal` (a
            decoder: itself and those before it); `unilm` (UniLM's sequence-to-sequence mask, Dong et al. 2019, as
            RoFormer-Sim: tokens of segment A (token type 0) see all of segment A, tokens of segment B (type 1) see
            segment A and the B tokens up to themselves). A `CausalLM` turns bidirectional into causal.
        use_bias: Biases in the attention and feed-forward layers. RoFormerV2 has none there (its port keeps them
            in the embedding projection and the pooler, as we do).
        norm_type: `layer_norm` (BERT, RoFormer) or `rms_norm`: RoFormerV2's parameter-free x / sqrt(mean(x^2) + eps)
            in place of every LayerNorm, the embeddings' included.
        norm_position: `post` (BERT, RoFormer: x = LN(x + f(x)) in every sublayer) or `pre` (GPT-2, Cramming,
            Zoology's models: x = x + f(LN(x)), and one more norm after the last block; Xiong et al. 2020, "On
            Layer Normalization in the Transformer Architecture"). The embeddings keep their norm either way.
        mlm_head: `transform` (BERT: dense, act, norm, then the decoder with a bias) or `bare` (RoFormerV2: the
            decoder alone, logits = x E^T with the tied embeddings E).
        initializer: `bert` (normal(0, initializer_range)) or `v2` (RoFormerV2: truncated normal, std
            1.13684723 / sqrt(fan_in) x num_layers^-1/2; 1.13684723 undoes the truncation at 2 std).
        cross_attention: Every block also attends to another sequence's states (an encoder's, given as the forward
            input `encoder_states`) between its self-attention and its feed-forward layer: the decoder of an
            encoder-decoder (`EncoderDecoderConfig` sets it). No position encoding enters cross-attention.
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
    position_encoding: str = field(default="rotary", metadata=POSITION)
    max_position_embeddings: int = field(default=512, metadata=POSITION)
    rotary_base: float = field(default=10000.0, metadata={**POSITION, **STAGE})
    rotary_layout: Literal["interleaved", "half"] = field(default="interleaved", metadata=POSITION)
    rotary_value: bool = field(default=False, metadata=POSITION)
    rotary_dim: int | None = field(default=None, metadata=POSITION)
    rope_scaling: RopeScaling | None = field(default=None, metadata={**POSITION, **STAGE})
    relative_max_distance: int = field(default=128, metadata=POSITION)
    relative_num_buckets: int = field(default=32, metadata=POSITION)
    alibi_form: Literal["symmetric", "asymmetric"] = field(default="symmetric", metadata=POSITION)
    attention_log_scale: int | None = field(default=None, metadata=POSITION)
    shaw_values: bool = field(default=False, metadata=POSITION)
    shaw_shared_layers: bool = field(default=False, metadata=POSITION)
    attention: Literal["softmax", "linear"] = "softmax"
    sinusoidal_scale: float | None = field(default=None, metadata=POSITION)
    sinusoidal_scale_learned: bool = field(default=False, metadata=POSITION)
    position_settings: dict[str, Any] = field(default_factory=dict, metadata=POSITION)
    tie_word_embeddings: bool = True
    num_labels: int = 2
    classifier_head: Literal["pooler", "mlp", "mean"] = "mlp"
    classifier_dropout: float | None = None
    add_pooler: bool = False
    pooler_activation: Literal["tanh", "linear"] = "tanh"
    attention_pattern: Literal["bidirectional", "causal", "unilm"] = "bidirectional"
    use_bias: bool = True
    norm_type: Literal["layer_norm", "rms_norm"] = "layer_norm"
    norm_position: Literal["post", "pre"] = "post"
    mlm_head: Literal["transform", "bare"] = "transform"
    initializer: Literal["bert", "v2"] = "bert"
    cross_attention: bool = False

    def __post_init__(self) -> None:
        check_types(self)
        self._validate()

    def _validate(self) -> None:
        positive = ("vocab_size", "hidden_size", "num_layers", "num_heads", "type_vocab_size")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.intermediate_size < 0:
            raise ConfigError(
                f"intermediate_size must be > 0, or 0 for no feed-forward layer, got {self.intermediate_size}"
            )
        if self.embedding_size is not None and self.embedding_size <= 0:
            raise ConfigError(f"embedding_size must be > 0 or null, got {self.embedding_size}")
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads ({self.num_heads})")
        if self.relative_max_distance < 1:
            raise ConfigError(f"relative_max_distance must be >= 1, got {self.relative_max_distance}")
        self._validate_position_encoding()
        if self.attention_log_scale is not None and (self.attention_log_scale < 2 or self.attention == "linear"):
            raise ConfigError(
                f"attention_log_scale must be a trained length >= 2 with softmax attention, got "
                f"{self.attention_log_scale} ({self.attention} attention)"
            )
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
        if self.attention_pattern == "unilm" and self.type_vocab_size < 2:
            # segment B (type 1) is what UniLM decodes, and generation feeds its new tokens as type 1
            raise ConfigError(
                f"attention_pattern: unilm needs token types 0 and 1, got type_vocab_size {self.type_vocab_size}"
            )
        if self.attention == "linear" and self.attention_pattern != "bidirectional":
            # eq. 19 sums over every key; a causal linear attention is a different algorithm (prefix sums)
            raise ConfigError(
                f"attention: linear is bidirectional only, got attention_pattern {self.attention_pattern}"
            )
        if self.mlm_head == "bare" and self.embedding_dim != self.hidden_size:
            raise ConfigError(
                "mlm_head: bare multiplies the hidden states by the embeddings: embedding_size must be null"
            )

    def _validate_position_encoding(self) -> None:
        """The encoding is declared; no other encoding's fields or settings are set; its attention and own checks."""
        spec = encoding_of(self.position_encoding)
        for name, owners in encoding_fields().items():
            if name not in spec.fields and getattr(self, name) != _default(name):
                raise ConfigError(f"{name} is only meaningful with position_encoding: {' or '.join(owners)}")
        self._resolve_position_settings(spec)
        if self.attention in spec.refuses:  # linear: eq. 19 never forms the T x T logits that a bias adds to
            reason = "has no attention logits to bias" if self.attention == "linear" else "cannot run it"
            raise ConfigError(f"attention: {self.attention} {reason}: {spec.name} needs softmax")
        if spec.check is not None:
            spec.check(self)

    def _resolve_position_settings(self, spec: EncodingSpec) -> None:
        """`position_settings` holds the encoding's own settings (its defaults where none are given), and no other."""
        known = encodings()
        for name in self.position_settings:
            if name not in known or known[name].settings is None:
                having = ", ".join(n for n, s in known.items() if s.settings is not None) or "none"
                raise ConfigError(f"position_settings.{name}: not an encoding with settings (those with: {having})")
            if name != spec.name:
                raise ConfigError(f"position_settings.{name} is only meaningful with position_encoding: {name}")
        if spec.settings is None:
            return
        given = self.position_settings.get(spec.name)
        if not isinstance(given, spec.settings):
            given = from_dict(spec.settings, given, prefix=f"position_settings.{spec.name}.")
        self.position_settings = {spec.name: given}

    @property
    def encoding(self) -> EncodingSpec:
        """The declaration of this config's position encoding."""
        return encoding_of(self.position_encoding)

    @property
    def position_limit(self) -> int | None:
        """The most tokens a sequence may have: the learned table's rows, or None (no length limit).

        One answer for every caller: only an encoding declared `limited` (`learned`) has a limit, its
        `max_position_embeddings`.
        """
        return self.max_position_embeddings if self.encoding.limited else None

    def holds_positions(self, length: int) -> bool:
        """Whether a sequence of `length` tokens has a position under this encoding (`position_limit`)."""
        limit = self.position_limit
        return limit is None or length <= limit

    @property
    def rotary_size(self) -> int:
        """Features of each head that are rotated (rotary_dim, or the head size)."""
        return self.rotary_dim or self.head_size

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
        `initializer_range` (0.02): added raw, positions drown the tokens (docs/baselines.md, "A fair sinusoidal
        baseline"). The default scales the table to RMS `initializer_range`, the scale of a learned table at init.
        """
        if self.sinusoidal_scale is not None:
            return self.sinusoidal_scale
        return self.initializer_range * math.sqrt(2.0)


def position_fields() -> tuple[str, ...]:
    """The names of the ModelConfig fields that make up the position encoding (metadata `POSITION`), in field order."""
    return tuple(f.name for f in dataclasses.fields(ModelConfig) if f.metadata.get("position", False))


def _default(name: str) -> Any:
    """The default value of ModelConfig field `name`."""
    declared = ModelConfig.__dataclass_fields__[name]
    return declared.default_factory() if declared.default is dataclasses.MISSING else declared.default


# ----------------------------------------------------------------------------------------------------------------
# The position encodings, collected from their modules' declarations


@cache
def encodings() -> dict[str, EncodingSpec]:
    """Every declared position encoding by name, sorted by name: the `ENCODINGS` of the modules of roformer.model.

    Raises:
        RuntimeError: two declarations of one name, or a declared field that ModelConfig has not (a programming
            error).
    """
    import roformer.model

    found: dict[str, EncodingSpec] = {}
    for module, spec in declarations(roformer.model, "ENCODINGS"):
        if spec.name in found:
            raise RuntimeError(f"position encoding {spec.name!r} is declared twice ({module})")
        unknown = [name for name in spec.fields if name not in ModelConfig.__dataclass_fields__]
        if unknown:
            raise RuntimeError(f"position encoding {spec.name!r} declares fields ModelConfig has not: {unknown}")
        found[spec.name] = spec
    return dict(sorted(found.items()))


def encoding_of(name: str) -> EncodingSpec:
    """The declaration of encoding `name`.

    Raises:
        ConfigError: an unknown name, listing the declared ones.
    """
    known = encodings()
    if name not in known:
        raise ConfigError(
            f"key 'position_encoding' must be one of {', '.join(map(repr, known))}, got {name!r} (the encodings "
            "are declared by their modules in roformer/model/)"
        )
    return known[name]


def encoding_fields() -> dict[str, tuple[str, ...]]:
    """{ModelConfig field: the encodings it belongs to} for every field an encoding declares as its own."""
    owners: dict[str, tuple[str, ...]] = {}
    for spec in encodings().values():
        for name in spec.fields:
            owners[name] = (*owners.get(name, ()), spec.name)
    return owners


def relative_encodings() -> tuple[str, ...]:
    """The encodings whose attention terms depend on positions through the distance alone (`EncodingSpec.relative`)."""
    return tuple(name for name, spec in encodings().items() if spec.relative)


TABLE_START = "<!-- position encodings: generated by roformer.model.config.encodings_table -->"
TABLE_END = "<!-- end of position encodings -->"


def encodings_table() -> str:
    """The position encodings as a markdown table (docs/baselines.md holds it between TABLE_START and TABLE_END)."""
    lines = [
        "| `position_encoding` | where | relative | real positions | attention kernel | refuses | HF export "
        "| its fields | from |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for spec in encodings().values():
        where = {"attention": "attention", "embeddings": "token embeddings", "nothing": "nowhere"}[spec.acts]
        if spec.folds_bias:
            where += " (a bias folded into the mask)"
        own = [f"`{name}`" for name in spec.fields]
        if spec.settings is not None:
            own += [f"`position_settings.{spec.name}.{f.name}`" for f in dataclasses.fields(spec.settings)]
        row = [
            f"`{spec.name}`: {spec.summary}",
            where,
            "yes" if spec.relative else "no",
            "yes" if spec.real_positions else "no",
            f"`{spec.kernel}`" if spec.kernel else "",
            ", ".join(f"`attention: {a}`" for a in spec.refuses),
            {"roformer": "HF RoFormer", "bert": "HF BERT", None: "refused"}[spec.hf],
            ", ".join(own),
            spec.paper,
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join([TABLE_START, *lines, TABLE_END])


@dataclass
class EncoderDecoderConfig(YamlFile):
    """An encoder-decoder (translation, the paper's Table 1): an encoder and a decoder, each a `ModelConfig`.

    The decoder is made a decoder here whatever its mapping says: causal self-attention (`attention_pattern:
    causal`) and cross-attention to the encoder's last hidden states (`cross_attention: true`), as HF's
    `EncoderDecoderModel` sets `is_decoder` and `add_cross_attention` on its decoder's config. The target's padding
    id is the decoder's `pad_token_id`.

    Attributes:
        encoder: The encoder: bidirectional, no cross-attention.
        decoder: The decoder (a causal LM over the target vocabulary); its output projection is its word embeddings
            when `tie_word_embeddings` (as HF's RoFormerForCausalLM ties them).
        share_embeddings: One word-embedding table for encoder and decoder (a joint vocabulary; with the decoder's
            tied output projection, fairseq's `--share-all-embeddings`): the two vocabularies, embedding sizes and
            padding ids must be equal.
        decoder_start_token_id: The token every target starts from (HF's `decoder_start_token_id`); labels are
            shifted right behind it when no decoder inputs are given. None: to be given where it is needed.
        eos_token_id: The token that ends a target (decoding stops there). None: to be given where it is needed.
    """

    encoder: ModelConfig
    decoder: ModelConfig
    share_embeddings: bool = False
    decoder_start_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self) -> None:
        check_types(self)
        if self.decoder.attention_pattern == "unilm":
            raise ConfigError("decoder.attention_pattern must be causal (or bidirectional, made causal), not unilm")
        if self.decoder.attention_pattern != "causal" or not self.decoder.cross_attention:
            self.decoder = dataclasses.replace(self.decoder, attention_pattern="causal", cross_attention=True)
        if self.encoder.cross_attention:
            raise ConfigError("encoder.cross_attention must be false: the encoder attends to its own tokens only")
        for name in ("decoder_start_token_id", "eos_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.decoder.vocab_size:
                raise ConfigError(f"{name} ({value}) must be in [0, decoder.vocab_size={self.decoder.vocab_size})")
        if self.share_embeddings:
            for name in ("vocab_size", "embedding_dim", "pad_token_id"):
                mine, theirs = getattr(self.encoder, name), getattr(self.decoder, name)
                if mine != theirs:
                    raise ConfigError(
                        f"share_embeddings needs one vocabulary: encoder {name} {mine} != decoder {name} {theirs}"
                    )

    def replaced(self, **overrides: Any) -> EncoderDecoderConfig:
        """This config with `overrides`: its own fields by name, a ModelConfig field (dropout...) on both halves.

        Raises:
            ConfigError: a name that is neither.
        """
        own = {f.name for f in dataclasses.fields(self)}
        model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
        unknown = sorted(set(overrides) - own - model_fields)
        if unknown:
            raise ConfigError(f"unknown EncoderDecoderConfig or ModelConfig field '{unknown[0]}'")
        halves = {k: v for k, v in overrides.items() if k not in own}
        changed = {k: v for k, v in overrides.items() if k in own}
        for half in ("encoder", "decoder"):
            if halves:
                changed[half] = dataclasses.replace(changed.get(half, getattr(self, half)), **halves)
        return dataclasses.replace(self, **changed)
