"""The decoder side of the family: CausalLM against HF (forward, past_key_values, greedy generate), the KV cache, the
UniLM mask, sampling, activation checkpointing and the RoFormerV2 fields."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from helpers import VOCAB, assert_checkpointing_changes_nothing, hf_config, padded_batch, randomised, tiny_config
from torch.testing import assert_close

import roformer
from roformer.model.generation import Sampling, choose_next
from roformer.model.layers import RMSNorm
from roformer.model.masks import KVCache, self_attention_mask
from roformer.model.model import CausalLM

HF_CAUSAL = {"roformer": transformers.RoFormerForCausalLM, "bert": transformers.BertLMHeadModel}


def hf_causal(family: str, seed: int = 0, **kw):
    """A randomised HF decoder; skips where the installed transformers' own decoder is not causal (no reference)."""
    torch.manual_seed(seed)
    model = randomised(HF_CAUSAL[family](hf_config(family, is_decoder=True, **kw)).eval())
    if not sees_only_the_past(model):
        pytest.skip(f"transformers {transformers.__version__}'s {type(model).__name__} attends to future tokens "
                    "(huggingface/transformers#48745, fixed in 5.18): no causal reference to compare with")  # fmt: skip
    return model


def sees_only_the_past(hf_model) -> bool:
    """Whether changing the last token leaves every earlier position's logits unchanged."""
    ids = torch.randint(1, VOCAB, (1, 7), generator=torch.Generator().manual_seed(3))
    changed = ids.clone()
    changed[0, -1] = ids[0, -1] % (VOCAB - 1) + 1
    with torch.no_grad():
        before, after = hf_model(input_ids=ids).logits, hf_model(input_ids=changed).logits
    return torch.equal(before[:, :-1], after[:, :-1])


def left_padded(batch: int = 3, length: int = 9, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of lengths length, length-3, ... ending at the last column (left padding with id 0)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    for row in range(batch):
        mask[row, : 3 * row] = 0
    return ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("family", ["roformer", "bert"])
def test_causal_lm_equals_hf_both_ways(family: str) -> None:
    hf_model = hf_causal(family)
    ours = roformer.from_hf(hf_model)
    assert isinstance(ours, CausalLM) and ours.config.attention_pattern == "causal"
    batch = padded_batch(VOCAB)  # right padding: compare the real positions (a padded query's output is unused)
    real = batch["attention_mask"].bool()
    labels = batch["input_ids"].masked_fill(~real, -100)
    with torch.no_grad():
        expected = hf_model(**batch, labels=labels)
        got = ours(**batch, labels=labels)
        exported = roformer.to_hf(ours)(**batch, labels=labels)
    assert_close(got.logits[real], expected.logits[real])
    assert_close(got.loss, expected.loss)
    assert_close(exported.logits[real], expected.logits[real])


@pytest.mark.parametrize(("version", "warns"), [("5.8.1", False), ("5.9.0", True), ("5.17.0", True), ("5.18.0", False)])
def test_exporting_a_decoder_warns_on_the_transformers_releases_that_drop_its_causal_mask(
    version: str, warns: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("transformers.__version__", version)  # the module in sys.modules, which to_hf imports
    with caplog.at_level("WARNING", logger="roformer.model.hf"):
        roformer.to_hf(CausalLM(tiny_config()))
        roformer.to_hf(roformer.MaskedLM(tiny_config()))  # an encoder is unaffected
    assert ("#48745" in caplog.text) == warns
    assert len(caplog.records) == int(warns)


@pytest.mark.parametrize("family", ["roformer", "bert"])
def test_kv_cache_equals_hf_past_key_values(family: str) -> None:
    hf_model = hf_causal(family, rotary_value=True) if family == "roformer" else hf_causal(family)
    ours = roformer.from_hf(hf_model)
    ids = torch.randint(1, VOCAB, (2, 11), generator=torch.Generator().manual_seed(1))
    types = torch.zeros_like(ids)
    types[:, 5:] = 1
    with torch.no_grad():
        first = hf_model(input_ids=ids[:, :6], token_type_ids=types[:, :6], use_cache=True)
        second = hf_model(input_ids=ids[:, 6:], token_type_ids=types[:, 6:], past_key_values=first.past_key_values)
        cache = KVCache()
        ours_first = ours(ids[:, :6], token_type_ids=types[:, :6], cache=cache).logits
        ours_second = ours(ids[:, 6:], token_type_ids=types[:, 6:], cache=cache).logits
        ours_whole = ours(ids, token_type_ids=types).logits
    assert_close(ours_first, first.logits)
    assert_close(ours_second, second.logits)
    assert_close(torch.cat([ours_first, ours_second], dim=1), ours_whole)
    assert cache.length == 11


def test_cache_grows_past_its_capacity() -> None:
    model = CausalLM(tiny_config()).eval()
    ids = torch.randint(1, VOCAB, (2, 40), generator=torch.Generator().manual_seed(2))
    cache = KVCache(capacity=4)
    with torch.no_grad():
        pieces = [model(ids[:, i : i + 3], cache=cache).logits for i in range(0, 40, 3)]
        assert_close(torch.cat(pieces, dim=1), model(ids).logits)
    assert cache.capacity >= 40


def test_cache_keeps_each_layer_contiguous_through_appends_and_reorders() -> None:
    cache = KVCache()
    for step in range(3):
        cache.add_tokens(torch.ones(3, 1, dtype=torch.bool), None)
        k, v = cache.update(0, torch.full((3, 2, 1, 4), float(step)), torch.full((3, 2, 1, 4), step + 10.0))
        assert k.shape == (3, 2, step + 1, 4) and k.is_contiguous() and v.is_contiguous()
        cache.reorder(torch.tensor([1, 0, 0]))
    assert cache.keys[0].is_contiguous() and cache.keys[0][0, 0, :, 0].tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float"])
def test_single_query_attention_equals_sdpa(mask_kind: str) -> None:
    from roformer.model.attention import decoding_on_cpu, single_query_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(3, 2, 1, 8, generator=g),
        torch.randn(3, 2, 5, 8, generator=g),
        torch.randn(3, 2, 5, 8, generator=g),
    )
    mask = {
        "none": None,
        "bool": torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)[:, None, None],
        "float": torch.randn(3, 2, 1, 5, generator=g),
    }[mask_kind]
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert_close(single_query_attention(q, k, v, mask), expected)
    assert decoding_on_cpu(q) and not decoding_on_cpu(torch.randn(3, 2, 2, 8))
    assert not decoding_on_cpu(q.requires_grad_())  # training keeps SDPA


def test_greedy_generate_equals_hf_token_for_token_batched_with_left_padding() -> None:
    hf_model = hf_causal("roformer")
    ours = roformer.from_hf(hf_model)
    ids, mask = left_padded()
    expected = hf_model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=None
    )
    got = ours.generate(ids, mask, max_new_tokens=12)
    assert got.shape == (3, 9 + 12)
    assert torch.equal(got, expected)
    # an end-of-sequence token: a row that produced it is padded from then on, as in HF
    eos = int(expected[0, 9 + 3])
    expected = hf_model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                                 pad_token_id=0, eos_token_id=eos)  # fmt: skip
    got = ours.generate(ids, mask, max_new_tokens=12, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(got, expected[:, : got.shape[1]])
    assert (got[0, 9 + 4 :] == 0).all()


@pytest.mark.parametrize("position_encoding", ["rotary", "learned", "sinusoidal", "shaw", "t5_bias", "alibi"])
def test_a_left_padded_prompt_generates_what_it_generates_alone(position_encoding: str) -> None:
    torch.manual_seed(0)
    model = CausalLM(tiny_config(position_encoding=position_encoding)).eval()
    ids, mask = left_padded()
    batched = model.generate(ids, mask, max_new_tokens=8)
    for row in range(3):
        alone = ids[row : row + 1, 3 * row :]
        assert torch.equal(model.generate(alone, max_new_tokens=8)[0], batched[row, 3 * row :])
    with pytest.raises(ValueError, match="left-padded"):
        model.generate(ids, mask.flip(1))


def unilm_reference(types: torch.Tensor) -> torch.Tensor:
    """UniLM's seq2seq mask written out: A sees A; B sees A and the B tokens up to itself. (B, T, T) bool."""
    B, T = types.shape
    allowed = torch.zeros(B, T, T, dtype=torch.bool)
    for b in range(B):
        for i in range(T):
            for j in range(T):
                if types[b, i] == 0:
                    allowed[b, i, j] = types[b, j] == 0
                else:
                    allowed[b, i, j] = types[b, j] == 0 or j <= i
    return allowed


def test_unilm_mask_is_the_seq2seq_mask_and_cached_generation_equals_recomputing() -> None:
    types = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1]])
    mask, causal = self_attention_mask("unilm", None, types, None, (2, 7), torch.device("cpu"))
    assert not causal and torch.equal(mask[:, 0], unilm_reference(types))
    causal_mask, fast = self_attention_mask("causal", None, None, None, (2, 7), torch.device("cpu"))
    assert causal_mask is None and fast  # SDPA's own causal path
    torch.manual_seed(0)
    model = CausalLM(tiny_config(attention_pattern="unilm")).eval()
    prompt = torch.randint(1, VOCAB, (2, 5), generator=torch.Generator().manual_seed(3))
    got = model.generate(prompt, token_type_ids=torch.zeros_like(prompt), max_new_tokens=6)
    ids = prompt
    with torch.no_grad():
        for _ in range(6):  # no cache: the whole sequence again, new tokens in segment B
            segment = torch.cat([torch.zeros_like(prompt), torch.ones_like(ids[:, 5:])], dim=1)
            ids = torch.cat([ids, model(ids, token_type_ids=segment).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(got, ids)
    # segment A is read bidirectionally: its last token changes the first one's output
    segment = torch.cat([torch.zeros_like(prompt), torch.ones_like(ids[:, 5:])], dim=1)
    with torch.no_grad():
        out = model(ids, token_type_ids=segment).logits
        changed = ids.clone()
        changed[:, 4] = (changed[:, 4] % (VOCAB - 1)) + 1
        out2 = model(changed, token_type_ids=segment).logits
    assert not torch.allclose(out[:, 0], out2[:, 0])


def test_sampling_draws_from_the_warped_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])
    greedy = choose_next(logits, Sampling())
    assert int(greedy) == 0
    assert int(choose_next(logits, Sampling(do_sample=True, top_k=1))) == 0
    assert int(choose_next(logits, Sampling(do_sample=True, top_p=0.01))) == 0
    g = torch.Generator().manual_seed(0)
    n = 20000
    draws = choose_next(logits.expand(n, -1), Sampling(do_sample=True, temperature=2.0, top_k=3), g)
    expected = torch.softmax(logits[0, :3] / 2.0, dim=0)
    observed = torch.bincount(draws, minlength=5).float() / n
    assert observed[3:].sum() == 0  # outside the top 3
    assert_close(observed[:3], expected, atol=0.015, rtol=0)
    # top-p: the smallest set reaching p. softmax(logits) = .53 .20 .12 .07 .03 (rounded): p = .7 keeps two
    draws = choose_next(logits.expand(n, -1), Sampling(do_sample=True, top_p=0.7), g)
    kept = torch.softmax(logits[0, :2], dim=0)
    observed = torch.bincount(draws, minlength=5).float() / n
    assert observed[2:].sum() == 0
    assert_close(observed[:2], kept, atol=0.015, rtol=0)
    again = [
        choose_next(logits.expand(8, -1), Sampling(do_sample=True), torch.Generator().manual_seed(5)) for _ in "ab"
    ]
    assert torch.equal(*again)
    for bad in (dict(temperature=0.0), dict(top_k=0), dict(top_p=1.5)):
        with pytest.raises(ValueError):
            Sampling(do_sample=True, **bad)


def test_sampled_generation_is_reproducible_and_stops_at_max_new_tokens() -> None:
    torch.manual_seed(0)
    model = CausalLM(tiny_config()).eval()
    ids, mask = left_padded()
    runs = [
        model.generate(
            ids,
            mask,
            max_new_tokens=5,
            do_sample=True,
            top_k=10,
            top_p=0.9,
            temperature=0.8,
            generator=torch.Generator().manual_seed(7),
        )  # fmt: skip
        for _ in range(2)
    ]
    assert torch.equal(*runs) and runs[0].shape == (3, 14)
    assert model.generate(ids, mask, max_new_tokens=0).shape == ids.shape


@pytest.mark.parametrize("architecture", ["masked_lm", "causal_lm"])
def test_activation_checkpointing_gives_the_same_loss_and_gradients(architecture: str) -> None:
    config = tiny_config(hidden_dropout=0.1, attention_dropout=0.1, num_layers=3)
    batch = padded_batch(VOCAB)
    batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    assert_checkpointing_changes_nothing(lambda: roformer.model.model.ARCHITECTURES[architecture](config), batch)


def v2_config(**kw) -> roformer.ModelConfig:
    return tiny_config(use_bias=False, norm_type="rms_norm", mlm_head="bare", initializer="v2", **kw)


def test_roformer_v2_has_no_biases_no_norm_parameters_and_a_bare_tied_head() -> None:
    torch.manual_seed(0)
    model = roformer.MaskedLM(v2_config()).eval()
    names = [n for n, _ in model.named_parameters()]
    assert not [n for n in names if "bias" in n or "norm" in n], names
    assert not [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
    batch = padded_batch(VOCAB)
    with torch.no_grad():
        x, _ = model.backbone.encode(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        assert_close(model(**batch).logits, x @ model.backbone.embeddings.word.weight.T)
    # v1 is one config away: the same shapes but for biases and norms
    v1 = roformer.MaskedLM(tiny_config())
    assert set(names) < {n for n, _ in v1.named_parameters()}


def test_rms_norm_is_the_parameter_free_formula() -> None:
    x = torch.randn(4, 7, 32, dtype=torch.float64)
    eps = 1e-12
    expected = x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps)
    assert_close(RMSNorm(32, eps)(x), expected)
    assert list(RMSNorm(32, eps).parameters()) == []


def test_v2_initialiser_is_a_truncated_normal_with_the_depth_scaled_std() -> None:
    config = roformer.ModelConfig(
        vocab_size=12000, hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024,
        use_bias=False, norm_type="rms_norm", mlm_head="bare", initializer="v2",
    )  # fmt: skip
    torch.manual_seed(0)
    model = roformer.MaskedLM(config)
    for weight, fan_in in [
        (model.backbone.layers[0].ffn_in.weight, 256),
        (model.backbone.layers[0].ffn_out.weight, 1024),
        (model.backbone.embeddings.word.weight, 256),
    ]:
        std = 1.13684723 / math.sqrt(fan_in) / math.sqrt(4)
        w = weight.detach()
        if w.shape[0] == 12000:
            w = w[1:]  # the padding row is zero
        assert w.abs().max() <= 2 * std + 1e-7  # truncated at 2 std
        assert abs(w.std().item() - std * 0.8796) < 0.02 * std  # a 2-std truncated normal has std 0.8796 sigma


def test_v2_and_unilm_are_refused_by_hf_export_and_saved_and_loaded_here(tmp_path) -> None:
    with pytest.raises(roformer.CheckpointError, match="cannot express norm_type: rms_norm"):
        roformer.to_hf(roformer.MaskedLM(v2_config()))
    with pytest.raises(roformer.CheckpointError, match="UniLM"):
        roformer.to_hf(CausalLM(tiny_config(attention_pattern="unilm")))
    torch.manual_seed(0)
    model = CausalLM(v2_config(attention_pattern="unilm", add_pooler=True, pooler_activation="linear")).eval()
    model.save(tmp_path / "sim-v2")
    loaded = roformer.load(tmp_path / "sim-v2")
    assert isinstance(loaded, CausalLM) and loaded.config == model.config
    batch = padded_batch(VOCAB)
    with torch.no_grad():
        assert_close(loaded(**batch).logits, model(**batch).logits)
        assert_close(loaded(**batch).pooled, model(**batch).pooled)


def test_decoder_config_errors() -> None:
    with pytest.raises(roformer.ConfigError, match="bidirectional only"):
        tiny_config(attention="linear", attention_pattern="causal")
    with pytest.raises(roformer.ConfigError, match="embedding_size must be null"):
        tiny_config(mlm_head="bare", embedding_size=16)
    with pytest.raises(roformer.ConfigError, match="attention_pattern"):
        tiny_config(attention_pattern="prefix")


def test_a_mask_out_of_step_with_the_ids_is_an_error_not_a_shifted_mask() -> None:
    model = CausalLM(tiny_config()).eval()
    ids = torch.randint(1, VOCAB, (2, 6), generator=torch.Generator().manual_seed(4))
    ones = torch.ones(2, 8, dtype=torch.long)
    with torch.no_grad():
        with pytest.raises(ValueError, match="covers 8 positions; expected the 6 new tokens$"):
            model(ids, ones)  # ids truncated, the mask not: its last 6 columns would not be these tokens' padding
        cache = KVCache()
        model(ids, ones[:, :6], cache=cache)
        model(ids[:, :2], ones, cache=cache)  # HF's way: the mask covers the cached slots too
        with pytest.raises(ValueError, match="expected the 2 new tokens or them and the 8 cached ones"):
            model(ids[:, :2], ones, cache=cache)
