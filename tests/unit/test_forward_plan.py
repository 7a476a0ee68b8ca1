"""The forward plan (roformer.model.plan): every `ForwardInputs` field reaches every layer's attention through every
head, and the plan picks the documented kernel in every (encoding x attention x pattern x device) cell, the encodings
and their kernels read from their declarations (a new encoding's module, tests/e2e/test_encoding_plugin.py)."""

from __future__ import annotations

import pytest
import torch
from helpers import ENCODINGS, padded_batch, short_range, tiny_config

import roformer
from roformer.errors import ConfigError
from roformer.model.attention import ATTENTION_KERNELS, PER_ROW_INPUTS, ForwardInputs, SelfAttention
from roformer.model.config import RopeScaling, encoding_of
from roformer.model.masks import KVCache
from roformer.model.model import ARCHITECTURES
from roformer.model.plan import blocks_kernel, grid_kernel
from roformer.model.positions import attention_positions

# --- every ForwardInputs field reaches the attention context, through every head -------------------------------------


# The single-backbone models, whose forward takes `**inputs: Unpack[ForwardInputs]` (the encoder-decoder hands its
# encoder's states to its decoder as two of them: tests/unit/test_seq2seq.py)
HEADS = [name for name in ARCHITECTURES if name != "encoder_decoder"]
ENCODER_INPUTS = ("encoder_states", "encoder_mask")  # read by a model with cross_attention, given together


def given_inputs(batch: dict[str, torch.Tensor]) -> dict[str, object]:
    """A value of every ForwardInputs field for `batch`, each one that a default could not be mistaken for."""
    B, T = batch["input_ids"].shape
    S = 5  # the encoder's length
    return {
        "position_ids": torch.arange(T).expand(B, T) + 3,
        "document_ids": (torch.arange(T) >= T // 2).long().expand(B, T) + 7,
        "output_hidden_states": True,
        "cache": KVCache(),
        "encoder_states": torch.randn(B, S, 32, generator=torch.Generator().manual_seed(5)),
        "encoder_mask": (torch.arange(S) < torch.arange(S, S - B, -1)[:, None]).long(),  # (B, S), padded rows
    }


# Whether each field has one value per row of the batch (PER_ROW_INPUTS: multiple choice makes rows of its choices and
# reshapes these alone); a field of the whole batch, a tensor or not, reaches every row as given
PER_ROW = {"position_ids": True, "document_ids": True, "output_hidden_states": False, "cache": False,
           "encoder_states": True, "encoder_mask": True}  # fmt: skip


def test_the_guard_covers_every_forward_input() -> None:
    """A new ForwardInputs field (a decoder's encoder states) needs a value above and a line in PER_ROW, as
    attention.py declares it, before this file passes."""
    assert set(given_inputs(padded_batch())) == ForwardInputs.__optional_keys__ == set(PER_ROW)
    assert {name for name, per_row in PER_ROW.items() if per_row} == PER_ROW_INPUTS


@pytest.mark.parametrize("field", sorted(ForwardInputs.__optional_keys__))
@pytest.mark.parametrize("architecture", HEADS)
def test_every_forward_input_reaches_the_attention_context(
    architecture: str, field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = []
    forward = SelfAttention.forward
    monkeypatch.setattr(SelfAttention, "forward", lambda self, x, ctx: seen.append(ctx) or forward(self, x, ctx))
    cross = field in ENCODER_INPUTS  # a model that reads them, given both
    model = ARCHITECTURES[architecture](tiny_config(num_labels=2, cross_attention=cross)).eval()
    batch = padded_batch()
    given = given_inputs(batch)
    inputs = {name: given[name] for name in (ENCODER_INPUTS if cross else (field,))}
    expected = inputs[field]
    if architecture == "multiple_choice":  # K = 2 choices of each row; the choices reach attention as rows
        batch = {name: t[:, None].expand(-1, 2, -1) for name, t in batch.items()}
        inputs = {
            name: v[:, None].expand(-1, 2, *v.shape[1:]) if name in PER_ROW_INPUTS else v for name, v in inputs.items()
        }
        if field in PER_ROW_INPUTS:  # any other input reaches attention as given (tests/unit/test_choices.py)
            expected = inputs[field].reshape(-1, *inputs[field].shape[2:])
    with torch.no_grad():
        model(**batch, **inputs)
    assert len(seen) == model.config.num_layers  # every block's attention
    for ctx in seen:
        got = ctx.inputs[field]
        assert torch.equal(got, expected) if isinstance(expected, torch.Tensor) else got is expected, (ctx.index, field)
    if field == "cache":
        assert all(ctx.cache is expected for ctx in seen) and expected.length == batch["input_ids"].shape[-1]
    if cross:  # the plan's cross-attention context in every layer: the states, and the mask as (B, 1, 1, S)
        assert all(torch.equal(ctx.cross.states, ctx.inputs["encoder_states"]) for ctx in seen)
        assert all(torch.equal(ctx.cross.mask[:, 0, 0], ctx.inputs["encoder_mask"].bool()) for ctx in seen)
    else:
        assert all(ctx.cross is None for ctx in seen)


@pytest.mark.parametrize("architecture", HEADS)
def test_encoder_inputs_are_refused_by_a_model_without_cross_attention_and_needed_by_one_with_it(
    architecture: str,
) -> None:
    batch = padded_batch()
    if architecture == "multiple_choice":
        batch = {name: t[:, None] for name, t in batch.items()}
    states = torch.zeros(*batch["input_ids"].shape[:-1], 4, 32)
    with pytest.raises(ValueError, match="encoder_states / encoder_mask are for a model with cross_attention"):
        ARCHITECTURES[architecture](tiny_config(num_labels=2))(**batch, encoder_states=states)
    with pytest.raises(ValueError, match="needs the forward input encoder_states"):
        ARCHITECTURES[architecture](tiny_config(num_labels=2, cross_attention=True))(**batch)


@pytest.mark.parametrize("architecture", HEADS)
def test_a_misspelt_forward_input_is_refused_by_every_head(architecture: str) -> None:
    model = ARCHITECTURES[architecture](tiny_config(num_labels=2))
    batch = padded_batch()
    if architecture == "multiple_choice":
        batch = {name: t[:, None] for name, t in batch.items()}
    with pytest.raises(TypeError, match=r"unexpected forward inputs \['document_id'\]"):
        model(**batch, document_id=batch["input_ids"])


# --- the kernel: every (encoding x attention x pattern x device) cell -------------------------------------------------

CELL_ENCODINGS = [*ENCODINGS, "self_extend"]  # SelfExtend: rotary with rope_scaling self_extend
DEVICES = [
    ("cpu", torch.float32),
    ("cpu", torch.bfloat16),
    ("cuda", torch.float32),
    ("cuda", torch.bfloat16),
    ("cuda", torch.float16),
]


def config_of(encoding: str, attention: str, pattern: str, **fields) -> roformer.ModelConfig:
    """The tiny config of a cell (ConfigError for the combinations the config refuses)."""
    if encoding == "self_extend":
        fields["rope_scaling"] = RopeScaling(type="self_extend", factor=2, window=4)
    return short_range(
        "rotary" if encoding == "self_extend" else encoding, attention=attention, attention_pattern=pattern, **fields
    )


def documented_kernel(encoding: str, attention: str, pattern: str, device: str, dtype: torch.dtype) -> str:
    """roformer/model/plan.py's table, written out again from the encodings' declarations: the first rule that
    holds."""
    if attention == "linear":
        return "linear"
    if encoding == "self_extend":
        return "grouped"
    spec = encoding_of(encoding)
    if spec.kernel not in (None, "sdpa"):  # Shaw's terms of each layer: biased
        return spec.kernel
    if spec.adds_to_logits:  # a bias on the logits (T5, ALiBi): folded into the mask, over the grid
        return "sdpa"
    if pattern == "bidirectional" and device == "cuda" and dtype in (torch.float16, torch.bfloat16):
        return "varlen"
    return "sdpa"


@pytest.fixture
def ampere(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA device that has torch's variable-length kernel, as far as `varlen_kernel_available` asks."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))


CELLS = [
    (encoding, attention, pattern)
    for encoding in CELL_ENCODINGS
    for attention in ("softmax", "linear")
    for pattern in ("bidirectional", "causal", "unilm")
]


def test_the_cells_the_config_allows() -> None:
    """The grid below tests every cell a config can be built for: linear attention is bidirectional, not SelfExtend
    and refused by the encodings that declare so (those adding to the logits); everything else is allowed."""
    allowed = []
    for cell in CELLS:
        try:
            config_of(*cell)
            allowed.append(cell)
        except ConfigError:
            pass
    refused = {cell for cell in CELLS if cell not in allowed}
    assert refused == {
        (encoding, "linear", pattern)
        for encoding in CELL_ENCODINGS
        for pattern in ("bidirectional", "causal", "unilm")
        if pattern != "bidirectional" or encoding == "self_extend" or "linear" in encoding_of(encoding).refuses
    }


@pytest.mark.parametrize(("device", "dtype"), DEVICES, ids=[f"{d}-{str(t).split('.')[1]}" for d, t in DEVICES])
@pytest.mark.parametrize(("encoding", "attention", "pattern"), CELLS, ids=["-".join(cell) for cell in CELLS])
def test_the_plan_picks_the_documented_kernel(
    encoding: str, attention: str, pattern: str, device: str, dtype: torch.dtype, ampere: None
) -> None:
    try:
        config = config_of(encoding, attention, pattern)
    except ConfigError:
        pytest.skip("a combination the config refuses (test_the_cells_the_config_allows)")
    positions = attention_positions(config)
    kernel = blocks_kernel(config, positions, torch.device(device), dtype)
    assert kernel == documented_kernel(encoding, attention, pattern, device, dtype)
    assert kernel in ATTENTION_KERNELS
    # over the grid (no segments in the batch, or the masked-only last block) varlen gives way to SDPA
    assert grid_kernel(config, positions) == ("sdpa" if kernel == "varlen" else kernel)
    # what a variable-length kernel cannot compute keeps the grid's kernel on the GPU too: attention dropout in
    # training, a cache, the switch off
    dropout = config_of(encoding, attention, pattern, attention_dropout=0.1)
    for reason in ({"training": True}, {"cached": True}, {"varlen": False}):
        got = blocks_kernel(dropout, attention_positions(dropout), torch.device(device), dtype, **reason)
        assert got == grid_kernel(config, positions), reason


@pytest.mark.parametrize(("encoding", "attention", "pattern"), CELLS, ids=["-".join(cell) for cell in CELLS])
def test_every_layer_attends_with_the_planned_kernel(
    encoding: str, attention: str, pattern: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On this CPU: the plan of a real forward, the kernel every block's attention reads, and the masked-only last
    block, which computes its queries alone where the grid's kernel is sdpa, bidirectional, without a cache."""
    try:
        config = config_of(encoding, attention, pattern)
    except ConfigError:
        pytest.skip("a combination the config refuses (test_the_cells_the_config_allows)")
    expected = documented_kernel(encoding, attention, pattern, "cpu", torch.float32)
    model = roformer.MaskedLM(config).eval()
    batch = padded_batch()
    queries = torch.tensor([1, 4, 4, 20, 38])  # flat positions into (B * T), one asked for twice
    plan = model.backbone.plan(**batch, queries=queries)
    assert plan.kernel == expected
    subset = expected == "sdpa" and pattern == "bidirectional"
    assert (plan.last is not None) == subset
    if subset:
        assert plan.last.kernel == "sdpa" and plan.last.queries.row.tolist() == [0, 0, 1, 2]
    seen = []
    forward = SelfAttention.forward
    monkeypatch.setattr(SelfAttention, "forward", lambda self, x, ctx: seen.append(ctx.kernel) or forward(self, x, ctx))
    with torch.no_grad():
        x, _ = model.backbone.encode(**batch, queries=queries)
    assert seen == [expected] * config.num_layers and x.shape == (len(queries), config.hidden_size)
