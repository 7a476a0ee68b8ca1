"""Word-level Chinese tokenizers (WoBERT, RoFormer-Chinese): loaded from their checkpoints, jieba words read as the
authors' tokenizer reads them, exact character offsets, and a word-level tokenizer refused without jieba."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roformer.data.segment import tokenize_texts
from roformer.data.tokenizer import (
    jieba_presegmenter,
    load_tokenizer,
    segmentation,
    word_level_vocab,
    word_vocabulary,
)
from roformer.errors import UserError

jieba = pytest.importorskip("jieba")
transformers = pytest.importorskip("transformers")

TEXT = "今天天气很好，我想去公园玩。iPhone手机的价格是5000元"
WORDS = ["今天", "天气", "很", "好", "我", "想", "去", "公园", "手机", "的", "价格", "是", "iphone", "##000", "元"]
CHARS = sorted(set("今天气很好我想去公园玩手机的价格是元，。玩5"))


def checkpoint(folder: Path, tokenizer_class: str | None = None, words: bool = True) -> Path:
    """A WoBERT/RoFormer-style checkpoint's tokenizer files: vocab.txt (words, characters, ## pieces), configs."""
    folder.mkdir(parents=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *CHARS, *(f"##{c}" for c in CHARS)]
    vocab += WORDS if words else [w for w in WORDS if len(w) == 1 or w.isascii() or w.startswith("##")]
    (folder / "vocab.txt").write_text("".join(f"{t}\n" for t in dict.fromkeys(vocab)), encoding="utf-8")
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "vocab_size": len(vocab)}))
    if tokenizer_class:
        settings = {"tokenizer_class": tokenizer_class, "do_lower_case": True}
        (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return folder


def authors_tokens(vocab_file: Path, text: str) -> list[str]:
    """bert4keras's Tokenizer with jieba pre_tokenize (the RoFormer and WoBERT scripts'), written out: the text
    lower-cased, each jieba word (HMM off) one token if in the vocabulary, else tokenized the plain BERT way (here by
    transformers' BertTokenizer on the same vocab.txt: CJK characters apart, punctuation apart, WordPiece)."""
    bert = transformers.BertTokenizer(str(vocab_file), do_lower_case=True)
    vocab = set(bert.vocab)
    tokens: list[str] = []
    for word in jieba.cut(text.lower(), HMM=False):
        tokens += [word] if word in vocab else bert.tokenize(word)
    return tokens


@pytest.mark.parametrize("tokenizer_class", [None, "RoFormerTokenizer", "BertTokenizer"])
def test_a_word_level_checkpoint_tokenizes_as_the_authors_tokenizer(tmp_path: Path, tokenizer_class: str) -> None:
    """Told by its vocabulary (words of several characters), whatever class it names: WoBERT's name none."""
    folder = checkpoint(tmp_path / "checkpoint", tokenizer_class)
    assert word_level_vocab(folder / "vocab.txt")
    tokenizer = load_tokenizer(folder)
    assert word_vocabulary(tokenizer) is not None
    ids = tokenizer(jieba_presegmenter(tokenizer)(TEXT), add_special_tokens=False)["input_ids"]
    expected = authors_tokens(folder / "vocab.txt", TEXT)
    assert tokenizer.convert_ids_to_tokens(ids) == expected
    assert "玩" in expected and "公园" in expected  # an unknown word spelled out, a known one whole


@pytest.mark.parametrize("tokenizer_class", [None, "RoFormerTokenizer"])
def test_a_character_level_checkpoint_stays_character_level(tmp_path: Path, tokenizer_class: str | None) -> None:
    """bert-base-chinese, and JunnYu's character-level RoFormers (Sim, V2), which name RoFormerTokenizer too."""
    folder = checkpoint(tmp_path / "wobert_named_but_char", tokenizer_class, words=False)
    assert not word_level_vocab(folder / "vocab.txt")
    tokenizer = load_tokenizer(folder)
    assert word_vocabulary(tokenizer) is None
    tokens = tokenizer.tokenize(jieba_presegmenter(tokenizer)(TEXT))
    assert tokens == tokenizer.tokenize(TEXT) and "公园" not in tokens  # jieba changes nothing at character level


def test_word_level_offsets_point_at_the_original_characters(tmp_path: Path) -> None:
    """transformers' RoFormerTokenizerFast gives wrong offset_mapping for jieba words (transformers#12244): ours
    are each token's characters in the text as given, also for spelled-out words and WordPiece pieces."""
    tokenizer = load_tokenizer(checkpoint(tmp_path / "wobert"))
    (tokenized,) = tokenize_texts(tokenizer, [TEXT], jieba=True)
    tokens = tokenizer.convert_ids_to_tokens(tokenized.ids)
    assert tokens == authors_tokens(tmp_path / "wobert" / "vocab.txt", TEXT)
    for token, (start, end) in zip(tokens, tokenized.offsets, strict=True):
        assert TEXT[start:end].lower() == token.removeprefix("##"), (token, TEXT[start:end])


def test_a_word_level_tokenizer_implies_jieba_and_refuses_only_a_contradiction(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(checkpoint(tmp_path / "wobert"))
    assert segmentation(tokenizer, None, "init-dir") and segmentation(tokenizer, True, "init-dir")
    with pytest.raises(UserError, match=r"init-dir: the tokenizer is word-level Chinese .* data.jieba is false"):
        segmentation(tokenizer, False, "init-dir")
    characters = load_tokenizer(checkpoint(tmp_path / "bert", words=False))
    assert not segmentation(characters, None, "init-dir") and not segmentation(characters, False, "init-dir")
    assert segmentation(characters, True, "init-dir")  # asked for: jieba's words, then the characters


def test_a_saved_word_level_tokenizer_loads_as_saved(tmp_path: Path) -> None:
    """Our own (tokenizer.json keeps CJK words whole) is not rebuilt from its vocab.txt."""
    from roformer.data.tokenizer import save_tokenizer

    tokenizer = load_tokenizer(checkpoint(tmp_path / "wobert"))
    save_tokenizer(tokenizer, tmp_path / "run")
    again = load_tokenizer(tmp_path / "run")
    assert word_vocabulary(again) is not None and again.tokenize("公园") == ["公园"]
