"""Shipped configs find a user's data (issue 63): the data root, shipped names wherever a config names a config, a
mistyped key refused before torch is imported (naming the nearest key), missing data and a missing init in one line."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from roformer import catalogue
from roformer.catalogue import find_config, shipped_configs
from roformer.config import check_keys, check_override_keys, field_keys, load
from roformer.config_paths import config_file, resolve_key
from roformer.config_yaml import read_yaml, write_yaml
from roformer.data.text import expand_paths
from roformer.errors import ConfigError, UserError
from roformer.tasks.build import check_data_present
from roformer.tasks.config import FinetuneDataConfig
from roformer.train.config import FinetuneConfig, PretrainConfig

CONFIGS = REPO / "configs"


@pytest.fixture
def data_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """ROFORMER_DATA set to an empty folder of its own."""
    root = tmp_path / "root"
    root.mkdir()
    monkeypatch.setenv("ROFORMER_DATA", str(root))
    return root


def test_the_data_root_is_the_variable_else_the_clones_shared_data_else_data_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ROFORMER_DATA", "mine")
    assert catalogue.data_root() == tmp_path / "mine"  # relative to the working directory
    monkeypatch.delenv("ROFORMER_DATA")
    monkeypatch.setattr(catalogue, "CHECKOUT_DATA", tmp_path / "shared" / "data")
    assert catalogue.data_root() == tmp_path / "data"  # a clone without ../shared/data beside it
    (tmp_path / "shared" / "data").mkdir(parents=True)
    assert catalogue.data_root() == tmp_path / "shared" / "data"  # the project's own layout
    monkeypatch.setattr(catalogue, "INSTALLED_CONFIGS", tmp_path)  # an installed package never reads a clone's
    assert catalogue.data_root() == tmp_path / "data"


def test_a_variable_in_a_path_is_expanded_and_one_not_set_is_named(
    tmp_path: Path, data_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MY_CORPUS", str(tmp_path / "corpus"))
    path = tmp_path / "task.yaml"
    data = {"type": "classification", "train_file": "${ROFORMER_DATA}/t/a.csv", "validation_file": "${MY_CORPUS}/b"}
    write_yaml(path, {"init": "m", "data": data})
    config = load(FinetuneConfig, path, ["data.test_file=${ROFORMER_DATA}/t/../t/c.csv"])  # --set too, normalised
    assert config.data.train_file == str(data_root / "t" / "a.csv")
    assert config.data.validation_file == str(tmp_path / "corpus" / "b")
    assert config.data.test_file == str(data_root / "t" / "c.csv")
    monkeypatch.delenv("MY_CORPUS")
    unset = r"data.validation_file: \$\{MY_CORPUS\}/b: the environment variable MY_CORPUS is not set$"
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: {unset}"):
        load(FinetuneConfig, path)


def _run_configs() -> list[tuple[str, type, list[str]]]:
    """(name, class, overrides) of every shipped run config (not suites, recipes or model sections)."""
    found = []
    for name, path in shipped_configs().items():
        folder = name.split("/")[0]
        if folder not in ("pretrain", "glue", "finetune", "translation", "synthetic") or path.stem == "recipe":
            continue
        if "tasks" not in (read_yaml(path) or {}):
            found.append((name, PretrainConfig if folder == "pretrain" else FinetuneConfig, []))
    return found


@pytest.mark.parametrize("name, cls, overrides", _run_configs(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_shipped_config_reads_its_data_from_the_data_root(
    name: str, cls: type, overrides: list[str], data_root: Path
) -> None:
    config = load(cls, shipped_configs()[name], overrides).to_dict()
    for key in field_keys(cls, "path"):
        value = resolve_key(config, key) if "[]" not in key else None
        for path in [Path(v) for v in (value if isinstance(value, list) else [value]) if v]:
            # the data under the root; inits and a first stage's ranking where runs write them, or local models
            written = path.is_relative_to(REPO / "runs") or path.is_relative_to(REPO / "models")
            assert path.is_relative_to(data_root) or (written and key != "data.glue_dir"), (key, path)


def test_no_shipped_config_climbs_out_of_the_clone() -> None:
    """A data path is written against the data root, never as ../../../shared/... (which an install cannot mean)."""
    for path in sorted(CONFIGS.rglob("*.yaml")):
        lines = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
        assert not [line for line in lines if "../../../" in line], path


def test_a_shipped_name_works_wherever_a_config_names_a_config(tmp_path: Path) -> None:
    write_yaml(tmp_path / "rte.yaml", {"include": "glue/rte", "train": {"lrs": [1e-5]}})  # include:
    config = load(FinetuneConfig, tmp_path / "rte.yaml")
    assert (config.data.task, config.train.lrs, config.train.seeds) == ("rte", [1e-5], [0, 1, 2, 3, 4])
    write_yaml(tmp_path / "tiny.yaml", {"include": "roformer-tiny", "model": "roformer-small"})  # a section's file
    assert load(PretrainConfig, tmp_path / "tiny.yaml").model.hidden_size == 256  # model/, not pretrain/
    # what an experiment's arms and a suite's tasks call
    assert config_file(tmp_path, "translation/multi30k-cpu") == CONFIGS / "translation" / "multi30k-cpu.yaml"
    assert config_file(tmp_path, "rte", "glue") == CONFIGS / "glue" / "rte.yaml"
    assert config_file(tmp_path, "roformer-tiny", "pretrain") == CONFIGS / "pretrain" / "roformer-tiny.yaml"
    (tmp_path / "glue").mkdir()
    write_yaml(tmp_path / "glue" / "rte.yaml", {})
    assert config_file(tmp_path, "glue/rte.yaml") == tmp_path / "glue" / "rte.yaml"  # a path wins
    assert config_file(tmp_path, "../glue/rte") == tmp_path.parent / "glue" / "rte"  # never a name: the path back
    with pytest.raises(ConfigError, match=r"include: file not found: .*nope.yaml \(nor a shipped config's name\)"):
        write_yaml(tmp_path / "bad.yaml", {"include": "nope.yaml"})
        load(FinetuneConfig, tmp_path / "bad.yaml")


def test_an_experiment_s_arms_and_tasks_and_a_suite_s_tasks_take_shipped_names(tmp_path: Path) -> None:
    """The first real experiment needs no copy of the configs folder: names where paths were."""
    from roformer.study.experiment import load_experiment
    from roformer.study.experiment_config import load_experiment_config
    from roformer.study.suite import load_suite
    from roformer.study.task_study import load_task_arms

    write_yaml(tmp_path / "suite.yaml", {"tasks": ["rte", {"config": "glue/mrpc"}]})
    _, configs = load_suite(tmp_path / "suite.yaml")
    assert [c.data.task for c in configs] == ["rte", "mrpc"]
    study = {"tasks": ["shift", "synthetic/passkey-binding"], "arms": {"rotary": {}, "none": {"set": [
        "model.position_encoding=none"]}}}  # fmt: skip
    write_yaml(tmp_path / "study.yaml", study)
    experiment = load_experiment_config(tmp_path / "study.yaml")
    assert list(load_task_arms(experiment, tmp_path / "study.yaml")) == ["shift", "passkey-binding"]
    arms = {"rotary": "roformer-tiny", "bert": "pretrain/bert-tiny"}
    write_yaml(tmp_path / "experiment.yaml", {"arms": arms})
    _, loaded = load_experiment(tmp_path / "experiment.yaml")
    assert {label: config.model.position_encoding for label, config in loaded.items()} == {
        "rotary": "rotary",
        "bert": "sinusoidal",
    }


def test_a_name_given_on_purpose_prints_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.INFO)
    assert find_config("glue/rte", "glue") == CONFIGS / "glue" / "rte.yaml"
    assert config_file(tmp_path, "glue/rte") == CONFIGS / "glue" / "rte.yaml"
    assert not [r for r in caplog.records if r.levelno >= logging.INFO]


def test_an_unknown_key_names_the_nearest_known_one() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'train.max_stepz' \(did you mean 'train.max_steps'\? known"):
        load(PretrainConfig, CONFIGS / "pretrain" / "roformer-tiny.yaml", ["train.max_stepz=1"])
    with pytest.raises(ConfigError, match=r"unknown key 'bad' \(known keys: data, init"):  # nothing near: no guess
        load(PretrainConfig, CONFIGS / "pretrain" / "roformer-tiny.yaml", ["bad.key=1"])


@pytest.mark.parametrize(
    "cls, config, override, message",
    [
        (PretrainConfig, "pretrain/roformer-tiny", "model.hiden_size=3", "did you mean 'model.hidden_size'?"),
        (PretrainConfig, "pretrain/roformer-tiny", "stages=[{name: a, stepz: 1}]", "'stages[0].steps'?"),
        (FinetuneConfig, "glue/rte", "train.max_stepz=1", "did you mean 'train.max_steps'?"),
        (FinetuneConfig, "glue/rte", "bad.key=1", "unknown key 'bad'"),
    ],
)
def test_check_keys_refuses_what_load_refuses(cls: type, config: str, override: str, message: str) -> None:
    path = shipped_configs()[config]
    with pytest.raises(ConfigError, match=re.escape(message)) as fast:
        check_keys(cls, path, [override])
    with pytest.raises(ConfigError) as full:
        load(cls, path, [override])
    assert str(fast.value) == str(full.value)
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_override_keys(cls, [override])


def test_check_keys_reads_the_task_types_sections_from_their_source() -> None:
    path = shipped_configs()["glue/rte"]
    # a key inside a type's section: its settings class's fields, read from the module's source, not imported
    with pytest.raises(ConfigError, match="unknown key 'data.tagging.bad'") as fast:
        check_keys(FinetuneConfig, path, ["data.tagging.bad=1"])
    with pytest.raises(ConfigError, match="unknown key 'data.tagging.bad'") as full:
        load(FinetuneConfig, path, ["data.tagging.bad=1"])
    assert str(fast.value) == str(full.value)
    shift = shipped_configs()["synthetic/shift"]
    with pytest.raises(ConfigError, match=re.escape("did you mean 'data.synthetic.symbols'?")):
        check_keys(FinetuneConfig, shift, ["data.synthetic.symbls=3"])
    check_keys(FinetuneConfig, shift, ["data.synthetic.symbols=3x"])  # a bad value is load's to refuse
    # the sections' names are known from the modules' source: a key beside them is refused here
    with pytest.raises(ConfigError, match="unknown key 'data.glue_dri' \\(did you mean 'data.glue_dir'\\?"):
        check_keys(FinetuneConfig, path, ["data.glue_dri=x"])


def test_the_section_keys_read_from_the_types_source_are_their_settings_fields() -> None:
    import dataclasses

    from roformer.tasks.registry import declared_section_keys, settings_sections

    sections = {k: v for k, v in settings_sections().items() if dataclasses.is_dataclass(v)}
    fields = {k: {f.name for f in dataclasses.fields(v) if f.init} for k, v in sections.items()}
    assert declared_section_keys() == fields


def test_the_data_keys_read_from_the_types_source_are_those_they_declare() -> None:
    from roformer.tasks.registry import declared_keys, settings_sections

    assert declared_keys() == set(settings_sections())  # sections and folders (retrieval's via its helper)


def test_a_mistyped_key_is_refused_before_torch_is_imported(tmp_path: Path) -> None:
    code = (
        "import sys\nfrom roformer.cli import main\ncodes = [\n"
        "    main(['pretrain', '--config', 'roformer-tiny', '--set', 'train.max_stepz=1']),\n"
        "    main(['finetune', '--config', 'glue/rte', '--set', 'train.max_stepz=1']),\n"
        "    main(['suite', '--config', 'glue/all', '--set', 'train.max_stepz=1']),\n"
        "    main(['experiment', '--config', 'rope-vs-bert-tiny', '--set', 'train.max_stepz=1']),\n"
        "    main(['finetune', '--config', 'glue/rte', '--set', 'data.glue_dri=x']),\n"
        "    main(['finetune', '--config', 'synthetic/shift', '--set', 'data.synthetic.symbls=3']),\n"
        "]\nprint(codes, 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["[2,", "2,", "2,", "2,", "2,", "2]", "False"]
    lines = done.stderr.splitlines()
    assert len(lines) == 6 and all("did you mean 'train.max_steps'?" in line for line in lines[:4]), lines
    assert "did you mean 'data.glue_dir'?" in lines[4] and "did you mean 'data.synthetic.symbols'?" in lines[5]


def test_missing_data_is_one_line_naming_the_key_the_data_root_and_the_hub(tmp_path: Path, data_root: Path) -> None:
    glue = FinetuneDataConfig(task="rte", glue_dir=str(data_root / "glue"))
    with pytest.raises(UserError) as error:
        check_data_present(glue)
    assert str(error.value) == (
        f"data.glue_dir: {data_root / 'glue'}: no such folder; give it with --set data.glue_dir=PATH, or set "
        f"ROFORMER_DATA=DIR (the shipped configs' data root, now {data_root}), or read the data from the hub: --set "
        "data.source=hub"
    )
    (tmp_path / "a.csv").write_text("text,label\n")
    files = FinetuneDataConfig(type="classification", train_file=str(tmp_path / "a.csv"), validation_file="/no/b.csv")
    with pytest.raises(UserError, match=r"^data.validation_file: /no/b.csv: no such file; give it with --set [^,]*$"):
        check_data_present(files)  # outside the data root, no hub dataset: the key alone
    pairs = FinetuneDataConfig(
        type="translation", source_lang="en", target_lang="de", train_prefix=str(data_root / "mt" / "train"),
        validation_prefix=str(data_root / "mt" / "val"),
    )  # fmt: skip
    with pytest.raises(UserError, match=rf"^data.train_prefix: {re.escape(str(data_root / 'mt'))}: no such folder"):
        check_data_present(pairs)
    with pytest.raises(UserError, match=r"^data.paths: .*gutenberg: no such file or folder; .*data.paths=\[PATH\]"):
        expand_paths([str(data_root / "corpus" / "gutenberg")], key="data.paths")


def test_an_init_that_is_not_a_folder_says_so(tmp_path: Path) -> None:
    from roformer.model.pretrained import check_init

    with pytest.raises(UserError, match=rf"^init: {re.escape(str(tmp_path / 'final'))}: no such model folder \("):
        check_init(tmp_path / "final")
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(UserError, match="a file, not a model folder"):
        check_init(tmp_path / "model.safetensors")
    check_init(tmp_path)
