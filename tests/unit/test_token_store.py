"""The memory-mapped token store: the same blocks as in-memory packing, shards, damage and interrupted builds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from roformer.data.builtin import generate_documents
from roformer.data.mlm import PackedBlocks
from roformer.data.packing import pack_blocks, tokenize_documents
from roformer.data.token_store import BlockView, TokenStore, shard_name, token_dtype, write_token_store
from roformer.data.tokenizer import train_tokenizer, vocab_hash
from roformer.errors import UserError


@pytest.fixture(scope="module")
def corpus() -> tuple[list[str], object]:
    documents = list(generate_documents(120, seed=4))
    documents.insert(5, "")  # an empty document is skipped, as packing skips it
    return documents, train_tokenizer(documents, 400)


@pytest.mark.parametrize("max_seq_len", [16, 32, 128])
def test_store_blocks_equal_in_memory_packing_across_shards(corpus, tmp_path: Path, max_seq_len: int) -> None:
    documents, tokenizer = corpus
    store = write_token_store(
        tmp_path / "store", iter(documents), tokenizer, vocab_hash(tokenizer), batch_size=7, shard_tokens=1000
    )
    assert len(store.shards) > 3  # blocks cross shard boundaries
    packed = pack_blocks(
        tokenize_documents(documents, tokenizer), max_seq_len, tokenizer.cls_token_id, tokenizer.sep_token_id
    )
    assert store.num_blocks(max_seq_len) == len(packed)
    every = store.blocks(torch.arange(len(packed)), max_seq_len, tokenizer.cls_token_id, tokenizer.sep_token_id)
    assert torch.equal(every, packed)
    view = BlockView(store, max_seq_len, tokenizer.cls_token_id, tokenizer.sep_token_id)
    assert view.shape == packed.shape and torch.equal(view[3], packed[3]) and torch.equal(view[2:5], packed[2:5])
    ours, theirs = PackedBlocks(view, 8, 3), PackedBlocks(packed, 8, 3)
    for step in (0, 1, len(packed) // 8 + 2):  # across an epoch boundary
        assert torch.equal(ours.blocks_of(step), theirs.blocks_of(step))
    assert ours.blocks_per_epoch() == theirs.blocks_per_epoch() == len(packed)


def test_two_bytes_per_token_and_document_offsets(corpus, tmp_path: Path) -> None:
    documents, tokenizer = corpus
    store = write_token_store(tmp_path / "store", documents, tokenizer, vocab_hash(tokenizer))
    assert store.dtype == np.uint16 and token_dtype(70_000) == np.uint32
    on_disk = sum(p.stat().st_size for p in (tmp_path / "store").glob("tokens-*.bin"))
    assert on_disk == 2 * store.num_tokens
    offsets = np.fromfile(tmp_path / "store" / "documents.bin", dtype=np.int64)
    assert len(offsets) == len(documents) - 1 == store.info["documents"]  # the empty one skipped
    first = tokenizer(documents[0], add_special_tokens=False)["input_ids"]
    assert store.tokens(0, len(first)).tolist() == first and store.tokens(len(first), len(first) + 1)[0] == 3
    assert (
        store.tokens(int(offsets[1]), int(offsets[1]) + 3).tolist()
        == tokenizer(documents[1], add_special_tokens=False)["input_ids"][:3]
    )


def test_damaged_and_missing_stores_are_one_line_errors(corpus, tmp_path: Path) -> None:
    documents, tokenizer = corpus
    write_token_store(tmp_path / "store", documents, tokenizer, vocab_hash(tokenizer), shard_tokens=2000)
    shard = tmp_path / "store" / shard_name(1)
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(UserError, match=r"tokens-00001.bin: damaged token store shard .* prepare-data --overwrite"):
        TokenStore(tmp_path / "store")
    with pytest.raises(UserError, match="not a token store"):
        TokenStore(tmp_path / "nothing")
    (tmp_path / "store" / "store.json").write_text("{")  # a torn index: was a JSONDecodeError
    with pytest.raises(UserError, match=r"store.json: damaged or unreadable .* prepare-data --overwrite"):
        TokenStore(tmp_path / "store")
    with pytest.raises(UserError, match="no tokens"):
        write_token_store(tmp_path / "empty", ["", " "], tokenizer, vocab_hash(tokenizer))
    assert not (tmp_path / "empty").exists()


def test_an_interrupted_build_leaves_nothing_that_looks_complete(corpus, tmp_path: Path) -> None:
    documents, tokenizer = corpus

    def dying():
        yield from documents[:50]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_token_store(tmp_path / "store", dying(), tokenizer, vocab_hash(tokenizer), batch_size=10)
    assert list(tmp_path.iterdir()) == []  # no store, no leftover staging directory
    store = write_token_store(tmp_path / "store", documents, tokenizer, vocab_hash(tokenizer))  # running again
    assert store.num_tokens > 0


def test_hub_sources_feed_the_same_store_builder(tmp_path: Path, monkeypatch) -> None:
    """A downloaded hub split streams from its Arrow table into the store (no list of all documents)."""
    import datasets

    from roformer.data.config import DataConfig
    from roformer.data.store import build_mlm_data

    rows = [{"text": d} for d in generate_documents(200, seed=8)] + [{"text": ""}]
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_list(rows))
    config = DataConfig(
        source="hub",
        hub_name="some/corpus",
        hub_revision="abc",
        vocab_size=300,
        max_seq_len=32,
        cache_dir=str(tmp_path),
    )
    data = build_mlm_data(config)
    in_memory = build_mlm_data(
        DataConfig(builtin_documents=200, builtin_seed=8, vocab_size=300, max_seq_len=32, cache_dir=str(tmp_path))
    )
    assert torch.equal(data.train[:], in_memory.train[:])  # the same documents give the same blocks


def test_text_statistics_count_the_text_as_given_and_its_tokens(corpus, tmp_path: Path) -> None:
    """Characters of the raw documents (a transform such as jieba's spaces adds none), tokens without the [SEP]s."""
    import json

    documents, tokenizer = corpus
    spaced = write_token_store(tmp_path / "a", documents, tokenizer, vocab_hash(tokenizer), transform=" ".join)
    kept = [d for d in documents if d]
    tokens = sum(len(tokenizer(" ".join(d), add_special_tokens=False)["input_ids"]) for d in kept)
    stats = spaced.text_statistics()
    assert stats["characters"] == sum(map(len, kept)) and stats["documents"] == len(kept)
    assert stats["tokens"] == tokens and stats["tokens_per_character"] == tokens / stats["characters"]
    assert stats["vocab_size"] == len(tokenizer)
    info = json.loads((tmp_path / "a" / "store.json").read_text())
    del info["characters"]  # a store written before stores counted characters
    (tmp_path / "a" / "store.json").write_text(json.dumps(info))
    assert TokenStore(tmp_path / "a").text_statistics() is None
