"""Pretraining data: the built-in corpus and its rules, text reading, tokenizers, packing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from roformer.data.builtin import AGREEMENT_DISTANCE, BRACKETS, NUMBERS, BuiltinCorpus, generate_documents
from roformer.data.packing import pack_blocks, split_documents, tokenize_documents
from roformer.data.text import decode, expand_paths, paragraphs, read_documents
from roformer.data.tokenizer import load_tokenizer, save_tokenizer, train_tokenizer
from roformer.errors import UserError


def test_builtin_corpus_is_deterministic_and_prefix_stable() -> None:
    a = list(generate_documents(50, seed=3))
    assert a == list(generate_documents(50, seed=3))
    assert a[:10] == list(generate_documents(10, seed=3))
    assert a != list(generate_documents(50, seed=4))


def test_builtin_corpus_rules_hold() -> None:
    corpus = BuiltinCorpus(seed=0)
    marker_of = dict(zip(corpus.subjects, corpus.markers, strict=True))
    openers = {o: c for o, c in BRACKETS}
    closers = set(openers.values())
    counts = {"agreement": 0, "brackets": 0, "copy": 0, "counting": 0}
    for doc in generate_documents(300, seed=0):
        for sentence in doc.split(" . "):
            words = sentence.replace(" .", "").split()
            for i, w in enumerate(words):
                if w in marker_of:
                    assert words[i + AGREEMENT_DISTANCE] == marker_of[w]
                    counts["agreement"] += 1
            if any(w in openers for w in words):
                stack = []
                for w in words:
                    if w in openers:
                        stack.append(openers[w])
                    elif w in closers:
                        assert stack.pop() == w
                assert not stack
                counts["brackets"] += 1
            if "echo" in words:
                k = words.index("echo")
                assert words[:k] == words[k + 1 :]
                counts["copy"] += 1
            if words and all(w in NUMBERS for w in words):
                positions = [NUMBERS.index(w) for w in words]
                assert positions == list(range(positions[0], positions[0] + len(words)))
                counts["counting"] += 1
    assert min(counts.values()) > 50, counts


def test_builtin_vocabulary_is_zipfian() -> None:
    words = " ".join(generate_documents(400)).split()
    corpus = BuiltinCorpus()
    freq = {w: 0 for w in corpus.fillers[:100]}
    for w in words:
        if w in freq:
            freq[w] += 1
    ranks = [freq[w] for w in corpus.fillers[:100]]
    assert ranks[0] > 5 * ranks[9] > 0 and ranks[0] > 40 * ranks[99]


def test_expand_paths_and_errors(tmp_path) -> None:
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.jsonl").write_text('{"text": "y"}\n')
    (tmp_path / "sub" / "ignored.bin").write_bytes(b"\0")
    assert [p.name for p in expand_paths([str(tmp_path)])] == ["a.txt", "b.jsonl"]
    assert [p.name for p in expand_paths([str(tmp_path / "*.txt")])] == ["a.txt"]
    with pytest.raises(UserError, match="no such file or folder"):
        expand_paths([str(tmp_path / "missing.txt")])
    with pytest.raises(UserError, match="glob matches no file"):
        expand_paths([str(tmp_path / "*.csv")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="folder has no"):
        expand_paths([str(tmp_path / "empty")])
    # a notebook's checkpoint copy is not a second document (it could land in validation while its twin trains)
    (tmp_path / "sub" / ".ipynb_checkpoints").mkdir()
    (tmp_path / "sub" / ".ipynb_checkpoints" / "b-checkpoint.jsonl").write_text('{"text": "y"}\n')
    (tmp_path / "sub" / ".notes.txt").write_text("private")
    (tmp_path / "sub" / "C.TXT").write_text("z")  # read_documents reads any case: so does the folder scan
    assert [p.name for p in expand_paths([str(tmp_path / "sub")])] == ["C.TXT", "b.jsonl"]


def test_decoding_errors_strict_and_replace(tmp_path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes("Caesar said: ¿qué?\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"latin1.txt: not UTF-8 \(byte 0xbf at offset 13\)"):
        list(read_documents(path))
    docs = list(read_documents(path, decode_errors="replace"))
    assert docs == ["Caesar said: \ufffdqu\ufffd?"]
    assert decode(path, path.read_bytes(), "replace")[1] == 2
    assert decode(path, b"\xef\xbb\xbfhi", "strict") == ("hi", 0)  # byte-order mark dropped


def test_real_latin1_file_is_reported(shared_data) -> None:
    path = shared_data / "corpus" / "gutenberg" / "shakespeare-caesar.txt"
    with pytest.raises(UserError, match="shakespeare-caesar.txt: not UTF-8"):
        list(read_documents(path))
    crlf = list(read_documents(shared_data / "corpus" / "gutenberg" / "melville-moby_dick.txt"))
    assert len(crlf) > 1000 and not any("\r" in d for d in crlf)


def test_paragraphs_and_jsonl(tmp_path) -> None:
    assert list(paragraphs("a\r\nb\r\n\r\n\r\nc\n")) == ["a b", "c"]
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "one"}\n\n{"text": "two"}\n')
    assert list(read_documents(path)) == ["one", "two"]
    path.write_text('{"body": "one"}\n')
    with pytest.raises(UserError, match="d.jsonl:1: no 'text' field"):
        list(read_documents(path))
    path.write_text("{oops\n")
    with pytest.raises(UserError, match="d.jsonl:1: not a JSON line"):
        list(read_documents(path))
    # JSON may hold U+2028 or U+0085 raw inside a string (json.dumps(..., ensure_ascii=False) writes them so):
    # str.splitlines would break the line there
    path.write_text('{"text": "a line\u2028separator"}\n{"text": "next\x85line"}\n', encoding="utf-8")
    assert list(read_documents(path)) == ["a line\u2028separator", "next\x85line"]


def test_a_vocab_file_with_a_token_twice_is_refused(tmp_path) -> None:
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "the", "sat"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    with pytest.raises(UserError, match=r"vocab.txt:8: token 'the' is also on line 6"):
        load_tokenizer(tmp_path / "vocab.txt")
    (tmp_path / "vocab.txt").write_text("\n".join(vocab[:7]) + "\n")
    assert load_tokenizer(tmp_path / "vocab.txt").get_vocab()["cat"] == 6


def test_a_file_that_is_not_a_tokenizer_is_refused_naming_it(tmp_path, capsys: pytest.CaptureFixture) -> None:
    """A config (or weights) given as the tokenizer was read as a vocab.txt; the error named no file."""
    from test_pretrain import tiny_run_config

    from roformer.cli import main

    config = tiny_run_config(tmp_path / "c.yaml", max_steps=1)
    with pytest.raises(UserError, match=rf"^{tmp_path}/c.yaml: not a tokenizer \(expected .* got a .yaml file\)$"):
        load_tokenizer(config)
    code = main(
        [
            "pretrain",
            "--config",
            str(config),
            "--set",
            f"data.tokenizer={config}",
            "--output-dir",
            str(tmp_path / "run"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and f"{config}: not a tokenizer" in err, err
    (tmp_path / "vocab.txt").write_text("a\nb\n")  # a vocabulary without BERT's special tokens: the file is named
    with pytest.raises(UserError, match=rf"^{tmp_path}/vocab.txt: tokenizer vocabulary has no \[CLS\]"):
        load_tokenizer(tmp_path / "vocab.txt")


def test_the_builtin_corpus_written_to_a_file_reads_back_document_by_document(tmp_path) -> None:
    from roformer.data.builtin import write_corpus

    path = write_corpus(tmp_path / "corpus.txt", 50, seed=3)
    assert list(read_documents(path)) == list(generate_documents(50, seed=3))  # was one document of 50


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(generate_documents(300), vocab_size=600)


def test_tokenizer_training_and_special_ids(tokenizer) -> None:
    assert [
        tokenizer.pad_token_id,
        tokenizer.unk_token_id,
        tokenizer.cls_token_id,
        tokenizer.sep_token_id,
        tokenizer.mask_token_id,
    ] == [0, 1, 2, 3, 4]
    assert 300 < len(tokenizer) <= 600
    enc = tokenizer("Tri tet pen", "un duo")
    assert enc["input_ids"][0] == 2 and enc["input_ids"][-1] == 3
    assert set(enc["token_type_ids"]) == {0, 1}
    assert tokenizer.decode(tokenizer("tri tet pen", add_special_tokens=False)["input_ids"]) == "tri tet pen"


def test_tokenizer_save_and_load_three_ways(tokenizer, tmp_path) -> None:
    save_tokenizer(tokenizer, tmp_path / "tok")
    assert (tmp_path / "tok" / "vocab.txt").is_file() and (tmp_path / "tok" / "tokenizer.json").is_file()
    text = "kra pen echo pen akr ."
    expected = tokenizer(text)["input_ids"]
    assert load_tokenizer(tmp_path / "tok")(text)["input_ids"] == expected
    assert load_tokenizer(tmp_path / "tok")(text, "pen")["token_type_ids"][-1] == 1
    assert load_tokenizer(tmp_path / "tok" / "tokenizer.json")(text)["input_ids"] == expected
    assert load_tokenizer(tmp_path / "tok" / "vocab.txt")(text)["input_ids"] == expected
    (tmp_path / "vocab_only").mkdir()
    (tmp_path / "vocab_only" / "vocab.txt").write_text((tmp_path / "tok" / "vocab.txt").read_text())
    assert load_tokenizer(tmp_path / "vocab_only")(text)["input_ids"] == expected
    with pytest.raises(UserError, match="tokenizer not found"):
        load_tokenizer(tmp_path / "nothing")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(UserError, match="cannot load tokenizer"):
        load_tokenizer(tmp_path / "bad.json")


def test_packing_loses_no_token_but_the_remainder(tokenizer) -> None:
    docs = list(generate_documents(40, seed=1))
    ids = tokenize_documents(docs, tokenizer)
    assert [list(x) for x in ids[:3]] == [tokenizer(d, add_special_tokens=False)["input_ids"] for d in docs[:3]]
    blocks = pack_blocks(ids, 32, cls_id=2, sep_id=3)
    assert blocks.shape[1] == 32 and blocks.dtype == torch.long
    assert (blocks[:, 0] == 2).all() and (blocks[:, -1] == 3).all()
    stream = np.concatenate([np.concatenate([x, [3]]) for x in ids])[:-1]
    body = blocks[:, 1:-1].reshape(-1).numpy()
    assert np.array_equal(body, stream[: len(body)])
    assert len(stream) - len(body) < 30  # only the final remainder is dropped
    with pytest.raises(UserError, match="corpus too small"):
        pack_blocks([np.arange(5)], 32, 2, 3)


def test_validation_split_is_fixed() -> None:
    docs = [f"doc {i}" for i in range(100)]
    train, val = split_documents(docs, 0.1, seed=0)
    assert len(val) == 10 and len(train) == 90 and not set(train) & set(val)
    assert split_documents(docs, 0.1, seed=0) == (train, val)
    assert split_documents(docs, 0.1, seed=1)[1] != val
    with pytest.raises(UserError, match="validation_fraction"):
        split_documents(docs, 1.0, seed=0)


def test_tokenizer_training_is_deterministic() -> None:
    # Without pinned continuation ids, about 1 run in 15 differs on this text (huggingface/tokenizers#1794).
    docs = list(generate_documents(200, seed=5))
    vocabularies = {tuple(sorted(train_tokenizer(docs, 400).get_vocab().items())) for _ in range(10)}
    assert len(vocabularies) == 1


CHINESE = ["我们喜欢学习中文。", "我们今天学习数学和中文。", "他们喜欢我们的学校。", "今天我们在学校学习。"] * 30


def test_jieba_words_survive_as_single_tokens(tmp_path: Path) -> None:
    """With data.jieba the BERT normaliser must not split CJK characters again (handle_chinese_chars)."""
    pytest.importorskip("jieba", reason="jieba is an optional dependency (pip install roformer-pytorch[chinese])")
    from roformer.data.tokenizer import jieba_presegmenter, load_tokenizer, save_tokenizer

    segment = jieba_presegmenter()
    assert "我们" in segment(CHINESE[0]).split()
    tokenizer = train_tokenizer([segment(t) for t in CHINESE], 200, split_cjk=False)
    assert tokenizer.tokenize(segment("我们学习中文")) == ["我们", "学习", "中文"]
    character_level = train_tokenizer([segment(t) for t in CHINESE], 200)  # the BERT default splits them again
    assert "我们" not in character_level.get_vocab()
    save_tokenizer(tokenizer, tmp_path / "saved")  # reloads keep the words, and a word-level vocab.txt works
    assert load_tokenizer(tmp_path / "saved").tokenize("我们 学习") == ["我们", "学习"]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "我们", "学习", "我", "们"]) + "\n")
    assert load_tokenizer(vocab, split_cjk=False).tokenize("我们 学习") == ["我们", "学习"]
    assert load_tokenizer(vocab).tokenize("我们") == ["我", "们"]


def test_max_eval_blocks_is_a_seeded_subset_from_the_whole_validation_set() -> None:
    from roformer.data.config import DataConfig
    from roformer.data.packing import eval_subset

    blocks = torch.arange(1000).unsqueeze(1)  # block i holds i: the order of the validation documents
    config = DataConfig(max_eval_blocks=50)
    subset = eval_subset(blocks, config)
    assert len(subset) == 50 and torch.equal(subset, eval_subset(blocks, config))
    rows = subset.squeeze(1)
    assert bool((rows[1:] > rows[:-1]).all()) and rows.max() > 900 and rows.min() < 100  # spread, in order
    assert not torch.equal(rows, eval_subset(blocks, DataConfig(max_eval_blocks=50, eval_mask_seed=7)).squeeze(1))
    assert eval_subset(blocks, DataConfig()) is blocks and len(eval_subset(blocks[:20], config)) == 20
