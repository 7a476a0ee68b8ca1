"""The installable package: shipped configs by name (`--config roformer-tiny`), their relative references inside an
installed package, `roformer configs`, and the built wheel installed outside the repository."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO
from packaging.specifiers import SpecifierSet

import roformer.catalogue as catalogue
from roformer.catalogue import find_config, shipped_config, shipped_configs
from roformer.cli import main
from roformer.config import ConfigError, load
from roformer.study.experiment import load_experiment
from roformer.study.suite import load_suite_config
from roformer.train.config import FinetuneConfig, PretrainConfig

CONFIGS = REPO / "configs"


def test_the_clone_ships_its_configs_folder() -> None:
    names = shipped_configs()
    assert set(names.values()) == set(CONFIGS.rglob("*.yaml"))
    assert names["pretrain/roformer-tiny"] == CONFIGS / "pretrain" / "roformer-tiny.yaml"


@pytest.mark.parametrize(
    "value, folder, expected",
    [
        ("roformer-tiny", "pretrain", "pretrain/roformer-tiny"),
        ("roformer-tiny.yaml", "pretrain", "pretrain/roformer-tiny"),
        ("model/roformer-tiny", "pretrain", "model/roformer-tiny"),
        ("glue/rte", "glue", "glue/rte"),
        ("rte", "glue", "glue/rte"),
        ("all", "glue", "glue/all"),
        ("rope-vs-bert-tiny", "experiments", "experiments/rope-vs-bert-tiny"),
        ("configs/pretrain/bert-tiny.yaml", "pretrain", "pretrain/bert-tiny"),  # the README's paths, from anywhere
    ],
)
def test_a_config_name_finds_the_shipped_file(
    value: str, folder: str, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # not the repository root: names only
    assert find_config(value, folder) == CONFIGS / f"{expected}.yaml"


def test_a_path_wins_over_a_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("roformer-tiny").write_text("label: mine\n")  # a file called like a shipped config
    assert find_config("roformer-tiny", "pretrain") == Path("roformer-tiny")
    Path("roformer-tiny").unlink()
    Path("roformer-tiny").mkdir()  # a folder is not a config file: the name still works
    assert find_config("roformer-tiny", "pretrain") == CONFIGS / "pretrain" / "roformer-tiny.yaml"


@pytest.mark.parametrize(
    "value", ["roformer-tyny", "/no/such/file.yaml", "glue/rte-extra", "../configs/pretrain/roformer-tiny.yaml"]
)
def test_neither_a_file_nor_a_name_is_one_error(value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # `..` is a path, never a name: it does not reach into the shipped folder
    with pytest.raises(ConfigError, match="config file not found, nor a shipped config of that name"):
        find_config(value, "pretrain")
    Path("a-folder").mkdir()
    with pytest.raises(ConfigError, match="a-folder: is a directory, not a config file"):
        find_config("a-folder", "pretrain")


def test_a_stem_two_folders_have_is_looked_up_in_folder_order() -> None:
    assert shipped_config("roformer-tiny") == CONFIGS / "pretrain" / "roformer-tiny.yaml"  # before model/
    assert shipped_config("model/roformer-tiny") == CONFIGS / "model" / "roformer-tiny.yaml"
    assert shipped_config("multi-gpu") == CONFIGS / "accelerate" / "multi-gpu.yaml"
    with pytest.raises(ConfigError, match="no shipped config of that name"):
        shipped_config("roformer-huge")


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The configs as a wheel installs them (site-packages/roformer/configs), and an empty working directory."""
    package = tmp_path / "site-packages" / "roformer" / "configs"
    shutil.copytree(CONFIGS, package)
    monkeypatch.setattr(catalogue, "INSTALLED_CONFIGS", package)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def test_installed_configs_are_found_before_the_clone(installed: Path) -> None:
    assert find_config("roformer-tiny", "pretrain") == catalogue.INSTALLED_CONFIGS / "pretrain/roformer-tiny.yaml"


def test_installed_references_between_configs_stay_inside_the_package(installed: Path) -> None:
    package = catalogue.INSTALLED_CONFIGS
    tiny = load(PretrainConfig, find_config("roformer-tiny", "pretrain"))  # model: ../model/roformer-tiny.yaml
    assert (tiny.model.num_layers, tiny.model.hidden_size) == (2, 64)
    suite = find_config("all", "glue")
    assert suite.parent == package / "glue" and len(load_suite_config(suite).tasks) == 9
    _, arms = load_experiment(find_config("rope-vs-bert-small", "experiments"))  # arms: ../pretrain/*.yaml
    assert set(arms) == {"roformer", "bert"}


def test_installed_paths_that_leave_the_configs_are_read_from_the_working_directory(
    installed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as if the configs folder were ./configs: in a clone's root, the name and the path mean the same files
    monkeypatch.delenv("ROFORMER_DATA", raising=False)
    rte = load(FinetuneConfig, find_config("glue/rte", "glue"))  # include: recipe.yaml, which holds the paths
    assert rte.init == str(installed / "runs" / "roformer-base" / "final")  # where `pretrain --config roformer-base`
    # the data: under the data root, ./data without ROFORMER_DATA
    assert rte.data.glue_dir == str(installed / "data" / "glue")  # download_glue_data.py --data_dir data/glue
    small = load(PretrainConfig, find_config("roformer-small", "pretrain"))
    assert small.data.paths == [str(installed / "data" / "corpus" / "gutenberg")]
    monkeypatch.setenv("ROFORMER_DATA", str(installed / "mine"))
    translation = load(FinetuneConfig, find_config("translation/multi30k-cpu", "glue"))
    assert translation.data.train_prefix == str(installed / "mine" / "translation" / "multi30k" / "train")


def test_clone_paths_stay_relative_to_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    rte = load(FinetuneConfig, find_config("glue/rte", "glue"))
    assert rte.init == str(REPO / "runs" / "roformer-base" / "final")


def test_configs_command_lists_every_shipped_config(capsys: pytest.CaptureFixture) -> None:
    assert main(["configs"]) == 0
    out = capsys.readouterr().out
    listed = {line.split()[0] for line in out.splitlines() if line.startswith("  ")}
    assert listed == set(shipped_configs())
    assert re.search(r"^  pretrain/roformer-tiny +the quickstart$", out, re.M)  # the header comment's first sentence
    assert "Su et al. 2021, sec. 4.5.1" in out  # not cut at an abbreviation's dot


def test_the_folder_table_names_every_shipped_folder_in_lookup_order() -> None:
    assert list(catalogue.SHIPPED_FOLDERS) == [
        "pretrain",
        "glue",
        "finetune",
        "experiments",
        "model",
        "accelerate",
        "synthetic",
        "translation",
    ]
    assert set(catalogue.SHIPPED_FOLDERS) == {p.name for p in CONFIGS.iterdir() if p.is_dir()}


def test_the_config_module_still_offers_the_catalogues_names() -> None:
    import roformer.config

    for name in ("find_config", "shipped_config", "shipped_configs", "shipped_configs_dir"):
        assert getattr(roformer.config, name) is getattr(catalogue, name)


def test_configs_command_prints_one_path(capsys: pytest.CaptureFixture) -> None:
    assert main(["configs", "accelerate/multi-gpu"]) == 0
    assert capsys.readouterr().out == f"{CONFIGS / 'accelerate' / 'multi-gpu.yaml'}\n"
    assert main(["configs", "roformer-huge"]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == "roformer configs: error: roformer-huge: no shipped config of that name (`roformer configs` lists them)\n"
    )


@pytest.mark.parametrize("command", ["pretrain", "prepare-data", "finetune", "glue", "experiment"])
def test_a_bad_config_name_is_one_line_and_exit_2(command: str, capsys: pytest.CaptureFixture) -> None:
    assert main([command, "--config", "roformer-tyny"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "roformer-tyny: config file not found, nor a shipped config" in err


def module_of(folder: Path) -> str:
    return ".".join(folder.relative_to(REPO).parts)


def test_every_configs_folder_is_a_listed_package() -> None:
    tomllib = pytest.importorskip("tomllib")
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"roformer.configs": "configs"}
    folders = {"roformer.configs." + ".".join(p.relative_to(CONFIGS).parts) for p in CONFIGS.rglob("*") if p.is_dir()}
    code = {module_of(p.parent) for p in (REPO / "roformer").rglob("__init__.py")}
    assert set(setuptools["packages"]) == {"roformer", "roformer.configs"} | folders | code


@pytest.mark.skipif(importlib.util.find_spec("build") is None, reason="needs `build` (pip install -e '.[dev]')")
def test_the_wheel_works_outside_the_repository() -> None:
    # build, install into a virtualenv, then from an empty directory: --help of every command, roformer configs,
    # shipped configs resolving inside the package, and a short tiny pretraining by config name
    done = subprocess.run(
        ["bash", "scripts/checks/check_wheel.sh", "--reuse"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "wheel check passed" in done.stdout and "/venv/lib/" in done.stdout  # the wheel's copy was imported


def declared_requirements(extras: tuple[str, ...]) -> dict[str, SpecifierSet]:
    """{normalised name: specifier} of pyproject.toml's core dependencies and the given extras."""
    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + [r for extra in extras for r in project["optional-dependencies"][extra]]
    return {normalised(Requirement(r).name): Requirement(r).specifier for r in declared}


def normalised(name: str) -> str:
    return name.lower().replace("_", "-")


def read_pins(path: Path) -> dict[str, str]:
    """{normalised name: version} of a file of `name==version` lines (comments and blank lines skipped)."""
    from packaging.requirements import Requirement

    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            pin = Requirement(line)
            assert str(pin.specifier).startswith("==") and len(pin.specifier) == 1, f"{path.name}: {line}"
            assert normalised(pin.name) not in pins, f"{path.name}: {pin.name} pinned twice"
            pins[normalised(pin.name)] = str(pin.specifier).removeprefix("==")
    return pins


def test_the_declared_ranges_admit_the_gpu_machines_versions() -> None:
    """The GPU machine of the device tool (issue 25) runs the suite with scripts/gpu/gpu_machine_pins.txt."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = declared_requirements(("onnx",))
    pins = read_pins(REPO / "scripts/gpu/gpu_machine_pins.txt")
    assert {"torch", "transformers", "accelerate", "tokenizers"} <= set(pins)
    for name, version in pins.items():
        assert version in requirements.get(name, SpecifierSet()), f"{name} {version} is outside {requirements[name]}"
    assert "3.12" in SpecifierSet(project["requires-python"]) and "3.11" in SpecifierSet(project["requires-python"])
    # scripts/checks/check_lower_bounds.sh pins them
    assert all(str(spec).startswith(">=") for spec in requirements.values())


def test_the_constraints_file_pins_every_dependency_inside_its_range() -> None:
    """constraints.txt (scripts/checks/refresh_constraints.sh) pins every declared dependency at a version pyproject
    allows."""
    requirements = declared_requirements(("dev", "chinese", "onnx"))
    pins = read_pins(REPO / "constraints.txt")
    assert not set(requirements) - set(pins), f"not pinned: {sorted(set(requirements) - set(pins))}"
    for name, specifier in requirements.items():
        assert pins[name] in specifier, f"constraints.txt: {name}=={pins[name]} is outside {specifier}"
    assert pins["torch"] == "2.13.0"  # the CPU wheel the README installs first; a local label would refuse a CUDA build
    assert "roformer-pytorch" not in pins


def test_published_numbers_name_the_constraints_file() -> None:
    """The reproduction command of docs/install.md installs the pinned versions; the results pages point to it."""
    install = (REPO / "docs/install.md").read_text()
    assert 'pip install torch==2.13.0 && pip install -c constraints.txt -e ".[dev]"' in install
    for page in ("README.md", "docs/experiments.md", "docs/baselines.md", "docs/speed.md", "docs/fine-tuning.md"):
        assert "install.md#exact-versions" in (REPO / page).read_text(), page


def test_the_package_index_page_is_the_readme_without_relative_links() -> None:
    """PyPI shows PACKAGE.md alone: made from README.md by scripts/tools/package_description.py, no link it cannot
    follow."""
    script = [sys.executable, "scripts/tools/package_description.py", "--check"]
    done = subprocess.run(script, cwd=REPO, capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    text = (REPO / "PACKAGE.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    assert targets and all(re.match(r"https?://", t) for t in targets), targets
    assert "`docs/install.md`" in text and "pip install torch==2.13.0" in text


def test_the_license_ships() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
