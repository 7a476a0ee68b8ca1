"""The encoder-decoder (roformer.model.seq2seq, issue 56): decoding step by step equals the whole target for every
position encoding, cross-attention sees no positions, padding, the loss, shared embeddings, model directories, and
greedy and beam search (batched = alone, per-row length limits). Parity with HF is in test_seq2seq_hf.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import ENCODINGS, assert_checkpointing_changes_nothing, short_range, tiny_config
from torch.testing import assert_close

import roformer
from roformer.errors import CheckpointError, ConfigError
from roformer.model.attention import CrossAttention
from roformer.model.config import EncoderDecoderConfig
from roformer.model.masks import KVCache
from roformer.model.search import SearchConfig, SearchValueError
from roformer.model.seq2seq import SHARED_TABLE, EncoderDecoder, shifted_right

START, EOS, PAD = 1, 2, 0


def seq2seq_config(encoding: str = "rotary", decoder: str | None = None, **fields) -> EncoderDecoderConfig:
    """The tiny model as both halves (relative encodings saturating within a test), start 1, eos 2."""
    shared = {k: fields.pop(k) for k in ("share_embeddings",) if k in fields}
    return EncoderDecoderConfig(
        short_range(encoding, **fields),
        short_range(decoder or encoding, **fields),
        decoder_start_token_id=START,
        eos_token_id=EOS,
        **shared,
    )


def sources(batch: int = 3, length: int = 9, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Source ids right-padded to lengths 9, 6, 3 (pad 0) and their mask."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 101, (batch, length), generator=g)
    mask = (torch.arange(length) < torch.tensor([length - 3 * row for row in range(batch)])[:, None]).long()
    return ids.masked_fill(mask == 0, PAD), mask


def targets(batch: int = 3, length: int = 7, seed: int = 1) -> torch.Tensor:
    """Labels of lengths 7, 5, 3: IGNORE_INDEX (-100) after each row's end."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(3, 101, (batch, length), generator=g)
    ends = torch.tensor([length - 2 * row for row in range(batch)])[:, None]
    return labels.masked_fill(torch.arange(length) >= ends, -100)


def model_of(config: EncoderDecoderConfig, seed: int = 0) -> EncoderDecoder:
    torch.manual_seed(seed)
    return EncoderDecoder(config).eval()


# --- the decoder and its cache ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_decoding_step_by_step_equals_the_whole_target(encoding: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every position encoding at the right absolute positions; the encoder's keys and values projected once."""
    projected = []
    keys_values = CrossAttention.keys_values
    monkeypatch.setattr(CrossAttention, "keys_values", lambda self, s: projected.append(1) or keys_values(self, s))
    model = model_of(seq2seq_config(encoding))
    src, mask = sources()
    ids = shifted_right(targets().clamp(min=3), START, PAD)  # (3, 7), all real
    with torch.no_grad():
        states = model.encode(src, mask)
        whole = model.decode(ids, states, mask)  # (B, T, V)
        projected.clear()
        cache = KVCache()
        steps = [model.decode(ids[:, t : t + 1], states, mask, cache=cache) for t in range(ids.shape[1])]
        chunks_cache = KVCache(capacity=2)  # a prompt of 3, then 1, then the rest: positions continue, the cache grows
        chunks = [model.decode(ids[:, a:b], states, mask, cache=chunks_cache) for a, b in ((0, 3), (3, 4), (4, 7))]
        last = model.next_token_logits(ids[:, -1:], states, mask, KVCache())  # a fresh cache: position 0
    assert_close(torch.cat(steps, dim=1), whole)
    assert_close(torch.cat(chunks, dim=1), whole)
    assert len(projected) == 3 * model.config.decoder.num_layers  # once per layer and cache (3), not per step
    assert cache.length == ids.shape[1] and len(cache.cross_keys) == model.config.decoder.num_layers
    assert_close(last, model.decode(ids[:, -1:], states, mask)[:, -1])


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_cross_attention_sees_no_positions(encoding: str) -> None:
    """No position encoding in cross-attention (as HF RoFormer, OpenNMT, x-transformers): the decoder's outputs do not
    change when the encoder's states are reordered, whatever the decoder's self-attention uses."""
    model = model_of(seq2seq_config(encoding))
    src, mask = sources()
    ids = shifted_right(targets().clamp(min=3), START, PAD)
    order = torch.randperm(src.shape[1], generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        states = model.encode(src, mask)
        assert_close(model.decode(ids, states[:, order], mask[:, order]), model.decode(ids, states, mask))


@pytest.mark.parametrize("encoding", ["rotary", "learned", "t5_bias"])
def test_a_padded_source_and_target_are_what_they_are_alone(encoding: str) -> None:
    model = model_of(seq2seq_config(encoding))
    src, mask = sources()
    labels = targets()
    with torch.no_grad():
        batched = model(src, mask, labels=labels).logits
        for row in range(3):
            n, t = int(mask[row].sum()), int((labels[row] != -100).sum())
            alone = model(src[row : row + 1, :n], labels=labels[row : row + 1, :t]).logits
            assert_close(alone, batched[row : row + 1, :t])


def test_the_loss_is_the_cross_entropy_of_the_labels_with_label_smoothing() -> None:
    model = model_of(seq2seq_config())
    src, mask = sources()
    labels = targets()
    out = model(src, mask, labels=labels, label_smoothing=0.1)
    expected = F.cross_entropy(out.logits.flatten(0, 1), labels.flatten(), ignore_index=-100, label_smoothing=0.1)
    assert_close(out.loss, expected)
    decoder_input_ids = shifted_right(labels, START, PAD)  # the start token, then the labels; -100 -> pad
    assert decoder_input_ids[:, 0].eq(START).all() and torch.equal(decoder_input_ids[0, 1:], labels[0, :-1])
    assert not decoder_input_ids.eq(-100).any()
    again = model(src, mask, decoder_input_ids, labels=labels)
    assert_close(again.logits, out.logits)
    assert_close(model(None, mask, decoder_input_ids, encoder_states=out.encoder_states).logits, out.logits)
    out.loss.backward()
    assert model.encoder.layers[0].attn.qkv.weight.grad.abs().sum() > 0  # through cross-attention to the encoder
    with pytest.raises(ValueError, match="decoder_input_ids or labels"):
        model(src, mask)


def test_activation_checkpointing_and_unpadding_change_nothing() -> None:
    config = seq2seq_config(hidden_dropout=0.1, attention_dropout=0.1)
    src, mask = sources()
    labels = targets()
    decoder_mask = torch.cat([torch.ones(3, 1, dtype=torch.long), (labels[:, :-1] != -100).long()], dim=1)
    batch = {"input_ids": src, "attention_mask": mask, "labels": labels, "decoder_attention_mask": decoder_mask}
    assert_checkpointing_changes_nothing(lambda: EncoderDecoder(config), batch)
    model = model_of(seq2seq_config())
    with torch.no_grad():
        padded = model(**batch).logits
        model.set_unpadding(True)
        assert model.encoder.unpadding and model.decoder.backbone.unpadding
        unpadded = model(**batch).logits
    real = decoder_mask.bool()
    assert_close(unpadded[real], padded[real])


# --- the model: config, embeddings, directories ----------------------------------------------------------------------


def test_the_config_makes_the_decoder_a_decoder_and_checks_the_halves() -> None:
    config = EncoderDecoderConfig(tiny_config(), tiny_config())
    assert config.decoder.attention_pattern == "causal" and config.decoder.cross_attention
    assert config.encoder.attention_pattern == "bidirectional" and not config.encoder.cross_attention
    with pytest.raises(ConfigError, match="share_embeddings needs one vocabulary"):
        EncoderDecoderConfig(tiny_config(), tiny_config(vocab_size=50), share_embeddings=True)
    with pytest.raises(ConfigError, match="not unilm"):
        EncoderDecoderConfig(tiny_config(), tiny_config(attention_pattern="unilm"))
    with pytest.raises(ConfigError, match="eos_token_id"):
        EncoderDecoderConfig(tiny_config(), tiny_config(), eos_token_id=101)
    with pytest.raises(ConfigError, match="encoder.cross_attention"):
        EncoderDecoderConfig(tiny_config(cross_attention=True), tiny_config())
    overridden = config.replaced(hidden_dropout=0.3, eos_token_id=5)
    assert overridden.encoder.hidden_dropout == overridden.decoder.hidden_dropout == 0.3
    assert overridden.eos_token_id == 5 and overridden.decoder.cross_attention
    with pytest.raises(ConfigError, match="unknown"):
        config.replaced(hidden_dropot=0.3)


def test_shared_embeddings_are_one_table_saved_once(tmp_path) -> None:
    model = model_of(seq2seq_config(share_embeddings=True))
    table = model.encoder.embeddings.word.weight
    assert model.decoder.backbone.embeddings.word.weight is table and model.decoder.decoder_weight is table
    assert SHARED_TABLE not in model.state_dict()
    separate = model_of(seq2seq_config())
    assert separate.num_parameters() - model.num_parameters() == table.numel()
    src, mask = sources()
    labels = targets()
    model(src, mask, labels=labels).loss.backward()
    assert table.grad is not None and table.grad[labels[0, 0]].abs().sum() > 0
    model.save(tmp_path)
    loaded = roformer.load(tmp_path)
    assert loaded.decoder.backbone.embeddings.word.weight is loaded.encoder.embeddings.word.weight
    with torch.no_grad():
        assert torch.equal(loaded(src, mask, labels=labels).logits, model.eval()(src, mask, labels=labels).logits)
    fresh = EncoderDecoder(seq2seq_config(share_embeddings=True))
    fresh.load_state_dict(model.state_dict())  # strict: the shared name is filled in
    assert torch.equal(fresh.decoder.backbone.embeddings.word.weight, table)


def test_a_model_directory_round_trip_with_an_encoder_of_another_width(tmp_path) -> None:
    config = EncoderDecoderConfig(
        tiny_config(), tiny_config(hidden_size=48, intermediate_size=64), decoder_start_token_id=START
    )
    model = model_of(config)
    assert model.encoder_projection is not None  # (32 -> 48), HF's enc_to_dec_proj
    src, mask = sources()
    labels = targets()
    model.save(tmp_path)
    loaded = roformer.load(tmp_path, hidden_dropout=0.0, attention_dropout=0.0)
    assert isinstance(loaded, roformer.EncoderDecoder) and loaded.config == model.config
    with torch.no_grad():
        assert torch.equal(loaded(src, mask, labels=labels).logits, model(src, mask, labels=labels).logits)
    assert roformer.model.weights.read_model_config(tmp_path)[0] == "encoder_decoder"
    with pytest.raises(CheckpointError, match="cannot be loaded as masked_lm"):
        roformer.load(tmp_path, architecture="masked_lm")
    half = roformer.load(tmp_path, rotary_layout="half")  # each rotary half's q/k rows permuted: the same outputs
    with torch.no_grad():
        assert_close(half(src, mask, labels=labels).logits, model(src, mask, labels=labels).logits)
    assert half.config.encoder.rotary_layout == half.config.decoder.rotary_layout == "half"


def test_load_weights_from_fills_an_encoder_decoder_of_another_layout(tmp_path) -> None:
    from roformer.model.pretrained import load_weights_from

    model = model_of(seq2seq_config(share_embeddings=True), seed=1)
    model.save(tmp_path)
    config = seq2seq_config(share_embeddings=True, rotary_layout="half", hidden_dropout=0.2)
    target = model_of(config, seed=2)
    load_weights_from(target, tmp_path)
    src, mask = sources()
    labels = targets()
    with torch.no_grad():
        assert_close(target.eval()(src, mask, labels=labels).logits, model(src, mask, labels=labels).logits)


def test_set_rotary_changes_both_halves_and_what_is_saved(tmp_path) -> None:
    model = model_of(seq2seq_config("rotary", "learned"))
    model.set_rotary(20000.0)
    assert model.config.encoder.rotary_base == 20000.0 and model.encoder.config.rotary_base == 20000.0
    assert model.config.decoder.rotary_base == 10000.0  # no rotary there
    model.save(tmp_path)
    assert roformer.load(tmp_path).config.encoder.rotary_base == 20000.0


def test_kv_cache_reorder_moves_the_self_attention_slots_only() -> None:
    cache = KVCache()
    k = torch.arange(3.0)[:, None, None, None].expand(3, 2, 4, 5)
    cache.add_tokens(torch.ones(3, 4, dtype=torch.bool), None)
    cache.update(0, k, k + 10)
    cross = cache.cross_keys_values(0, lambda: (k[:, 0], k[:, 0]))
    cache.reorder(torch.tensor([2, 2, 0]))
    assert cache.keys[0][:, 0, 0, 0].tolist() == [2.0, 2.0, 0.0]
    assert cache.values[0][:, 0, 0, 0].tolist() == [12.0, 12.0, 10.0]
    assert cache.cross_keys_values(0, lambda: pytest.fail("projected again"))[0] is cross[0]


# --- decoding ------------------------------------------------------------------------------------------------------


def talkative(encoding: str = "rotary", seed: int = 0) -> EncoderDecoder:
    """A model whose targets depend on the source and end at various steps: weights of std 0.4, eos made likely."""
    model = model_of(seq2seq_config(encoding, initializer_range=0.4), seed)
    with torch.no_grad():
        model.decoder.decoder_bias[EOS] += 4.5
    return model


@pytest.mark.parametrize("num_beams", [1, 3])
def test_a_batch_decodes_each_source_as_alone(num_beams: int) -> None:
    model = talkative()
    src, mask = sources(batch=4, length=11, seed=2)
    settings = dict(num_beams=num_beams, length_penalty=0.6, max_new_tokens=4, max_len_a=0.5, pad_token_id=99)
    batched = model.generate(src, mask, **settings)
    ends = 0
    for row in range(4):
        n = int(mask[row].sum())
        alone = model.generate(src[row : row + 1, :n], **settings)[0]
        assert torch.equal(batched[row, : alone.shape[0]], alone) and batched[row, alone.shape[0] :].eq(99).all()
        limit = int(0.5 * n + 4)
        assert alone.shape[0] <= 1 + limit  # the start token and at most a*len(src)+b new ones
        ends += int(alone.eq(EOS).any())
    assert 0 < ends < 4  # the test sees rows that end and rows that run to their limit


def test_length_limits_are_per_row_without_an_end_token() -> None:
    model = talkative()
    src, mask = sources()
    out = model.generate(src, mask, eos_token_id=None, max_new_tokens=2, max_len_a=1.0, num_beams=2, pad_token_id=99)
    limits = (mask.sum(dim=1) + 2).tolist()  # 11, 8, 5
    assert out.shape == (3, 1 + max(limits))
    for row, limit in enumerate(limits):
        assert not out[row, 1 : 1 + limit].eq(99).any() and out[row, 1 + limit :].eq(99).all()
    greedy = model.generate(src, mask, eos_token_id=None, max_new_tokens=2, max_len_a=1.0, pad_token_id=99)
    assert greedy.shape == out.shape and greedy[:, 0].eq(START).all()


def test_generate_takes_a_search_object_and_keywords_replace_its_fields() -> None:
    """As HF's `generate(generation_config=..., num_beams=...)`: the object, or HF's keywords, or both."""
    model = talkative()
    src, mask = sources(seed=4)
    search = SearchConfig(num_beams=3, length_penalty=0.6, early_stopping=True, max_new_tokens=4, max_len_a=0.5)
    by_keywords = model.generate(src, mask, num_beams=3, length_penalty=0.6, early_stopping=True, max_new_tokens=4,
                                 max_len_a=0.5)  # fmt: skip
    assert torch.equal(model.generate(src, mask, search=search), by_keywords)
    greedy = SearchConfig(max_new_tokens=4, max_len_a=0.5, length_penalty=0.6, early_stopping=True)
    assert torch.equal(model.generate(src, mask, search=search, num_beams=1), model.generate(src, mask, search=greedy))
    assert torch.equal(model.generate(src, mask), model.generate(src, mask, search=SearchConfig()))
    with pytest.raises(TypeError, match="num_beam"):
        model.generate(src, mask, num_beam=2)


def test_search_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="num_beams"):
        SearchConfig(num_beams=0)
    with pytest.raises(ValueError, match="early_stopping"):
        SearchConfig(early_stopping="sometimes")
    with pytest.raises(SearchValueError, match="^length_penalty must be a finite number, got nan$") as caught:
        SearchConfig(length_penalty=float("nan"))
    assert (caught.value.field, caught.value.problem) == ("length_penalty", "must be a finite number, got nan")
    with pytest.raises(SearchValueError, match="^max_new_tokens must be >= 0, got -1$"):
        SearchConfig(max_new_tokens=-1)
    assert SearchConfig(max_new_tokens=0).limits(torch.tensor([0, 10])).tolist() == [1, 1]  # a row makes one token
    assert SearchConfig(max_new_tokens=3, max_len_a=1.5).limits(torch.tensor([0, 10])).tolist() == [3, 18]
    with pytest.raises(ValueError, match="decoder_start_token_id"):
        EncoderDecoder(EncoderDecoderConfig(tiny_config(), tiny_config())).generate(torch.ones(1, 3, dtype=torch.long))


def test_onnx_export_refuses_an_encoder_decoder(tmp_path) -> None:
    from roformer.model.onnx import export_onnx

    with pytest.raises(CheckpointError, match="ONNX export of an encoder_decoder"):
        export_onnx(model_of(seq2seq_config()), tmp_path / "model.onnx")
