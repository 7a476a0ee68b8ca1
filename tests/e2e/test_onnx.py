"""`roformer export --format onnx`: every architecture and position encoding, run in onnxruntime against PyTorch.

The file is traced once at a small shape; it must then run at other batch sizes, choice counts and lengths up to
its `max_length`, with padding (a row of padding only included), and match PyTorch at float32 tolerance.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from helpers import BIASED, ENCODINGS, tiny_config
from torch.testing import assert_close

from roformer.cli import main
from roformer.model.model import ARCHITECTURES
from roformer.model.onnx import INPUT_NAMES, ONNX_FILE, export_onnx

ort = pytest.importorskip("onnxruntime", reason="ONNX export tests need onnxruntime (pip install '.[onnx]')")
pytest.importorskip("onnxscript", reason="torch.onnx's exporter needs onnxscript (pip install '.[onnx]')")

# Every head with rotary; every other encoding under an encoder head and the multiple-choice head (whose padded
# choices are rows of padding only); the encodings that add to the mask under a decoder (its mask is built apart).
CASES = (
    [(arch, "rotary") for arch in ARCHITECTURES if arch != "encoder_decoder"]  # refused: test_seq2seq.py
    + [(arch, encoding) for arch in ("masked_lm", "multiple_choice") for encoding in ENCODINGS if encoding != "rotary"]
    + [("causal_lm", encoding) for encoding in BIASED]
)
# CI runs every encoding once: rotary and the absolute ones under the masked-LM head, the relative biases under the
# multiple-choice head (padded choices), T5's bucketed bias under the decoder, rotary also under those two; the other
# pairings (the remaining heads add a linear layer to the same exported backbone) are `slow`
IN_CI = {("masked_lm", e) for e in ("sinusoidal", "learned", "none")}
IN_CI |= {("multiple_choice", e) for e in ("shaw", "t5_bias", "alibi")} | {("causal_lm", "t5_bias")}
IN_CI |= {(arch, "rotary") for arch in ("masked_lm", "multiple_choice", "causal_lm")}  # other heads: one layer more


def run_both(model, path: Path, shape: tuple[int, ...]) -> tuple[list, object]:
    """onnxruntime's outputs and PyTorch's for one padded batch of `shape`, its last row (or choice) all padding."""
    generator = torch.Generator().manual_seed(sum(shape))
    ids = torch.randint(1, 101, shape, generator=generator)
    mask = torch.ones_like(ids)
    mask[0, ..., -3:] = 0  # the first row padded
    # no real token at all: a padded choice of the last example, or a static batch's filler row
    mask[(-1, -1) if ids.dim() == 3 else -1] = 0
    types = torch.randint(0, 2, shape, generator=generator)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outputs = session.run(None, dict(zip(INPUT_NAMES, (ids.numpy(), mask.numpy(), types.numpy()), strict=True)))
    with torch.no_grad():
        reference = model(ids, attention_mask=mask, token_type_ids=types)
    return outputs, reference


@pytest.mark.parametrize(
    ("architecture", "encoding"),
    [case if case in IN_CI else pytest.param(*case, marks=pytest.mark.slow) for case in CASES],
)
def test_exported_file_matches_pytorch_at_other_shapes(architecture: str, encoding: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    fields = {"add_pooler": True} if architecture == "backbone" else {}
    if encoding == "shaw":
        fields["relative_max_distance"] = 6  # clipped within the tested lengths
    model = ARCHITECTURES[architecture](tiny_config(position_encoding=encoding, **fields)).eval()
    path = export_onnx(model, tmp_path / ONNX_FILE, max_length=64)
    for batch, length in ((3, 40), (2, 64)):  # traced at (2, 8): both axes are dynamic
        shape = (batch, 3, length) if architecture == "multiple_choice" else (batch, length)
        outputs, reference = run_both(model, path, shape)
        assert reference.logits.isfinite().all()
        assert_close(torch.from_numpy(outputs[0]), reference.logits)  # NaN in onnxruntime fails here too
        if reference.pooled is not None:
            assert len(outputs) == 2
            assert_close(torch.from_numpy(outputs[1]), reference.pooled)


def test_export_warns_nothing_and_names_every_axis(tmp_path: Path) -> None:
    """Shared axes are named once (torch warned about each input's copy of a name) and the exported copy is in eval
    mode; the three inputs share the names."""
    model = ARCHITECTURES["multiple_choice"](tiny_config())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        path = export_onnx(model, tmp_path / ONNX_FILE, max_length=16)
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [(i.name, i.shape) for i in session.get_inputs()] == [
        (name, ["batch", "choices", "sequence"]) for name in INPUT_NAMES
    ]
    assert session.get_outputs()[0].shape == ["batch", "choices"]


def test_cli_writes_the_file_config_and_tokenizer_and_refuses_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    torch.manual_seed(0)
    model = ARCHITECTURES["sequence_classification"](tiny_config())
    model.save(tmp_path / "model")
    bf16 = ARCHITECTURES["sequence_classification"](tiny_config()).to(torch.bfloat16).train()
    export_onnx(bf16, tmp_path / "bf16.onnx", max_length=16)
    assert bf16.training and {p.dtype for p in bf16.parameters()} == {torch.bfloat16}  # the caller's model untouched
    (tmp_path / "model" / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    assert (
        main(["export", "--model", str(tmp_path / "model"), "--out", str(tmp_path / "onnx"), "--max-length", "32"]) == 0
    )
    assert "sequences up to 32 tokens, outputs logits, tokenizer: vocab.txt" in capsys.readouterr().out
    assert {p.name for p in (tmp_path / "onnx").iterdir()} == {ONNX_FILE, "config.yaml", "vocab.txt"}
    outputs, reference = run_both(model.eval(), tmp_path / "onnx" / ONNX_FILE, (2, 32))
    assert_close(torch.from_numpy(outputs[0]), reference.logits)
    # an existing output is not replaced without --overwrite; a learned table cannot go beyond its rows
    assert main(["export", "--model", str(tmp_path / "model"), "--out", str(tmp_path / "onnx")]) == 2
    assert "--overwrite" in capsys.readouterr().err
    ARCHITECTURES["masked_lm"](tiny_config(position_encoding="learned")).save(tmp_path / "learned")
    code = main(["export", "--model", str(tmp_path / "learned"), "--out", str(tmp_path / "x"), "--max-length", "100"])
    errors = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(errors) == 1 and "learned positions cover 64 tokens" in errors[0]
    assert not (tmp_path / "x").exists()
    assert main(["export", "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "y")]) == 2
