"""`roformer attention-distance`: tiny random models of every position encoding on a tiny text folder, and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import ENCODINGS, tiny_config

import roformer
from roformer.cli import main
from roformer.data.builtin import generate_documents
from roformer.data.tokenizer import save_tokenizer, train_tokenizer
from roformer.model.config import EncoderDecoderConfig

LENGTH = 24


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A text folder, and a tiny random masked LM with a tokenizer for every encoding (and one of linear attention)."""
    tmp = tmp_path_factory.mktemp("attention-distance")
    documents = list(generate_documents(120, seed=3))
    text = tmp / "text"
    text.mkdir()
    (text / "a.txt").write_text("\n\n".join(documents[:40]))
    (text / "b.txt").write_text("\n\n".join(documents[40:]))
    tokenizer = train_tokenizer(documents, vocab_size=200)
    runes = tmp / "runes"  # a script the tokenizer never saw: every word [UNK]
    runes.mkdir()
    (runes / "a.txt").write_text("\n\n".join(" ".join(["ᚠᚢᚦ ᚨᚱᚲ ᚷᚹᚺ"] * 30) for _ in range(20)))
    found = {"text": text, "runes": runes}
    for name, fields in [*((e, {"position_encoding": e}) for e in ENCODINGS), ("linear", {"attention": "linear"})]:
        torch.manual_seed(0)
        roformer.MaskedLM(tiny_config(vocab_size=len(tokenizer), **fields)).save(tmp / name)
        save_tokenizer(tokenizer, tmp / name)
        found[name] = tmp / name
    halves = EncoderDecoderConfig(tiny_config(vocab_size=len(tokenizer)), tiny_config(vocab_size=len(tokenizer)))
    roformer.EncoderDecoder(halves).save(tmp / "encoder_decoder")  # with the MLM tokenizer: the model is refused
    save_tokenizer(tokenizer, tmp / "encoder_decoder")
    found["encoder_decoder"] = tmp / "encoder_decoder"
    return found


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_every_encoding_gives_curves_per_layer_and_head(
    encoding: str, folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "curves.json"
    args = ["--model", str(folders[encoding]), "--data", str(folders["text"]), "--out", str(out)]
    assert main(["attention-distance", *args, "--length", str(LENGTH), "--samples", "3", "--batch-size", "2"]) == 0
    printed = capsys.readouterr().out
    assert "mean pre-softmax logit by distance" in printed and f"written to {out}" in printed
    result = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert (result["position_encoding"], result["length"], result["samples"]) == (encoding, LENGTH, 3)
    assert result["unknown_rate"] == 0.0 and "0.00% [UNK]" in printed  # its own tokenizer's text
    assert result["distances"] == list(range(LENGTH))
    assert result["pairs"] == [3 * (LENGTH if r == 0 else 2 * (LENGTH - r)) for r in range(LENGTH)]
    assert [layer["layer"] for layer in result["layers"]] == [0, 1]
    for layer in result["layers"]:
        assert len(layer["mean_logit"]) == len(layer["mean_weight"]) == LENGTH
        heads = layer["heads"]
        assert len(heads["mean_logit"]) == len(heads["mean_weight"]) == 4
        assert all(len(row) == LENGTH and None not in row for row in heads["mean_logit"] + heads["mean_weight"])
        # every query's weights sum to 1: pairs x mean weight, summed over distances, is the number of queries
        queries = sum(p * w for p, w in zip(result["pairs"], layer["mean_weight"], strict=True))
        assert queries == pytest.approx(3 * LENGTH, rel=1e-4)
    bound = result["bound"]
    assert bound["head_size"] == 8 and len(bound["relative_upper_bound"]) == LENGTH
    assert bound["relative_upper_bound"][0] == pytest.approx((8 / 2 + 1) / 2)


@pytest.mark.parametrize(
    ("which", "extra", "message"),
    [
        ("model", [], "--model: {missing}: model directory not found"),
        ("data", [], "--data: {missing}: no such file or folder"),
        ("linear", [], "linear attention has no softmax logits"),
        ("learned", ["--length", "100"], "--length 100: {model} has learned positions for 64 tokens"),
        ("rotary", ["--length", "50000"], "a window of --length 50000 needs 49998"),
        # it spoke of a tokenizer without [MASK], or of a tokenizer its model has no use for
        ("encoder_decoder", [], "--model {model}: an encoder-decoder; attention-distance needs an encoder model"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    which: str, extra: list[str], message: str, folders: dict[str, Path], tmp_path: Path, capsys
) -> None:
    missing = tmp_path / "missing"
    model = missing if which == "model" else folders["rotary" if which == "data" else which]
    data = missing if which == "data" else folders["text"]
    out = tmp_path / "curves.json"
    code = main(["attention-distance", "--model", str(model), "--data", str(data), "--out", str(out), *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and message.format(missing=missing, model=model) in err, err
    assert not out.exists() and not out.with_suffix(".png").exists()


def test_results_are_kept_unless_overwrite(folders: dict[str, Path], tmp_path: Path, capsys) -> None:
    out = tmp_path / "curves.json"
    args = ["attention-distance", "--model", str(folders["alibi"]), "--data", str(folders["text"]), "--out", str(out)]
    args += ["--length", "16", "--samples", "1"]
    assert main(args) == 0
    assert main(args) == 2
    assert "exists (--overwrite replaces it)" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0


def test_text_the_model_cannot_read_is_refused_with_its_unknown_rate(
    folders: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Curves over windows of [UNK] are those of one repeated token: refused above MAX_UNKNOWN_RATE, the rate said."""
    from roformer.study.decay import MAX_UNKNOWN_RATE

    out = tmp_path / "curves.json"
    args = ["--model", str(folders["rotary"]), "--data", str(folders["runes"]), "--out", str(out)]
    assert main(["attention-distance", *args, "--length", str(LENGTH), "--samples", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--data {folders['runes']}: 100.0% of its tokens are [UNK]" in err, err
    assert f"(more than {MAX_UNKNOWN_RATE:.0%})" in err and not out.exists()
