"""The `data:` section end to end: sources, tokenizer, split, packing, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from roformer.config import from_dict
from roformer.data.config import DataConfig
from roformer.data.packing import split_documents
from roformer.data.store import build_mlm_data
from roformer.data.tokenizer import save_tokenizer
from roformer.errors import ConfigError, UserError


def test_builtin_end_to_end() -> None:
    config = DataConfig(builtin_documents=300, vocab_size=500, max_seq_len=64, validation_fraction=0.1)
    data = build_mlm_data(config)
    assert data.train.shape[1] == 64 and data.validation.shape[1] == 64
    assert len(data.train) > 5 * len(data.validation) > 0
    assert (data.train[:][:, 0] == data.tokenizer.cls_token_id).all()
    again = build_mlm_data(config)
    assert torch.equal(again.train[:], data.train[:]) and torch.equal(again.validation, data.validation)


def test_validation_blocks_are_exactly_the_held_out_documents(tmp_path) -> None:
    lines = [f"document {chr(97 + i % 26)} says {' '.join(['word'] * (i % 7 + 3))} and ends" for i in range(200)]
    (tmp_path / "c.jsonl").write_text("".join(f'{{"text": "{t}"}}\n' for t in lines))
    config = DataConfig(source="text", paths=["c.jsonl"], vocab_size=100, max_seq_len=16, validation_fraction=0.2)
    data = build_mlm_data(config, base=tmp_path)
    _, held_out = split_documents(lines, 0.2, seed=0)
    sep = data.tokenizer.sep_token_id
    stream = []
    for doc in held_out:
        stream += data.tokenizer(doc, add_special_tokens=False)["input_ids"] + [sep]
    body = data.validation[:, 1:-1].reshape(-1).tolist()
    assert body == stream[: len(body)] and len(stream) - 1 - len(body) < 14


def test_loaded_tokenizer_and_validation_paths(tmp_path) -> None:
    first = build_mlm_data(DataConfig(builtin_documents=100, vocab_size=300, max_seq_len=32))
    save_tokenizer(first.tokenizer, tmp_path / "tok")
    (tmp_path / "train.txt").write_text("un duo tri tet pen hex .\n\n" * 40)
    (tmp_path / "val.txt").write_text("tri tet pen hex sep okt .\n\n" * 10)
    config = DataConfig(
        source="text", paths=["train.txt"], validation_paths=["val.txt"], tokenizer="tok", max_seq_len=16
    )
    data = build_mlm_data(config, base=tmp_path)
    assert data.tokenizer.get_vocab() == first.tokenizer.get_vocab()
    assert "sep okt" in data.tokenizer.decode(data.validation[0])


def test_gutenberg_with_replaced_bytes(shared_data) -> None:
    folder = shared_data / "corpus" / "gutenberg"
    strict = DataConfig(source="text", paths=[str(folder / "shakespeare-*.txt")], vocab_size=2000)
    with pytest.raises(UserError, match="shakespeare-caesar.txt: not UTF-8"):
        build_mlm_data(strict)
    relaxed = DataConfig(
        source="text",
        paths=[str(folder / "shakespeare-*.txt")],
        vocab_size=2000,
        decode_errors="replace",
        max_seq_len=128,
    )
    data = build_mlm_data(relaxed)
    assert len(data.train) > 100 and len(data.validation) > 2


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"source": "text"}, "source: text needs paths"),
        ({"source": "hub"}, "source: hub needs hub_name"),
        ({"mask_rate": 1.5}, "mask_rate must be in (0, 1)"),
        ({"max_seq_lenn": 12}, "unknown key 'data.max_seq_lenn'"),
        ({"decode_errors": "ignore"}, "key 'data.decode_errors' must be one of 'strict', 'replace'"),
    ],
)
def test_bad_data_configs(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        from_dict(DataConfig, fields, source="run.yaml", prefix="data.")
    assert message in str(info.value) and "run.yaml" in str(info.value)


def test_small_corpus_and_missing_files(tmp_path) -> None:
    (tmp_path / "tiny.txt").write_text("just a few words\n\nand another few\n")
    with pytest.raises(UserError, match="corpus too small"):
        build_mlm_data(DataConfig(source="text", paths=[str(tmp_path / "tiny.txt")], vocab_size=50), base=tmp_path)
    with pytest.raises(UserError, match="no such file or folder"):
        build_mlm_data(DataConfig(source="text", paths=["missing/"]), base=tmp_path)
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(UserError, match="has no text"):
        build_mlm_data(DataConfig(source="text", paths=[str(tmp_path / "empty.txt")]))


def test_second_build_comes_from_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import roformer.data.tokenizer as tokenizer_module

    config = DataConfig(builtin_documents=120, vocab_size=200, max_seq_len=32, cache_dir=str(tmp_path))
    first = build_mlm_data(config)

    def no_training(*args, **kwargs):
        raise AssertionError("the tokenizer was trained again")

    monkeypatch.setattr(tokenizer_module, "train_tokenizer", no_training)
    second = build_mlm_data(config)
    assert torch.equal(first.train[:], second.train[:]) and torch.equal(first.validation, second.validation)
    assert first.tokenizer.get_vocab() == second.tokenizer.get_vocab()
    longer = build_mlm_data(DataConfig(builtin_documents=120, vocab_size=200, max_seq_len=48, cache_dir=str(tmp_path)))
    assert longer.train.shape[1] == 48  # one store serves every block length: no new build
    changed = DataConfig(builtin_documents=120, vocab_size=210, max_seq_len=32, cache_dir=str(tmp_path))
    with pytest.raises(AssertionError, match="trained again"):  # a different key misses the cache
        build_mlm_data(changed)


def test_cache_key_follows_the_input_files(tmp_path: Path) -> None:
    from roformer.data.cache import data_fingerprint

    corpus = tmp_path / "a.txt"
    corpus.write_text("one two three\n")
    config = DataConfig(source="text", paths=[str(corpus)])
    before = data_fingerprint(config)
    assert data_fingerprint(DataConfig(source="text", paths=[str(corpus)], mask_rate=0.3)) == before
    corpus.write_text("one two three four\n")
    assert data_fingerprint(config) != before
    held_out = tmp_path / "validation.txt"  # validation_paths are read whatever the source: their edits count too
    held_out.write_text("alpha beta\n")
    builtin = DataConfig(source="builtin", validation_paths=[str(held_out)])
    before = data_fingerprint(builtin)
    held_out.write_text("completely different validation text\n")
    assert data_fingerprint(builtin) != before


def test_hub_revision_reaches_datasets_and_the_cache_key(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import datasets

    from roformer.data.cache import data_fingerprint
    from roformer.data.config import DataConfig
    from roformer.data.corpus import load_documents

    asked = {}

    def fake_load(name, config, split, streaming, revision):
        asked["revision"] = revision
        return datasets.Dataset.from_list([{"text": f"document {i} " * 20} for i in range(40)])

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    pinned = DataConfig(source="hub", hub_name="some/corpus", hub_revision="abc123")
    load_documents(pinned)
    assert asked["revision"] == "abc123"
    other = DataConfig(source="hub", hub_name="some/corpus", hub_revision="def456")
    assert data_fingerprint(pinned) != data_fingerprint(other)
    with caplog.at_level("WARNING"):
        data_fingerprint(DataConfig(source="hub", hub_name="some/corpus"))
    assert "hub_revision is not pinned" in caplog.text


def test_whole_word_masking_warns_without_wordpiece_continuations(caplog: pytest.LogCaptureFixture) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from roformer.data.masking import continuation_table

    words = Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, "a": 2, "b": 3}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, pad_token="[PAD]", unk_token="[UNK]")
    with caplog.at_level("WARNING"):
        assert not continuation_table(tokenizer).any()
    assert "masking is per token" in caplog.text


def test_validation_files_that_are_also_training_files_are_refused(tmp_path) -> None:
    (tmp_path / "corpus").mkdir()
    for name in ("a.txt", "b.txt"):
        (tmp_path / "corpus" / name).write_text("un duo tri tet pen hex .\n\n" * 40)
    config = DataConfig(source="text", paths=["corpus"], validation_paths=["corpus/b.txt"], max_seq_len=16)
    with pytest.raises(UserError, match=r"validation_paths: .*b.txt is also in data.paths"):
        build_mlm_data(config, base=tmp_path)


def test_a_null_text_in_jsonl_is_no_document(tmp_path) -> None:
    from roformer.data.text import read_documents

    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "first"}\n{"text": null}\n{"text": "third"}\n')
    assert list(read_documents(path)) == ["first", "third"]
