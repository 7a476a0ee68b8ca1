"""Every task head on the backbone, one class per architecture, as HF RoFormer/BERT have them.

`masked_lm` (MaskedLM), `causal_lm` (CausalLM, a decoder), `sequence_classification` (SequenceClassifier),
`token_classification` (TokenClassifier), `question_answering` (QuestionAnswering) and `multiple_choice`
(MultipleChoice); `backbone` (Backbone, no head) is in `roformer.model.backbone`. Each head is the backbone plus one
small module: `forward(input_ids, attention_mask=None, token_type_ids=None, labels=None, **inputs)`, its labels
named as HF names them, and the forward's `ForwardInputs` handed to the backbone unread, so `model(**batch)` works for
every head and a new per-forward input touches no head.

References:
    Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding", arXiv 2104.09864 ("paper").
    Devlin et al. 2019, BERT.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Unpack

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from roformer.labels import IGNORE_INDEX
from roformer.model.attention import PER_ROW_INPUTS, ForwardInputs
from roformer.model.backbone import Backbone, Model, ModelOutput, pool_states
from roformer.model.config import ModelConfig
from roformer.model.dropout import Dropout
from roformer.model.generation import Sampling, generate
from roformer.model.layers import ACTIVATIONS, make_norm
from roformer.model.masks import KVCache


def token_cross_entropy(logits: Tensor, labels: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """Mean cross-entropy of (..., V) logits against labels, positions labelled IGNORE_INDEX not scored.

    `label_smoothing` eps: the target is (1 - eps) on the label and eps / V on every token (torch's and HF's
    `label_smoothing`, Szegedy et al. 2016).
    """
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        labels.reshape(-1),
        ignore_index=IGNORE_INDEX,
        label_smoothing=label_smoothing,
    )


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
        *,
        masked_only: bool = False,
        masked_positions: Tensor | None = None,
        **inputs: Unpack[ForwardInputs],
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
        subset = (
            masked_only
            and masked_positions is not None
            and self.last_layer_subset
            and not inputs.get("output_hidden_states")
        )
        if subset:  # the last block computes the masked positions alone (`Backbone.encode`'s queries)
            x, _ = self.backbone.encode(input_ids, attention_mask, token_type_ids, masked_positions, **inputs)  # (N, C)
            labels, hidden, pooled = labels.flatten()[masked_positions], None, None
        else:
            x, hidden, pooled = self.run_backbone(input_ids, attention_mask, token_type_ids, **inputs)
        if masked_only and not subset:
            if masked_positions is None:
                selected = labels != IGNORE_INDEX  # (B, T)
                x, labels = x[selected], labels[selected]  # (N, C), (N,)
            else:
                x, labels = x.flatten(0, 1)[masked_positions], labels.flatten()[masked_positions]  # (N, C), (N,)
        logits = self.vocabulary_logits(x)  # (B, T, V) or (N, V)
        loss = token_cross_entropy(logits, labels) if labels is not None else None
        return ModelOutput(logits=logits, loss=loss, hidden_states=hidden, pooled=pooled)


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
        **inputs: Unpack[ForwardInputs],
    ) -> ModelOutput:
        """(B, T, V) next-token logits; with labels (B, T), the mean cross-entropy of logits[:, t] vs labels[:, t+1].

        Labels are the input ids themselves (shifted here, as in HF), IGNORE_INDEX where not scored (the prompt of a
        sequence-to-sequence pair, padding). With a `cache`, the input is the tokens after the cached ones.
        """
        x, hidden, pooled = self.run_backbone(input_ids, attention_mask, token_type_ids, **inputs)
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
        x, _ = self.backbone.encode(input_ids, attention_mask, token_type_ids, position_ids=position_ids, cache=cache)
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
        **inputs: Unpack[ForwardInputs],
    ) -> ModelOutput:
        """(B, num_labels) logits; with labels: MSE (1 label), cross-entropy (int labels) or BCE (float labels)."""
        x, hidden, pooled = self.run_backbone(input_ids, attention_mask, token_type_ids, **inputs)
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
        **inputs: Unpack[ForwardInputs],
    ) -> ModelOutput:
        """(B, T, num_labels) logits; with labels (B, T) (IGNORE_INDEX: not scored), the mean cross-entropy."""
        x, hidden, pooled = self.run_backbone(input_ids, attention_mask, token_type_ids, **inputs)
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
        **inputs: Unpack[ForwardInputs],
    ) -> ModelOutput:
        """(B, T, 2) start/end logits; with both positions (B,), the mean of the start and end cross-entropies.

        Positions outside the input (an answer cut off by truncation) are clamped to T and not scored, as in HF.
        """
        x, hidden, pooled = self.run_backbone(input_ids, attention_mask, token_type_ids, **inputs)
        logits = self.out(x)  # (B, T, 2)
        loss = None
        if start_positions is not None and end_positions is not None:
            outside = logits.shape[1]
            start, end = (p.view(-1).clamp(0, outside) for p in (start_positions, end_positions))
            start_loss = F.cross_entropy(logits[..., 0].float(), start, ignore_index=outside)
            end_loss = F.cross_entropy(logits[..., 1].float(), end, ignore_index=outside)
            loss = (start_loss + end_loss) / 2
        return ModelOutput(logits=logits, loss=loss, hidden_states=hidden, pooled=pooled)


def choices_as_rows(inputs: ForwardInputs, rows: int) -> ForwardInputs:
    """The per-row `inputs` of (B, K, ...) choices as `rows` = B*K rows (B*K, ...); every other input as given.

    Which are per row is declared (`PER_ROW_INPUTS`), not guessed from a tensor's type: a new input of the whole
    batch (a tensor too) is not cut into choices.
    """
    return {k: v.reshape(rows, *v.shape[2:]) if k in PER_ROW_INPUTS and v is not None else v for k, v in inputs.items()}


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
        **inputs: Unpack[ForwardInputs],
    ) -> ModelOutput:
        """(B, K, T) ids of K choices each -> (B, K) logits; with labels (B,), the cross-entropy over choices."""
        B, K, T = input_ids.shape
        ids, mask, types = (
            t.reshape(B * K, T) if t is not None else None for t in (input_ids, attention_mask, token_type_ids)
        )
        inputs = choices_as_rows(inputs, B * K)
        x, hidden, pooled = self.run_backbone(ids, mask, types, **inputs)  # (B*K, T, C), (B*K, C)
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
