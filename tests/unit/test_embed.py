"""Sentence embeddings: pooling against its definitions, the encoder's batching against one text at a time, the files
in and out, and `roformer embed`'s errors."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import ENCODINGS, tiny_config
from torch.testing import assert_close

import roformer
from roformer.data.builtin import generate_documents
from roformer.data.tokenizer import train_tokenizer
from roformer.embed import (
    SentenceEncoder,
    check_vectors_path,
    default_pooling,
    read_texts,
    read_vectors,
    write_vectors,
)
from roformer.errors import UserError
from roformer.model.model import pool_states

TEXTS = [
    "the cat",
    "a much longer sentence about the cat and the dog that sat on the mat by the door",
    "",
    "dogs",
    "the dog sat on the mat",
]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(list(generate_documents(200)) + TEXTS, vocab_size=300)


def embed_cli(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    """`roformer embed ARGS` in this process: (exit code, stdout, stderr)."""
    from roformer.cli import main

    code = main(["embed", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def states() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(3, 5, 4)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])  # right, none, left padding
    return x, mask


def test_pooling_follows_its_definitions() -> None:
    x, mask = states()
    assert_close(pool_states(x, mask, "cls"), x[:, 0])
    assert_close(pool_states(x, mask, "mean")[0], x[0, :3].mean(0))
    assert_close(pool_states(x, mask, "mean")[2], x[2, 2:].mean(0))
    assert_close(pool_states(x, mask, "last"), torch.stack([x[0, 2], x[1, 4], x[2, 4]]))
    assert_close(pool_states(x, None, "mean"), x.mean(1))
    pooled = torch.randn(3, 4)
    assert pool_states(x, mask, "pooler", pooled) is pooled
    with pytest.raises(ValueError, match="needs a model with a pooler"):
        pool_states(x, mask, "pooler")
    with pytest.raises(ValueError, match="unknown pooling 'max'"):
        pool_states(x, mask, "max")


@pytest.mark.parametrize("pooling", ["cls", "mean", "pooler", "last"])
def test_model_embed_is_the_pooled_backbone_output(pooling: str) -> None:
    model = roformer.SequenceClassifier(tiny_config(add_pooler=True)).eval()
    ids = torch.randint(1, 101, (2, 7))
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    out = model.backbone(ids, attention_mask=mask)
    expected = pool_states(out.logits, mask, pooling, out.pooled)
    assert_close(model.embed(ids, mask, pooling=pooling), expected)
    assert_close(model.embed(ids, mask, pooling=pooling, normalize=True), F.normalize(expected, dim=-1))


def test_sim_models_pool_with_their_linear_pooler_by_default() -> None:
    assert default_pooling(tiny_config(add_pooler=True, pooler_activation="linear")) == "pooler"
    assert default_pooling(tiny_config(add_pooler=True)) == "mean"
    assert default_pooling(tiny_config()) == "mean"


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("pooling", ["cls", "mean", "last"])
def test_batched_vectors_equal_each_text_alone_in_the_texts_order(tokenizer, encoding: str, pooling: str) -> None:
    """Sorted by length, padded in batches, computed on real tokens: each row is what the text gives alone."""
    model = roformer.Backbone(tiny_config(vocab_size=len(tokenizer), position_encoding=encoding))
    encoder = SentenceEncoder(model, tokenizer, pooling=pooling)
    batched = encoder.encode(TEXTS, batch_size=2)
    alone = np.concatenate([encoder.encode([text], batch_size=1) for text in TEXTS])
    assert batched.shape == (len(TEXTS), 32) and batched.dtype == np.float32
    np.testing.assert_allclose(batched, alone, rtol=1.3e-6, atol=1e-5)
    assert not np.allclose(batched[0], batched[1])


def test_normalized_bf16_vectors_are_unit_length_and_near_fp32(tokenizer) -> None:
    encoder = SentenceEncoder(roformer.Backbone(tiny_config(vocab_size=len(tokenizer))), tokenizer)
    fp32 = encoder.encode(TEXTS, normalize=True)
    bf16 = encoder.encode(TEXTS, normalize=True, precision="bf16")
    np.testing.assert_allclose(np.linalg.norm(fp32, axis=1), 1.0, rtol=1e-5)
    assert (fp32 * bf16).sum(1).min() > 0.99  # cosine of each text's two vectors


def test_texts_longer_than_max_length_are_cut(tokenizer) -> None:
    encoder = SentenceEncoder(roformer.Backbone(tiny_config(vocab_size=len(tokenizer))), tokenizer, max_length=5)
    assert max(len(ids) for ids in encoder.tokenize(TEXTS)) == 5
    assert encoder.tokenize(TEXTS) == tokenizer(TEXTS, truncation=True, max_length=5)["input_ids"]  # transformers' ids
    assert tokenizer(TEXTS[1])["input_ids"][-1] == tokenizer.sep_token_id  # the shared tokenizer is left as it was
    assert len(tokenizer(TEXTS[1])["input_ids"]) > 5
    assert encoder.encode(TEXTS).shape == (5, 32)


def test_the_encoder_refuses_what_the_model_cannot_give(tokenizer) -> None:
    model = roformer.Backbone(tiny_config(vocab_size=len(tokenizer), position_encoding="learned"))
    with pytest.raises(UserError, match="has no pooler"):
        SentenceEncoder(model, tokenizer, pooling="pooler")
    with pytest.raises(UserError, match="expected one of cls, mean, pooler, last"):
        SentenceEncoder(model, tokenizer, pooling="max")
    with pytest.raises(UserError, match="exceeds the learned position table"):
        SentenceEncoder(model, tokenizer, max_length=65)
    assert SentenceEncoder(model, tokenizer).max_length == 64


def test_a_model_directory_loads_with_its_weights_and_no_fresh_ones(tmp_path: Path, tokenizer, caplog) -> None:
    model = roformer.MaskedLM(tiny_config(vocab_size=len(tokenizer)))
    model.save(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    with caplog.at_level(logging.INFO):
        encoder = SentenceEncoder.load(tmp_path / "m")
    assert "freshly initialised" not in caplog.text
    expected = SentenceEncoder(model.backbone, tokenizer).encode(TEXTS)
    np.testing.assert_allclose(encoder.encode(TEXTS), expected, rtol=1.3e-6, atol=1e-5)


# --- files ----------------------------------------------------------------------------------------------------------


def test_texts_are_read_from_lines_and_columns(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_text("one\n\nthree\n", encoding="utf-8")
    assert read_texts(tmp_path / "t.txt") == ["one", "", "three"]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"s": s, "n": i}) + "\n" for i, s in enumerate("ab")))
    assert read_texts(tmp_path / "t.jsonl", "s") == ["a", "b"]
    (tmp_path / "t.csv").write_text('text,label\nhello,1\n"a, b",0\n')
    assert read_texts(tmp_path / "t.csv") == ["hello", "a, b"]
    with pytest.raises(UserError, match=r"t\.jsonl:1: no field 'text'"):
        read_texts(tmp_path / "t.jsonl")
    with pytest.raises(UserError, match="no columns"):
        read_texts(tmp_path / "t.txt", "text")
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(UserError, match="no texts to embed"):
        read_texts(tmp_path / "empty.txt")
    with pytest.raises(UserError, match="not found"):
        read_texts(tmp_path / "missing.txt")


def test_a_txt_file_has_one_text_per_newline_and_no_other_break(tmp_path: Path) -> None:
    """Form feed, U+2028, \\x1c, \\x85 and a lone \\r are text (str.splitlines broke there): row i is line i."""
    path = tmp_path / "t.txt"
    path.write_bytes("a\x0cb\nc\u2028d\r\ne\x1cf\x1dg\x1eh\n\ni\x85j\rk\u2029l\n".encode())
    assert read_texts(path) == ["a\x0cb", "c\u2028d", "e\x1cf\x1dg\x1eh", "", "i\x85j\rk\u2029l"]
    for text, lines in [("x", ["x"]), ("x\n", ["x"]), ("x\r\n", ["x"]), ("x\n\n", ["x", ""]), ("\n", [""])]:
        path.write_bytes(text.encode())
        assert read_texts(path) == lines, text


@pytest.mark.parametrize("suffix", [".npy", ".safetensors"])
def test_vectors_are_written_whole_and_read_back(tmp_path: Path, suffix: str) -> None:
    vectors = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    path = tmp_path / f"v{suffix}"
    write_vectors(path, vectors)
    assert np.array_equal(read_vectors(path), vectors)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temporary file left
    with pytest.raises(UserError, match="exists"):
        check_vectors_path(path, overwrite=False)
    assert check_vectors_path(path, overwrite=True) == path
    with pytest.raises(UserError, match="expected a .npy or .safetensors file"):
        check_vectors_path(tmp_path / "v.pt", overwrite=False)


def test_embed_command(tmp_path: Path, tokenizer, capsys: pytest.CaptureFixture) -> None:
    model = roformer.Backbone(tiny_config(vocab_size=len(tokenizer), add_pooler=True, pooler_activation="linear"))
    model.save(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    (tmp_path / "t.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    args = ["--model", str(tmp_path / "m"), "--input", str(tmp_path / "t.txt")]
    code, out, _ = embed_cli([*args, "--out", str(tmp_path / "v.npy"), "--normalize", "--batch-size", "2"], capsys)
    assert code == 0 and "5 x 32 vectors (pooler pooling, unit length) written to" in out
    expected = SentenceEncoder(model, tokenizer).encode(TEXTS, normalize=True)
    np.testing.assert_allclose(np.load(tmp_path / "v.npy"), expected, rtol=1.3e-6, atol=1e-5)
    before = (tmp_path / "v.npy").read_bytes()
    code, _, err = embed_cli([*args, "--out", str(tmp_path / "v.npy")], capsys)
    assert code == 2 and "exists (pass --overwrite" in err and (tmp_path / "v.npy").read_bytes() == before


def saved_backbone(folder: Path, tokenizer) -> Path:
    """A tiny random backbone and `tokenizer`, saved as a model directory."""
    roformer.Backbone(tiny_config(vocab_size=len(tokenizer))).save(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_embed_makes_the_output_folder(tmp_path: Path, tokenizer, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "t.txt").write_text("one\ntwo\n", encoding="utf-8")
    out = tmp_path / "new" / "deeper" / "v.safetensors"
    args = ["--model", str(saved_backbone(tmp_path / "m", tokenizer)), "--input", str(tmp_path / "t.txt")]
    code, _, err = embed_cli([*args, "--out", str(out)], capsys)
    assert code == 0, err
    assert read_vectors(out).shape == (2, 32) and [p.name for p in out.parent.iterdir()] == [out.name]


def test_an_output_folder_that_cannot_be_made_is_refused_before_the_work(
    tmp_path: Path, tokenizer, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "t.txt").write_text("one\n", encoding="utf-8")
    (tmp_path / "file").write_text("kept")
    monkeypatch.setattr(SentenceEncoder, "encode", lambda *a, **k: pytest.fail("encoded before the output was checked"))
    args = ["--model", str(saved_backbone(tmp_path / "m", tokenizer)), "--input", str(tmp_path / "t.txt")]
    code, _, err = embed_cli([*args, "--out", str(tmp_path / "file" / "sub" / "v.npy")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "file is a file" in err, err
    assert (tmp_path / "file").read_text() == "kept"


def test_a_failed_vectors_write_is_one_line_and_loses_nothing(
    tmp_path: Path, tokenizer, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folder checked before the work is taken meanwhile (a file made where it goes): one line, exit 2."""
    (tmp_path / "t.txt").write_text("one\ntwo\n", encoding="utf-8")
    encode = SentenceEncoder.encode

    def encode_while_the_folder_is_taken(self, *args, **kwargs) -> np.ndarray:
        (tmp_path / "out").write_text("kept")
        return encode(self, *args, **kwargs)

    monkeypatch.setattr(SentenceEncoder, "encode", encode_while_the_folder_is_taken)
    args = ["--model", str(saved_backbone(tmp_path / "m", tokenizer)), "--input", str(tmp_path / "t.txt")]
    code, out, err = embed_cli([*args, "--out", str(tmp_path / "out" / "v.npy")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert re.search(r"cannot write .*out/v\.npy", err) and "written to" not in out, err
    assert (tmp_path / "out").read_text() == "kept"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"--model": "missing"}, "missing"),
        ({"--input": "missing.txt"}, r"missing\.txt: data file not found"),
        ({"--out": "v.pt"}, r"v\.pt: expected a \.npy or \.safetensors file"),
        ({"--pooling": "pooler"}, "has no pooler"),
    ],
)
def test_embed_command_bad_input_is_one_line(
    tmp_path: Path, tokenizer, change: dict, message: str, capsys: pytest.CaptureFixture
) -> None:
    roformer.Backbone(tiny_config(vocab_size=len(tokenizer))).save(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    (tmp_path / "t.txt").write_text("a\n")
    options = {"--model": str(tmp_path / "m"), "--input": str(tmp_path / "t.txt"), "--out": str(tmp_path / "v.npy")}
    for key, value in change.items():
        options[key] = value if key == "--pooling" else str(tmp_path / value)
    code, _, err = embed_cli(sum(([k, v] for k, v in options.items()), []), capsys)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and re.search(message, err), err
    assert not (tmp_path / "v.npy").exists()


def test_a_word_level_model_is_read_in_jieba_s_words_unasked_and_false_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from roformer.data.tokenizer import load_tokenizer
    from roformer.embed import SentenceEncoder

    model = tmp_path / "wobert"
    model.mkdir()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"今天气很好", "今天", "天气"]
    (model / "vocab.txt").write_text("".join(f"{t}\n" for t in vocab), encoding="utf-8")
    roformer.Backbone(tiny_config(vocab_size=len(load_tokenizer(model)))).save(model)
    (tmp_path / "t.txt").write_text("今天天气很好\n", encoding="utf-8")
    args = ["--model", str(model), "--input", str(tmp_path / "t.txt"), "--out", str(tmp_path / "v.npy")]
    code, _, err = embed_cli(args, capsys)
    assert code == 0, err  # a word-level vocabulary implies jieba (was refused without --jieba)
    encoder = SentenceEncoder.load(model)
    assert encoder.segment is not None and " " in encoder.segment("今天天气很好")  # jieba's words, spelled out
    with pytest.raises(UserError, match=rf"{model}: the tokenizer is word-level Chinese .* jieba is false"):
        SentenceEncoder.load(model, jieba=False)


# --- RoFormer-Sim's paraphrases ---------------------------------------------------------------------------------


def test_decoded_chinese_loses_the_spaces_between_characters_only() -> None:
    from roformer.embed import joined_text

    assert joined_text("今 天 天 气 很 好 ！") == "今天天气很好！"
    assert joined_text("我 love 你") == "我 love 你"
    assert joined_text(" the cat sat ") == "the cat sat"


def test_similar_sentences_are_distinct_samples_ranked_by_the_pooled_cosine(tokenizer) -> None:
    from roformer.embed import similar_sentences

    config = tiny_config(
        vocab_size=len(tokenizer), attention_pattern="unilm", add_pooler=True, pooler_activation="linear"
    )
    torch.manual_seed(0)
    sim = roformer.CausalLM(config)
    texts = ["the cat sat on the mat", "dogs"]
    ranked = similar_sentences(sim, tokenizer, texts, n=6, max_new_tokens=6, generator=torch.Generator().manual_seed(1))
    again = similar_sentences(sim, tokenizer, texts, n=6, max_new_tokens=6, generator=torch.Generator().manual_seed(1))
    assert ranked == again  # the generator decides the draws
    encoder = SentenceEncoder(sim, tokenizer, pooling="pooler")
    for text, candidates in zip(texts, ranked):
        assert 1 <= len(candidates) <= 6
        names = [c for c, _ in candidates]
        assert len(set(names)) == len(names) and text not in names and "" not in names
        scores = [s for _, s in candidates]
        assert scores == sorted(scores, reverse=True)
        vectors = encoder.encode([text, *names], normalize=True)
        np.testing.assert_allclose(scores, vectors[1:] @ vectors[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(UserError, match="n must be >= 1"):
        similar_sentences(sim, tokenizer, texts, n=0)


def model_settings(model: torch.nn.Module) -> list[tuple[str, bool, bool | None]]:
    """Every module's name, training mode and unpadding setting (None for a module without one)."""
    return [(name, m.training, getattr(m, "unpadding", None)) for name, m in model.named_modules()]


@pytest.mark.parametrize("unpadding", [False, True])
def test_the_encoder_leaves_the_callers_model_as_it_was(
    tokenizer, unpadding: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Training mode (each module's own) and unpadding as the caller set them, after encoding and after a failure."""
    model = roformer.Backbone(tiny_config(vocab_size=len(tokenizer)))
    model.set_unpadding(unpadding)
    model.layers[1].eval()  # a mixed setting: some modules training, some not
    before = model_settings(model)
    encoder = SentenceEncoder(model, tokenizer)
    assert model_settings(model) == before
    vectors = encoder.encode(TEXTS, batch_size=2)
    assert model_settings(model) == before
    model.eval()
    np.testing.assert_allclose(vectors, encoder.encode(TEXTS, batch_size=2), rtol=1.3e-6, atol=1e-5)  # eval's
    model.train()
    model.layers[1].eval()
    seen = []

    def failing_rows(*args, **kwargs) -> np.ndarray:
        seen.append((model.training, model.unpadding))
        raise RuntimeError("out of memory")

    monkeypatch.setattr(encoder, "encode_rows", failing_rows)
    with pytest.raises(RuntimeError, match="out of memory"):
        encoder.encode(TEXTS)
    assert seen == [(False, True)] and model_settings(model) == before


def test_similar_sentences_leaves_the_callers_model_as_it_was(tokenizer) -> None:
    from roformer.embed import similar_sentences

    config = tiny_config(vocab_size=len(tokenizer), attention_pattern="unilm", add_pooler=True)
    sim = roformer.CausalLM(config).train()
    before = model_settings(sim)
    similar_sentences(sim, tokenizer, ["the cat"], n=2, max_new_tokens=3, generator=torch.Generator().manual_seed(0))
    assert model_settings(sim) == before
    with pytest.raises(ValueError, match="top_p"):  # refused by generation, after the model was switched
        similar_sentences(sim, tokenizer, ["the cat"], n=2, max_new_tokens=3, top_p=2.0)
    assert model_settings(sim) == before
