"""Pretraining stages, part by part: the config (what may change, what is refused), the batches of stages sharing a
block order, the learning rate of stages with their own phase, the rotary base switch, and the optimizer moments a
branch continues."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import TINY_MODEL

import roformer
from roformer.config import from_dict, load
from roformer.config_yaml import write_yaml
from roformer.data.config import DataConfig
from roformer.data.mlm import MixtureBlocks, PackedBlocks
from roformer.errors import ConfigError, UserError
from roformer.model.config import ModelConfig
from roformer.model.model import MaskedLM
from roformer.train.config import PretrainConfig
from roformer.train.optim import load_moments, lr_multiplier, make_optimizer, save_moments
from roformer.train.stages import StagedBatches, lr_multiplier_for, source_groups, stage_index

CONTRACT = [
    {"name": "short", "steps": 200, "data": {"max_seq_len": 64, "mask_rate": 0.3}},
    {"name": "long", "steps": 100, "data": {"max_seq_len": 256, "mask_rate": 0.15}, "model": {"rotary_base": 160000}},
]


def staged(stages: list[dict], **sections) -> PretrainConfig:
    return from_dict(PretrainConfig, {"stages": stages, **sections}, "run.yaml")


def test_the_contract_resolves_into_stages_whose_steps_make_the_run() -> None:
    config = staged(CONTRACT, train={"max_steps": 7})
    assert config.train.max_steps == 300  # the sum of the stages' steps, whatever max_steps said
    short, long = config.resolved_stages()
    assert (short.name, short.start, short.end, long.start, long.end) == ("short", 0, 200, 200, 300)
    assert (short.data.max_seq_len, short.data.mask_rate, short.model.rotary_base) == (64, 0.3, 10000.0)
    assert (long.data.max_seq_len, long.data.mask_rate, long.model.rotary_base) == (256, 0.15, 160000.0)
    assert long.data.eval_mask_rate == config.data.eval_mask_rate and long.train.max_steps == 100
    assert config.to_dict()["stages"][1]["model"] == {"rotary_base": 160000}
    assert "stages" not in PretrainConfig().to_dict()  # a run without stages records what it always did
    one = PretrainConfig().resolved_stages()
    assert len(one) == 1 and one[0].name is None and one[0].steps == PretrainConfig().train.max_steps


@pytest.mark.parametrize(
    ("stage", "message"),
    [
        ({"model": {"hidden_size": 64}}, "model.hidden_size cannot change between stages (the architecture"),
        ({"data": {"vocab_size": 500}}, "data.vocab_size cannot change between stages (the tokenizer"),
        ({"data": {"eval_mask_rate": 0.3}}, "data.eval_mask_rate cannot change between stages"),
        ({"train": {"seed": 3}}, "train.seed cannot change between stages (one optimizer and seed per run)"),
        ({"data": {"mask_rate": 1.5}}, "stages[0].data: mask_rate must be in (0, 1), got 1.5"),
        ({"data": {"mask_rate": {"start": 0.3, "end": 0.0}}}, "mask_rate.end must be in (0, 1)"),
        ({"model": {"rope_scaling": {"type": "wrong", "factor": 2}}}, "rope_scaling.type"),
        ({"steps": 0}, "steps must be >= 1"),
        ({"name": "a/b"}, "name must be letters"),
        ({"colour": "red"}, "unknown key 'stages[0].colour'"),
    ],
)
def test_a_stage_that_changes_what_it_may_not_is_refused_naming_the_key(stage: dict, message: str) -> None:
    with pytest.raises(ConfigError, match="^run.yaml: ") as caught:
        staged([{"name": "a", "steps": 5, **stage}])
    assert message in str(caught.value)


def test_stages_are_refused_where_the_run_could_not_follow_them() -> None:
    with pytest.raises(ConfigError, match="two stages are named 'a'"):
        staged([{"name": "a", "steps": 1}, {"name": "a", "steps": 1}])
    with pytest.raises(ConfigError, match="eval_every: null"):
        staged([{"name": "a", "steps": 1}], train={"eval_every": None})
    with pytest.raises(ConfigError, match="stages\\[0\\].model.rotary_base: a stage changes it for .*rotary only"):
        staged([{"name": "a", "steps": 1, "model": {"rotary_base": 5e5}}], model={"position_encoding": "sinusoidal"})
    learned = {"position_encoding": "learned", "max_position_embeddings": 128}
    with pytest.raises(ConfigError, match="^run.yaml: model.max_position_embeddings=128 is shorter than data.max_seq"):
        staged([{"name": "a", "steps": 1, "data": {"max_seq_len": 64}}], model=learned, data={"max_seq_len": 256})
    with pytest.raises(ConfigError, match="stages\\[1\\]: model.max_position_embeddings=128 is shorter"):
        staged([{"name": "a", "steps": 1}, {"name": "b", "steps": 1, "data": {"max_seq_len": 256}}], model=learned)


def test_stages_that_differ_in_masking_only_read_one_order_on_without_a_gap_or_a_repeat() -> None:
    """30% then 15% at batch 8 (another length between, its own blocks), then batch 4: each shared block once."""
    stages = staged(
        [
            {"name": "a", "steps": 3, "data": {"mask_rate": 0.3}},
            {"name": "b", "steps": 2, "data": {"max_seq_len": 16}},
            {"name": "c", "steps": 4, "train": {"batch_size": 4}},
        ],
        data={"max_seq_len": 8},
        train={"batch_size": 8},
    ).resolved_stages()
    assert source_groups(stages) == [0, 1, 0]
    tokenizer = roformer.data.tokenizer.train_tokenizer(["a b c d e f g"] * 5, 50)
    long_blocks, short_blocks = torch.arange(50 * 16).view(50, 16) + 1000, torch.arange(100 * 8).view(100, 8) + 1000
    sources = [PackedBlocks(short_blocks, 8, seed=1), PackedBlocks(long_blocks, 8, seed=1)]
    batches = StagedBatches(stages, sources, tokenizer, seed=1)
    order = PackedBlocks(short_blocks, 8, seed=1).take(0, 100)  # the shared order, block by block
    steps = (0, 1, 2, 5, 6, 7, 8)  # stages a and c
    unmasked = [torch.where(labels == -100, ids, labels) for ids, labels in (batches.step(s) for s in steps)]
    assert torch.equal(torch.cat(unmasked), order[: 3 * 8 + 4 * 4])
    assert [batches.of(s).global_batch for s in range(9)] == [8, 8, 8, 8, 8, 4, 4, 4, 4]
    assert batches.step(3)[0].shape == (8, 16) and batches.step(5)[0].shape == (4, 8)
    assert [batches.rate_of(s) for s in (0, 3, 5)] == [0.3, 0.15, 0.15]
    assert batches.state_dict() == {"sources": [{}, {}]}


def test_a_mask_schedule_runs_over_its_stage() -> None:
    schedule = {"start": 0.3, "end": 0.1}
    stages = staged([{"name": "a", "steps": 4}, {"name": "b", "steps": 11, "data": {"mask_rate": schedule}}])
    tokenizer = roformer.data.tokenizer.train_tokenizer(["a b c d e f g"] * 5, 50)
    blocks = torch.arange(100 * 8).view(100, 8) + 1000
    batches = StagedBatches(stages.resolved_stages(), [PackedBlocks(blocks, 32, 0)], tokenizer, seed=0)
    rates = [batches.rate_of(step) for step in range(15)]
    assert rates[:4] == [0.15] * 4 and rates[4] == pytest.approx(0.3) and rates[-1] == pytest.approx(0.1)
    assert rates[9] == pytest.approx(0.2)  # half-way through its stage


def test_stages_with_their_own_lr_phase_run_it_over_their_steps() -> None:
    """WSD by hand: warmup + constant, then a stage that decays linearly from its own peak to 0."""
    config = staged(
        [
            {"name": "stable", "steps": 10, "train": {"schedule": "constant", "warmup_steps": 2}},
            {"name": "mid", "steps": 5},
            {"name": "decay", "steps": 5, "train": {"schedule": "linear", "warmup_steps": 0, "lr": 5e-4}},
        ],
        train={"lr": 1e-3, "schedule": "cosine", "warmup_steps": 4},
    )
    multiplier = lr_multiplier_for(config.resolved_stages(), config.train)
    assert [multiplier(s) for s in range(3)] == [0.5, 1.0, 1.0]
    assert multiplier(12) == lr_multiplier(12, 4, 20, "cosine")  # a stage without its own phase: the run's
    assert [multiplier(s) for s in range(15, 20)] == pytest.approx([0.5 * (1 - k / 5) for k in range(5)])
    assert multiplier(20) == pytest.approx(0.0)  # past the end (LambdaLR's last call): the last stage's
    assert stage_index(config.resolved_stages(), 20) == 2


def test_set_rotary_computes_as_a_model_built_with_that_base() -> None:
    config = ModelConfig(**{**TINY_MODEL, "position_encoding": "rotary"})
    torch.manual_seed(0)
    switched = MaskedLM(config).eval()
    torch.manual_seed(0)
    built = MaskedLM(replace(config, rotary_base=160000.0)).eval()
    ids = torch.randint(5, 300, (2, 700))  # past the tables' first 512 positions
    assert not torch.allclose(switched(ids).logits, built(ids).logits)
    switched.set_rotary(160000.0)
    torch.testing.assert_close(switched(ids).logits, built(ids).logits)
    assert switched.config.rotary_base == switched.base_model.config.rotary_base == 160000.0
    with pytest.raises(ValueError, match="rotary"):
        MaskedLM(replace(config, position_encoding="sinusoidal")).set_rotary(5e5)


def test_moments_continue_under_the_new_optimizers_own_hyperparameters(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = MaskedLM(ModelConfig(**TINY_MODEL))
    ids = torch.randint(5, 300, (2, 16))

    def step(optimizer: torch.optim.Optimizer) -> None:
        model(ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    first, _ = make_optimizer(model, 1e-3, 0.01, (0.9, 0.999), 1e-6, 0, 10)
    step(first)
    save_moments(first, tmp_path / "optimizer.pt")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    step(first)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(before)
    branch, _ = make_optimizer(model, 1e-3, 0.01, (0.9, 0.999), 1e-6, 0, 10)
    assert load_moments(branch, tmp_path / "optimizer.pt") == len(list(model.parameters()))
    step(branch)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, expected[key])
    other, _ = make_optimizer(model, 5e-4, 0.0, (0.8, 0.99), 1e-8, 0, 10)
    load_moments(other, tmp_path / "optimizer.pt")
    assert other.param_groups[0]["lr"] == 5e-4 and other.param_groups[0]["betas"] == (0.8, 0.99)
    small = MaskedLM(ModelConfig(**{**TINY_MODEL, "hidden_size": 16, "num_heads": 2}))
    with pytest.raises(UserError, match="does not fit this model's parameters"):
        load_moments(make_optimizer(small, 1e-3, 0.0, (0.9, 0.99), 1e-6, 0, 10)[0], tmp_path / "optimizer.pt")


def test_blocks_differ_between_data_keys_only_by_what_decides_blocks() -> None:
    base = DataConfig()
    stages = staged(
        [
            {"name": "a", "steps": 1, "data": {"mask_split": [1, 0, 0], "whole_word_mask": True}},
            {"name": "b", "steps": 1, "data": {"builtin_seed": 7}},
        ]
    ).resolved_stages()
    assert source_groups(stages) == [0, 1] and stages[0].data != base


def test_a_mixture_draws_each_source_in_its_share_and_its_own_order() -> None:
    a = PackedBlocks(torch.arange(50).view(50, 1), 4, seed=1)  # source 0: ids 0..49
    b = PackedBlocks(torch.arange(1000, 1030).view(30, 1), 4, seed=1)  # source 1: ids 1000..1029
    mixture = MixtureBlocks([a, b], [3.0, 1.0], seed=5, window=40)
    assert mixture.quotas == [30, 10]
    drawn = mixture.take(0, 120)[:, 0]
    assert int((drawn[:40] < 1000).sum()) == 30 and int((drawn[40:80] >= 1000).sum()) == 10  # every window's share
    assert torch.equal(drawn[drawn < 1000], a.take(0, 90)[:, 0])  # source 0's own order, no gap or repeat
    assert torch.equal(drawn[drawn >= 1000], b.take(0, 30)[:, 0])
    assert torch.equal(torch.cat([mixture.take(0, 37), mixture.take(37, 83)]), mixture.take(0, 120))
    assert mixture.read_of(0, 120) == 90 and mixture.read_of(1, 45) == 10 + int((drawn[40:45] >= 1000).sum())
    assert not torch.equal(drawn[:40], MixtureBlocks([a, b], [3.0, 1.0], seed=6, window=40).take(0, 40)[:, 0])


def test_mixture_paths_resolve_against_the_file_that_names_them(tmp_path: Path) -> None:
    (tmp_path / "cfg").mkdir()
    mixture = [{"paths": ["a.txt"], "weight": 2}, {"paths": ["b.txt"], "weight": 1}]
    stages = [{"name": "s", "steps": 1, "data": {"mixture": [{"paths": ["b.txt"], "weight": 3}, {"paths": ["a.txt"]}]}}]
    data = {"source": "text", "paths": ["a.txt", "b.txt"], "mixture": mixture}
    write_yaml(tmp_path / "cfg" / "run.yaml", {"data": data, "stages": stages})
    config = load(PretrainConfig, tmp_path / "cfg" / "run.yaml")
    assert config.data.mixture[0].paths == [str(tmp_path / "cfg" / "a.txt")]
    assert config.resolved_stages()[0].data.mixture[0].paths == [str(tmp_path / "cfg" / "b.txt")]
    other = [{"name": "s", "steps": 1, "data": {"paths": ["c.txt"]}}]
    write_yaml(tmp_path / "cfg" / "other.yaml", {"data": {"source": "text", "paths": ["a.txt"]}, "stages": other})
    assert load(PretrainConfig, tmp_path / "cfg" / "other.yaml").stages[0].data["paths"] == [
        str(tmp_path / "cfg" / "c.txt")
    ]
    with pytest.raises(ConfigError, match="weights must be > 0"):
        from_dict(PretrainConfig, {"data": {"mixture": [{"paths": ["x"], "weight": 0}]}}, "run.yaml")
    with pytest.raises(ConfigError, match="a weight of 0.0005 is under 0.1% of the total"):
        from_dict(PretrainConfig, {"data": {"mixture": [{"paths": ["x"]}, {"paths": ["y"], "weight": 0.0005}]}}, "r")


def test_a_stage_may_not_train_on_the_runs_validation_documents() -> None:
    """The run evaluates on its corpus's (its mixture's) validation split: a stage may not split those otherwise."""
    run = {"source": "text", "paths": ["/c/a", "/c/b"]}
    with pytest.raises(ConfigError, match="stages\\[0\\].data.paths: shares /c/a with the run's corpus but splits it"):
        staged([{"name": "s", "steps": 1, "data": {"paths": ["/c/a"]}}], data=run)
    staged([{"name": "s", "steps": 1, "data": {"paths": ["/d/other"]}}], data=run)  # another corpus: fine
    staged([{"name": "s", "steps": 1, "data": {"paths": ["/c/b", "/c/a"]}}], data=run)  # the same files: fine
    mixed = {**run, "mixture": [{"paths": ["/c/a"]}, {"paths": ["/c/b"]}]}
    with pytest.raises(ConfigError, match="changes the weights of the run's data.mixture, not its corpora"):
        staged([{"name": "s", "steps": 1, "data": {"mixture": [{"paths": ["/c/a"]}]}}], data=mixed)
    with pytest.raises(ConfigError, match="data.mixture, not its corpora"):
        staged([{"name": "s", "steps": 1, "data": {"mixture": [{"paths": ["/c/a"]}]}}], data=run)
