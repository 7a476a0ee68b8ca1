"""A task type's capabilities: declared in its TaskSpec, implemented by its class, checked against each other once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from helpers import tiny_config

from roformer.tasks.base import (
    CAPABILITIES,
    NO_FACTS,
    ChecksModel,
    HeadOutputs,
    ModelFacts,
    Publishes,
    TaskSpec,
    TokenBatches,
    check_capabilities,
    learn_model,
)
from roformer.tasks.registry import specs


def task_class(spec: TaskSpec) -> type:
    """The class a declaration builds: its `from_config`'s, or the one a builder closes over (`TextTask.reading`)."""
    owner = getattr(spec.builder, "__self__", None)
    if owner is None:
        owner = next(c.cell_contents for c in spec.builder.__closure__ if isinstance(c.cell_contents, type))
    return owner


def spec(**declared) -> TaskSpec:
    fields = dict(architecture="masked_lm", metrics=(), default_metrics=(), predictions="dev.txt", docs="x.md")
    return TaskSpec(name="fake", summary="a fake type", builder=lambda data: None, **fields, **declared)


@pytest.mark.parametrize("name", sorted(specs()))
def test_every_shipped_type_declares_exactly_what_its_class_implements(name: str) -> None:
    check_capabilities(specs()[name], task_class(specs()[name]))


def test_the_capabilities_the_issue_names_are_where_they_belong() -> None:
    declared = {name: {c.__name__ for c in s.capabilities} for name, s in specs().items()}
    assert declared["translation"] == {"TokenBatches", "Publishes", "ChecksModel", "ReportsResults"}
    assert declared["triplet"] == {"CrossValidates"} and declared["synthetic"] == {"ChecksModel", "ScoresVariants"}
    assert {name for name, s in specs().items() if s.own_vocabulary} == {"synthetic", "translation"}
    assert {name for name, c in declared.items() if "Publishes" in c} == {
        "classification", "glue", "multi_label_classification", "regression", "retrieval", "similarity",
        "token_classification", "translation",
    }  # fmt: skip


class Batches(HeadOutputs):
    def token_batches(self, split, cap):  # noqa: ANN001, ANN201
        return [[0]]


class Files(HeadOutputs):
    def model_files(self, eval_batch_size):  # noqa: ANN001, ANN201
        return {"x.json": "{}"}


def test_a_declared_capability_without_its_members_is_a_programming_error_naming_them() -> None:
    with pytest.raises(RuntimeError, match="'fake' declares TokenBatches but has no loss_weight, padded_tokens"):
        check_capabilities(spec(capabilities=(TokenBatches,)), Batches)
    with pytest.raises(RuntimeError, match="'fake' declares Publishes but has no model_files"):
        check_capabilities(spec(capabilities=(Publishes,)), HeadOutputs)


def test_a_member_of_an_undeclared_capability_is_refused_as_it_would_never_be_asked_for() -> None:
    with pytest.raises(RuntimeError, match="'fake' has model_files but does not declare Publishes in its TaskSpec"):
        check_capabilities(spec(), Files)
    with pytest.raises(RuntimeError, match="'fake' has token_batches but does not declare TokenBatches"):
        check_capabilities(spec(), Batches)
    check_capabilities(spec(capabilities=(Publishes,)), Files)
    assert set(CAPABILITIES) >= {TokenBatches, Publishes, ChecksModel}


class Checked:
    def __init__(self, declared: bool, facts: ModelFacts) -> None:
        self.spec, self.facts, self.asked = spec(capabilities=(ChecksModel,) if declared else ()), facts, 0

    def check_model(self, config: object) -> ModelFacts:
        self.asked += 1
        return self.facts


def test_the_engine_asks_a_model_check_of_the_types_that_declare_one_and_logs_its_warnings_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    undeclared = Checked(False, ModelFacts(eos_id=3))
    assert learn_model(undeclared, tiny_config()) is NO_FACTS and undeclared.asked == 0
    declared = Checked(True, ModelFacts(eos_id=3, warnings=("mind the padding",)))
    with caplog.at_level(logging.WARNING):
        assert learn_model(declared, tiny_config()) == ModelFacts(eos_id=3, warnings=("mind the padding",))
    assert declared.asked == 1 and [r.getMessage() for r in caplog.records] == ["mind the padding"]


def test_multiple_choice_says_what_an_mlp_head_means_instead_of_logging_it_itself(tmp_path: Path) -> None:
    from test_choices import make_task, swag_row

    task = make_task(tmp_path, [swag_row("w1", "w2", ["w3", "w4", "w5"], 0)])
    assert task.check_model(tiny_config(classifier_head="pooler")) is NO_FACTS
    (warning,) = task.check_model(tiny_config(classifier_head="mlp")).warnings
    assert "classifier_head: mlp scores each candidate at the last position" in warning
