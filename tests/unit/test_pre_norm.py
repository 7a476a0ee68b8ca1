"""`norm_position: pre`: x = x + Attn(LN(x)); x = x + FFN(LN(x)); one norm after the last block (GPT-2, Cramming)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import padded_batch, tiny_config
from torch.testing import assert_close

import roformer
from roformer.errors import CheckpointError
from roformer.model.seq2seq import EncoderDecoder, EncoderDecoderConfig


def written_out_block(block: torch.nn.Module, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """The pre-LN block from its parts, `attn` being Attn(LN(x)) as the layer computed it."""
    h = x + attn
    return h + block.ffn_out(F.gelu(block.ffn_in(block.ffn_norm(h))))


@pytest.mark.parametrize("intermediate_size", [48, 0])
def test_a_pre_norm_block_is_the_residual_sum_written_out(intermediate_size: int) -> None:
    model = roformer.MaskedLM(tiny_config(norm_position="pre", intermediate_size=intermediate_size)).eval()
    seen: dict[str, torch.Tensor] = {}
    layer = model.backbone.layers[1]
    layer.register_forward_hook(lambda _m, args, out: seen.update(x=args[0], out=out))
    layer.attn.register_forward_hook(lambda _m, args, out: seen.update(attn_in=args[0], attn=out))
    batch = padded_batch()
    with torch.no_grad():
        model(batch["input_ids"], attention_mask=batch["attention_mask"])
        assert_close(seen["attn_in"], layer.attn_norm(seen["x"]))  # the sublayer reads the normalised stream
        expected = (
            seen["x"] + seen["attn"] if intermediate_size == 0 else written_out_block(layer, seen["x"], seen["attn"])
        )
    assert_close(seen["out"], expected)


def test_the_last_hidden_states_are_the_final_norm_of_the_stream() -> None:
    model = roformer.MaskedLM(tiny_config(norm_position="pre")).eval()
    batch = padded_batch()
    seen: dict[str, torch.Tensor] = {}
    model.backbone.layers[-1].register_forward_hook(lambda _m, _args, out: seen.update(stream=out))
    with torch.no_grad():
        x, hidden = model.backbone.encode(batch["input_ids"], batch["attention_mask"], output_hidden_states=True)
    assert_close(x, model.backbone.final_norm(seen["stream"]))
    assert_close(hidden[-1], x)
    assert roformer.MaskedLM(tiny_config()).backbone.final_norm is None  # post-LN (BERT) has none


def test_pre_norm_masked_positions_alone_equal_the_full_grid() -> None:
    model = roformer.MaskedLM(tiny_config(norm_position="pre")).eval()
    batch = padded_batch()
    labels = torch.full_like(batch["input_ids"], -100)
    labels[:, 2] = 7
    with torch.no_grad():
        full = model(batch["input_ids"], batch["attention_mask"], labels=labels).loss
        model.set_last_layer_subset(True)
        positions = (labels.flatten() != -100).nonzero().squeeze(1)
        subset = model(
            batch["input_ids"], batch["attention_mask"], labels=labels, masked_only=True, masked_positions=positions
        ).loss
    assert_close(subset, full)


def test_pre_norm_is_refused_by_hf_export_and_saves_and_loads(tmp_path) -> None:
    model = roformer.MaskedLM(tiny_config(norm_position="pre"))
    with pytest.raises(CheckpointError, match="norm_position pre cannot export"):
        roformer.to_hf(model)
    model.save(tmp_path)
    loaded = roformer.load(tmp_path).eval()
    batch = padded_batch()
    with torch.no_grad():
        assert_close(loaded(batch["input_ids"]).logits, model.eval()(batch["input_ids"]).logits)


def test_a_pre_norm_encoder_decoder_decodes_step_by_step_as_it_scores_the_whole_target() -> None:
    torch.manual_seed(0)
    half = tiny_config(norm_position="pre", hidden_dropout=0.0, attention_dropout=0.0)
    model = EncoderDecoder(EncoderDecoderConfig(half, half, decoder_start_token_id=1, eos_token_id=2)).eval()
    src = torch.randint(5, half.vocab_size, (2, 6), generator=torch.Generator().manual_seed(1))
    out = model.generate(src, max_new_tokens=5, num_beams=1, eos_token_id=-1)  # greedy through the KV cache
    with torch.no_grad():
        logits = model(src, decoder_input_ids=out[:, :-1]).logits  # the whole target at once
    assert torch.equal(logits.argmax(-1), out[:, 1:])
