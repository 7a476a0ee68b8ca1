"""`roformer embed` over several processes, and the sentence-transformers export loaded by sentence-transformers."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import launch_two, tiny_config, write_wrapper
from torch.testing import assert_close

from roformer.cli import main


def test_two_processes_embed_what_one_does(tmp_path: Path, pretrained: Path) -> None:
    """Each process encodes a share of the texts sorted by length; the main process writes them in file order."""
    texts = [" ".join(["word"] * (i % 7 + 1)) + f" number {i}" for i in range(23)]  # odd count: uneven shares
    (tmp_path / "t.txt").write_text("\n".join(texts) + "\n", encoding="utf-8")
    args = ["embed", "--model", str(pretrained), "--input", str(tmp_path / "t.txt"), "--batch-size", "4"]
    assert main([*args, "--out", str(tmp_path / "one.npy")]) == 0
    wrapper = write_wrapper(tmp_path / "run.py", "")
    ranks = launch_two(wrapper, [*args, "--out", str(tmp_path / "two.npy")])
    assert [code for code, _ in ranks] == [0, 0], [err[-1500:] for _, err in ranks]
    one, two = np.load(tmp_path / "one.npy"), np.load(tmp_path / "two.npy")
    assert one.shape == (23, 32)
    np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-6)


# --- the sentence-transformers export ------------------------------------------------------------------------------

TEXTS = ["the cat", "", "a much longer sentence about the cat and the dog that sat on the mat by the door", "dogs"]
EXPORTABLE = [  # (model fields, pooling): every pooling, the encodings transformers holds, both poolers
    ({"position_encoding": "rotary"}, "mean"),
    ({"position_encoding": "rotary"}, "cls"),
    ({"position_encoding": "rotary"}, "last"),
    ({"position_encoding": "sinusoidal"}, "mean"),
    ({"position_encoding": "learned"}, "cls"),
    ({"position_encoding": "learned", "add_pooler": True}, "pooler"),  # BERT's tanh pooler
    ({"position_encoding": "rotary", "add_pooler": True, "pooler_activation": "linear"}, "pooler"),  # RoFormer-Sim's
    ({"position_encoding": "rotary", "embedding_size": 16}, "mean"),
]


def saved_model(path: Path, **fields) -> Path:
    """A tiny random backbone with a tokenizer of the built-in corpus, saved as a roformer model directory."""
    import roformer
    from roformer.data.builtin import generate_documents
    from roformer.data.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(list(generate_documents(200)) + TEXTS, vocab_size=300)
    torch.manual_seed(0)
    roformer.Backbone(tiny_config(vocab_size=len(tokenizer), **fields)).save(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("fields, pooling", EXPORTABLE, ids=lambda v: str(v))
@pytest.mark.parametrize("normalize", [False, True])
def test_sentence_transformers_loads_the_export_and_gives_our_vectors(
    tmp_path: Path, fields: dict, pooling: str, normalize: bool, capsys: pytest.CaptureFixture
) -> None:
    """SentenceTransformer(path), no remote code: the same vectors as `roformer embed` (fp32 tolerances)."""
    st = pytest.importorskip("sentence_transformers")
    model = saved_model(tmp_path / "m", **fields)
    unit = ["--normalize"] if normalize else []
    args = ["export", "--model", str(model), "--format", "sentence-transformers", "--out", str(tmp_path / "st")]
    assert main([*args, "--pooling", pooling, "--max-length", "64", *unit]) == 0
    assert f"({pooling} pooling" in capsys.readouterr().out
    from roformer.embed import SentenceEncoder

    ours = SentenceEncoder.load(model, pooling=pooling, max_length=64).encode(TEXTS, normalize=normalize)
    theirs = st.SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(TEXTS, convert_to_numpy=True)
    assert_close(torch.from_numpy(theirs), torch.from_numpy(ours))


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"position_encoding": "shaw"}, "shaw"),
        ({"position_encoding": "alibi"}, "alibi"),
        ({"norm_type": "rms_norm", "use_bias": False, "mlm_head": "bare"}, "rms_norm|RoFormerV2|V2"),
    ],
)
def test_what_transformers_cannot_hold_is_refused_in_one_line(
    tmp_path: Path, fields: dict, message: str, capsys: pytest.CaptureFixture
) -> None:
    pytest.importorskip("sentence_transformers")
    model = saved_model(tmp_path / "m", **fields)
    out = tmp_path / "st"
    code = main(["export", "--model", str(model), "--format", "sentence-transformers", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and re.search(message, err), err
    assert not out.exists()


def word_level_model(folder: Path) -> Path:
    """A tiny backbone with a WoBERT-style word-level vocab.txt (words of several characters) as its tokenizer."""
    import roformer
    from roformer.data.tokenizer import load_tokenizer

    folder.mkdir(parents=True)
    chars = sorted(set("今天气很好我想去公园"))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, "今天", "天气", "公园"]
    (folder / "vocab.txt").write_text("".join(f"{t}\n" for t in vocab), encoding="utf-8")
    roformer.Backbone(tiny_config(vocab_size=len(load_tokenizer(folder)))).save(folder)
    return folder


def test_a_word_level_model_is_refused_naming_its_folder_and_what_can_be_done(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """sentence-transformers cannot segment with jieba: refused, naming the folder, with no option export lacks."""
    pytest.importorskip("sentence_transformers")
    model, out = word_level_model(tmp_path / "wobert"), tmp_path / "st"
    code = main(["export", "--model", str(model), "--format", "sentence-transformers", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{model}: " in err and "word-level" in err and "roformer embed" in err, err
    assert "data.jieba" not in err, err
    assert not out.exists()


def test_without_sentence_transformers_the_export_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # import fails
    model = saved_model(tmp_path / "m")
    code = main(["export", "--model", str(model), "--format", "sentence-transformers", "--out", str(tmp_path / "st")])
    err = capsys.readouterr().err
    assert code == 2 and "pip install 'roformer-pytorch[sentence-transformers]'" in err, err
    assert not (tmp_path / "st").exists()


# --- a similarity fine-tune's model, read back as sentence vectors -----------------------------------------------


def finetune_similarity(out: Path, sets: list[str], capsys: pytest.CaptureFixture) -> Path:
    """`roformer finetune --config finetune/chinese-stsb-cosent --set ...` into `out` (which it returns), succeeded."""
    args = ["finetune", "--config", "finetune/chinese-stsb-cosent", "--output-dir", str(out)]
    assert main([*args, *sum((["--set", s] for s in sets), [])]) == 0, capsys.readouterr().err
    return out


def test_a_similarity_finetune_publishes_a_backbone_whose_cosines_are_its_predictions(
    tmp_path: Path, pretrained: Path, capsys: pytest.CaptureFixture
) -> None:
    """best/ records its pooling; SentenceEncoder.load(best/) reads it, and its cosines are the dev predictions."""
    from roformer.embed import SentenceEncoder

    pairs = [(f"word {i} and more", f"word {i % 5} or less", float(i % 6)) for i in range(40)]
    (tmp_path / "pairs.tsv").write_text("".join(f"{a}\t{b}\t{s}\n" for a, b, s in pairs), encoding="utf-8")
    sets = [
        f"init={pretrained}",
        f"data.train_file={tmp_path / 'pairs.tsv'}",
        f"data.validation_file={tmp_path / 'pairs.tsv'}",
        "data.test_file=null",
        "data.similarity.pooling=cls",
        "train.max_steps=4",
        "train.batch_size=8",
        "train.lrs=[1.0e-3]",
        "train.seeds=[0]",
        "train.progress=false",
    ]
    out = finetune_similarity(tmp_path / "run", sets, capsys)
    assert json.loads((out / "best" / "sentence.json").read_text()) == {"pooling": "cls"}
    encoder = SentenceEncoder.load(out / "best")
    assert encoder.pooling == "cls"
    first, second = (encoder.encode([p[i] for p in pairs], normalize=True) for i in (0, 1))
    lines = (out / "predictions" / "lr0.001-seed0" / "dev.tsv").read_text().splitlines()[1:]
    predicted = [float(line.split("\t")[1]) for line in lines]
    np.testing.assert_allclose((first * second).sum(1), predicted, rtol=1e-5, atol=1e-5)


def test_triplets_with_hard_negatives_fine_tune_through_the_engine(
    tmp_path: Path, pretrained: Path, capsys: pytest.CaptureFixture
) -> None:
    """In-batch negatives on (anchor, positive, negative) training rows, scored pairs on dev: trains and scores."""
    (tmp_path / "train.csv").write_text(
        "anchor,positive,negative\n" + "".join(f"word {i},word {i} more,other {i + 1}\n" for i in range(24))
    )
    (tmp_path / "dev.csv").write_text(
        "anchor,positive,score\n" + "".join(f"word {i},word {i % 3},{i % 4}\n" for i in range(12))
    )
    sets = [
        f"init={pretrained}",
        f"data.train_file={tmp_path / 'train.csv'}",
        f"data.validation_file={tmp_path / 'dev.csv'}",
        "data.test_file=null",
        "data.format=auto",
        "data.column_names=null",
        "data.text_columns=[anchor, positive]",
        "data.similarity.loss=in_batch_negatives",
        "data.similarity.negative_column=negative",
        "train.max_steps=3",
        "train.batch_size=8",
        "train.lrs=[1.0e-3]",
        "train.seeds=[0]",
        "train.progress=false",
        "train.log_every=1",
    ]
    out = finetune_similarity(tmp_path / "run", sets, capsys)
    results = json.loads((out / "results.json").read_text())
    assert "spearman" in results["runs"][0]["dev"]["dev"]
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [e["loss"] for e in events if e["event"] == "train"]
    assert len(losses) == 3 and all(math.isfinite(v) and v > 0 for v in losses)
