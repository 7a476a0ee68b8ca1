"""The backbone every model stands on, and the base class of the models.

`Model` holds what every architecture shares (config, BERT init, `save`, the switches of how a forward computes);
`Backbone` is the encoder itself: embeddings, post-LN blocks and an optional BERT pooler, with its forward planned
once (`Backbone.plan`, `roformer.model.plan`) before the first block. The task heads on top are in
`roformer.model.heads`. Plain PyTorch: no training, logging or distributed code lives here.

References:
    Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding", arXiv 2104.09864 ("paper").
    Devlin et al. 2019, BERT.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Unpack

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from roformer.model.attention import ForwardInputs
from roformer.model.config import POOLINGS, ModelConfig, RopeScaling
from roformer.model.layers import Block, Embeddings, make_norm
from roformer.model.plan import ForwardPlan, plan_forward
from roformer.model.positions import attention_positions
from roformer.model.rotary import RotaryEmbedding
from roformer.model.terms import AttentionPositions
from roformer.model.weights import save_model


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
        """The init std of a linear or embedding weight: its own `init_std`, initializer_range (BERT), or RoFormerV2's.

        V2 (bert4keras `RoFormerV2.initializer`): 1.13684723 / sqrt(fan_in) x num_layers^-1/2, where 1.13684723 is
        1 / std of a unit normal truncated at 2 std, so the drawn weights have std 1 / sqrt(fan_in) before the depth
        factor. fan_in is a linear layer's input width and an embedding's width (bert4keras takes the width for
        tables with more than 10000 or fewer than 10 rows, i.e. every real vocabulary and the token types).
        """
        own = getattr(module, "init_std", None)  # a module that needs its own scale says so (FIRE's f_theta)
        if own is not None:
            return own
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
        **inputs: Unpack[ForwardInputs],
    ) -> tuple[Tensor, tuple[Tensor, ...] | None, Tensor | None]:
        """Every model's opening: encode the batch, then pool it, before any head reads the hidden states.

        `inputs` (`ForwardInputs`) reach the backbone as the head was given them.

        Returns:
            The last hidden states (B, T, C); all hidden states when asked (`Backbone.encode`), else None; the
            pooler's output (B, C), or None without a pooler or with a `cache` (x[:, 0] is then not the first token).
        """
        backbone = self.base_model
        x, hidden = backbone.encode(input_ids, attention_mask, token_type_ids, **inputs)
        return x, hidden, backbone.pooled(x) if inputs.get("cache") is None else None

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
        """Attend with a variable-length kernel where one applies (`roformer.model.plan.blocks_kernel`), or not.

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
        # pre-LN blocks leave the residual stream unnormalised: one norm after the last (GPT-2's ln_f)
        self.final_norm = make_norm(config, config.hidden_size) if config.norm_position == "pre" else None
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

    def plan(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        queries: Tensor | None = None,
        **inputs: Unpack[ForwardInputs],
    ) -> ForwardPlan:
        """Decide once, for every block, this forward's token layout and attention kernel (`roformer.model.plan`).

        Reads the backbone's state: its config and position encoding, `unpadding` and `varlen_attention`, training
        mode, and the dtype attention computes in.
        """
        return plan_forward(
            self.config,
            self.positions,
            input_ids,
            attention_mask,
            token_type_ids,
            inputs,
            queries=queries,
            dtype=self.compute_dtype(input_ids.device),
            training=self.training,
            unpadding=self.unpadding,
            varlen=self.varlen_attention,
        )

    def encode(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        queries: Tensor | None = None,
        **inputs: Unpack[ForwardInputs],
    ) -> tuple[Tensor, tuple[Tensor, ...] | None]:
        """(B, T) ids -> last hidden states (B, T, C), and all hidden states when asked (`output_hidden_states`).

        `queries` (Q,) flat positions into (B*T) asks for the last hidden states there alone, (Q, C): the last block
        then computes only those positions as queries and through its FFN, every token still a key and value (the
        masked positions of MLM); where that does not apply (Shaw, linear attention, SelfExtend, causal attention)
        the whole grid is computed and the positions taken. Not with `output_hidden_states`.

        `inputs` are the forward's `ForwardInputs` (positions, packed documents, hidden states, a decoder's cache):
        which keys a token sees follows `config.attention_pattern`, its padding, its document and the cache.
        """
        plan = self.plan(input_ids, attention_mask, token_type_ids, queries, **inputs)
        x = self.embeddings(input_ids, token_type_ids, plan.inputs["position_ids"], plan.tokens)  # (B, T, C) / (N, C)
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        hidden = [plan.grid(x)] if plan.inputs.get("output_hidden_states") else None
        for i, block in enumerate(self.layers):
            ctx = plan.context(i, len(self.layers))
            if ctx.queries is not None:
                x = plan.grid(x)  # (B, T, C): every token a key and value, the queries alone computed
            if recompute:  # dropout masks are replayed: the same values and gradients as without
                # non-reentrant: the context, a dataclass holding tensors, needs no unpacking into tensor arguments
                x = checkpoint(block, x, ctx, use_reentrant=False)
            else:
                x = block(x, ctx)
            if hidden is not None:
                hidden.append(plan.grid(x))
        if self.final_norm is not None:
            x = self.final_norm(x)
            if hidden is not None:
                hidden[-1] = plan.grid(x)  # the last hidden states are the normalised ones, as the output
        return plan.output(x), tuple(hidden) if hidden is not None else None

    def compute_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype attention computes in: autocast's on `device` when on, else the weights'."""
        if torch.is_autocast_enabled(device.type):
            return torch.get_autocast_dtype(device.type)
        return self.layers[0].attn.qkv.weight.dtype

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
        *,
        pooling: str | None = None,
        **inputs: Unpack[ForwardInputs],
    ) -> ModelOutput:
        """Encode; `logits` holds the last hidden states (B, T, C), `embeddings` their `pooling` (`pool_states`).

        The sentence vectors come out of the forward itself, so that a bi-encoder trained under DDP (whose wrapper
        synchronises gradients through `forward` only) gets them as any head gets its logits.
        """
        if labels is not None:
            raise ValueError("a bare Backbone has no loss; use MaskedLM or SequenceClassifier")
        x, hidden, pooled = self.run_backbone(input_ids, attention_mask, token_type_ids, **inputs)
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
