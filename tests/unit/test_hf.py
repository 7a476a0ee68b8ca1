"""Parity with HF transformers' RoFormer and BERT: tiny random models (no download), both directions."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import transformers
from helpers import HF_CASES, VOCAB, hf_config, hf_output, make_hf, our_output, padded_batch, randomised, tiny_config
from packaging.version import Version
from torch.testing import assert_close
from transformers.activations import ACT2FN

import roformer
import roformer.model.hf as hf_module
from roformer.model.config import ACTIVATION_NAMES
from roformer.model.layers import ACTIVATIONS
from roformer.model.model import ARCHITECTURES
from roformer.model.rotary import rotary_angles


@pytest.mark.parametrize("name", list(HF_CASES))
def test_from_hf_logits_match(name: str) -> None:
    hf_model = make_hf(name)
    ours = roformer.from_hf(hf_model)
    batch = padded_batch(VOCAB)
    assert_close(our_output(ours, batch), hf_output(hf_model, batch))


@pytest.mark.parametrize("name", list(HF_CASES))
def test_to_hf_round_trip(name: str, tmp_path) -> None:
    hf_model = make_hf(name)
    ours = roformer.from_hf(hf_model)
    back = roformer.to_hf(ours)
    assert type(back) is type(hf_model)
    batch = padded_batch(VOCAB, seed=1)
    assert_close(hf_output(back, batch), hf_output(hf_model, batch))
    # what users do next: save_pretrained, then load with transformers
    back.save_pretrained(tmp_path)
    reloaded, info = type(hf_model).from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert_close(hf_output(reloaded.eval(), batch), hf_output(hf_model, batch))


@pytest.mark.parametrize("name", ["roformer-mlm", "roformer-cls", "bert-mlm", "bert-cls"])
def test_loss_matches_hf(name: str) -> None:
    hf_model = make_hf(name)
    ours = roformer.from_hf(hf_model)
    batch = padded_batch(VOCAB)
    if "mlm" in name:
        labels = batch["input_ids"].masked_fill(torch.rand(batch["input_ids"].shape) > 0.3, -100)
    else:
        labels = torch.tensor([0, 2, 1])
    with torch.no_grad():
        assert_close(ours(**batch, labels=labels).loss, hf_model(**batch, labels=labels).loss)


def test_rotary_runs_past_hf_max_position_embeddings() -> None:
    hf_small = make_hf("roformer-mlm")  # max_position_embeddings=64
    ours = roformer.from_hf(hf_small)
    hf_big = transformers.RoFormerForMaskedLM(hf_config("roformer", max_position_embeddings=256)).eval()
    hf_big.load_state_dict({k: v for k, v in hf_small.state_dict().items() if "embed_positions" not in k}, strict=False)
    batch = padded_batch(VOCAB, batch=2, length=150)
    assert_close(our_output(ours, batch), hf_output(hf_big, batch))


def test_sinusoidal_baseline_exports_to_hf_bert_exactly() -> None:
    for learned in (False, True):
        ours = roformer.MaskedLM(tiny_config(position_encoding="sinusoidal", sinusoidal_scale_learned=learned)).eval()
        hf_model = roformer.to_hf(ours)
        assert isinstance(hf_model, transformers.BertForMaskedLM)
        batch = padded_batch(101, length=40)
        assert_close(hf_output(hf_model, batch), our_output(ours, batch))


def test_half_layout_import_export() -> None:
    hf_model = make_hf("roformer-mlm-emb16-rotv")
    ours = roformer.from_hf(hf_model, rotary_layout="half")
    assert ours.config.rotary_layout == "half"
    batch = padded_batch(VOCAB)
    assert_close(our_output(ours, batch), hf_output(hf_model, batch))
    assert_close(hf_output(roformer.to_hf(ours), batch), hf_output(hf_model, batch))


def test_from_hf_directory_and_architecture_switch(tmp_path) -> None:
    hf_model = make_hf("bert-cls")
    hf_model.save_pretrained(tmp_path)
    ours = roformer.from_hf(tmp_path)
    assert isinstance(ours, roformer.SequenceClassifier)
    batch = padded_batch(VOCAB)
    assert_close(our_output(ours, batch), hf_output(hf_model, batch))
    # a sequence-classification checkpoint read as a backbone: same hidden states as HF BertModel
    backbone = roformer.from_hf(tmp_path, architecture="backbone")
    assert_close(our_output(backbone, batch), hf_output(hf_model.bert, batch))
    assert backbone.pooler is not None  # BERT's pretrained pooler is kept for fine-tuning


@pytest.mark.parametrize(
    ("name", "overrides", "lost"),
    [
        ("bert-mlm", {"max_position_embeddings": 128}, "embeddings.position.weight"),  # a longer position table
        ("roformer-mlm", {"vocab_size": VOCAB + 7}, "embeddings.word.weight"),  # added tokens
        ("roformer-mlm", {"tie_word_embeddings": False}, "decoder.weight"),  # an output layer it does not hold
    ],
)
def test_an_override_that_changes_converted_weights_is_refused_not_left_random(
    name: str, overrides: dict, lost: str, tmp_path
) -> None:
    hf_model = make_hf(name)
    hf_model.save_pretrained(tmp_path)
    for source in (hf_model, tmp_path):
        with pytest.raises(roformer.CheckpointError, match=f"change weights the checkpoint holds.*{lost}"):
            roformer.from_hf(source, **overrides)


def test_overrides_that_keep_the_shapes_keep_every_weight() -> None:
    relabelled = roformer.from_hf(make_hf("roformer-cls"), num_labels=5, hidden_dropout=0.0)  # a fresh output layer
    original = roformer.from_hf(make_hf("roformer-cls"))
    kept = {k: v for k, v in relabelled.state_dict().items() if not k.startswith("out.")}
    assert kept and all(torch.equal(v, original.state_dict()[k]) for k, v in kept.items())
    assert relabelled.config.num_labels == 5 and relabelled.config.hidden_dropout == 0.0


def test_loading_a_saved_rotary_model_in_the_other_layout_keeps_its_outputs(tmp_path) -> None:
    ours = roformer.from_hf(make_hf("roformer-mlm-emb16-rotv"))
    ours.save(tmp_path)
    half = roformer.load(tmp_path, rotary_layout="half")
    assert half.config.rotary_layout == "half"
    batch = padded_batch(VOCAB)
    assert_close(our_output(half, batch), our_output(ours, batch))
    assert roformer.load(tmp_path, rotary_layout="interleaved").config.rotary_layout == "interleaved"
    # an init (continued pretraining, fine-tuning's init) of the other layout: the rows are permuted too
    from roformer.model.pretrained import load_weights_from

    target = ARCHITECTURES["masked_lm"](replace(ours.config, rotary_layout="half")).eval()
    load_weights_from(target, tmp_path)
    assert_close(our_output(target, batch), our_output(ours, batch))


def test_a_checkpoint_whose_rotary_table_is_not_the_sinusoid_is_refused(tmp_path) -> None:
    """HF RoFormer's saved table is compared with ours, not rebuilt: one of another base (or shape) is another model.

    It converted without a word into a model whose logits were HF's own table's, not the checkpoint's.
    """
    hf_model = make_hf("roformer-mlm")
    table = hf_model.roformer.encoder.embed_positions.weight
    angles = rotary_angles(table.shape[0], table.shape[1], base=500.0)
    with torch.no_grad():
        table.copy_(torch.cat([angles.sin(), angles.cos()], dim=1))
    message = r"RoFormerForMaskedLM: roformer.encoder.embed_positions.weight differs by up to [\d.]+ \(position \d+, "
    with pytest.raises(roformer.CheckpointError, match=message + r"feature \d+\) from the sinusoidal table of rotary"):
        roformer.from_hf(hf_model)
    hf_model.save_pretrained(tmp_path / "saved")  # read from its files too, naming the directory
    with pytest.raises(roformer.CheckpointError, match=rf"{tmp_path / 'saved'}: roformer.encoder.embed_positions"):
        roformer.from_hf(tmp_path / "saved")
    state = make_hf("roformer-mlm").state_dict()
    state["roformer.encoder.embed_positions.weight"] = state["roformer.encoder.embed_positions.weight"][:32]
    with pytest.raises(roformer.CheckpointError, match=r"embed_positions.weight is \(32, 8\), not \(64, 8\)"):
        hf_module._check_rotary_table(state, roformer.from_hf(make_hf("roformer-mlm")).config, "x")
    for dtype in (torch.float16, torch.bfloat16):  # HF's own table, rounded to the checkpoint's dtype: accepted
        roformer.from_hf(make_hf("roformer-mlm").to(dtype))


def test_unsupported_hf_models_give_clear_errors(tmp_path) -> None:
    with pytest.raises(roformer.CheckpointError, match="relative_key"):
        roformer.from_hf(transformers.BertModel(hf_config("bert", position_embedding_type="relative_key")))
    with pytest.raises(roformer.CheckpointError, match="cannot convert"):  # token classification is a head now
        roformer.from_hf(transformers.BertForNextSentencePrediction(hf_config("bert")))
    with pytest.raises(roformer.CheckpointError, match="a start and an end output, this one 3"):
        roformer.from_hf(transformers.BertForQuestionAnswering(hf_config("bert", num_labels=3)))
    with pytest.raises(roformer.CheckpointError, match="cannot read an HF config"):
        roformer.from_hf(tmp_path)
    rotary_with_pooler = roformer.SequenceClassifier(tiny_config(classifier_head="pooler"))
    with pytest.raises(roformer.CheckpointError, match="no pooler classifier head"):
        roformer.to_hf(rotary_with_pooler)


@pytest.mark.parametrize("name", ACTIVATION_NAMES)
def test_activations_match_hf(name: str) -> None:
    if name not in ACT2FN and Version(transformers.__version__) < Version("5.6"):  # 5.3 lacks hardswish, 5.6 has it
        pytest.skip(f"transformers {transformers.__version__} has no {name!r} activation to compare with")
    x = torch.linspace(-12, 12, 2001)
    assert_close(ACTIVATIONS[name](x), ACT2FN[name](x))


@pytest.mark.parametrize("rotary_value", [False, True])
def test_rotary_layout_conversion_with_partial_rotary(rotary_value: bool) -> None:
    """rotary_dim < head_size: only the rotated features change layout; the outputs stay the same."""
    config = tiny_config(hidden_size=64, num_heads=2, intermediate_size=64, rotary_dim=16, rotary_value=rotary_value)
    torch.manual_seed(0)
    model = roformer.MaskedLM(config).eval()
    half = roformer.convert_rotary_layout(model, "half").eval()
    back = roformer.convert_rotary_layout(half, "interleaved").eval()
    batch = padded_batch(VOCAB)
    assert half.config.rotary_layout == "half"
    assert_close(our_output(half, batch), our_output(model, batch))
    assert_close(our_output(back, batch), our_output(model, batch))


HEAD_CASES = {
    "token_classification": ("ForTokenClassification", {"labels": torch.randint(0, 3, (6, 19))}),
    "question_answering": (
        "ForQuestionAnswering",
        {"start_positions": torch.tensor([1, 5, 40, 2, 0, 7]), "end_positions": torch.tensor([3, 6, 41, 30, 0, 9])},
    ),  # fmt: skip
    "multiple_choice": ("ForMultipleChoice", {"labels": torch.tensor([0, 2])}),
}


def head_batch(architecture: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Six padded rows; for multiple choice two questions of three choices each, (2, 3, T)."""
    batch = padded_batch(VOCAB, batch=6, seed=seed)
    if architecture == "multiple_choice":
        batch = {k: v.view(2, 3, -1) for k, v in batch.items()}
    return batch


def hf_head_logits(out) -> torch.Tensor:
    if hasattr(out, "start_logits"):  # ours: (B, T, 2), start then end
        return torch.stack([out.start_logits, out.end_logits], dim=-1)
    return out.logits


@pytest.mark.parametrize("family", ["roformer", "bert"])
@pytest.mark.parametrize("architecture", list(HEAD_CASES))
def test_task_heads_equal_transformers_both_ways(family: str, architecture: str, tmp_path) -> None:
    """Token classification, extractive QA and multiple choice: logits and losses equal HF's, and to_hf round-trips."""
    suffix, targets = HEAD_CASES[architecture]
    cls = getattr(transformers, ("RoFormer" if family == "roformer" else "Bert") + suffix)
    torch.manual_seed(0)
    labels = {"num_labels": 2} if architecture == "question_answering" else {}  # HF BERT's QA head: num_labels
    hf_model = randomised(cls(hf_config(family, **labels)).eval())
    ours = roformer.from_hf(hf_model)
    assert ours.architecture == architecture
    batch = head_batch(architecture)
    with torch.no_grad():
        expected = hf_model(**batch, **targets)
        got = ours(**batch, **targets)
    assert_close(got.logits, hf_head_logits(expected))
    assert_close(got.loss, expected.loss)
    back = roformer.to_hf(ours)
    assert type(back) is cls
    with torch.no_grad():
        assert_close(hf_head_logits(back(**batch)), hf_head_logits(expected))
    ours.save(tmp_path / "m")
    assert_close(roformer.load(tmp_path / "m")(**batch).logits, got.logits)


@pytest.mark.parametrize("architecture", ["masked_lm", "causal_lm"])
def test_a_bert_lm_pooler_hf_has_no_place_for_is_left_out_with_a_warning(
    architecture: str, caplog: pytest.LogCaptureFixture
) -> None:
    model = ARCHITECTURES[architecture](tiny_config(position_encoding="learned", add_pooler=True))
    with caplog.at_level("WARNING", logger="roformer.model.hf"):
        hf_model = roformer.to_hf(model)
    assert not any("pooler" in k for k in hf_model.state_dict())
    assert "has no pooler: backbone.pooler.weight, backbone.pooler.bias not exported" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="roformer.model.hf"):
        roformer.to_hf(ARCHITECTURES[architecture](tiny_config(position_encoding="learned")))
    assert "pooler" not in caplog.text


def test_pooler_output_equals_hf_bert_and_a_linear_pooler_is_ours_alone(tmp_path) -> None:
    """Every model returns its pooler's output; tanh equals HF BERT's pooler_output, linear (RoFormer-Sim's) is the
    bare dense layer and is refused by the HF export, as is any pooler on HF RoFormer (it has none)."""
    hf_model = make_hf("bert-model")
    ours = roformer.from_hf(hf_model)
    batch = padded_batch(VOCAB)
    with torch.no_grad():
        assert_close(ours(**batch).pooled, hf_model(**batch).pooler_output)
    linear = roformer.MaskedLM(tiny_config(add_pooler=True, pooler_activation="linear")).eval()
    with torch.no_grad():
        out = linear(**batch)
        hidden = linear.backbone.encode(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])[0]
        assert_close(out.pooled, linear.backbone.pooler(hidden[:, 0]))
    linear.save(tmp_path / "sim")
    reloaded = roformer.load(tmp_path / "sim")
    assert reloaded.config.pooler_activation == "linear"
    with torch.no_grad():
        assert_close(reloaded(**batch).pooled, out.pooled)
    with pytest.raises(roformer.CheckpointError, match="HF RoFormer has no pooler"):
        roformer.to_hf(linear)
    bert_linear = roformer.Backbone(
        tiny_config(position_encoding="learned", add_pooler=True, pooler_activation="linear")
    )
    with pytest.raises(roformer.CheckpointError, match="linear pooler cannot be exported"):
        roformer.to_hf(bert_linear)
    assert roformer.MaskedLM(tiny_config())(**batch).pooled is None  # no pooler, nothing pooled
