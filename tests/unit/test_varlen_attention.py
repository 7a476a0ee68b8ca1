"""Attention within segments by a variable-length kernel (packed documents, unpadded batches), on CPU.

torch's kernel (flash attention) runs on CUDA in fp16/bf16 only; here a reference kernel written from its contract
(softmax attention inside each [starts[i], starts[i+1]) run of the real tokens) stands in for it, so everything
around the kernel is tested: which forwards take it, the segments, the token layout, the rotation at each token's
position, gradients, the masked-only last layer. tests/e2e/test_gpu.py runs the real kernel against the mask.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from helpers import TINY_MODEL, padded_batch

import roformer.model.attention as attention
import roformer.model.plan as plan
from roformer.data.masking import masked_positions
from roformer.model.config import ModelConfig, RopeScaling
from roformer.model.layouts import Segments
from roformer.model.model import MaskedLM

VARLEN_ENCODINGS = ["rotary", "sinusoidal", "learned", "none"]


def reference_kernel(calls: list) -> Callable:
    """Softmax attention within each segment, one SDPA call per segment: (N, H, D) q, k, v -> (N, H, D)."""

    def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: Segments) -> torch.Tensor:
        calls.append(segments)
        starts = segments.starts.tolist()
        out = [
            F.scaled_dot_product_attention(*(t[s:e].transpose(0, 1)[None] for t in (q, k, v)))[0].transpose(0, 1)
            for s, e in zip(starts[:-1], starts[1:], strict=True)
        ]
        return torch.cat(out)

    return kernel


@pytest.fixture
def kernel_calls(monkeypatch: pytest.MonkeyPatch) -> list:
    """The reference kernel in place of torch's, available on this CPU; the list of its calls."""
    calls: list = []
    monkeypatch.setattr(plan, "varlen_kernel_available", lambda device, dtype, head_size: True)
    monkeypatch.setattr(attention, "varlen_kernel", reference_kernel(calls))
    return calls


def model_of(encoding: str, **fields) -> MaskedLM:
    torch.manual_seed(0)
    return MaskedLM(ModelConfig(**{**TINY_MODEL, "position_encoding": encoding, **fields}))


def packed_rows(pad: int = 0) -> dict[str, torch.Tensor]:
    """Two rows of packed documents (5+7+4 and 9+3+4 tokens), each followed by `pad` padding tokens."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 300, (2, 16 + pad), generator=g)
    documents = torch.tensor([[0] * 5 + [1] * 7 + [2] * 4, [3] * 9 + [4] * 3 + [5] * 4])
    documents = torch.cat((documents, torch.full((2, pad), 9)), dim=1)
    mask = torch.ones_like(ids)
    mask[:, 16:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    return {"input_ids": ids, "attention_mask": mask, "document_ids": documents}


def outputs_and_grads(model: MaskedLM, batch: dict, varlen: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The real tokens' logits and every gradient of a loss on them, with the variable-length kernel or the mask."""
    model.set_varlen_attention(varlen)
    model.zero_grad()
    logits = model(**batch).logits
    keep = batch["attention_mask"].bool() if "attention_mask" in batch else torch.ones_like(logits[..., 0]).bool()
    weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(2))
    (logits * weights)[keep].mean().backward()  # a mean: gradients of the scale of a loss
    return logits[keep].detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_computation(model: MaskedLM, batch: dict) -> None:
    logits, grads = outputs_and_grads(model, batch, varlen=True)
    mask_logits, mask_grads = outputs_and_grads(model, batch, varlen=False)
    torch.testing.assert_close(logits, mask_logits)
    assert grads.keys() == mask_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, mask_grads[name], msg=name)


@pytest.mark.parametrize("encoding", VARLEN_ENCODINGS)
@pytest.mark.parametrize("pad", [0, 3], ids=["full-rows", "padding"])
def test_packed_documents_through_the_kernel_equal_the_block_diagonal_mask(
    encoding: str, pad: int, kernel_calls: list
) -> None:
    model = model_of(encoding)
    model.set_unpadding(True)
    assert_same_computation(model, packed_rows(pad))
    assert len(kernel_calls) == TINY_MODEL["num_layers"]  # every block of the varlen forward
    assert kernel_calls[0].starts.tolist() == [0, 5, 12, 16, 25, 28, 32]
    assert kernel_calls[0].longest == 9


@pytest.mark.parametrize("encoding", VARLEN_ENCODINGS)
def test_an_unpadded_batch_through_the_kernel_equals_the_padding_mask(encoding: str, kernel_calls: list) -> None:
    model = model_of(encoding, rotary_value=encoding == "rotary")
    model.set_unpadding(True)
    batch = padded_batch(vocab_size=300)
    batch["position_ids"] = torch.arange(19).expand(3, 19) + 2  # positions are the given ones, not 0..T-1
    assert_same_computation(model, batch)
    lengths = batch["attention_mask"].sum(-1).tolist()
    assert kernel_calls[0].starts.tolist() == [0, lengths[0], lengths[0] + lengths[1], sum(lengths)]


def test_the_masked_only_last_layer_reads_the_mask_after_the_kernel(kernel_calls: list) -> None:
    model = model_of("rotary")
    model.set_unpadding(True)
    model.set_last_layer_subset(True)
    batch = packed_rows(pad=2)
    labels = torch.full_like(batch["input_ids"], -100)
    labels[:, [1, 6, 13]] = batch["input_ids"][:, [1, 6, 13]]
    losses, grads = [], []
    for varlen in (True, False):
        model.set_varlen_attention(varlen)
        model.zero_grad()
        out = model(**batch, labels=labels, masked_only=True, masked_positions=masked_positions(labels))
        out.loss.backward()
        losses.append(out.loss.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    torch.testing.assert_close(losses[0], losses[1])
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], msg=name)
    assert len(kernel_calls) == TINY_MODEL["num_layers"] - 1  # every block but the last, which computes the queries


@pytest.mark.parametrize(
    ("case", "fields"),
    [
        ("t5_bias", {"position_encoding": "t5_bias"}),
        ("alibi", {"position_encoding": "alibi"}),
        ("shaw", {"position_encoding": "shaw"}),
        ("linear", {"attention": "linear"}),
        ("unilm", {"attention_pattern": "unilm"}),
        ("self_extend", {"rope_scaling": RopeScaling(type="self_extend", factor=2, window=4)}),
        ("attention dropout in training", {"attention_dropout": 0.1}),
    ],
)
def test_the_kernel_is_not_taken_where_it_would_compute_something_else(
    case: str, fields: dict, kernel_calls: list
) -> None:
    model = model_of(fields.pop("position_encoding", "rotary"), **fields)
    model.train(case == "attention dropout in training")
    model.set_unpadding(True)
    model(**packed_rows(pad=2))
    assert kernel_calls == []


def test_the_kernel_is_not_taken_for_full_rows_padding_kept_or_a_split_document(kernel_calls: list) -> None:
    model = model_of("rotary")
    model(**padded_batch(vocab_size=300))  # unpadding off: padding's outputs stay as HF computes them
    model.set_unpadding(True)
    full = padded_batch(vocab_size=300)
    model(input_ids=full["input_ids"])  # one full row each: SDPA's own path
    split = packed_rows()
    split["document_ids"][0, :3] = 2  # document 2 both before and after document 0's tokens: one document, two runs
    model(**split)
    assert kernel_calls == []


def test_torch_kernel_is_available_only_on_cuda_in_half_precision_for_flash_head_sizes() -> None:
    available = attention.varlen_kernel_available
    assert not available(torch.device("cpu"), torch.bfloat16, 64)
    assert not available(torch.device("cuda"), torch.float32, 64)
    assert not available(torch.device("cuda"), torch.bfloat16, 26)  # 312 / 12: not a multiple of 8
    assert not available(torch.device("cuda"), torch.bfloat16, 512)


def test_a_batch_of_padding_alone_keeps_the_mask(kernel_calls: list) -> None:
    model = model_of("rotary")
    model.set_unpadding(True)
    batch = packed_rows(pad=2)
    batch["attention_mask"] = torch.zeros_like(batch["attention_mask"])
    assert torch.isfinite(model(**batch).logits).all()
    assert kernel_calls == []


def test_the_kernel_path_builds_no_mask_and_gathers_the_rotations_once(
    kernel_calls: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No (B, T, T) mask beside the kernel (unless the masked-only last block reads it), and the rotations at the
    tokens' positions gathered once a forward, not once a layer (a host sync each)."""
    from roformer.model.rotary import RotaryEmbedding

    masks, gathers = [], []
    mask_of, rotations_at = plan.self_attention_mask, RotaryEmbedding.rotations_at
    monkeypatch.setattr(plan, "self_attention_mask", lambda *a, **k: masks.append(1) or mask_of(*a, **k))
    monkeypatch.setattr(RotaryEmbedding, "rotations_at", lambda self, p: gathers.append(1) or rotations_at(self, p))
    model = model_of("rotary")
    model.set_unpadding(True)
    model(**packed_rows(pad=2))
    assert len(kernel_calls) == TINY_MODEL["num_layers"] and masks == [] and len(gathers) == 1
    model.set_varlen_attention(False)
    model(**packed_rows(pad=2))
    assert masks == [1] and len(gathers) == 2


def test_segments_of_real_tokens_and_documents() -> None:
    keep = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]).bool()
    documents = torch.tensor([[7, 7, 3, 3, 3], [3, 3, 3, 8, 8]])  # ids reused across rows: still separate runs
    segments = Segments.of(keep, documents)
    assert segments.starts.tolist() == [0, 2, 4, 7, 9] and segments.starts.dtype == torch.int32
    assert segments.longest == 3
    assert Segments.of(keep, None).starts.tolist() == [0, 4, 9]
    assert Segments.of(keep, torch.tensor([[1, 2, 1, 1, 1], [3, 3, 3, 3, 3]])) is None  # document 1 split by 2
