"""The encoder-decoder: translation with RoPE in both halves (the paper's Table 1 setup, Transformer-base with RoPE).

`EncoderDecoder` is a `Backbone` encoder and a `CausalLM` decoder of the same family whose blocks also attend to
the encoder's last hidden states: self-attention (causal, with the decoder's own position encoding) -> add & norm ->
cross-attention -> add & norm -> feed-forward -> add & norm, post-LN like the encoder (HF's decoder layer with
`add_cross_attention`). Cross-attention applies no position encoding (HF RoFormer, OpenNMT and x-transformers
neither): a source token's position is in the encoder's states already. The decoder's output projection is its word
embeddings (tied, as HF's RoFormerForCausalLM); `share_embeddings` makes those the encoder's too (a joint
vocabulary, fairseq's `--share-all-embeddings`). Encoder states of another width are projected to the decoder's
(HF's `enc_to_dec_proj`).

The encoder's states reach the decoder as forward inputs (`encoder_states`, `encoder_mask`), which the forward plan
turns into every block's cross-attention context; a `KVCache` keeps the decoder's self-attention keys and values and
its projection of the encoder's states while a target is decoded one token at a time (`roformer.model.beam`: greedy
and beam search). `roformer.from_hf` / `to_hf` convert HF's `EncoderDecoderModel` of RoFormer or BERT halves.

References:
    Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding", arXiv 2104.09864 (sec. 4.2,
    table 1: WMT 2014 English-German). Vaswani et al. 2017, "Attention is all you need" (the encoder-decoder).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor, nn

from roformer.labels import IGNORE_INDEX
from roformer.model import beam
from roformer.model.backbone import Backbone, Model
from roformer.model.config import EncoderDecoderConfig, RopeScaling
from roformer.model.heads import CausalLM, token_cross_entropy
from roformer.model.masks import KVCache
from roformer.model.search import SearchConfig

# The decoder's word table when it is the encoder's (`share_embeddings`): one parameter, saved once under the
# encoder's name.
SHARED_TABLE = "decoder.backbone.embeddings.word.weight"
SOURCE_TABLE = "encoder.embeddings.word.weight"


@dataclass
class Seq2SeqOutput:
    """What `EncoderDecoder` returns.

    Attributes:
        logits: (B, T, V) the decoder's next-token logits at every target position.
        loss: The mean cross-entropy of `logits` against `labels` (IGNORE_INDEX not scored), when labels were given.
        encoder_states: (B, S, C) the encoder's last hidden states, in the decoder's width (to decode without
            encoding again).
    """

    logits: Tensor
    loss: Tensor | None = None
    encoder_states: Tensor | None = None


def shifted_right(labels: Tensor, start: int, pad: int) -> Tensor:
    """The decoder's inputs of `labels` (B, T): the start token, then labels[:, :-1]; IGNORE_INDEX becomes `pad`.

    As HF's `shift_tokens_right`: position t then predicts labels[:, t] (teacher forcing).
    """
    ids = labels.new_full(labels.shape, start)
    ids[:, 1:] = labels[:, :-1]
    return ids.masked_fill(ids == IGNORE_INDEX, pad)


class EncoderDecoder(Model):
    """An encoder (`Backbone`) and a decoder (`CausalLM` with cross-attention): sequence to sequence.

    `forward` is teacher-forced (logits and the loss of a target); `encode`, `decode` and `next_token_logits` are its
    parts; `generate` searches for targets as a `SearchConfig` says (greedy or beam search, `roformer.model.beam`).
    """

    architecture = "encoder_decoder"

    def __init__(self, config: EncoderDecoderConfig) -> None:
        super().__init__(config)
        self.encoder = Backbone(config.encoder, init=False)
        self.decoder = CausalLM(config.decoder)  # initialised by itself
        source, target = config.encoder.hidden_size, config.decoder.hidden_size
        self.encoder_projection = nn.Linear(source, target) if source != target else None
        if config.share_embeddings:
            self.decoder.backbone.embeddings.word = self.encoder.embeddings.word
            # saved once (safetensors refuses two names for one tensor) and filled in again on loading
            self.register_state_dict_post_hook(_drop_shared_table)
            self.register_load_state_dict_pre_hook(_fill_shared_table)
        self._init_encoder_side()

    def init_weights(self) -> None:
        """Every weight drawn again: the decoder's, then the encoder's (a shared table is the encoder's draw)."""
        self.decoder.init_weights()
        self._init_encoder_side()

    def _init_encoder_side(self) -> None:
        self.encoder.init_weights()
        if self.encoder_projection is not None:
            weight = self.encoder_projection.weight
            self.decoder._normal_(weight, self.decoder.weight_std(self.encoder_projection), "encoder_projection.weight")
            nn.init.zeros_(self.encoder_projection.bias)

    @property
    def base_model(self) -> Backbone:
        """The encoder (what `embed` pools)."""
        return self.encoder

    def set_rotary(self, base: float, scaling: RopeScaling | None = None) -> None:
        """Rotate by another base and context scaling from now on, in every half with rotary positions.

        Raises:
            ValueError: neither half has rotary positions.
        """
        halves = [h for h in (self.encoder, self.decoder) if h.config.position_encoding == "rotary"]
        if not halves:
            raise ValueError("set_rotary needs position_encoding: rotary in the encoder or the decoder")
        for half in halves:
            half.set_rotary(base, scaling)
        self.config = replace(self.config, encoder=self.encoder.config, decoder=self.decoder.config)

    def encode(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None
    ) -> Tensor:
        """(B, S) source ids -> (B, S, C) the encoder's last hidden states, in the decoder's width C."""
        states, _ = self.encoder.encode(input_ids, attention_mask, token_type_ids)
        return states if self.encoder_projection is None else self.encoder_projection(states)

    def decode(
        self,
        decoder_input_ids: Tensor,
        encoder_states: Tensor,
        encoder_mask: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """(B, T) target ids -> (B, T, V) next-token logits, attending to `encoder_states` (B, S, C).

        With a `cache`, the ids are the tokens after the cached ones, at the positions that follow them.
        """
        inputs = {"encoder_states": encoder_states, "encoder_mask": encoder_mask, "cache": cache}
        return self.decoder(decoder_input_ids, decoder_attention_mask, **inputs).logits

    def next_token_logits(
        self, decoder_input_ids: Tensor, encoder_states: Tensor, encoder_mask: Tensor | None, cache: KVCache
    ) -> Tensor:
        """(B, V) logits at the last new position only: decoding needs no others (the vocabulary matmul is T x less)."""
        x, _ = self.decoder.backbone.encode(
            decoder_input_ids, cache=cache, encoder_states=encoder_states, encoder_mask=encoder_mask
        )  # (B, T, C)
        return self.decoder.vocabulary_logits(x[:, -1])

    def forward(
        self,
        input_ids: Tensor | None,
        attention_mask: Tensor | None = None,
        decoder_input_ids: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        *,
        token_type_ids: Tensor | None = None,
        encoder_states: Tensor | None = None,
        cache: KVCache | None = None,
        label_smoothing: float = 0.0,
    ) -> Seq2SeqOutput:
        """Teacher forcing: the logits of every target position and, with `labels`, the mean cross-entropy.

        Args:
            input_ids: (B, S) source ids (None with `encoder_states`).
            attention_mask: (B, S) 1 for real source tokens, 0 for padding; None = no padding.
            decoder_input_ids: (B, T) target ids, starting with `decoder_start_token_id`; None: `labels` shifted
                right behind it (`shifted_right`, as HF).
            decoder_attention_mask: (B, T) 1 for real target tokens. Right padding needs none: under causal
                attention no real token sees a later one, so the real positions' logits are the same without it.
            labels: (B, T) the token each position predicts (IGNORE_INDEX: not scored), aligned with the logits (not
                shifted again, as HF's EncoderDecoderModel).
            token_type_ids: (B, S) the source's token types, or None.
            encoder_states: (B, S, C) the encoder's states of an earlier call, to skip encoding.
            cache: A `KVCache` for the decoder (decoding step by step).
            label_smoothing: eps of the loss's label smoothing (0.1 in fairseq's and the paper's setups).

        Returns:
            `Seq2SeqOutput`: logits (B, T, V), loss, encoder states.
        """
        if decoder_input_ids is None:
            if labels is None:
                raise ValueError("decoder_input_ids or labels (shifted right behind the start token) are needed")
            decoder_input_ids = shifted_right(labels, self.start_token(), self.config.decoder.pad_token_id)
        if encoder_states is None:
            if input_ids is None:
                raise ValueError("input_ids or encoder_states are needed")
            encoder_states = self.encode(input_ids, attention_mask, token_type_ids)
        logits = self.decode(decoder_input_ids, encoder_states, attention_mask, decoder_attention_mask, cache)
        loss = None if labels is None else token_cross_entropy(logits, labels, label_smoothing)
        return Seq2SeqOutput(logits=logits, loss=loss, encoder_states=encoder_states)

    def start_token(self, given: int | None = None) -> int:
        """`given`, else the config's `decoder_start_token_id`.

        Raises:
            ValueError: neither is set.
        """
        start = self.config.decoder_start_token_id if given is None else given
        if start is None:
            raise ValueError("decoder_start_token_id is not set (EncoderDecoderConfig or the call)")
        return start

    @torch.no_grad()
    def generate(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        *,
        search: SearchConfig | None = None,
        decoder_start_token_id: int | None = None,
        eos_token_id: int | None = None,
        pad_token_id: int | None = None,
        **settings: Any,
    ) -> Tensor:
        """The best target of every source: greedy (`num_beams` 1) or beam search, with a KV cache.

        As HF `generate` with a `GenerationConfig`: the search is `search` (default: `SearchConfig()`), any of its
        fields given by keyword replacing its own (`num_beams=4, max_new_tokens=12`, HF's names; see
        `roformer.model.beam`). A row generates at most int(max_len_a * its real source tokens + max_new_tokens)
        tokens. The ids default to the config's (`decoder_start_token_id`, `eos_token_id`) and the decoder's
        `pad_token_id`. Call it in eval mode.

        Returns:
            (B, 1 + N) ids: the start token, then each row's target, `pad_token_id` after its end.

        Raises:
            SearchValueError: a search setting out of range (a ValueError).
            TypeError: a keyword that is no `SearchConfig` field.
        """
        chosen = replace(search or SearchConfig(), **settings)
        eos = self.config.eos_token_id if eos_token_id is None else eos_token_id
        pad = self.config.decoder.pad_token_id if pad_token_id is None else pad_token_id
        states = self.encode(input_ids, attention_mask, token_type_ids)
        return beam.search(self, states, attention_mask, chosen, self.start_token(decoder_start_token_id), eos, pad)


def _drop_shared_table(module: nn.Module, state: dict[str, Any], prefix: str, metadata: Any) -> None:
    """A state dict holds the shared word table once, under the encoder's name."""
    state.pop(prefix + SHARED_TABLE, None)


def _fill_shared_table(
    module: nn.Module, state: dict[str, Any], prefix: str, metadata: Any, strict: bool, *errors: Any
) -> None:
    """The shared word table is loaded into the decoder's name too (the same parameter), so strict loading holds."""
    if prefix + SOURCE_TABLE in state and prefix + SHARED_TABLE not in state:
        state[prefix + SHARED_TABLE] = state[prefix + SOURCE_TABLE]
