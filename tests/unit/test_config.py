"""Configs: every shipped YAML loads; bad keys, types and values fail naming the field and the file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import REPO

import roformer
from roformer.catalogue import data_root
from roformer.config import load
from roformer.errors import ConfigError
from roformer.model.config import ModelConfig
from roformer.tasks.config import FinetuneDataConfig
from roformer.train.config import FinetuneConfig, PretrainConfig, data_section


def _load_accelerate_config(path: Path) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(path))  # accelerate's own parser: unknown keys are errors
    assert config.num_processes >= 1


def _load_glue_config(path: Path) -> None:
    from roformer.config_yaml import read_yaml
    from roformer.study.suite import load_suite_config

    if "tasks" in (read_yaml(path) or {}):  # all.yaml, small-cpu.yaml: suites of task configs
        load_suite_config(path)
    elif path.name == "recipe.yaml":  # what every task config includes: a task config but for its task
        load(FinetuneConfig, path, ["data.task=rte"])
    else:
        load(FinetuneConfig, path)


def _load_finetune_config(path: Path) -> None:
    from roformer.config_yaml import read_yaml
    from roformer.study.suite import load_suite_config

    if "tasks" in (read_yaml(path) or {}):  # a suite of task configs
        load_suite_config(path)
    elif path.name == "recipe.yaml":  # what every config of the folder includes: a config but for its data
        load(FinetuneConfig, path, ["data.type=classification", "data.train_file=a", "data.validation_file=b"])
    else:
        load(FinetuneConfig, path)


def _load_experiment_config(path: Path) -> None:
    from roformer.study.experiment import load_experiment

    load_experiment(path)


CONFIG_LOADERS = {
    "experiments": _load_experiment_config,
    "glue": _load_glue_config,
    "finetune": _load_finetune_config,
    "synthetic": lambda path: load(FinetuneConfig, path),
    "translation": lambda path: load(FinetuneConfig, path),
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
    from roformer.config_yaml import read_yaml

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
    """Our loader resolves `<<` itself (roformer.config_yaml._ConfigLoader): the spec's values under any PyYAML.

    `scripts/checks/check_yaml_versions.sh` (run by .ci/run) runs this file under PyYAML 6.0.1, 6.0.3 and 6.0.4.
    """
    from roformer.config_yaml import read_yaml

    assert read_yaml(write(tmp_path, text))["c"] == expected


def test_a_set_override_merges_as_the_file_does() -> None:
    from roformer.config_yaml import apply_overrides

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
    from roformer.config_yaml import read_yaml

    with pytest.raises(roformer.ConfigError, match=re.escape(message)):
        read_yaml(write(tmp_path, text))


@pytest.mark.parametrize(
    "text, message",
    [
        ("hiden_size: 64\n", "unknown key 'hiden_size'"),
        ("hidden_size: sixty\n", "key 'hidden_size' must be an integer"),
        ("hidden_size: 64.5\n", "key 'hidden_size' must be an integer"),
        ("rotary_value: 'yes'\n", "key 'rotary_value' must be true or false"),
        ("position_encoding: alibj\n", "key 'position_encoding' must be one of 'alibi', "),
        ("hidden_size: 30\nnum_heads: 4\n", "hidden_size (30) must be divisible by num_heads (4)"),
        ("hidden_size: 36\nnum_heads: 4\n", "rotary needs an even head size"),
        ("hidden_act: gelu_magic\n", "hidden_act 'gelu_magic' is not one of"),
        ("hidden_dropout: 1.5\n", "hidden_dropout must be in [0, 1)"),
        ("hidden_dropout: -0.1\n", "hidden_dropout must be in [0, 1), got -0.1"),
        ("attention_dropout: -0.1\n", "attention_dropout must be in [0, 1), got -0.1"),
        ("attention_dropout: 1.5\n", "attention_dropout must be in [0, 1), got 1.5"),
        ("classifier_dropout: -0.1\n", "classifier_dropout must be in [0, 1) or null, got -0.1"),
        ("classifier_dropout: 2\n", "classifier_dropout must be in [0, 1) or null, got 2"),
        ("attention_dropout: .nan\n", "key 'attention_dropout' must be a finite number, got nan"),
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
    roformer.config_yaml.write_yaml(
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
    from roformer.config_yaml import apply_overrides

    assert apply_overrides({}, ["data.cache_dir=@scratch:/x"]) == {"data": {"cache_dir": "@scratch:/x"}}


# The field tables as they were written out by hand before the fields carried them (issue 34): the loader's
# (PretrainConfig.INCLUDES, .PATH_KEYS; FinetuneConfig.PATH_KEYS, .NAME_KEYS) and the resume policy's
# (roformer.train.run_dir.RESUME_MAY_CHANGE, RESUME_MAY_CHANGE_UNTIL_A_RUN_FINISHES, RESUME_UNLOGGED).
PATH_KEYS_BEFORE = {
    PretrainConfig: ("data.paths", "data.validation_paths", "data.tokenizer", "init"),
    FinetuneConfig: (
        "init",
        "data.glue_dir",
        "data.train_file",
        "data.validation_file",
        "data.test_file",
        "data.validation_mismatched_file",
        "data.test_mismatched_file",
    ),
}
NAME_KEYS_BEFORE = {PretrainConfig: (), FinetuneConfig: ("init",)}
INCLUDES_BEFORE = {PretrainConfig: ("model",), FinetuneConfig: ()}
RESUME_MAY_CHANGE_BEFORE = (
    "label",
    "train.progress",
    "train.report_to",
    "train.log_every",
    "train.eval_batch_size",
    "train.save_every",
    "train.keep_checkpoints",
    "train.max_bad_steps",
    "train.gradient_checkpointing",
    "data.num_proc",
    "data.cache_dir",
    "train.batch_size",
    "train.grad_accum",
)
RESUME_MAY_CHANGE_UNTIL_A_RUN_FINISHES_BEFORE = (
    "train.max_steps",
    "train.epochs",
    "train.eval_every",
    "train.patience",  # since: where a fine-tuning run ends, as max_steps
)
RESUME_UNLOGGED_BEFORE = ("train.progress", "train.report_to")


@pytest.mark.parametrize("cls", [PretrainConfig, FinetuneConfig], ids=lambda cls: cls.__name__)
def test_the_loader_tables_derived_from_the_fields_are_the_old_tables(cls: type) -> None:
    from roformer.config import field_keys

    keys, before = field_keys(cls, "path"), PATH_KEYS_BEFORE[cls]
    if cls is PretrainConfig:  # since: the paths of a mixture's corpora and of the stages' sections, every item's
        added = ("data.mixture[].paths", "stages[].data.paths", "stages[].data.mixture[].paths")
        assert keys == (*before[:3], added[0], before[3], *added[1:])
        return
    assert keys[: len(before)] == before  # in the same order, too
    # then the task types' own, declared with them (retrieval's data.beir_dir, rerank's data.rerank.first_stage)
    assert all(key.startswith("data.") for key in keys[len(before) :]) and len(set(keys)) == len(keys)
    assert field_keys(cls, "hub_name") == NAME_KEYS_BEFORE[cls]
    assert field_keys(cls, "include") == INCLUDES_BEFORE[cls]


def test_the_resume_tables_derived_from_the_fields_are_the_old_tables() -> None:
    from roformer.train import run_dir

    # the same keys, each once; listed in field order now (the order a refused resume's message names them in)
    for derived, before in [
        (run_dir.RESUME_MAY_CHANGE, RESUME_MAY_CHANGE_BEFORE),
        (run_dir.RESUME_MAY_CHANGE_UNTIL_A_RUN_FINISHES, RESUME_MAY_CHANGE_UNTIL_A_RUN_FINISHES_BEFORE),
        (run_dir.RESUME_UNLOGGED, RESUME_UNLOGGED_BEFORE),
    ]:
        assert sorted(derived) == sorted(before)


def test_a_field_a_subclass_redefines_keeps_its_metadata() -> None:
    """FinetuneTrainConfig changes defaults of TrainArgs fields: it must repeat what the loader and resume read."""
    from dataclasses import fields

    from roformer.train.config import FinetuneTrainConfig, TrainArgs, TrainConfig

    shared = {f.name: f.metadata for f in fields(TrainArgs)}
    for cls in (TrainConfig, FinetuneTrainConfig):
        for f in fields(cls):
            if f.name in shared:
                assert f.metadata == shared[f.name], f"{cls.__name__}.{f.name}"
    pretraining = {f.name: f.metadata for f in fields(TrainConfig)}
    assert {f.name: f.metadata for f in fields(FinetuneTrainConfig)}["max_steps"] == pretraining["max_steps"]


# Every shipped task config as it loaded before the nine files included configs/glue/recipe.yaml (issue 34): the same
# for all but data.task (to_dict() of each, computed then; paths relative to the repository)
GLUE_TASK_CONFIG_BEFORE = {
    "init": "runs/roformer-base/final",
    "label": None,
    "model": {"classifier_dropout": 0.1},
    "data": {
        "source": "glue_dir",
        "glue_dir": "glue_data",
        "hub_name": "nyu-mll/glue",
        "train_file": None,
        "validation_file": None,
        "test_file": None,
        "validation_mismatched_file": None,
        "test_mismatched_file": None,
        "text_columns": None,
        "label_column": "label",
        "max_length": 512,
        "pad_to_multiple_of": 8,
        "group_by_length": False,
        "beyond_pretraining_length": False,
        "max_train_examples": None,
        "max_eval_examples": None,
    },
    "train": {
        "seed": 0,
        "lr": 2e-05,
        "batch_size": 32,
        "grad_accum": 1,
        "mixed_precision": None,
        "schedule": "linear",
        "warmup_steps": None,
        "warmup_fraction": 0.1,
        "weight_decay": 0.01,
        "adam_beta1": 0.9,
        "adam_beta2": 0.999,
        "adam_eps": 1e-06,
        "max_grad_norm": 1.0,
        "log_every": 50,
        "eval_every": None,
        "eval_batch_size": None,
        "save_every": 0,
        "keep_checkpoints": 2,
        "report_to": [],
        "max_bad_steps": 20,
        "compile": False,
        "gradient_checkpointing": False,
        "deterministic": False,
        "progress": True,
        "epochs": 3.0,
        "max_steps": None,
        "lrs": [2e-05, 3e-05, 4e-05, 5e-05],
        "seeds": [0, 1, 2, 3, 4],
    },
}
GLUE_TASKS = ["cola", "mnli", "mrpc", "qnli", "qqp", "rte", "sst2", "stsb", "wnli"]


@pytest.mark.parametrize("task", GLUE_TASKS)
def test_a_glue_task_config_loads_as_it_did_before_it_included_the_recipe(task: str) -> None:
    expected = {**GLUE_TASK_CONFIG_BEFORE, "data": {"task": task, **GLUE_TASK_CONFIG_BEFORE["data"]}}
    expected["init"] = str(REPO / expected["init"])
    expected["data"]["glue_dir"] = str(data_root() / "glue")  # since: the shipped configs' data root (issue 63)
    loaded = load(FinetuneConfig, REPO / "configs" / "glue" / f"{task}.yaml").to_dict()
    # the task types came later: their keys have the defaults of type glue
    added = {k: v for k, v in loaded["data"].items() if k not in expected["data"]}
    assert added == {k: v for k, v in data_section(FinetuneDataConfig(task=task, glue_dir="g")).items() if k in added}
    assert added["type"] == "glue"
    # train.unpadding, the WSD settings and checkpoint averaging came later too, with their defaults
    later = {k: v for k, v in loaded["train"].items() if k not in expected["train"]}
    assert later == {
        "unpadding": None,
        "decay_fraction": 0.2,
        "decay_shape": "1-sqrt",
        "average_last": 0,
        "average_every": None,
        "patience": None,
    }
    loaded["train"] = {k: v for k, v in loaded["train"].items() if k not in later}
    assert {**loaded, "data": {k: v for k, v in loaded["data"].items() if k not in added}} == expected


def test_every_glue_task_config_is_the_recipe_and_its_task() -> None:
    from roformer.config_yaml import read_yaml

    for task in GLUE_TASKS:
        assert read_yaml(REPO / "configs" / "glue" / f"{task}.yaml") == {
            "include": "recipe.yaml",
            "data": {"task": task},
        }


def write_finetune_configs(folder: Path, recipe: dict, task: dict) -> Path:
    """`folder/shared/recipe.yaml` and `folder/tasks/task.yaml`, which includes it; returns the task's path."""
    (folder / "shared").mkdir(parents=True)
    (folder / "tasks").mkdir()
    roformer.config_yaml.write_yaml(folder / "shared" / "recipe.yaml", recipe)
    roformer.config_yaml.write_yaml(folder / "tasks" / "task.yaml", {"include": "../shared/recipe.yaml", **task})
    return folder / "tasks" / "task.yaml"


RECIPE = {
    "init": "../models/base",
    "model": {"classifier_dropout": 0.1, "hidden_dropout": 0.2},
    "data": {"source": "files", "train_file": "train.tsv", "validation_file": "dev.tsv", "max_length": 128},
    "train": {"lrs": [1e-5, 2e-5], "seeds": [0, 1], "epochs": 2},
}


def test_a_files_own_keys_win_over_the_included_files_and_mappings_merge(tmp_path: Path) -> None:
    task = {"model": {"hidden_dropout": 0.0}, "data": {"task": "rte"}, "train": {"lrs": [3e-5]}}
    config = load(FinetuneConfig, write_finetune_configs(tmp_path, RECIPE, task), ["train.epochs=1"])
    assert config.model == {"classifier_dropout": 0.1, "hidden_dropout": 0.0}  # merged key by key
    assert (config.data.task, config.data.max_length) == ("rte", 128)
    assert (config.train.lrs, config.train.seeds, config.train.epochs) == ([3e-5], [0, 1], 1.0)  # a list replaces


def test_included_paths_are_relative_to_the_file_that_writes_them(tmp_path: Path) -> None:
    path = write_finetune_configs(tmp_path, RECIPE, {"data": {"task": "rte", "validation_file": "mine.tsv"}})
    config = load(FinetuneConfig, path)
    assert config.init == str(tmp_path / "models" / "base")
    assert config.data.train_file == str(tmp_path / "shared" / "train.tsv")
    assert config.data.validation_file == str(tmp_path / "tasks" / "mine.tsv")


def test_an_included_pretraining_config_brings_its_model_file(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    base = REPO / "configs" / "pretrain" / "roformer-tiny.yaml"  # model: ../model/roformer-tiny.yaml
    roformer.config_yaml.write_yaml(
        tmp_path / "mine" / "long.yaml", {"include": str(base), "data": {"max_seq_len": 256}}
    )
    config = load(PretrainConfig, tmp_path / "mine" / "long.yaml")
    expected = load(PretrainConfig, base, ["data.max_seq_len=256"])
    assert config.to_dict() == expected.to_dict()


def test_a_bad_value_in_an_included_file_is_named_by_that_file(tmp_path: Path) -> None:
    path = write_finetune_configs(tmp_path / "a", {**RECIPE, "train": {"lr": "abc"}}, {"data": {"task": "rte"}})
    recipe = tmp_path / "a" / "shared" / "recipe.yaml"
    with pytest.raises(roformer.ConfigError, match=f"^{re.escape(str(recipe))}: key 'train.lr' must be a number"):
        load(FinetuneConfig, path)
    path = write_finetune_configs(tmp_path / "b", RECIPE, {"data": {"tsak": "rte"}})  # the including file's own
    with pytest.raises(roformer.ConfigError, match=f"^{re.escape(str(path))}: unknown key 'data.tsak'"):
        load(FinetuneConfig, path)


@pytest.mark.parametrize(
    "include, message",
    [
        ("missing.yaml", "include: file not found: "),
        (["a.yaml"], "include: expected the path of a YAML file, got ['a.yaml']"),
        ("task.yaml", "is already being included (the files include each other)"),
    ],
)
def test_a_bad_include_is_one_error_naming_the_file(tmp_path: Path, include: object, message: str) -> None:
    path = tmp_path / "task.yaml"
    roformer.config_yaml.write_yaml(path, {"include": include, "init": "x", "data": {"task": "rte", "glue_dir": "."}})
    with pytest.raises(roformer.ConfigError, match=f"^{re.escape(str(path))}: .*{re.escape(message)}"):
        load(FinetuneConfig, path)


def test_include_is_an_unknown_key_where_a_config_class_does_not_take_it(tmp_path: Path) -> None:
    from roformer.study.suite import SuiteConfig

    path = write(tmp_path, "include: other.yaml\ntasks: [rte.yaml]\n")
    with pytest.raises(roformer.ConfigError, match="unknown key 'include'"):
        load(SuiteConfig, path)


def test_a_suite_task_may_carry_overrides_of_its_own(tmp_path: Path) -> None:
    """`{config, set}` entries: the task's set comes after the suite's overrides, the command line's after both."""
    from roformer.config_yaml import write_yaml
    from roformer.study.suite import load_suite

    task = {"data": {"type": "classification", "train_file": "a", "validation_file": "b"}, "init": "m"}
    write_yaml(tmp_path / "t.yaml", task)
    tasks = ["t.yaml", {"config": "t.yaml", "set": ["data.task=other", "train.seeds=[0,1]", "train.lr=0.5"]}]
    write_yaml(tmp_path / "s.yaml", {"tasks": tasks, "overrides": ["train.seeds=[7]", "train.lr=0.1"]})
    _, (plain, own) = load_suite(tmp_path / "s.yaml", ["train.lr=0.2"])
    assert (plain.data.task, plain.train.seeds, plain.train.lr) == ("classification", [7], 0.2)
    assert (own.data.task, own.train.seeds, own.train.lr) == ("other", [0, 1], 0.2)
    write_yaml(tmp_path / "twice.yaml", {"tasks": ["t.yaml", {"config": "t.yaml", "set": ["train.lr=0.5"]}]})
    with pytest.raises(ConfigError, match="twice.yaml: tasks share the name 'classification'"):
        load_suite(tmp_path / "twice.yaml")
    write_yaml(tmp_path / "bad.yaml", {"tasks": [{"set": ["train.lr=1"]}]})
    with pytest.raises(ConfigError, match=r"bad.yaml: tasks\[0\]: a task mapping needs config:"):  # the mapping's own
        load_suite(tmp_path / "bad.yaml")


def test_chinese_pretrain_configs_differ_only_in_the_position_encoding_or_the_tokenization() -> None:
    for size in ("tiny", "small"):
        configs = {
            name: load(PretrainConfig, REPO / "configs" / "pretrain" / f"{name}-{size}.yaml").to_dict()
            for name in ("roformer-zh", "bert-zh", "bert-zh-char")
        }
        rope, bert, char = configs["roformer-zh"], configs["bert-zh"], configs["bert-zh-char"]
        assert rope["data"] == bert["data"] and rope["train"] == bert["train"] and rope["data"]["jieba"], size
        assert rope["model"]["position_encoding"] == "rotary" and bert["model"]["position_encoding"] == "sinusoidal"
        assert {k for k in bert["data"] if bert["data"][k] != char["data"][k]} == {"jieba"}, size
        assert bert["model"] == char["model"] and bert["train"] == char["train"], size
