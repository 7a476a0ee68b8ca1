"""`roformer convert` as a user runs it, in a subprocess: an HF checkpoint in and back out, and bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest
import transformers
from helpers import VOCAB, hf_output, make_hf, our_output, padded_batch, tiny_config
from torch.testing import assert_close

import roformer


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "roformer", *args], capture_output=True, text=True)


@pytest.mark.slow
def test_convert_cli_round_trip(tmp_path) -> None:
    hf_model = make_hf("roformer-mlm")
    hf_dir, ours_dir, back_dir = tmp_path / "hf", tmp_path / "ours", tmp_path / "back"
    hf_model.save_pretrained(hf_dir)
    (hf_dir / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    result = run_cli("convert", "--from-hf", str(hf_dir), "--out", str(ours_dir))
    assert result.returncode == 0, result.stderr
    assert (ours_dir / "vocab.txt").is_file()
    ours = roformer.load(ours_dir)
    batch = padded_batch(VOCAB)
    assert_close(our_output(ours, batch), hf_output(hf_model, batch))
    result = run_cli("convert", "--to-hf", str(ours_dir), "--out", str(back_dir))
    assert result.returncode == 0, result.stderr
    back = transformers.AutoModelForMaskedLM.from_pretrained(back_dir).eval()
    assert_close(hf_output(back, batch), hf_output(hf_model, batch))
    assert (back_dir / "vocab.txt").is_file()


def test_convert_cli_bad_input(tmp_path) -> None:
    result = run_cli("convert", "--to-hf", str(tmp_path / "missing"), "--out", str(tmp_path / "o"))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "model directory not found" in result.stderr
    assert "Traceback" not in result.stderr
    # a non-empty output directory is refused and left untouched
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    roformer.MaskedLM(tiny_config()).save(tmp_path / "m")
    result = run_cli("convert", "--to-hf", str(tmp_path / "m"), "--out", str(out))
    assert result.returncode == 2 and "not empty" in result.stderr and result.stderr.count("\n") == 1
    assert (out / "keep.txt").read_text() == "precious" and len(list(out.iterdir())) == 1
    result = run_cli("convert", "--out", str(out))
    assert result.returncode == 2 and result.stderr.count("\n") == 1
