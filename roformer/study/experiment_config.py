"""An experiment config, of either kind: a pretraining experiment or a task study, told apart by its `tasks:` key.

`roformer experiment --config FILE` reads one of two configs, `load_experiment_config` choosing by the file's keys:

- without `tasks:`, a `PretrainExperimentConfig`: every arm is a pretraining config, and the stages after
  pretraining (`glue:`, `length:`, `probes:`), the further `comparisons:` and the loss `targets:` are its own
  (run by roformer.study.experiment);
- with `tasks:`, a `TaskStudyConfig`: fine-tuning configs that train from scratch, every arm overrides alone over each
  of them, and the dev accuracy `target:` (run by roformer.study.task_study).

What both hold (arms, seeds, shared overrides, the baseline, `vary`) is their base's, `ExperimentConfig`. A key of
the other kind is an unknown key, refused in one line that names it and the file (`glue:` in a task study, `target:`
in a pretraining experiment). This module holds the configs alone: the experiment and the task study both read them,
and the experiment runs the task study, so their modules import one another in one direction only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roformer.config import check_seed, check_types, load
from roformer.config_yaml import read_mapping
from roformer.errors import ConfigError
from roformer.model.config import ModelConfig
from roformer.study.length_eval import LengthEvalSettings
from roformer.study.probes import ProbeSettings

TASKS_KEY = "tasks"  # its presence at the top of an experiment file makes the file a task study


@dataclass
class ArmSpec:
    """How to make an arm's runs: a pretraining config plus overrides of its own (e.g. `model.position_encoding=none`).

    The `{config: ..., set: [...]}` form of an entry of `arms:` (a plain string is the config alone). The runs it
    makes, read back for a comparison, are a roformer.study.runs.Arm.

    Attributes:
        config: The arm's config (a task study's arms have none: their task's).
        set: Overrides of this arm.
        seeds: In a task study, the experiment's seeds this arm runs (null: all of them): three seeds for the arms
            that decide a comparison, one for the rest. A seed compared is one both arms ran.
    """

    config: str = ""
    set: list[str] = field(default_factory=list)
    seeds: list[int] | None = None


@dataclass
class GlueStage:
    """Fine-tune every final model on the tasks of a `roformer glue` suite (tasks, their lr grid and seeds).

    Attributes:
        suite: A suite YAML (relative to the experiment file), e.g. ../glue/small-cpu.yaml.
        glue_dir: The GLUE data folder (relative to the experiment file), set as every task's `data.glue_dir`.
        overrides: `--set` style overrides of every task (e.g. `data.max_length=128`, `train.seeds=[0,1,2]`).
    """

    suite: str = ""
    glue_dir: str | None = None
    overrides: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.suite:
            raise ConfigError("glue.suite is required (a roformer glue suite YAML)")


@dataclass
class LengthStage:
    """Evaluate every final model at several block lengths (roformer eval-mlm).

    Attributes:
        seq_lens: Block lengths.
        max_tokens: Tokens scored at every length.
        batch_size: Blocks per forward.
    """

    seq_lens: list[int] = field(default_factory=list)
    max_tokens: int = 65536
    batch_size: int = 8

    def __post_init__(self) -> None:
        self.settings()  # checked where the command checks it

    def settings(self) -> LengthEvalSettings:
        """What eval-mlm measures for every final model."""
        return LengthEvalSettings(tuple(self.seq_lens), self.max_tokens, self.batch_size)


@dataclass
class ProbeStage:
    """Probe every final model (roformer probe) at several lengths, under several scalings.

    Attributes:
        probes: `passkey`, `needle`, `passkey-mlm` (roformer.study.probes).
        lengths: Input lengths.
        samples: Queries (or masked keys) per length.
        scalings: Context scalings of rotary models (`none`, `linear`, `ntk`, `yarn`, `self_extend`); the other
            encodings are probed as they are (`none`) only.
        haystack: A folder of text the filler is cut from (relative to the experiment file); null = built-in.
        distances: passkey-mlm's key-to-copy distances; empty = its defaults per length.
    """

    probes: list[str] = field(default_factory=lambda: ["passkey"])
    lengths: list[int] = field(default_factory=lambda: [128, 256, 512, 1024])
    samples: int = 50
    scalings: list[str] = field(default_factory=lambda: ["none"])
    haystack: str | None = None
    distances: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.probes or not self.scalings:
            raise ConfigError(f"probes: name probes and scalings, got {self.probes} and {self.scalings}")
        for probe in self.probes:  # each file's settings, checked where the command checks them
            for scaling in self.scalings:
                self.settings(probe, scaling, haystack=None)

    def settings(self, probe: str, scaling: str, haystack: str | None) -> ProbeSettings:
        """The settings of one probe file: `probe` under `scaling`, the filler cut from `haystack` (resolved)."""
        distances = self.distances or None
        return ProbeSettings(probe, self.lengths, self.samples, scaling, distances, haystack)


# The data fields that make a tokenizer: arms may differ in these alone when `vary` names them.
TOKENIZATION_FIELDS = ("jieba", "vocab_size", "tokenizer", "lowercase", "tokenizer_documents")
# A pretraining recipe's fields (the mask and the stages, roformer.train.config.Stage): arms may differ in these when
# `vary` names them. The evaluation mask stays the same, so their eval losses compare.
RECIPE_FIELDS = ("data.mask_rate", "data.mask_split", "data.whole_word_mask", "data.packing", "stages")


@dataclass
class Comparison:
    """A comparison of some arms against a baseline of their own, besides the experiment's (`<out>/compare-<name>/`).

    For a grid of recipes x position encodings: each encoding's recipes against its own constant-15% arm.

    Attributes:
        arms: The arms compared (the baseline among them).
        baseline: Their baseline.
    """

    arms: list[str] = field(default_factory=list)
    baseline: str = ""

    def __post_init__(self) -> None:
        if len(self.arms) < 2 or self.baseline not in self.arms:
            raise ConfigError(f"a comparison needs two arms or more and its baseline among them, got {self.arms}")


@dataclass
class ExperimentConfig:
    """What every experiment config holds: arms (label -> how to make its runs), seeds, shared overrides, a baseline.

    The base of the two kinds, never a config of its own: `PretrainExperimentConfig` (no `tasks:`) and
    `TaskStudyConfig` (`tasks:`), one of which `load_experiment_config` reads.

    Attributes:
        arms: {label: how to make the arm's runs (ArmSpec)}; the label names the arm and its runs' folders.
        seeds: One run per arm and seed.
        overrides: `--set` style overrides applied to every arm (e.g. `train.max_steps=300`).
        baseline: The arm the others are compared with (each kind says its default).
        vary: Fields besides the position-encoding ones that the arms may set differently: the fields under
            comparison. Model fields by name (e.g. [attention] for softmax vs linear), and the tokenization fields
            of the data section as `data.<field>` (TOKENIZATION_FIELDS, e.g. [data.jieba] for word- against
            character-level Chinese: such arms read other tokens, so `roformer compare` sets their MLM losses apart
            and compares them downstream). Anything else that differs is refused.
            A pretraining recipe's fields (RECIPE_FIELDS: `data.mask_rate`, `data.mask_split`, `stages`) may be named
            too: arms that train under other masks or stages, evaluated under the same fixed mask.
    """

    arms: dict[str, str | ArmSpec] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=lambda: [0])
    overrides: list[str] = field(default_factory=list)
    baseline: str | None = None
    vary: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if type(self) is ExperimentConfig:
            raise TypeError("ExperimentConfig is the base of the two kinds (PretrainExperimentConfig, TaskStudyConfig)")
        check_types(self)
        self.arms = {
            label: arm if isinstance(arm, ArmSpec) else ArmSpec(config=arm) for label, arm in self.arms.items()
        }
        for label in self.arms:  # a label names its runs' folders: `<out>/<label>-seed<k>`, `<out>/<task>/<label>-...`
            check_folder_name(f"arms: {label!r}", label)
        self._check_kind()
        tokenization = {f"data.{name}" for name in TOKENIZATION_FIELDS}
        known = set(ModelConfig.__dataclass_fields__) | tokenization | set(RECIPE_FIELDS)
        unknown = [name for name in self.vary if name not in known]
        if unknown:
            raise ConfigError(
                f"vary: {unknown[0]!r} is neither a model field nor a tokenization field "
                f"({', '.join(sorted(tokenization))}) nor a recipe field ({', '.join(RECIPE_FIELDS)})"
            )
        self._check_references()
        if len(self.arms) < 2:
            raise ConfigError("arms: an experiment compares at least two arms")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"seeds must be a non-empty list of distinct seeds, got {self.seeds}")
        for seed in self.seeds:
            check_seed("seeds", seed)
        if self.baseline is not None and self.baseline not in self.arms:
            raise ConfigError(f"baseline {self.baseline!r} is not one of the arms {list(self.arms)}")
        for label, arm in self.arms.items():
            self._check_arm_seeds(label, arm)

    def _check_kind(self) -> None:
        """The checks of this kind of experiment, before `vary`'s: its arms' form and its own fields."""

    def _check_references(self) -> None:
        """The arms this kind's own fields name are the experiment's (checked before the arms are counted)."""

    def _check_arm_seeds(self, label: str, arm: ArmSpec) -> None:
        """An arm's own seeds (`arms.<label>.seeds`), if this kind has them."""


@dataclass
class PretrainExperimentConfig(ExperimentConfig):
    """Arms that are pretraining configs (relative to this file), seeds, the stages after pretraining, the targets.

    An experiment config without `tasks:` (roformer.study.experiment runs it).

    Attributes:
        arms: {label: pretraining YAML, or {config: YAML, set: [overrides of this arm]}}; every arm runs every seed.
        baseline: The baseline arm for steps-to-target ratios (default: the first non-rotary arm).
        targets: Target eval losses (default: the baseline's final eval loss and a few levels above).
        glue: Optional GLUE stage (GlueStage).
        length: Optional length-evaluation stage (LengthStage).
        probes: Optional probe stage (ProbeStage): `<run>/probes/*.json`, tabulated and drawn by the comparison.
        comparisons: Further comparisons of some arms against a baseline of their own ({name: Comparison}), each
            into `<out>/compare-<name>/` and a section of the report.
    """

    targets: list[float] | None = None
    glue: GlueStage | None = None
    length: LengthStage | None = None
    probes: ProbeStage | None = None
    comparisons: dict[str, Comparison] = field(default_factory=dict)

    def _check_kind(self) -> None:
        missing = [label for label, arm in self.arms.items() if not arm.config]
        if missing:
            raise ConfigError(f"arms.{missing[0]}: needs config: (a pretraining YAML)")

    def _check_references(self) -> None:
        for name, comparison in self.comparisons.items():
            strangers = [arm for arm in comparison.arms if arm not in self.arms]
            if strangers:
                raise ConfigError(f"comparisons.{name}: {strangers[0]!r} is not one of the arms {list(self.arms)}")

    def _check_arm_seeds(self, label: str, arm: ArmSpec) -> None:
        if arm.seeds is not None:
            raise ConfigError(
                f"arms.{label}.seeds: an arm's own seeds are a task study's (tasks:); here every arm runs every seed"
            )


@dataclass
class TaskStudyConfig(ExperimentConfig):
    """Fine-tuning configs that train from scratch, arms that are overrides of each of them, the target accuracy.

    An experiment config with `tasks:` (roformer.study.task_study runs it): the experiment trains each task under
    every arm and compares accuracy by test length.

    Attributes:
        arms: {label: {set: [overrides of every task], seeds: [the experiment's seeds this arm runs]}}.
        baseline: The arm every other is compared with, paired on the same rows (default: the first arm).
        tasks: The fine-tuning configs (configs/synthetic/*.yaml, relative to this file or shipped names), each
            trained under every arm (an empty list is refused).
        target: The dev accuracy whose first step is reported (steps to target), e.g. 0.9.
    """

    tasks: list[str] = field(default_factory=list)
    target: float = 0.9

    def _check_kind(self) -> None:
        if not self.tasks:
            raise ConfigError(
                "tasks: is empty: list the task configs a task study trains (e.g. configs/synthetic/*.yaml), or leave "
                "tasks: out for arms that are pretraining configs"
            )
        given = [label for label, arm in self.arms.items() if arm.config]
        if given:
            raise ConfigError(f"arms.{given[0]}: with tasks:, an arm is {{set: [...]}} over every task, not a config")
        if len(set(self.tasks)) != len(self.tasks):
            raise ConfigError(f"tasks: a config named twice {self.tasks}")
        if not 0.0 < self.target <= 1.0:
            raise ConfigError(f"target must be a dev accuracy in (0, 1], got {self.target}")

    def _check_arm_seeds(self, label: str, arm: ArmSpec) -> None:
        """An arm's own seeds: some of the experiment's (null: all of them)."""
        if arm.seeds is None:
            return
        strangers = [seed for seed in arm.seeds if seed not in self.seeds]
        if not arm.seeds or strangers or len(set(arm.seeds)) != len(arm.seeds):
            raise ConfigError(
                f"arms.{label}.seeds must be distinct seeds of the experiment's {self.seeds}, got {arm.seeds}"
            )

    def arm_runs_seed(self, label: str, seed: int) -> bool:
        """Whether arm `label` has a run of `seed` (its own seeds, or the experiment's)."""
        seeds = self.arms[label].seeds
        return seeds is None or seed in seeds


def check_folder_name(key: str, name: str) -> None:
    """A name that becomes a folder must stay one: letters, digits, '-', '_' or '.' (no '/', so no '../').

    The rule of a pretraining stage's name (roformer.train.config.Stage), said of `key`.

    Raises:
        ConfigError: naming `key` and the name.
    """
    if not name or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
        raise ConfigError(f"{key}: a name must be letters, digits, '-', '_' or '.' (a folder name), got {name!r}")


def experiment_config_class(data: Mapping[str, Any]) -> type[PretrainExperimentConfig] | type[TaskStudyConfig]:
    """The kind of experiment a file's top-level mapping is: a task study if it has `tasks:`, else pretraining."""
    return TaskStudyConfig if TASKS_KEY in data else PretrainExperimentConfig


def load_experiment_config(path: str | Path) -> PretrainExperimentConfig | TaskStudyConfig:
    """Read experiment file `path` into the config of its kind (`experiment_config_class` of its keys).

    Raises:
        ConfigError: naming the file and the key: a file that does not read, a key of neither kind or of the other
            kind (`glue:` in a task study, `target:` in a pretraining experiment), a bad value.
    """
    path = Path(path)
    return load(experiment_config_class(read_mapping(path)), path)
