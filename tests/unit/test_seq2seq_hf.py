"""The encoder-decoder against HF transformers' EncoderDecoderModel (RoFormerModel + RoFormerForCausalLM, BertModel +
BertLMHeadModel, `is_decoder` and `add_cross_attention`): logits and loss on padded batches both ways, greedy and
beam search token for token with HF `generate`, and `roformer convert` of a saved HF encoder-decoder directory."""

from __future__ import annotations

from functools import cache

import pytest
import torch
import transformers
from helpers import hf_config, randomised
from packaging.version import Version
from torch.testing import assert_close

import roformer
from roformer.cli import main
from roformer.model.heads import CausalLM
from roformer.model.hf import hf_model_config
from roformer.model.seq2seq import EncoderDecoder

START, EOS, PAD = 1, 2, 3  # HF fills a finished beam with eos, not pad, when pad_token_id is 0: 3 avoids that quirk
FAMILIES = ["roformer", "bert"]


def hf_seq2seq(family: str, seed: int = 0, decoder: dict | None = None, **fields) -> transformers.EncoderDecoderModel:
    """A randomised HF EncoderDecoderModel of the tiny model's halves; `fields` on both, `decoder` on the decoder.

    Skips where the installed transformers runs its RoFormer decoder without a causal mask (no reference).
    """
    if family == "roformer" and Version("5.9.0") <= Version(transformers.__version__) < Version("5.18.0"):
        pytest.skip("transformers 5.9-5.17 run RoFormer decoders without their causal mask (transformers#48745)")
    torch.manual_seed(seed)
    encoder = hf_config(family, **fields)
    decoder = hf_config(family, is_decoder=True, add_cross_attention=True, **{**fields, **(decoder or {})})
    config = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id, config.eos_token_id, config.pad_token_id = START, EOS, PAD
    return randomised(transformers.EncoderDecoderModel(config).eval())


def padded_pair(vocab: int = 101, seed: int = 0) -> dict[str, torch.Tensor]:
    """Sources of lengths 11, 7, 4 and targets of lengths 8, 5, 3 (labels -100 after their end)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (3, 11), generator=g)
    mask = (torch.arange(11) < torch.tensor([11, 7, 4])[:, None]).long()
    labels = torch.randint(4, vocab, (3, 8), generator=g)
    labels = labels.masked_fill(torch.arange(8) >= torch.tensor([8, 5, 3])[:, None], -100)
    return {"input_ids": src.masked_fill(mask == 0, PAD), "attention_mask": mask, "labels": labels}


def real_target_positions(labels: torch.Tensor) -> torch.Tensor:
    """(B, T) the decoder positions holding a real input: the start token and every label but the last."""
    return torch.cat([torch.ones_like(labels[:, :1], dtype=torch.bool), labels[:, :-1] != -100], dim=1)


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_and_loss_equal_hf_on_padded_batches_both_ways(family: str) -> None:
    hf_model = hf_seq2seq(family)
    ours = roformer.from_hf(hf_model)
    assert isinstance(ours, EncoderDecoder) and ours.config.decoder.cross_attention
    assert (ours.config.decoder_start_token_id, ours.config.eos_token_id, ours.config.decoder.pad_token_id) == (
        START,
        EOS,
        PAD,
    )
    batch = padded_pair()
    real = real_target_positions(batch["labels"])  # a padded query's output is unused (HF builds another mask)
    with torch.no_grad():
        expected = hf_model(**batch)  # decoder inputs: the labels shifted right, as ours
        got = ours(**batch)
        back = roformer.to_hf(ours)
        exported = back(**batch)
    assert_close(got.logits[real], expected.logits[real])
    assert_close(got.loss, expected.loss)
    assert_close(exported.logits, expected.logits)  # HF both: every position
    assert type(back.encoder) is type(hf_model.encoder) and type(back.decoder) is type(hf_model.decoder)
    again = roformer.from_hf(back)
    assert again.state_dict().keys() == ours.state_dict().keys()
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in ours.state_dict().items())
    # explicit decoder inputs and their padding mask, as a training batch gives them
    decoder_inputs = {
        "decoder_input_ids": torch.where(real, hf_model.prepare_decoder_input_ids_from_labels(batch["labels"]), PAD),
        "decoder_attention_mask": real.long(),
    }
    with torch.no_grad():
        expected = hf_model(**batch, **decoder_inputs)
        got = ours(**batch, **decoder_inputs)
    assert_close(got.logits[real], expected.logits[real])
    assert_close(got.loss, expected.loss)


@pytest.mark.parametrize("family", FAMILIES)
def test_an_encoder_of_another_width_is_projected_as_hf_does(family: str) -> None:
    hf_model = hf_seq2seq(family, decoder={"hidden_size": 48, "num_attention_heads": 4})
    assert hasattr(hf_model, "enc_to_dec_proj")
    ours = roformer.from_hf(hf_model)
    assert ours.encoder_projection is not None
    batch = padded_pair()
    real = real_target_positions(batch["labels"])
    with torch.no_grad():
        assert_close(ours(**batch).logits[real], hf_model(**batch).logits[real])
        assert_close(roformer.to_hf(ours)(**batch).logits, hf_model(**batch).logits)


def test_a_roformer_decoder_with_cross_attention_converts_alone() -> None:
    """HF's RoFormerForCausalLM with add_cross_attention (refused before issue 56) is a CausalLM reading
    encoder_states."""
    hf_model = hf_seq2seq("roformer").decoder
    ours = roformer.from_hf(hf_model)
    assert isinstance(ours, CausalLM) and ours.config.cross_attention
    g = torch.Generator().manual_seed(4)
    ids, states = torch.randint(4, 101, (2, 6), generator=g), torch.randn(2, 5, 32, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    with torch.no_grad():
        expected = hf_model(input_ids=ids, encoder_hidden_states=states, encoder_attention_mask=mask).logits
        assert_close(ours(ids, encoder_states=states, encoder_mask=mask).logits, expected)
        back = roformer.to_hf(ours)
        assert back.config.add_cross_attention and back.config.is_decoder
        assert_close(back(input_ids=ids, encoder_hidden_states=states, encoder_attention_mask=mask).logits, expected)


@cache
def talkative_hf(family: str) -> transformers.EncoderDecoderModel:
    """An HF model whose targets depend on the source and end at various steps: 41 tokens, weights of std 0.4, eos
    made likely."""
    hf_model = hf_seq2seq(family, vocab_size=41, initializer_range=0.4)
    with torch.no_grad():
        hf_model.decoder.cls.predictions.bias[EOS] += 2.5
    return hf_model


def search_batch() -> dict[str, torch.Tensor]:
    """Four padded sources of the 41-token vocabulary."""
    batch = padded_pair(vocab=41, seed=5)
    ids = torch.cat([batch["input_ids"], batch["input_ids"][:1].flip(1)])
    mask = torch.cat([batch["attention_mask"], torch.ones_like(batch["attention_mask"][:1])])
    return {"input_ids": ids, "attention_mask": mask}


SEARCHES = [  # (num_beams, length_penalty, early_stopping)
    (1, 1.0, False),  # greedy
    (4, 0.6, True),  # the paper's / fairseq's beam 4, length penalty 0.6
    (4, 1.0, False),  # HF's defaults: the early-stop heuristic
    (4, 2.0, "never"),  # the canonical beam search, scored at the length limit
    (3, -0.5, False),  # a penalty that favours short targets
]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("num_beams", "length_penalty", "early_stopping"), SEARCHES)
def test_generate_equals_hf_token_for_token(
    family: str, num_beams: int, length_penalty: float, early_stopping: bool | str
) -> None:
    hf_model = talkative_hf(family)
    ours = roformer.from_hf(hf_model)
    batch = search_batch()
    settings = dict(num_beams=num_beams, length_penalty=length_penalty, early_stopping=early_stopping)
    expected = hf_model.generate(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        max_new_tokens=12,
        decoder_start_token_id=START,
        eos_token_id=EOS,
        pad_token_id=PAD,
        do_sample=False,
        **settings,
    )
    got = ours.generate(batch["input_ids"], batch["attention_mask"], max_new_tokens=12, **settings)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_search_tests_see_targets_that_end_and_targets_that_run_on(family: str) -> None:
    """What makes the token-for-token comparison above meaningful: the sources give different targets, some end after
    a few tokens, others run to the length limit."""
    ours = roformer.from_hf(talkative_hf(family))
    batch = search_batch()
    ends, run_on, distinct = set(), 0, 0
    for num_beams, length_penalty, early_stopping in SEARCHES:
        out = ours.generate(
            batch["input_ids"],
            batch["attention_mask"],
            max_new_tokens=12,
            num_beams=num_beams,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
        )
        ends |= {int(row.eq(EOS).nonzero()[0]) for row in out if row.eq(EOS).any()}
        run_on += int((~out.eq(EOS).any(dim=1)).sum())
        distinct = max(distinct, len({tuple(row) for row in out.tolist()}))
    assert max(ends) > 2 and run_on > 0 and distinct > 1


def test_convert_reads_and_writes_an_hf_encoder_decoder_directory(tmp_path, capsys: pytest.CaptureFixture) -> None:
    hf_model = hf_seq2seq("roformer")
    hf_model.save_pretrained(tmp_path / "hf")
    assert main(["convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "ours")]) == 0
    assert "rotary/rotary encoder_decoder" in capsys.readouterr().out
    ours = roformer.load(tmp_path / "ours")
    assert isinstance(ours, EncoderDecoder)
    assert hf_model_config(str(tmp_path / "hf")) == ours.config  # read from config.json and the tensor names
    batch = padded_pair()
    real = real_target_positions(batch["labels"])
    with torch.no_grad():
        expected = hf_model(**batch).logits
        assert_close(ours(**batch).logits[real], expected[real])
    assert main(["convert", "--to-hf", str(tmp_path / "ours"), "--out", str(tmp_path / "back")]) == 0
    back, info = transformers.EncoderDecoderModel.from_pretrained(tmp_path / "back", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert back.generation_config.decoder_start_token_id == START and back.generation_config.eos_token_id == EOS
    with torch.no_grad():
        assert_close(back.eval()(**batch).logits, expected)


def test_one_hf_model_is_not_an_encoder_decoder_and_a_pair_is_nothing_else(tmp_path) -> None:
    with pytest.raises(roformer.CheckpointError, match="does not make an encoder_decoder"):
        roformer.from_hf(transformers.RoFormerModel(hf_config("roformer")), architecture="encoder_decoder")
    transformers.RoFormerModel(hf_config("roformer")).save_pretrained(tmp_path / "one")
    with pytest.raises(roformer.CheckpointError, match="does not make an encoder_decoder"):
        hf_model_config(str(tmp_path / "one"), "encoder_decoder")
    with pytest.raises(roformer.CheckpointError, match="converts as encoder_decoder, not masked_lm"):
        roformer.from_hf(hf_seq2seq("bert"), architecture="masked_lm")
