"""Computing on the real tokens alone (`Model.set_unpadding`) and the CPU dropout: the same values as the padded
computation and as torch's dropout distribution."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import ENCODINGS, assert_checkpointing_changes_nothing, padded_batch, short_range, tiny_config
from torch.testing import assert_close

import roformer
from roformer.model.attention import softmax_attention
from roformer.model.dropout import dropout, dropout_mask
from roformer.model.layouts import RealTokens
from roformer.model.model import ARCHITECTURES, IGNORE_INDEX
from roformer.train.config import TrainConfig

HEADS = ["backbone", "masked_lm", "sequence_classification", "token_classification", "question_answering"]


def outputs_both_ways(model: roformer.Model, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's logits with unpadding off, then on."""
    results = []
    for on in (False, True):
        model.set_unpadding(on)
        with torch.no_grad():
            results.append(model(**batch).logits)
    return results[0], results[1]


def real(batch: dict) -> torch.Tensor:
    return batch["attention_mask"].bool()


def test_real_tokens_take_and_put_back() -> None:
    keep = torch.tensor([[1, 1, 0], [1, 0, 0]])
    tokens = RealTokens.of(keep)
    x = torch.arange(6.0).view(2, 3, 1)
    assert tokens.take(x).flatten().tolist() == [0.0, 1.0, 3.0]
    assert tokens.grid(tokens.take(x)).flatten().tolist() == [0.0, 1.0, 0.0, 3.0, 0.0, 0.0]


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("head", HEADS)
def test_every_real_token_is_as_padded(encoding: str, head: str) -> None:
    model = ARCHITECTURES[head](short_range(encoding, num_labels=3)).eval()
    batch = padded_batch()
    padded, unpadded = outputs_both_ways(model, batch)
    if head == "sequence_classification":
        assert_close(unpadded, padded)
    else:
        assert_close(unpadded[real(batch)], padded[real(batch)])
    if head == "backbone":
        assert unpadded[~real(batch)].abs().max() == 0  # the padding's states are zeros, not computed
        assert padded[~real(batch)].abs().max() > 0


@pytest.mark.parametrize(
    "fields",
    [
        {"attention": "linear"},
        {"attention_pattern": "unilm"},
        {"embedding_size": 16},
        {"rotary_value": True},
        {"position_encoding": "shaw", "shaw_values": True, "relative_max_distance": 5},
        {"add_pooler": True, "classifier_head": "pooler"},
    ],
    ids=lambda fields: "-".join(f"{k}={v}" for k, v in fields.items()),
)
def test_variants_are_as_padded(fields: dict) -> None:
    model = roformer.SequenceClassifier(tiny_config(**fields)).eval()
    padded, unpadded = outputs_both_ways(model, padded_batch())
    assert_close(unpadded, padded)


def test_hidden_states_are_as_padded_at_real_tokens() -> None:
    model = roformer.Backbone(tiny_config()).eval()
    batch = padded_batch()
    states = []
    for on in (False, True):
        model.set_unpadding(on)
        states.append(model(**batch, output_hidden_states=True).hidden_states)
    assert len(states[0]) == len(states[1]) == 3
    for padded, unpadded in zip(*states):
        assert_close(unpadded[real(batch)], padded[real(batch)])


def test_gradients_are_as_padded() -> None:
    """Training: the same loss and the same gradients of every parameter (no dropout, so no masks differ)."""
    batch = padded_batch()
    labels = torch.randint(0, 3, batch["input_ids"].shape).masked_fill(~real(batch), IGNORE_INDEX)
    results = []
    for on in (False, True):
        torch.manual_seed(0)
        model = roformer.TokenClassifier(tiny_config(num_labels=3)).train()
        model.set_unpadding(on)
        loss = model(**batch, labels=labels).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (loss_off, grads_off), (loss_on, grads_on) = results
    assert_close(loss_on, loss_off)
    for name, grad in grads_off.items():
        assert_close(grads_on[name], grad, msg=name)


def test_checkpointing_with_unpadding_changes_nothing() -> None:
    """Recomputed blocks replay their dropout masks on the real tokens too."""

    def build() -> roformer.Model:
        model = roformer.MaskedLM(tiny_config(hidden_dropout=0.1, attention_dropout=0.1))
        model.set_unpadding(True)
        return model

    batch = padded_batch()
    batch["labels"] = batch["input_ids"].masked_fill(~real(batch), IGNORE_INDEX)
    assert_checkpointing_changes_nothing(build, batch)


def test_without_padding_nothing_changes() -> None:
    model = roformer.MaskedLM(tiny_config()).eval()
    ids = torch.randint(1, 101, (2, 9))
    padded, unpadded = outputs_both_ways(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    assert torch.equal(unpadded, padded)


def test_multiple_choice_summary_of_the_last_position_keeps_the_padding() -> None:
    """HF's `mlp` summary reads the last position, padding or not: that head is never unpadded; the pooler's is."""
    batch = {k: v.view(1, 3, -1) for k, v in padded_batch().items()}
    mlp = roformer.MultipleChoice(tiny_config()).eval()
    mlp.set_unpadding(True)
    assert not mlp.backbone.unpadding
    padded, unpadded = outputs_both_ways(mlp, batch)
    assert torch.equal(unpadded, padded)
    pooler = roformer.MultipleChoice(tiny_config(classifier_head="pooler")).eval()
    pooler.set_unpadding(True)
    assert pooler.backbone.unpadding
    padded, unpadded = outputs_both_ways(pooler, batch)
    assert_close(unpadded, padded)


def test_a_cached_decode_is_not_unpadded() -> None:
    model = roformer.CausalLM(tiny_config(attention_pattern="causal")).eval()
    ids = torch.randint(1, 101, (2, 6))
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    outs = []
    for on in (False, True):
        model.set_unpadding(on)
        outs.append(model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False))
    assert torch.equal(outs[0], outs[1])


def test_training_unpads_unless_compiled_or_told_not_to() -> None:
    assert TrainConfig().unpadding_on()
    assert not TrainConfig(compile=True).unpadding_on()
    assert TrainConfig(compile=True, unpadding=True).unpadding_on()
    assert not TrainConfig(unpadding=False).unpadding_on()


# --- dropout ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_drops_p_of_the_elements_in_both_halves_of_each_draw(p: float) -> None:
    torch.manual_seed(0)
    n = 2_000_000
    drop, scale = dropout_mask(torch.empty(n), p)
    dropped = round(p * 2**32) / 2**32
    assert scale == pytest.approx(1 / (1 - dropped), rel=1e-12)
    # 5 standard deviations of a binomial fraction over n / 2 elements
    tolerance = 5 * math.sqrt(p * (1 - p) / (n / 2))
    for half in (drop[0::2], drop[1::2]):  # the low and the high 32 bits of the 64-bit draws
        assert abs(half.float().mean().item() - dropped) < tolerance
    # neighbours are independent: P(both dropped) = p^2
    assert abs((drop[0::2] & drop[1::2]).float().mean().item() - dropped**2) < 5 * math.sqrt(p**2 / (n / 2))


def test_dropout_keeps_the_expectation_and_replays_with_the_seed() -> None:
    x = torch.randn(1000, 64)
    torch.manual_seed(3)
    y = dropout(x, 0.1)
    kept = y != 0
    assert_close(y[kept], x[kept] * (2**32 / (2**32 - round(0.1 * 2**32))))
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.1), y)
    assert dropout(x, 0.1, training=False) is x and dropout(x, 0.0) is x
    assert dropout(x, 1.0).abs().max() == 0
    many = torch.stack([dropout(torch.ones(20_000), 0.3) for _ in range(20)])
    assert abs(many.mean().item() - 1.0) < 0.01


@pytest.mark.parametrize("p", [-0.1, 1.5, float("nan")])
@pytest.mark.parametrize("training", [True, False])
def test_dropout_refuses_a_probability_outside_0_1_as_torch_does(p: float, training: bool) -> None:
    """In training and out of it, with F.dropout's ValueError and message (p = -0.1 used to zero 90% of `x`)."""
    x = torch.ones(100)
    with pytest.raises(ValueError, match=rf"^dropout probability has to be between 0 and 1, but got {p}$"):
        dropout(x, p, training)
    if not math.isnan(p):  # torch's own check lets NaN through
        with pytest.raises(ValueError, match=rf"^dropout probability has to be between 0 and 1, but got {p}$"):
            F.dropout(x, p, training)


def test_dropout_gradient_is_the_mask_times_the_scale() -> None:
    x = torch.randn(500, 8, requires_grad=True)
    torch.manual_seed(1)
    y = dropout(x, 0.2)
    y.sum().backward()
    assert_close(x.grad, (y != 0).float() * (2**32 / (2**32 - round(0.2 * 2**32))))


@pytest.mark.parametrize("mask_kind", ["bool", "float", "causal", "none"])
def test_cpu_attention_with_dropout_is_sdpa_with_the_same_mask(mask_kind: str, monkeypatch) -> None:
    """Written out for dropout on CPU: with a mask that drops nothing it equals SDPA, with one that drops it equals
    the paper's softmax(q k^T / sqrt(d)) dropped and scaled, then times v."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4) for _ in range(3))
    mask = {
        "bool": torch.tensor([True, True, True, False, False]).expand(2, 1, 5, 5),
        "float": torch.randn(2, 3, 5, 5),
        "causal": None,
        "none": None,
    }[mask_kind]
    causal = mask_kind == "causal"
    keep_all = torch.zeros(2, 3, 5, 5, dtype=torch.bool)
    monkeypatch.setattr("roformer.model.attention.dropout_mask", lambda x, p: (keep_all, 1.0))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    assert_close(softmax_attention(q, k, v, mask, 0.1, causal), expected)
    drop = torch.rand(2, 3, 5, 5) < 0.3
    monkeypatch.setattr("roformer.model.attention.dropout_mask", lambda x, p: (drop, 1 / 0.7))
    logits = q @ k.transpose(-1, -2) / 2.0
    if mask_kind == "bool":
        logits = logits.masked_fill(~mask, float("-inf"))
    elif mask_kind == "float":
        logits = logits + mask
    elif causal:
        logits = logits.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    probs = logits.softmax(-1).masked_fill(drop, 0.0) / 0.7
    assert_close(softmax_attention(q, k, v, mask, 0.1, causal), probs @ v)
