"""The task types' declarations (roformer.tasks.registry): collected from their modules, and everything derived from
them (the config's types, sections and metric checks, the CLI help, the docs' table) agrees with them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers import REPO

from roformer.config import from_dict
from roformer.config_yaml import read_yaml
from roformer.errors import ConfigError
from roformer.model.model import ARCHITECTURES
from roformer.tasks.config import FinetuneDataConfig
from roformer.tasks.registry import TABLE_END, TABLE_START, settings_sections, spec_of, specs, types_table


def test_every_type_is_declared_once_with_what_the_rest_reads() -> None:
    assert set(specs()) >= {
        "glue",
        "classification",
        "regression",
        "multi_label_classification",
        "token_classification",
        "question_answering",
        "multiple_choice",
        "similarity",
        "triplet",
    }
    for name, spec in specs().items():
        assert spec.name == name and spec.summary and spec.predictions and callable(spec.builder)
        assert spec.architecture in ARCHITECTURES or spec.architecture == "backbone", name
        assert set(spec.default_metrics) <= set(spec.metrics), name
        if spec.section is not None:
            assert dataclasses.is_dataclass(spec.settings), name
            if not spec.section_required:
                spec.settings()  # defaults make a section
    folders = {key: str for s in specs().values() for key in s.folders}  # data: keys naming a folder: paths
    assert settings_sections() == {**{s.section: s.settings for s in specs().values() if s.section}, **folders}


def test_every_type_has_a_shipped_config() -> None:
    shipped = {
        (read_yaml(path).get("data") or {}).get("type", "glue")
        for folder in ("finetune", "glue", "synthetic", "translation")
        for path in (REPO / "configs" / folder).glob("*.yaml")
        if "tasks:" not in path.read_text()
    }
    assert set(specs()) - shipped == set()


def test_the_docs_table_of_types_is_the_registry_s() -> None:
    text = (REPO / "docs" / "fine-tuning.md").read_text()
    shown = text[text.index(TABLE_START) : text.index(TABLE_END) + len(TABLE_END)]
    assert shown == types_table(), "docs/fine-tuning.md: paste roformer.tasks.registry.types_table() in its place"


def test_an_unknown_type_lists_the_declared_ones() -> None:
    with pytest.raises(ConfigError, match=r"type: unknown 'ner' \(known: .*token_classification"):
        FinetuneDataConfig(type="ner", train_file="a", validation_file="b")
    with pytest.raises(ConfigError, match=r"x.yaml: unknown key 'retrievl'"):
        from_dict(FinetuneDataConfig, {"type": "classification", "retrievl": {}}, source="x.yaml")


def test_a_section_reads_as_an_attribute_and_writes_under_its_key(tmp_path: Path) -> None:
    data = from_dict(
        FinetuneDataConfig,
        {"type": "token_classification", "train_file": "a", "validation_file": "b", "tagging": {"scheme": "none"}},
    )
    assert data.tagging.scheme == "none" and data.qa is None and data.spec is spec_of("token_classification")
    data.tagging = dataclasses.replace(data.tagging, label_all_tokens=True)
    assert data.sections["tagging"].label_all_tokens
    default = FinetuneDataConfig(type="question_answering", train_file="a", validation_file="b")
    assert default.qa == spec_of("question_answering").settings()  # the type's section, its defaults
    with pytest.raises(ConfigError, match="tagging: is for type: token_classification"):
        FinetuneDataConfig(type="question_answering", train_file="a", validation_file="b", tagging={})


def test_the_command_line_help_lists_every_type(capsys: pytest.CaptureFixture) -> None:
    from roformer.cli import main

    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name, spec in specs().items():
        assert f"{name}{f' (data.{spec.section})' if spec.section else ''}: " in text
