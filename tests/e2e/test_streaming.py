"""Streaming data (data.streaming): packing equals the in-memory packing, shuffling is seeded, runs resume exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import interrupted_run, tiny_run_config, train_losses

from roformer.config import load
from roformer.config_yaml import read_yaml, write_yaml
from roformer.data.builtin import generate_documents
from roformer.data.packing import pack_blocks, tokenize_documents
from roformer.data.streaming import StreamPacker, shuffled
from roformer.data.tokenizer import train_tokenizer
from roformer.train.config import PretrainConfig
from roformer.train.pretrain import pretrain


def test_shuffle_buffer_is_a_seeded_permutation() -> None:
    items = [str(i) for i in range(1000)]
    a = list(shuffled(iter(items), 64, seed=1))
    assert sorted(a, key=int) == items and a != items
    assert a == list(shuffled(iter(items), 64, seed=1))
    assert a != list(shuffled(iter(items), 64, seed=2))
    assert list(shuffled(iter(items), 0, seed=1)) == items


def test_stream_packing_equals_in_memory_packing() -> None:
    documents = list(generate_documents(60, seed=3))
    tokenizer = train_tokenizer(documents, 300)
    packer = StreamPacker(lambda epoch, seed: iter(documents), 0, tokenizer, max_seq_len=24)
    expected = pack_blocks(tokenize_documents(documents, tokenizer), 24, tokenizer.cls_token_id, tokenizer.sep_token_id)
    streamed = torch.cat([packer.blocks(1) for _ in range(len(expected))])
    assert torch.equal(streamed, expected)
    assert packer.epoch == 0
    packer.blocks(1)  # the epoch's remainder is dropped and the stream starts over
    assert packer.epoch == 1


def test_stream_state_round_trip() -> None:
    documents = list(generate_documents(40, seed=4))
    tokenizer = train_tokenizer(documents, 300)
    first = StreamPacker(lambda epoch, seed: iter(shuffled(iter(documents), 8, seed + epoch)), 5, tokenizer, 16)
    first.blocks(7)
    state = first.state_dict()
    expected = first.blocks(30)
    second = StreamPacker(lambda epoch, seed: iter(shuffled(iter(documents), 8, seed + epoch)), 5, tokenizer, 16)
    second.load_state_dict(state)
    assert torch.equal(second.blocks(30), expected)


def stream_config(tmp_path: Path, **train) -> Path:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in generate_documents(300, seed=5)))
    data = {
        "source": "text",
        "paths": [str(corpus)],
        "streaming": True,
        "stream_validation_documents": 20,
        "shuffle_buffer": 50,
    }
    return tiny_run_config(tmp_path / "stream.yaml", data=data, **train)


def test_streaming_run_resumes_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    yaml = stream_config(tmp_path, max_steps=10, model={"hidden_dropout": 0.1})
    config = load(PretrainConfig, yaml)
    reference = train_losses(pretrain(config, tmp_path / "full"))
    assert not (tmp_path / "full" / "tokenization.json").exists()  # a stream is never counted whole
    assert reference[-1][1] < reference[0][1]
    interrupted_run(config, tmp_path / "cut", 6, monkeypatch)
    pretrain(config, tmp_path / "cut", resume=True)
    assert train_losses(tmp_path / "cut") == reference


@pytest.mark.slow  # long: CI skips it (docs/install.md, the slow marker)
def test_a_streamed_run_in_stages_resumes_exactly_inside_each_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stage sharing the stream (another mask, another batch) reads on; one at another length streams its own."""
    yaml = stream_config(tmp_path, max_steps=1)
    stages = [
        {"name": "a", "steps": 4},
        {"name": "b", "steps": 4, "data": {"mask_rate": 0.3}, "train": {"batch_size": 2}},
        {"name": "c", "steps": 4, "data": {"max_seq_len": 48}},
    ]
    write_yaml(yaml, {**read_yaml(yaml), "stages": stages})
    config = load(PretrainConfig, yaml)
    reference = train_losses(pretrain(config, tmp_path / "full"))
    assert len(reference) == 12
    for crash in (6, 10):  # inside b (checkpoint at a's end, step 4), inside c (at b's end, step 8)
        interrupted_run(config, tmp_path / f"cut{crash}", crash, monkeypatch)
        pretrain(config, tmp_path / f"cut{crash}", resume=True)
        assert train_losses(tmp_path / f"cut{crash}") == reference


def test_streaming_config_errors(tmp_path: Path) -> None:
    from roformer.errors import ConfigError, UserError

    with pytest.raises(ConfigError, match="streaming"):
        load(PretrainConfig, tiny_run_config(tmp_path / "c.yaml", data={"streaming": True}))
    one_document = tmp_path / "one.txt"
    one_document.write_text("a single paragraph of text\n")
    data = {"source": "text", "paths": [str(one_document)], "streaming": True}
    with pytest.raises(UserError, match="all taken for validation"):
        pretrain(load(PretrainConfig, tiny_run_config(tmp_path / "d.yaml", data=data)), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_hub_source_streams_through_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub path (no network here): datasets.load_dataset is asked for a streaming split and iterated."""
    import datasets

    documents = list(generate_documents(200, seed=6))
    calls = []

    def fake_load_dataset(name, config=None, split=None, streaming=False, revision=None):
        calls.append((name, config, split, streaming))
        rows = [{"text": d} for d in documents] + [{"text": "  "}]  # blank rows are skipped
        if streaming:
            return datasets.IterableDataset.from_generator(lambda: iter(rows))
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    data = {
        "source": "hub",
        "hub_name": "someone/corpus",
        "hub_config": "en",
        "streaming": True,
        "stream_validation_documents": 10,
        "cache": False,
    }
    run = pretrain(load(PretrainConfig, tiny_run_config(tmp_path / "c.yaml", data=data, max_steps=3)), tmp_path / "r")
    assert calls and all(c == ("someone/corpus", "en", "train", True) for c in calls)
    assert len(train_losses(run)) == 3


def test_a_stream_without_tokens_or_too_short_for_a_batch_is_an_error_not_a_hang() -> None:
    from roformer.errors import UserError

    tokenizer = train_tokenizer(list(generate_documents(50, seed=1)), 200)
    empty = StreamPacker(lambda epoch, seed: iter(["", "   ", "\n"]), 0, tokenizer, max_seq_len=16)
    with pytest.raises(UserError, match="no tokens"):  # was: unbounded recursion through the epochs
        empty.blocks(1)
    short = StreamPacker(lambda epoch, seed: iter(["one two three"]), 0, tokenizer, max_seq_len=16)
    with pytest.raises(UserError, match="fewer tokens than one global batch"):  # was: an endless loop
        short.blocks(4)
    enough = StreamPacker(lambda epoch, seed: iter(list(generate_documents(5, seed=2))), 0, tokenizer, max_seq_len=16)
    assert enough.blocks(4).shape == (4, 16)


def test_an_epoch_end_drops_less_than_one_block_whatever_the_batch() -> None:
    """Requests of a whole global batch (7 blocks): every full block of the epoch is still served, in order."""
    documents = list(generate_documents(60, seed=3))
    tokenizer = train_tokenizer(documents, 300)
    expected = pack_blocks(tokenize_documents(documents, tokenizer), 24, tokenizer.cls_token_id, tokenizer.sep_token_id)
    assert len(expected) % 7 != 0  # the epoch ends inside a request
    packer = StreamPacker(lambda epoch, seed: iter(documents), 0, tokenizer, max_seq_len=24)
    streamed = torch.cat([packer.blocks(7) for _ in range(len(expected) // 7 + 1)])
    assert torch.equal(streamed[: len(expected)], expected)  # the last request: the epoch's tail, then the next's head
    assert torch.equal(streamed[len(expected) :], expected[: len(streamed) - len(expected)])
