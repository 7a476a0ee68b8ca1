"""`data.packing: isolated`: the same blocks, documents apart; no token lost or repeated; a run's step and its
evaluation see each document alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import tiny_run_config

import roformer
from roformer.config import load
from roformer.data.builtin import generate_documents
from roformer.data.packing import block_documents, pack_blocks
from roformer.model.model import MaskedLM
from roformer.train.config import PretrainConfig
from roformer.train.pretrain import Pretrainer
from roformer.train.run_dir import read_metrics


def test_every_token_of_every_document_is_in_exactly_one_isolated_document() -> None:
    """Counted: the blocks' tokens are the documents' (but the stream's last remainder), each in one document."""
    rng = np.random.default_rng(0)
    documents = [rng.integers(10, 99, size=n) for n in rng.integers(1, 40, size=60)]
    sep = 3
    blocks = pack_blocks(documents, 32, 2, sep)
    document_ids, position_ids = block_documents(blocks, sep)
    stream = torch.from_numpy(np.concatenate(documents))
    bodies = blocks[:, 1:-1].reshape(-1)
    kept = bodies[bodies != sep]
    assert torch.equal(kept, stream[: len(kept)]) and len(stream) - len(kept) < 30  # none lost, none twice
    steps = document_ids[:, 1:] - document_ids[:, :-1]
    assert torch.equal(steps, (blocks[:, :-1] == sep).long())  # a new document right after every [SEP], only there
    assert bool((document_ids[:, 0] == 0).all()) and int(document_ids.max()) >= 1
    assert torch.equal(position_ids[:, 1:], torch.where(steps.bool(), 0, position_ids[:, :-1] + 1))  # from 0 each


def test_an_isolated_run_trains_and_evaluates_each_document_alone(tmp_path: Path) -> None:
    corpus = tmp_path / "short.txt"  # documents of 8 words: many in every block
    corpus.write_text("\n\n".join(" ".join(d.split()[:8]) for d in generate_documents(2000, seed=5)) + "\n")
    data = {"packing": "isolated", "source": "text", "paths": [str(corpus)]}
    yaml = tiny_run_config(tmp_path / "c.yaml", data=data, max_steps=2, eval_every=2)
    config = load(PretrainConfig, yaml)
    trainer = Pretrainer(config, tmp_path / "run")
    ids, labels = trainer.batches.step(0)
    trainer.run()
    events = read_metrics(tmp_path / "run" / "metrics.jsonl")
    logged = next(e["loss"] for e in events if e["event"] == "train")
    torch.manual_seed(config.train.seed)
    model = MaskedLM(trainer.config.model).train()  # the run's initial weights
    document_ids, position_ids = block_documents(ids, trainer.data.tokenizer.sep_token_id)
    assert int(document_ids.max()) >= 2  # the blocks do hold several documents
    torch.manual_seed(roformer.train.engine.dropout_seed(config.train.seed, 0, 0))
    isolated = model(ids, labels=labels, document_ids=document_ids, position_ids=position_ids).loss
    torch.manual_seed(roformer.train.engine.dropout_seed(config.train.seed, 0, 0))
    crossing = model(ids, labels=labels).loss
    # at initialisation attention is near uniform: the documents change the loss by about 1e-5, the path by 1e-7
    assert logged == pytest.approx(isolated.item(), rel=1e-6) and logged != pytest.approx(crossing.item(), rel=1e-6)
