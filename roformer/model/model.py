"""RoFormer and its BERT baseline: the backbone, every task head, and `load`.

The backbone stacks the layers of `roformer.model.layers`: one post-LN encoder whose position encoding the config
chooses (`rotary`, `sinusoidal`, `learned`, `shaw`, `t5_bias`, `alibi` or `none`: `roformer.model.positions`). The
heads on top are those of HF RoFormer/BERT, one class per architecture: `backbone` (Backbone, no head), `masked_lm`
(MaskedLM), `sequence_classification` (SequenceClassifier), `token_classification` (TokenClassifier),
`question_answering` (QuestionAnswering), `multiple_choice` (MultipleChoice) and `causal_lm` (CausalLM, a decoder).
A saved model directory is read through `roformer.model.weights`. Plain PyTorch: no training, logging or
distributed code lives here.

References:
    Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding", arXiv 2104.09864 ("paper").
    Devlin et al. 2019, BERT.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from roformer.model.config import ARCHITECTURE_NAMES, POOLINGS, ModelConfig, RopeScaling
from roformer.model.generation import Sampling, generate
from roformer.model.layers import (
    ACTIVATIONS,
    AttentionContext,
    Block,
    Dropout,
    Embeddings,
    KVCache,
    QuerySubset,
    RealTokens,
    Segments,
    document_index,
    document_positions,
    make_norm,
    self_attention_mask,
    varlen_kernel_available,
)
from roformer.model.positions import (
    AttentionPositions,
    GroupedRotation,
    PositionTerms,
    RotaryEmbedding,
    attention_positions,
)
from roformer.model.weights import load_weights, read_model_config, read_model_dir, save_model


@dataclass
class ModelOutput:
    """What every model returns.

    Attributes:
        logits: Per model, with V = vocab_size, L = num_labels, C = hidden_size:
            `MaskedLM`: (B, T, V); with `masked_only=True`, (N, V) for the N labelled positions, or for the N
            entries of `masked_positions` when given (padding included).
            `SequenceClassifier`: (B, L).
            `TokenClassifier`: (B, T, L).
            `QuestionAnswering`: (B, T, 2), start and end logits.
            `MultipleChoice`: (B, K) for inputs of K choices (B, K, T).
            `Backbone`: (B, T, C), the last hidden states (no head).
        loss: Scalar loss when labels were given (never for `Backbone`).
        hidden_states: Embedding output and the output of every block, each (B, T, C), on request.
        pooled: The pooler's output (B, C) ((B, K, C) for multiple choice) when the backbone has a pooler
            (`add_pooler`), else None.
        embeddings: A bare backbone's sentence vectors (B, C) when its forward is given a `pooling`, else None.
    """

    logits: Tensor
    loss: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    pooled: Tensor | None = None
    embeddings: Tensor | None = None


class Model(nn.Module):
    """Base of all models here: config, BERT init, `save`."""

    architecture = ""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        # Drawn before any submodule exists, so it is the same for every position encoding under one seed.
        self.init_seed = int(torch.randint(2**62, ()))

    @staticmethod
    def adapt_config(config: ModelConfig) -> ModelConfig:
        """The config this class builds from `config` (a head may need a pooler, a decoder causal attention)."""
        return config

    def init_weights(self) -> None:
        """BERT init: normal(0, initializer_range) weights, zero biases, unit LayerNorm, zero padding embedding.

        Each weight draws from its own generator, seeded by `init_seed` and the parameter's name: a parameter that
        only one position encoding has (the learned table) does not shift the draws of the others, so under one
        seed every shared parameter starts identical in RoFormer and in each BERT baseline. `initializer: v2` draws
        the weights as RoFormerV2 does (`v2_std`), truncated at 2 std.
        """
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                self._normal_(module.weight, self.weight_std(module), f"{name}.weight")
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
                if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                    module.weight.data[module.padding_idx].zero_()
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def weight_std(self, module: nn.Linear | nn.Embedding) -> float:
        """The init std of a linear or embedding weight: initializer_range (BERT), or RoFormerV2's.

        V2 (bert4keras `RoFormerV2.initializer`): 1.13684723 / sqrt(fan_in) x num_layers^-1/2, where 1.13684723 is
        1 / std of a unit normal truncated at 2 std, so the drawn weights have std 1 / sqrt(fan_in) before the depth
        factor. fan_in is a linear layer's input width and an embedding's width (bert4keras takes the width for
        tables with more than 10000 or fewer than 10 rows, i.e. every real vocabulary and the token types).
        """
        if self.config.initializer != "v2":
            return self.config.initializer_range
        fan_in = module.in_features if isinstance(module, nn.Linear) else module.embedding_dim
        return 1.13684723 / math.sqrt(fan_in) * self.config.num_layers**-0.5

    @torch.no_grad()
    def _normal_(self, weight: Tensor, std: float, name: str) -> None:
        digest = hashlib.blake2b(f"{self.init_seed}/{name}".encode(), digest_size=8).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
        values = torch.empty(weight.shape, dtype=torch.float32)
        if self.config.initializer == "v2":
            nn.init.trunc_normal_(values, 0.0, std, -2 * std, 2 * std, generator=generator)
        else:
            values.normal_(0.0, std, generator=generator)
        weight.copy_(values)

    @property
    def base_model(self) -> Backbone:
        """The backbone: the model itself when it is one, else the one under its head (HF's `base_model`)."""
        return self if isinstance(self, Backbone) else self.backbone

    def run_backbone(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        output_hidden_states: bool = False,
        position_ids: Tensor | None = None,
        cache: KVCache | None = None,
        document_ids: Tensor | None = None,
    ) -> tuple[Tensor, tuple[Tensor, ...] | None, Tensor | None]:
        """Every model's opening: encode the batch, then pool it, before any head reads the hidden states.

        Returns:
            The last hidden states (B, T, C); all hidden states when asked (`Backbone.encode`), else None; the
            pooler's output (B, C), or None without a pooler or with a `cache` (x[:, 0] is then not the first token).
        """
        backbone = self.base_model
        x, hidden = backbone.encode(
            input_ids, attention_mask, token_type_ids, output_hidden_states, position_ids, cache, document_ids
        )
        return x, hidden, backbone.pooled(x) if cache is None else None

    def embed(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        pooling: str = "mean",
        normalize: bool = False,
    ) -> Tensor:
        """One vector per row (B, C): the backbone's last hidden states pooled (`pool_states`), unit length if asked.

        What any model's backbone gives as a sentence embedding; the head, if any, is not used.
        """
        vectors = self.base_model(input_ids, attention_mask, token_type_ids, pooling=pooling).embeddings
        return F.normalize(vectors.float(), dim=-1) if normalize else vectors

    def set_gradient_checkpointing(self, enabled: bool = True) -> None:
        """Recompute each block in the backward pass instead of keeping its activations (training only)."""
        for module in self.modules():
            if isinstance(module, Backbone):
                module.gradient_checkpointing = enabled

    def set_unpadding(self, enabled: bool = True) -> None:
        """Compute a padded batch's blocks on its real tokens alone (`RealTokens`).

        The same values at every real token, zeros at padding, and the padding's share of the work saved. Not for a
        head that reads the padding's states (`reads_padding`): it stays as HF computes it.
        """
        for module in self.modules():
            if isinstance(module, Backbone):
                module.unpadding = enabled and not self.reads_padding

    def set_varlen_attention(self, enabled: bool = True) -> None:
        """Attend with a variable-length kernel where one applies (`Backbone.variable_length_segments`), or not.

        On by default: on a GPU, packed documents and unpadded batches then attend within their segments, with no
        (B, T, T) mask and no padding; elsewhere nothing changes. Off: always SDPA over the grid (benchmarks).
        """
        for module in self.modules():
            if isinstance(module, Backbone):
                module.varlen_attention = enabled

    def set_rotary(self, base: float, scaling: RopeScaling | None = None) -> None:
        """Rotate by another base and context scaling from now on (a pretraining stage, mmBERT's 10k -> 160k).

        No parameter changes: the rotary tables are rebuilt where they are, and every config of the model records
        the new values, so a model saved afterwards loads as it now computes.

        Raises:
            ValueError: the model has no rotary position encoding.
        """
        if self.config.position_encoding != "rotary":
            raise ValueError(f"set_rotary needs position_encoding: rotary, not {self.config.position_encoding}")
        for module in self.modules():
            if isinstance(module, Model):
                module.config = replace(module.config, rotary_base=base, rope_scaling=scaling)
            if isinstance(module, RotaryEmbedding):
                device = next((p.device for p in self.parameters()), None)
                module.set_frequencies(base, scaling, device)

    @property
    def reads_padding(self) -> bool:
        """Whether the head reads hidden states at padded positions (HF's multiple-choice summary does)."""
        return False

    def num_parameters(self) -> int:
        """Number of distinct parameters (tied weights counted once)."""
        return sum(p.numel() for p in self.parameters())

    def save(self, directory: str | Path) -> None:
        """Write `model.yaml` (architecture + config) and `model.safetensors` to `directory`."""
        save_model(self, directory)


class Backbone(Model):
    """Embeddings + post-LN blocks (+ optional BERT pooler). Returns the last hidden states as `logits`."""

    architecture = "backbone"

    def __init__(self, config: ModelConfig, init: bool = True) -> None:
        super().__init__(config)
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        # The encoding that acts inside attention (rotary, T5's bias, ALiBi, Shaw); the absolute ones are in
        # `embeddings`. Registered under its own name (`rotary`, `relative_bias`, `shaw`), which its checkpoint keys
        # carry, and reached as `self.positions` whatever the name.
        positions = attention_positions(config)
        self.positions_attribute = None if positions is None else positions.attribute
        if positions is not None:
            self.add_module(positions.attribute, positions)
        self.pooler = (
            nn.Linear(config.hidden_size, config.hidden_size, bias=config.use_bias) if config.add_pooler else None
        )
        # Activation checkpointing (Chen et al. 2016): in training, keep only each block's input and recompute the
        # block in the backward pass; about a third more compute for activations that no longer grow with depth.
        self.gradient_checkpointing = False
        self.unpadding = False  # `set_unpadding`: off by default, so every output position equals HF's
        self.varlen_attention = True  # `set_varlen_attention`: a variable-length kernel where it applies
        if init:  # a head owning this backbone initialises everything once
            self.init_weights()

    @property
    def positions(self) -> AttentionPositions | None:
        """The position encoding that acts inside attention, or None (absolute positions, or none at all)."""
        return None if self.positions_attribute is None else getattr(self, self.positions_attribute)

    def encode(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        output_hidden_states: bool = False,
        position_ids: Tensor | None = None,
        cache: KVCache | None = None,
        document_ids: Tensor | None = None,
        queries: Tensor | None = None,
    ) -> tuple[Tensor, tuple[Tensor, ...] | None]:
        """(B, T) ids -> last hidden states (B, T, C), and all hidden states when asked.

        `queries` (N,) flat positions into (B*T) asks for the last hidden states there alone, (N, C): the last block
        then computes only those positions as queries and through its FFN, every token still a key and value (the
        masked positions of MLM; `Block.forward_queries`); where that path does not apply (Shaw, linear attention,
        SelfExtend, causal attention) the whole grid is computed and the positions taken. Not with
        `output_hidden_states`.

        `position_ids` (B, T) gives every token its position (default 0..T-1, or after the cached ones): a
        left-padded row then equals itself unpadded. HF RoFormer cannot take them. `document_ids` (B, T) packs
        documents into rows: a token attends to the tokens of its own document only (a block-diagonal mask; linear
        attention sums per document) and positions restart at 0 in each (unless `position_ids` says otherwise), so
        every document's outputs are those of the document run alone, for every position encoding. Which keys a
        token sees follows `config.attention_pattern`; with a `cache`, the new tokens' keys and values are added to
        it and the cached ones are attended to (no `document_ids` then).
        """
        B, T = input_ids.shape
        if cache is not None and position_ids is None:
            position_ids = torch.arange(cache.length, cache.length + T, device=input_ids.device).expand(B, T)
        if document_ids is not None and position_ids is None:
            position_ids = document_positions(document_ids)  # (B, T): every document from 0
        segments = self.variable_length_segments(input_ids, attention_mask, document_ids, cache)
        tokens = self.real_tokens(attention_mask, cache) if segments is None else segments.tokens
        x = self.embeddings(input_ids, token_type_ids, position_ids, tokens)  # (B, T, C), or (N, C)
        blocks_ctx = None if segments is None else self.variable_length_context(segments, position_ids, B, T)
        grid_ctx = None  # attention over the grid: every block's, or the masked-only last one's
        if blocks_ctx is None or queries is not None:
            grid_ctx = self.grid_context(
                input_ids, attention_mask, token_type_ids, position_ids, cache, document_ids, tokens
            )
        if blocks_ctx is None:
            blocks_ctx = grid_ctx
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        hidden = [x if tokens is None else tokens.grid(x)] if output_hidden_states else None
        if queries is not None and hidden is not None:
            raise ValueError("queries gives the last hidden states at some positions: not with output_hidden_states")
        subset = None
        if queries is not None and query_subset_applies(grid_ctx, self.config):
            distinct, order = torch.unique(queries, return_inverse=True)  # padded positions repeat
            subset = QuerySubset.of(distinct, T)
        for i, block in enumerate(self.layers):
            if subset is not None and i == len(self.layers) - 1:
                grid = x if tokens is None else tokens.grid(x)  # (B, T, C): every token a key
                return block.forward_queries(grid, replace(grid_ctx.layer(i), tokens=None), subset)[order], None
            if recompute:  # dropout masks are replayed: the same values and gradients as without
                # non-reentrant: the context, a dataclass holding tensors, needs no unpacking into tensor arguments
                x = checkpoint(block, x, blocks_ctx.layer(i), use_reentrant=False)
            else:
                x = block(x, blocks_ctx.layer(i))
            if hidden is not None:
                hidden.append(x if tokens is None else tokens.grid(x))
        if tokens is not None:
            x = tokens.grid(x)  # (B, T, C)
        if queries is not None:
            return x.flatten(0, 1)[queries], None  # (N, C)
        return x, tuple(hidden) if hidden is not None else None

    def grid_context(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None,
        token_type_ids: Tensor | None,
        position_ids: Tensor | None,
        cache: KVCache | None,
        document_ids: Tensor | None,
        tokens: RealTokens | None,
    ) -> AttentionContext:
        """What attention over the (B, T) grid reads: the mask (padding, pattern, documents) and the position terms."""
        B, T = input_ids.shape
        positions = self.positions
        mask, causal = self_attention_mask(
            self.config.attention_pattern,
            attention_mask,
            token_type_ids,
            cache,
            (B, T),
            input_ids.device,
            causal_shortcut=positions is None or not positions.adds_to_logits,
            document_ids=document_ids,
        )
        device = input_ids.device
        terms = PositionTerms(mask) if positions is None else positions.terms(mask, position_ids, cache, T, device)
        linear = self.config.attention == "linear"  # sums per document; softmax attention reads the mask alone
        documents = document_index(document_ids, attention_mask) if linear and document_ids is not None else None
        return AttentionContext(terms.mask, causal, terms.rotary, cache, terms.shaw, tokens=tokens, documents=documents)

    def variable_length_segments(
        self, input_ids: Tensor, attention_mask: Tensor | None, document_ids: Tensor | None, cache: KVCache | None
    ) -> Segments | None:
        """The segments for a variable-length attention kernel when one applies to this forward, else None.

        It applies (`varlen_attention` on, eager) where it computes what the mask computes: softmax attention,
        bidirectional, no cache, no attention dropout in training (the kernel has none), rotary (not SelfExtend),
        absolute or no positions (no bias on the logits), on a device and dtype with the kernel
        (`varlen_kernel_available`: CUDA in fp16/bf16), for packed documents (`document_ids`, each one run in its
        row) or a padded batch with `unpadding` on. Chosen once per forward for every block.
        """
        config, positions = self.config, self.positions
        if not self.varlen_attention or cache is not None or torch.compiler.is_compiling():
            return None
        if config.attention != "softmax" or config.attention_pattern != "bidirectional":
            return None
        if positions is not None and not (isinstance(positions, RotaryEmbedding) and not positions.groups_positions):
            return None
        if (self.training and config.attention_dropout > 0) or not varlen_kernel_available(
            input_ids.device, self.compute_dtype(input_ids.device), config.head_size
        ):
            return None
        padded = attention_mask is not None and not bool(attention_mask.all())
        if (padded and not self.unpadding) or (document_ids is None and not padded):
            return None  # padding's outputs stay as HF computes them; a full batch is SDPA's flash path already
        keep = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
        if not bool(keep.any()):
            return None  # no real token: no segment to attend within
        return Segments.of(keep, document_ids)

    def variable_length_context(
        self, segments: Segments, position_ids: Tensor | None, B: int, T: int
    ) -> AttentionContext:
        """What the blocks read under a variable-length kernel: the real tokens, rotated at their positions (1, N).

        No mask: the segments say which keys each token sees.
        """
        tokens, rotary = segments.tokens, None
        if self.positions is not None:
            if position_ids is None:
                position_ids = torch.arange(T, device=segments.starts.device).expand(B, T)
            rotary = self.positions.terms(None, tokens.take(position_ids)[None], None, T, position_ids.device).rotary
        return AttentionContext(rotary=rotary, tokens=tokens, segments=segments)

    def compute_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype attention computes in: autocast's on `device` when on, else the weights'."""
        if torch.is_autocast_enabled(device.type):
            return torch.get_autocast_dtype(device.type)
        return self.layers[0].attn.qkv.weight.dtype

    def real_tokens(self, attention_mask: Tensor | None, cache: KVCache | None) -> RealTokens | None:
        """The batch's real tokens when the blocks are to compute on them alone, else None.

        With `unpadding` on, for a padded batch without a cache (a cached decode's new tokens are few, and its mask
        also covers the cached slots).
        """
        if not self.unpadding or attention_mask is None or cache is not None or bool(attention_mask.all()):
            return None
        return RealTokens.of(attention_mask)

    def pool(self, x: Tensor) -> Tensor:
        """The pooler on the first token: tanh(dense(x[:, 0])) (BERT), or dense(x[:, 0]) (pooler_activation: linear)."""
        if self.pooler is None:
            raise ValueError("this backbone has no pooler (config.add_pooler is false)")
        h = self.pooler(x[:, 0])  # (B, C)
        return torch.tanh(h) if self.config.pooler_activation == "tanh" else h

    def pooled(self, x: Tensor) -> Tensor | None:
        """`pool(x)` when there is a pooler, else None (what every model returns as `ModelOutput.pooled`)."""
        return self.pool(x) if self.pooler is not None else None

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: None = None,
        output_hidden_states: bool = False,
        position_ids: Tensor | None = None,
        pooling: str | None = None,
        document_ids: Tensor | None = None,
    ) -> ModelOutput:
        """Encode; `logits` holds the last hidden states (B, T, C), `embeddings` their `pooling` (`pool_states`).

        The sentence vectors come out of the forward itself, so that a bi-encoder trained under DDP (whose wrapper
        synchronises gradients through `forward` only) gets them as any head gets its logits.
        """
        if labels is not None:
            raise ValueError("a bare Backbone has no loss; use MaskedLM or SequenceClassifier")
        x, hidden, pooled = self.run_backbone(
            input_ids, attention_mask, token_type_ids, output_hidden_states, position_ids, document_ids=document_ids
        )
        embeddings = None if pooling is None else pool_states(x, attention_mask, pooling, pooled)
        return ModelOutput(logits=x, hidden_states=hidden, pooled=pooled, embeddings=embeddings)


def pool_states(x: Tensor, attention_mask: Tensor | None, pooling: str, pooled: Tensor | None = None) -> Tensor:
    """A sentence vector per row from the last hidden states x (B, T, C) -> (B, C).

    `cls`: the first token's state (BERT's [CLS]); `mean`: the mean over the real tokens (Sentence-BERT's default,
    text2vec's CoSENT models); `pooler`: the backbone's pooler on the first token (`pooled`: BERT's tanh layer,
    RoFormer-Sim's linear one, whose output is the vector Sim was trained to compare by cosine); `last`: the last
    real token's state (left or right padding), as sentence-transformers' `lasttoken`.

    Raises:
        ValueError: an unknown pooling, or `pooler` without a pooler.
    """
    if pooling == "cls":
        return x[:, 0]
    if pooling == "pooler":
        if pooled is None:
            raise ValueError("pooling 'pooler' needs a model with a pooler (add_pooler: true); use cls or mean")
        return pooled
    keep = torch.ones(x.shape[:2], device=x.device) if attention_mask is None else attention_mask.to(x.dtype)
    if pooling == "mean":
        summed = (x * keep[..., None]).sum(dim=1)  # (B, C)
        return summed / keep.sum(dim=1, keepdim=True).clamp(min=1)
    if pooling == "last":
        T = x.shape[1]
        # the highest position holding a real token: the last one, whichever side the padding is on
        last = (keep * torch.arange(1, T + 1, device=x.device)).argmax(dim=1)  # (B,)
        return x[torch.arange(x.shape[0], device=x.device), last]
    raise ValueError(f"unknown pooling {pooling!r}: expected one of {', '.join(POOLINGS)}")


IGNORE_INDEX = -100  # labels at this value are not scored (the cross-entropy's ignore_index, as in HF)


def token_cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy of (..., V) logits against labels, positions labelled IGNORE_INDEX not scored."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=IGNORE_INDEX)


def head_dropout(config: ModelConfig) -> Dropout:
    """The dropout of a task head: classifier_dropout, else hidden_dropout."""
    return Dropout(config.hidden_dropout if config.classifier_dropout is None else config.classifier_dropout)


def with_pooler_for_head(config: ModelConfig) -> ModelConfig:
    """A head that summarises through BERT's pooler (`classifier_head: pooler`) needs the backbone to have one."""
    return replace(config, add_pooler=True) if config.classifier_head == "pooler" else config


class LanguageModel(Model):
    """A backbone with a vocabulary head, shared by `MaskedLM` and `CausalLM`.

    `mlm_head: transform` is BERT's: dense -> act -> norm -> decoder (+ bias); `bare` is RoFormerV2's: the decoder
    alone. The decoder is tied to the word embeddings unless `tie_word_embeddings` is false.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.backbone = Backbone(config, init=False)
        dim = config.embedding_dim
        bare = config.mlm_head == "bare"
        self.transform = None if bare else nn.Linear(config.hidden_size, dim)
        self.transform_norm = None if bare else make_norm(config, dim)
        self.act = ACTIVATIONS[config.hidden_act]
        self.decoder = None if config.tie_word_embeddings else nn.Linear(dim, config.vocab_size, bias=False)
        self.decoder_bias = None if bare else nn.Parameter(torch.zeros(config.vocab_size))
        self.init_weights()

    @property
    def decoder_weight(self) -> Tensor:
        """(V, E) output projection: the word embeddings when tied."""
        return self.backbone.embeddings.word.weight if self.decoder is None else self.decoder.weight

    def vocabulary_logits(self, x: Tensor) -> Tensor:
        """Hidden states (..., C) -> logits over the vocabulary (..., V)."""
        if self.transform is not None:
            x = self.transform_norm(self.act(self.transform(x)))
        return F.linear(x, self.decoder_weight, self.decoder_bias)


class MaskedLM(LanguageModel):
    """Backbone + MLM head: dense -> act -> LayerNorm -> decoder tied to the word embeddings (+ bias), as BERT."""

    architecture = "masked_lm"
    last_layer_subset = False  # `set_last_layer_subset`

    def set_last_layer_subset(self, enabled: bool = True) -> None:
        """With `masked_only` and `masked_positions`, compute the last block at the masked positions alone.

        They are its only queries and the only rows of its FFN (keys and values still from every token), which
        leaves their logits as they were (flash-attention's BERT `last_layer_subset`; tests/unit/
        test_last_layer_subset.py) and saves the rest of the last block: about 85% of it at 15% masking.
        """
        self.last_layer_subset = enabled

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_hidden_states: bool = False,
        masked_only: bool = False,
        masked_positions: Tensor | None = None,
        position_ids: Tensor | None = None,
        document_ids: Tensor | None = None,
    ) -> ModelOutput:
        """MLM logits and, with `labels` (IGNORE_INDEX: not scored), the mean cross-entropy over the scored ones.

        With `masked_only=True` the vocabulary projection runs only at labelled positions (logits (N, V)): the
        decoder is the largest matmul of a small model and ~85% of its rows would be thrown away. Their flat indices
        into (B*T) may be given as `masked_positions` (N,), padded with positions labelled IGNORE_INDEX to a bucketed
        length (roformer.data.masking.masked_positions): a fixed shape, so torch.compile traces one graph where the
        boolean selection would break it at every new masked-token count. With `set_last_layer_subset`, the last
        block computes those positions alone.
        """
        if masked_only and labels is None:
            raise ValueError("masked_only=True needs labels")
        subset = masked_only and masked_positions is not None and self.last_layer_subset and not output_hidden_states
        if subset:  # the last block computes the masked positions alone (`Backbone.encode`'s queries)
            x, _ = self.backbone.encode(
                input_ids, attention_mask, token_type_ids, False, position_ids, None, document_ids, masked_positions
            )  # (N, C)
            labels, hidden, pooled = labels.flatten()[masked_positions], None, None
        else:
            x, hidden, pooled = self.run_backbone(
                input_ids, attention_mask, token_type_ids, output_hidden_states, position_ids, document_ids=document_ids
            )
        if masked_only and not subset:
            if masked_positions is None:
                selected = labels != IGNORE_INDEX  # (B, T)
                x, labels = x[selected], labels[selected]  # (N, C), (N,)
            else:
                x, labels = x.flatten(0, 1)[masked_positions], labels.flatten()[masked_positions]  # (N, C), (N,)
        logits = self.vocabulary_logits(x)  # (B, T, V) or (N, V)
        loss = token_cross_entropy(logits, labels) if labels is not None else None
        return ModelOutput(logits=logits, loss=loss, hidden_states=hidden, pooled=pooled)


def query_subset_applies(ctx: AttentionContext, config: ModelConfig) -> bool:
    """Whether the last block can compute a subset of queries alone (`Block.forward_queries`).

    Softmax attention, bidirectional, no cache; not Shaw's per-query value terms nor SelfExtend's grouped products.
    """
    return (
        config.attention == "softmax"
        and ctx.shaw is None
        and not ctx.causal
        and ctx.cache is None
        and not isinstance(ctx.rotary, GroupedRotation)
        and config.attention_pattern == "bidirectional"
    )


def as_decoder(config: ModelConfig) -> ModelConfig:
    """A causal LM attends causally: a bidirectional pattern (an encoder's config) becomes causal; unilm is kept."""
    return replace(config, attention_pattern="causal") if config.attention_pattern == "bidirectional" else config


class CausalLM(LanguageModel):
    """Backbone as a decoder + the MLM head predicting the next token (HF's RoFormerForCausalLM, RoFormer-Sim).

    Attention is causal, or UniLM's sequence-to-sequence mask (`attention_pattern: unilm`: the prompt, segment A,
    is read bidirectionally and segment B is generated left to right). `generate` decodes with a KV cache.
    """

    architecture = "causal_lm"
    adapt_config = staticmethod(as_decoder)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(self.adapt_config(config))

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_hidden_states: bool = False,
        position_ids: Tensor | None = None,
        cache: KVCache | None = None,
        document_ids: Tensor | None = None,
    ) -> ModelOutput:
        """(B, T, V) next-token logits; with labels (B, T), the mean cross-entropy of logits[:, t] vs labels[:, t+1].

        Labels are the input ids themselves (shifted here, as in HF), IGNORE_INDEX where not scored (the prompt of a
        sequence-to-sequence pair, padding). With a `cache`, the input is the tokens after the cached ones.
        """
        x, hidden, pooled = self.run_backbone(
            input_ids, attention_mask, token_type_ids, output_hidden_states, position_ids, cache, document_ids
        )
        logits = self.vocabulary_logits(x)  # (B, T, V)
        loss = None
        if labels is not None:  # shift the labels, not the logits: no copy of the (B, T, V) logits and their gradient
            ignore = torch.full_like(labels[:, :1], IGNORE_INDEX)
            loss = token_cross_entropy(logits, torch.cat([labels[:, 1:], ignore], dim=1))
        return ModelOutput(logits=logits, loss=loss, hidden_states=hidden, pooled=pooled)

    def next_token_logits(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        token_type_ids: Tensor | None,
        position_ids: Tensor,
        cache: KVCache,
    ) -> Tensor:
        """(B, V) logits at the last position only: generation needs no others (the vocabulary matmul is T x less)."""
        x, _ = self.backbone.encode(input_ids, attention_mask, token_type_ids, False, position_ids, cache)
        return self.vocabulary_logits(x[:, -1])

    @torch.no_grad()
    def generate(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        max_new_tokens: int = 20,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | None = None,
        pad_token_id: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Continue left-padded prompts (B, T) with a KV cache: (B, T + N) ids, N <= max_new_tokens.

        Greedy unless `do_sample`; the arguments are those of `roformer.model.generation.generate` and HF's.
        """
        sampling = Sampling(do_sample, temperature, top_k, top_p)
        return generate(
            self,
            input_ids,
            attention_mask,
            token_type_ids,
            max_new_tokens,
            sampling,
            eos_token_id,
            pad_token_id,
            generator,
        )


class SequenceClassifier(Model):
    """Backbone + classification/regression head on x[:, 0].

    `classifier_head: pooler` is BERT's: tanh pooler, dropout, linear. `mlp` is HF RoFormer's: dropout, dense,
    hidden_act, dropout, linear. `mean` is the RoFormer authors' head for CAIL2019-SCM (`finetune_scm.py`: average
    pooling over the real tokens, then one dense unit): the mean state, dropout, linear. num_labels = 1 means
    regression with MSE loss (a task may score the one logit its own way, as `type: triplet` does with BCE).
    """

    architecture = "sequence_classification"
    adapt_config = staticmethod(with_pooler_for_head)

    def __init__(self, config: ModelConfig) -> None:
        config = self.adapt_config(config)
        super().__init__(config)
        self.backbone = Backbone(config, init=False)
        C = config.hidden_size
        self.dense = nn.Linear(C, C) if config.classifier_head == "mlp" else None
        self.act = ACTIVATIONS[config.hidden_act]
        self.dropout = head_dropout(config)
        self.out = nn.Linear(C, config.num_labels)
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_hidden_states: bool = False,
        position_ids: Tensor | None = None,
        document_ids: Tensor | None = None,
    ) -> ModelOutput:
        """(B, num_labels) logits; with labels: MSE (1 label), cross-entropy (int labels) or BCE (float labels)."""
        x, hidden, pooled = self.run_backbone(
            input_ids, attention_mask, token_type_ids, output_hidden_states, position_ids, document_ids=document_ids
        )
        if self.config.classifier_head == "mean":
            h = self.dropout(pool_states(x, attention_mask, "mean"))
        elif self.dense is None:
            h = self.dropout(pooled)
        else:
            h = self.dropout(self.act(self.dense(self.dropout(x[:, 0]))))
        logits = self.out(h)  # (B, L)
        return ModelOutput(logits=logits, loss=self.loss(logits, labels), hidden_states=hidden, pooled=pooled)

    def loss(self, logits: Tensor, labels: Tensor | None) -> Tensor | None:
        """Regression, single-label or multi-label loss, chosen as HF does from num_labels and the label dtype."""
        if labels is None:
            return None
        if self.config.num_labels == 1:
            return F.mse_loss(logits.squeeze(-1).float(), labels.view(-1).float())
        if labels.dtype.is_floating_point:
            return F.binary_cross_entropy_with_logits(logits.float(), labels.float())
        return F.cross_entropy(logits.float(), labels.view(-1))


class TokenClassifier(Model):
    """Backbone + a label per token: dropout, linear (HF's RoFormer/BertForTokenClassification)."""

    architecture = "token_classification"

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.backbone = Backbone(config, init=False)
        self.dropout = head_dropout(config)
        self.out = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_hidden_states: bool = False,
        position_ids: Tensor | None = None,
        document_ids: Tensor | None = None,
    ) -> ModelOutput:
        """(B, T, num_labels) logits; with labels (B, T) (IGNORE_INDEX: not scored), the mean cross-entropy."""
        x, hidden, pooled = self.run_backbone(
            input_ids, attention_mask, token_type_ids, output_hidden_states, position_ids, document_ids=document_ids
        )
        logits = self.out(self.dropout(x))  # (B, T, L)
        loss = token_cross_entropy(logits, labels) if labels is not None else None
        return ModelOutput(logits=logits, loss=loss, hidden_states=hidden, pooled=pooled)


class QuestionAnswering(Model):
    """Backbone + extractive QA: every token gets a start and an end logit (HF's ...ForQuestionAnswering).

    `logits` is (B, T, 2): [..., 0] start, [..., 1] end.
    """

    architecture = "question_answering"

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.backbone = Backbone(config, init=False)
        self.out = nn.Linear(config.hidden_size, 2)
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        start_positions: Tensor | None = None,
        end_positions: Tensor | None = None,
        output_hidden_states: bool = False,
        position_ids: Tensor | None = None,
        document_ids: Tensor | None = None,
    ) -> ModelOutput:
        """(B, T, 2) start/end logits; with both positions (B,), the mean of the start and end cross-entropies.

        Positions outside the input (an answer cut off by truncation) are clamped to T and not scored, as in HF.
        """
        x, hidden, pooled = self.run_backbone(
            input_ids, attention_mask, token_type_ids, output_hidden_states, position_ids, document_ids=document_ids
        )
        logits = self.out(x)  # (B, T, 2)
        loss = None
        if start_positions is not None and end_positions is not None:
            outside = logits.shape[1]
            start, end = (p.view(-1).clamp(0, outside) for p in (start_positions, end_positions))
            start_loss = F.cross_entropy(logits[..., 0].float(), start, ignore_index=outside)
            end_loss = F.cross_entropy(logits[..., 1].float(), end, ignore_index=outside)
            loss = (start_loss + end_loss) / 2
        return ModelOutput(logits=logits, loss=loss, hidden_states=hidden, pooled=pooled)


class MultipleChoice(Model):
    """Backbone + one score per choice: inputs (B, K, T), logits (B, K), cross-entropy over the K choices.

    The summary of a choice follows `classifier_head`: `pooler` is BERT's (tanh pooler on x[:, 0], dropout); `mlp` is
    HF RoFormer's sequence summary with its defaults (the hidden state of the last position, nothing else); `mean` the
    mean over the choice's real tokens, dropout.
    """

    architecture = "multiple_choice"
    adapt_config = staticmethod(with_pooler_for_head)

    def __init__(self, config: ModelConfig) -> None:
        config = self.adapt_config(config)
        super().__init__(config)
        self.backbone = Backbone(config, init=False)
        self.dropout = head_dropout(config)
        self.out = nn.Linear(config.hidden_size, 1)
        self.init_weights()

    @property
    def reads_padding(self) -> bool:
        """The `mlp` summary is the last position's state (HF's SequenceSummary `last`), padding or not."""
        return self.config.classifier_head == "mlp"

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_hidden_states: bool = False,
        position_ids: Tensor | None = None,
        document_ids: Tensor | None = None,
    ) -> ModelOutput:
        """(B, K, T) ids of K choices each -> (B, K) logits; with labels (B,), the cross-entropy over choices."""
        B, K, T = input_ids.shape
        ids, mask, types, positions, documents = (
            t.reshape(B * K, T) if t is not None else None
            for t in (input_ids, attention_mask, token_type_ids, position_ids, document_ids)
        )
        x, hidden, pooled = self.run_backbone(
            ids, mask, types, output_hidden_states, positions, document_ids=documents
        )  # (B*K, T, C), (B*K, C)
        if self.config.classifier_head == "pooler":
            summary = self.dropout(pooled)  # (B*K, C)
        elif self.config.classifier_head == "mean":
            summary = self.dropout(pool_states(x, mask, "mean"))  # (B*K, C)
        else:
            summary = x[:, -1]  # (B*K, C)
        logits = self.out(summary).view(B, K)
        loss = F.cross_entropy(logits.float(), labels.view(-1)) if labels is not None else None
        pooled = pooled.view(B, K, -1) if pooled is not None else None
        return ModelOutput(logits=logits, loss=loss, hidden_states=hidden, pooled=pooled)


ARCHITECTURES: dict[str, type[Model]] = {
    cls.architecture: cls
    for cls in (Backbone, MaskedLM, SequenceClassifier, TokenClassifier, QuestionAnswering, MultipleChoice, CausalLM)
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
            `question_answering`, `multiple_choice` or `causal_lm`; None = the saved one. A different one keeps the
            backbone weights and initialises the new head (logged).
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
    rotary = config.position_encoding == "rotary"
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

    With `rotary_value` the values are rotated too, so the output projection's input columns are permuted back.
    """
    config = model.config
    if config.position_encoding != "rotary":
        raise ValueError("rotary layouts only apply to position_encoding: rotary")
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
