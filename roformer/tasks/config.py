"""The `data:` section of fine-tuning: `FinetuneDataConfig`, and the task types' settings (`data.tagging`, ...).

Values only, checked on construction; what reads them is the task types' modules (roformer.tasks). The loader and the
resume policy read what their field metadata says (roformer.config: PATH, MAY_CHANGE_ON_RESUME). `Vocabulary` is what a
model trained from scratch takes of its task's tokenizer (a type's `TaskSpec.scratch_model` builds its config from the
`model:` section and it), here so that a config is checked without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, is_dataclass
from typing import Any, Literal

from roformer.config import PATH, check_types, from_dict
from roformer.errors import ConfigError
from roformer.model.config import POOLINGS
from roformer.tasks import registry  # the types' modules are imported when a config first asks for them
from roformer.tasks.glue_tasks import get_task

Pooling = Literal[POOLINGS]  # how a text's vector is read: roformer.model.config.POOLINGS, one list
SECTIONS = "sections"  # the field holding the task types' settings sections (roformer.config reads its metadata)


@dataclass
class FinetuneDataConfig:
    """Where the task's examples come from, what kind of task it is and how its examples become model inputs.

    Attributes:
        type: The kind of task, one of the declared task types (roformer.tasks.registry; `roformer finetune --help`
            lists them): `glue`, `classification`, `regression`, `multi_label_classification`,
            `token_classification`, `question_answering`, `multiple_choice`, `similarity`, `triplet`, ...
        task: `glue`: cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte or wnli. Other types: the task's name in
            results.json and the logs (default: the type).
        source: `glue_dir` (GLUE's official TSV layout), `hub` (datasets) or `files` (local files); null = glue_dir
            for `glue`; other types: files when train_file is set, else hub when hub_name is (a config that names
            a hub dataset takes local files with `--set data.train_file=... --set data.validation_file=...`).
        glue_dir: The GLUE directory (holding CoLA/, SST-2/, ...); relative to the config file.
        hub_name: The hub dataset for `hub` (GLUE: nyu-mll/glue).
        hub_config: Its configuration (GLUE: the task's).
        train_file: `files`: the training file.
        validation_file: `files`: the dev file (labelled; it selects checkpoints and learning rates).
        test_file: `files`: a test file (optional; predicted by every run, scored too when it has labels).
        validation_mismatched_file: `files`, MNLI: the mismatched dev file (optional; `validation_file` is matched).
        test_mismatched_file: `files`, MNLI: the mismatched test file (optional).
        format: `files` of classification, regression and multiple choice: `csv`, `tsv`, `json` (a list of records,
            or JSON lines), `jsonl` or `parquet`; `auto` = from the file's suffix.
        column_names: csv and tsv files without a header line: the names of their columns, in order (Chinese
            STS-B's `sentence1, sentence2, score`); null = the first line is the header.
        text_columns: The text fields: one, or two for a pair (default: GLUE, the hub's names; classification,
            `text` and `text_pair` when present). A field in a nested JSON object is `a.b`; an entry with `{field}`
            in it is a template filled from the record (`"{target.span2_text}是{target.span1_text}"`).
        label_column: The label field (classification: names or ids; regression: numbers; multi-label: a list).
        id_column: The example id field, written with the predictions (null = `id` or `idx` when present, else
            the row number).
        labels: The label set, in id order (null = read from the training data, sorted). A label outside it is an
            error naming the file and line.
        skip_labels: Rows with one of these labels are left out (OCNLI's `-`: no majority label).
        metrics: The dev metrics whose mean (`score`) selects checkpoints, learning rates and seeds, for every
            type: classification and regression from roformer.tasks.glue_metrics.METRICS (null = accuracy; pearson
            and spearman); glue, a subset of the task's own (null = all of them); multi-label, micro_f1, macro_f1 and
            subset_accuracy (null = micro_f1 and macro_f1); similarity, pearson and spearman (null = spearman);
            token classification, f1, precision, recall (entity-level) and accuracy (token) (null = f1 with an
            entity scheme, accuracy with `tagging.scheme: none`); question answering, exact_match and f1 (null =
            both); multiple choice and triplet, accuracy.
        threshold: `multi_label_classification`: a label is predicted when its probability is at least this.
        source_lang: `translation`: the source language's suffix of the parallel files (`en`: PREFIX.en), or its
            key in a hub dataset's `translation` records.
        target_lang: `translation`: the target language's suffix (`de`: PREFIX.de), or its hub key.
        train_prefix: `translation`, files: the training pair, PREFIX.<source_lang> and PREFIX.<target_lang> (or
            their `.gz`), one sentence a line, paired by line number (fairseq's `--trainpref`).
        validation_prefix: `translation`, files: the dev pair (`--validpref`): it selects checkpoints.
        test_prefix: `translation`, files: a test pair (`--testpref`; optional), translated and scored at the end.
        sections: The settings of the task types, each under its own key (`data.tagging:` of
            `token_classification`, `data.qa:`, `data.choices:`, ...: the type's declaration names its section and
            its dataclass), and the folders a type reads (`data.beir_dir` of retrieval); read as `data.tagging`.
            Only the keys of this config's type may be given; its section is filled with its defaults when absent.
        jieba: Segment Chinese text into words with jieba before WordPiece, as the word-level (WoBERT-style)
            tokenizers were pretrained; character offsets stay exact. null = as the init's tokenizer says (a
            word-level vocabulary implies jieba, any other reads the text as it is); false with a word-level
            tokenizer is refused (a contradiction).
        pad_to_multiple_of: Batches are padded to their longest example rounded up to this (8: what tensor cores and
            the fused attention kernels want; fewer distinct shapes for torch.compile). 1 = no rounding.
        group_by_length: Training batches of similar-length examples (windows of 50 global batches sorted by length,
            batch order shuffled): less padding, a little less randomness. Off by default, as in HF.
        max_length: Tokens per example (pair) including specials. Capped at the length the model was pretrained
            at when its directory records it (position rows or angles beyond it were never trained; the learned
            arm's table rows past it are random) and by a learned position table.
        beyond_pretraining_length: Lift the first cap (e.g. to study rotary extrapolation in fine-tuning).
        max_train_examples: Use only the first N training examples (quick runs).
        max_eval_examples: Use only the first N examples of each dev/test split.
    """

    type: str = "glue"
    task: str = ""
    source: Literal["glue_dir", "hub", "files"] | None = None
    glue_dir: str | None = field(default=None, metadata=PATH)
    hub_name: str | None = None
    hub_config: str | None = None
    train_file: str | None = field(default=None, metadata=PATH)
    validation_file: str | None = field(default=None, metadata=PATH)
    test_file: str | None = field(default=None, metadata=PATH)
    validation_mismatched_file: str | None = field(default=None, metadata=PATH)
    test_mismatched_file: str | None = field(default=None, metadata=PATH)
    format: Literal["auto", "csv", "tsv", "json", "jsonl", "parquet"] = "auto"
    column_names: list[str] | None = None
    text_columns: list[str] | None = None
    label_column: str = "label"
    id_column: str | None = None
    labels: list[str] | None = None
    skip_labels: list[str] = field(default_factory=list)
    metrics: list[str] | None = None
    threshold: float = 0.5
    source_lang: str | None = None
    target_lang: str | None = None
    train_prefix: str | None = field(default=None, metadata=PATH)
    validation_prefix: str | None = field(default=None, metadata=PATH)
    test_prefix: str | None = field(default=None, metadata=PATH)
    sections: dict[str, Any] = field(default_factory=dict, repr=False, metadata={SECTIONS: True})
    jieba: bool | None = None
    max_length: int = 512
    pad_to_multiple_of: int = 8
    group_by_length: bool = False
    beyond_pretraining_length: bool = False
    max_train_examples: int | None = None
    max_eval_examples: int | None = None

    def __post_init__(self) -> None:
        check_types(self)
        self.spec = registry.spec_of(self.type)
        if self.source is None:
            self.source = self._default_source()
        if self.type == "glue":
            self._check_glue()
        else:
            self._check_files_or_hub()
        self._check_sections()
        self._check_type_keys()
        if self.pad_to_multiple_of < 1:
            raise ConfigError(f"pad_to_multiple_of must be >= 1, got {self.pad_to_multiple_of}")
        if self.max_length < 8:
            raise ConfigError(f"max_length must be >= 8, got {self.max_length}")
        for name in ("max_train_examples", "max_eval_examples"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1 or null (all), got {getattr(self, name)}")
        if not 0.0 < self.threshold < 1.0:
            raise ConfigError(f"threshold must be in (0, 1), got {self.threshold}")
        if self.labels is not None and len(set(self.labels)) != len(self.labels):
            raise ConfigError(f"labels must be distinct, got {self.labels}")
        if self.metrics is not None:
            self._check_metrics()

    def _check_metrics(self) -> None:
        """data.metrics names metrics the type's evaluation gives, each once, at least one."""
        known = self.spec.known_metrics(self)
        unknown = [m for m in self.metrics if m not in known]
        if unknown or not self.metrics:
            where = f"task {self.task}" if self.type == "glue" else f"type {self.type}"
            raise ConfigError(f"metrics: unknown {unknown or 'empty list'} for {where} (known: {', '.join(known)})")
        if len(set(self.metrics)) < len(self.metrics):
            raise ConfigError(f"metrics: a metric named twice {self.metrics}")

    def _default_source(self) -> str:
        """glue_dir for GLUE; other types: the files when a training file is named, else the hub when a dataset is."""
        if self.type == "glue":
            return "glue_dir"
        return "hub" if self.hub_name and not self.train_file else "files"

    def _check_glue(self) -> None:
        if not self.task:
            raise ConfigError("task is required (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli)")
        task = get_task(self.task)
        if self.hub_name is None:
            self.hub_name = "nyu-mll/glue"
        if self.source == "glue_dir" and not self.glue_dir:
            raise ConfigError("source: glue_dir needs glue_dir")
        if self.source == "files" and not (self.train_file and self.validation_file):
            raise ConfigError("source: files needs train_file and validation_file")
        mismatched = self.validation_mismatched_file or self.test_mismatched_file
        if mismatched and (self.source != "files" or len(task.dev) < 2):
            raise ConfigError("validation_mismatched_file / test_mismatched_file are for MNLI with source: files")

    def _check_files_or_hub(self) -> None:
        if self.source == "glue_dir":
            raise ConfigError(f"source: glue_dir is for type: glue (type {self.type} reads files or the hub)")
        needs_dev = self.spec.needs_validation_file is None or self.spec.needs_validation_file(self)
        if needs_dev and self.source == "files" and not (self.train_file and self.validation_file):
            raise ConfigError(f"type {self.type} with source: files needs train_file and validation_file")
        if self.source == "hub" and not self.hub_name:
            raise ConfigError("source: hub needs hub_name")
        if self.validation_mismatched_file or self.test_mismatched_file:
            raise ConfigError("validation_mismatched_file / test_mismatched_file are for MNLI (type: glue)")
        if not self.task:
            self.task = self.type

    def _check_type_keys(self) -> None:
        """A field that only some types read (their declaration's `data_keys`) is refused for every other type."""
        for spec in registry.specs().values():
            for key in spec.data_keys:
                if getattr(self, key) is not None and key not in self.spec.data_keys:
                    owners = [s.name for s in registry.specs().values() if key in s.data_keys]
                    raise ConfigError(f"{key}: is for type: {' or '.join(owners)} (this task is type: {self.type})")

    def _check_sections(self) -> None:
        """The section of this type is filled with its defaults; another type's section is an error."""
        declared = _declared_sections()
        for section, value in self.sections.items():
            if section not in declared:
                raise ConfigError(f"{section}: unknown section (known: {', '.join(declared)})")
            if value is not None and section != self.spec.section and section not in self.spec.folders:
                owners = [s.name for s in registry.specs().values() if section in (s.section, *s.folders)]
                raise ConfigError(f"{section}: is for type: {' or '.join(owners)} (this task is type: {self.type})")
            if isinstance(value, dict) and is_dataclass(declared[section]):  # a mapping from Python: checked as YAML
                self.sections[section] = from_dict(declared[section], value, prefix=f"{section}.")
        own = self.spec.section
        if own is not None and self.sections.get(own) is None:
            if self.spec.section_required:
                raise ConfigError(f"type: {self.type} needs a {own}: section")
            self.sections[own] = declared[own]()
        if self.spec.check is not None:
            self.spec.check(self)

    @classmethod
    def declared_sections(cls) -> dict[str, type]:
        """The settings sections of every task type ({key under data: -> its dataclass}), for the config loader."""
        return _declared_sections()

    @classmethod
    def declared_names(cls) -> frozenset[str]:
        """The keys of `declared_sections`, known without importing the types (roformer.config.check_keys)."""
        return registry.declared_keys()

    @classmethod
    def declared_section_keys(cls) -> dict[str, frozenset[str]]:
        """{section: its keys} of the types' settings sections, known without importing the types (check_keys)."""
        return registry.declared_section_keys()

    def __getattr__(self, name: str) -> Any:
        """`data.tagging` and the like: a declared section (None unless this config's type has it)."""
        if name.startswith("__") or name in (SECTIONS, "spec"):
            raise AttributeError(name)
        if name in _declared_sections():
            return self.__dict__.get(SECTIONS, {}).get(name)
        raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in (SECTIONS, "spec") and not name.startswith("_") and name not in self.__dataclass_fields__:
            if name in _declared_sections():
                self.sections[name] = value
                return
        object.__setattr__(self, name, value)


_generated_init = FinetuneDataConfig.__init__


def _init_with_sections(self: FinetuneDataConfig, *args: Any, **kwargs: Any) -> None:
    """`FinetuneDataConfig(type="token_classification", tagging=TaggingConfig(...), ...)`: sections by their keys."""
    declared = _declared_sections() if set(kwargs) - set(FinetuneDataConfig.__dataclass_fields__) else {}
    sections = dict(kwargs.pop(SECTIONS, None) or {})
    sections.update({key: kwargs.pop(key) for key in list(kwargs) if key in declared})
    _generated_init(self, *args, sections=sections, **kwargs)


FinetuneDataConfig.__init__ = _init_with_sections  # type: ignore[method-assign]


def _declared_sections() -> dict[str, type]:
    return registry.settings_sections()


@dataclass(frozen=True)
class Vocabulary:
    """What a model trained from scratch takes of its task's tokenizer: its size and special ids.

    Attributes:
        size: Ids of the tokenizer (the model's vocab_size).
        pad_token_id: The padding id.
        bos_token_id: The id a target starts from (a decoder's start token), or None.
        eos_token_id: The id that ends a target, or None.
    """

    size: int
    pad_token_id: int
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    @classmethod
    def of(cls, tokenizer: Any) -> Vocabulary:
        """The vocabulary of a transformers tokenizer."""
        return cls(len(tokenizer), tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id)


# A vocabulary of every special id, for checking a `model:` section before any tokenizer is made
PLACEHOLDER_VOCABULARY = Vocabulary(size=8, pad_token_id=0, bos_token_id=1, eos_token_id=2)
