"""Configs: every shipped YAML loads; bad keys, types and values fail naming the field and the file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO

import roformer
from roformer.config import load
from roformer.model.config import ModelConfig
from roformer.train.config import FinetuneConfig, PretrainConfig


def _load_accelerate_config(path: Path) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(path))  # accelerate's own parser: unknown keys are errors
    assert config.num_processes >= 1


def _load_glue_config(path: Path) -> None:
    from roformer.config import read_yaml
    from roformer.study.suite import load_suite_config

    is_suite = "tasks" in (read_yaml(path) or {})  # all.yaml, small-cpu.yaml: suites of task configs
    load_suite_config(path) if is_suite else load(FinetuneConfig, path)


def _load_experiment_config(path: Path) -> None:
    from roformer.study.experiment import load_experiment

    load_experiment(path)


CONFIG_LOADERS = {
    "experiments": _load_experiment_config,
    "glue": _load_glue_config,
    "model": ModelConfig.from_yaml,
    "pretrain": lambda path: load(PretrainConfig, path),
    "accelerate": _load_accelerate_config,
}


def shipped_configs() -> list[Path]:
    return sorted((REPO / "configs").rglob("*.yaml"))


def test_configs_exist() -> None:
    names = {p.name for p in (REPO / "configs" / "model").glob("*.yaml")}
    pairs = {f"{arm}-{size}.yaml" for arm in ("roformer", "bert") for size in ("tiny", "small", "base")}
    assert names == pairs | {"roformer-v2-small.yaml"}


def test_v2_config_is_v1_but_for_the_v2_fields() -> None:
    v1 = ModelConfig.from_yaml(REPO / "configs" / "model" / "roformer-small.yaml").to_dict()
    v2 = ModelConfig.from_yaml(REPO / "configs" / "model" / "roformer-v2-small.yaml").to_dict()
    assert {k for k in v1 if v1[k] != v2[k]} == {"use_bias", "norm_type", "mlm_head", "initializer"}


@pytest.mark.parametrize("path", shipped_configs(), ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_every_shipped_yaml_loads(path: Path) -> None:
    kind = path.relative_to(REPO / "configs").parts[0]
    assert kind in CONFIG_LOADERS, f"no loader registered for configs/{kind}/: add one to this test"
    CONFIG_LOADERS[kind](path)


def test_pretrain_config_pairs_differ_only_in_the_model() -> None:
    for size in ("tiny", "small", "base"):
        rope = load(PretrainConfig, REPO / "configs" / "pretrain" / f"roformer-{size}.yaml").to_dict()
        bert = load(PretrainConfig, REPO / "configs" / "pretrain" / f"bert-{size}.yaml").to_dict()
        assert rope["data"] == bert["data"] and rope["train"] == bert["train"], size
        assert (rope["label"], bert["label"]) == ("roformer", "bert")
        assert rope["model"]["position_encoding"] == "rotary" and bert["model"]["position_encoding"] == "sinusoidal"
    base = load(PretrainConfig, REPO / "configs" / "pretrain" / "roformer-base.yaml")
    assert (base.data.max_seq_len, base.train.batch_size * 8) == (512, 64)  # the paper's 64 x 512 on 8 devices


def test_accelerate_examples_exist() -> None:
    names = {p.stem for p in (REPO / "configs" / "accelerate").glob("*.yaml")}
    assert names == {"single-gpu", "multi-gpu", "fsdp", "deepspeed-zero2", "multi-cpu"}


def test_model_config_pairs_differ_only_in_position_encoding() -> None:
    for size in ("tiny", "small", "base"):
        rope = ModelConfig.from_yaml(REPO / "configs" / "model" / f"roformer-{size}.yaml").to_dict()
        bert = ModelConfig.from_yaml(REPO / "configs" / "model" / f"bert-{size}.yaml").to_dict()
        differ = {k for k in rope if rope[k] != bert[k]}
        assert differ == {"position_encoding"}, differ
        assert rope["position_encoding"] == "rotary" and bert["position_encoding"] == "sinusoidal"
    base = ModelConfig.from_yaml(REPO / "configs" / "model" / "roformer-base.yaml")
    assert (base.num_layers, base.hidden_size, base.num_heads, base.intermediate_size) == (12, 768, 12, 3072)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


def test_merge_keys_may_override_what_they_merge(tmp_path: Path) -> None:
    """`<<` merges (also of a mapping that itself merges and overrides) are not duplicate keys."""
    from roformer.config import read_yaml

    text = "a: &a {k: 0}\nx:\n  b: &b\n    <<: *a\n    k: 1\nc:\n  <<: *b\n  j: 2\n"
    assert read_yaml(write(tmp_path, text)) == {"a": {"k": 0}, "x": {"b": {"k": 1}}, "c": {"k": 1, "j": 2}}


@pytest.mark.parametrize(
    "text, expected",
    [
        # yaml/pyyaml#953: PyYAML 6.0.4 read c.k as 0 here (the value b's own key overrides)
        ("a: &a {k: 0, m: 0}\nb: &b\n  <<: *a\n  k: 1\nc:\n  <<: *b\n", {"k": 1, "m": 0}),
        # three levels: each level's own keys win over everything it merges
        ("a: &a {k: 0}\nb: &b {<<: *a, k: 1}\nd: &d {<<: *b, j: 5}\nc: {<<: *d, i: 9}\n", {"k": 1, "j": 5, "i": 9}),
        # a list of mappings: the earlier wins (https://yaml.org/type/merge.html)
        ("a: &a {k: 0}\nb: &b {k: 1, j: 1}\nc: {<<: [*a, *b]}\n", {"k": 0, "j": 1}),
        ("a: &a {k: 0}\nb: &b {k: 1, j: 1}\nc: {<<: [*b, *a]}\n", {"k": 1, "j": 1}),
        # a merged mapping that itself merges a list
        ("a: &a {k: 0}\nb: &b {k: 1, j: 1}\nx: &x {<<: [*a, *b], j: 2}\nc: {<<: *x}\n", {"k": 0, "j": 2}),
        # the own key wins wherever it is written
        ("a: &a {k: 0}\nc: {k: 3, <<: *a}\n", {"k": 3}),
    ],
)
def test_merge_keys_mean_the_same_under_every_pyyaml(tmp_path: Path, text: str, expected: dict) -> None:
    """Our loader resolves `<<` itself (roformer.config._ConfigLoader): the spec's values, whatever PyYAML is installed.

    `scripts/check_yaml_versions.sh` (run by .ci/run) runs this file under PyYAML 6.0.1, 6.0.3 and 6.0.4.
    """
    from roformer.config import read_yaml

    assert read_yaml(write(tmp_path, text))["c"] == expected


def test_a_set_override_merges_as_the_file_does() -> None:
    from roformer.config import apply_overrides

    data = apply_overrides({}, ["x={<<: {k: 0}, k: 1}"])
    assert data == {"x": {"k": 1}}


@pytest.mark.parametrize(
    "text, message",
    [
        ("train:\n  lr: 1.0\ndata: {}\ntrain:\n  lr: 2.0\n", "duplicate key 'train' (first on line 1)"),
        ("a: &a {k: 0}\nb:\n  <<: *a\n  j: 1\n  j: 2\n", "duplicate key 'j' (first on line 4)"),
        ("flags:\n  yes: 1\n  true: 2\n", "duplicate key 'true' (first on line 2)"),  # one key once parsed
    ],
)
def test_a_key_given_twice_is_an_error(tmp_path: Path, text: str, message: str) -> None:
    from roformer.config import read_yaml

    with pytest.raises(roformer.ConfigError, match=re.escape(message)):
        read_yaml(write(tmp_path, text))


@pytest.mark.parametrize(
    "text, message",
    [
        ("hiden_size: 64\n", "unknown key 'hiden_size'"),
        ("hidden_size: sixty\n", "key 'hidden_size' must be an integer"),
        ("hidden_size: 64.5\n", "key 'hidden_size' must be an integer"),
        ("rotary_value: 'yes'\n", "key 'rotary_value' must be true or false"),
        ("position_encoding: alibj\n", "key 'position_encoding' must be one of 'rotary'"),
        ("hidden_size: 30\nnum_heads: 4\n", "hidden_size (30) must be divisible by num_heads (4)"),
        ("hidden_size: 36\nnum_heads: 4\n", "rotary needs an even head size"),
        ("hidden_act: gelu_magic\n", "hidden_act 'gelu_magic' is not one of"),
        ("hidden_dropout: 1.5\n", "hidden_dropout must be in [0, 1)"),
        ("rotary_base: .nan\n", "key 'rotary_base' must be a finite number, got nan"),
        ("layer_norm_eps: .inf\n", "key 'layer_norm_eps' must be a finite number, got inf"),
        ("initializer_range: nan\n", "key 'initializer_range' must be a finite number"),
        ("attention_pattern: unilm\ntype_vocab_size: 1\n", "unilm needs token types 0 and 1"),
        ("num_layers: 0\n", "num_layers must be > 0"),
        ("rotary_value: true\nposition_encoding: learned\n", "rotary_value is only meaningful"),
        ("pad_token_id: 5000\nvocab_size: 100\n", "pad_token_id (5000) must be in [0, vocab_size=100)"),
        ("- a\n- b\n", "expected a mapping"),
        ("hidden_size: [64\n", "not valid YAML"),
        ("hidden_size: 64\nnum_heads: 4\nhidden_size: 128\n", "duplicate key 'hidden_size' (first on line 1)"),
    ],
)
def test_bad_model_configs_name_field_and_file(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(roformer.ConfigError) as info:
        ModelConfig.from_yaml(path)
    assert message in str(info.value)
    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(roformer.ConfigError, match="config file not found"):
        ModelConfig.from_yaml(tmp_path / "none.yaml")


def test_yaml_round_trip_and_python_construction(tmp_path: Path) -> None:
    config = ModelConfig(hidden_size=64, num_heads=2, num_layers=1, intermediate_size=128, embedding_size=32)
    config.to_yaml(tmp_path / "c.yaml")
    assert ModelConfig.from_yaml(tmp_path / "c.yaml") == config
    assert ModelConfig(layer_norm_eps=1).layer_norm_eps == 1.0  # int accepted as float
    with pytest.raises(roformer.ConfigError, match="ModelConfig: key 'num_heads'"):
        ModelConfig(num_heads="12")
    # YAML 1.1 reads 1e-5 without a dot as a string; a float field still accepts it
    assert ModelConfig.from_yaml(write(tmp_path, "layer_norm_eps: 1e-5\n")).layer_norm_eps == 1e-5
    nested = write(tmp_path, "model:\n  hidden_size: 64\n  num_heads: 2\n")
    assert ModelConfig.from_yaml(nested).hidden_size == 64


def test_sinusoidal_scale_default_matches_embedding_init() -> None:
    config = ModelConfig(position_encoding="sinusoidal")
    assert config.resolved_sinusoidal_scale == pytest.approx(0.02 * 2**0.5)
    assert ModelConfig(position_encoding="sinusoidal", sinusoidal_scale=1.0).resolved_sinusoidal_scale == 1.0


def test_mnli_mismatched_files_are_resolved_against_the_config_file(tmp_path: Path) -> None:
    folder = tmp_path / "configs"
    folder.mkdir()
    roformer.config.write_yaml(
        folder / "mnli.yaml",
        {
            "init": "bert-base-uncased",
            "data": {
                "task": "mnli",
                "source": "files",
                "train_file": "train.tsv",
                "validation_file": "dev_matched.tsv",
                "validation_mismatched_file": "dev_mismatched.tsv",
                "test_mismatched_file": "test_mismatched.tsv",
            },
        },
    )
    data = load(FinetuneConfig, folder / "mnli.yaml").data
    assert data.validation_mismatched_file == str(folder / "dev_mismatched.tsv")
    assert data.test_mismatched_file == str(folder / "test_mismatched.tsv")


TINY = REPO / "configs" / "pretrain" / "roformer-tiny.yaml"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["train.lr=abc"], "--set train.lr=abc: key 'train.lr' must be a number, got 'abc' (str)"),
        (["train.lr=1e-3", "train.lr=abc"], "--set train.lr=abc: key 'train.lr'"),  # the last one counts
        (["train.lrs=1"], "--set train.lrs=1: unknown key 'train.lrs'"),
        (["model.num_heads=5"], "--set model.num_heads=5: model: hidden_size (64) must be divisible by num_heads (5)"),
        (["train.max_steps=-1"], "--set train.max_steps=-1: train: max_steps must be >= 1, got -1"),
        (["train={lr: x}"], "--set train={lr: x}: key 'train.lr' must be a number"),
        (["data.paths=[a.txt, b.txt"], "--set data.paths=[a.txt, b.txt: not valid YAML (expected ',' or ']'"),
        (["train.report_to=[tensorboard"], "--set train.report_to=[tensorboard: not valid YAML"),
    ],
)
def test_a_bad_set_value_is_named_as_given_not_as_the_file(overrides: list[str], message: str) -> None:
    with pytest.raises(roformer.ConfigError, match=f"^{re.escape(message)}"):
        load(PretrainConfig, TINY, overrides)


def test_a_bad_value_in_the_file_is_still_named_by_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "train:\n  lr: abc\n")
    with pytest.raises(roformer.ConfigError, match=f"^{re.escape(str(path))}: key 'train.lr'"):
        load(PretrainConfig, path, ["train.max_steps=3"])


def test_a_plain_string_yaml_cannot_parse_is_kept_as_written() -> None:
    from roformer.config import apply_overrides

    assert apply_overrides({}, ["data.cache_dir=@scratch:/x"]) == {"data": {"cache_dir": "@scratch:/x"}}
