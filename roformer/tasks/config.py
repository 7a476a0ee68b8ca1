"""The `data:` section of fine-tuning: `FinetuneDataConfig`, and the task types' settings (`data.tagging`, ...).

Values only, checked on construction; what reads them is the task types' modules (roformer.tasks). The loader and the
resume policy read what their field metadata says (roformer.config: PATH, MAY_CHANGE_ON_RESUME).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from roformer.config import PATH, check_types
from roformer.errors import ConfigError
from roformer.tasks.glue_tasks import get_task

TaskType = Literal[
    "glue",
    "classification",
    "regression",
    "multi_label_classification",
    "token_classification",
    "question_answering",
    "multiple_choice",
    "similarity",
    "triplet",
]
TASK_TYPES = get_args(TaskType)
Pooling = Literal["cls", "mean", "pooler", "last"]  # roformer.model.config.POOLINGS (tested equal)


@dataclass
class TaggingConfig:
    """`data.tagging:` of `type: token_classification` (NER, POS).

    Attributes:
        format: `conll` (whitespace-separated columns, one token per line, blank lines between sentences,
            `-DOCSTART-` lines skipped) or `jsonl` (one sentence per line: a list of tokens and a list of tags);
            `auto` = `jsonl` for .json/.jsonl files, `conll` otherwise.
        tag_column: `conll`: the column holding the tag (0-based; -1 = the last).
        tokens_column: `jsonl` and hub datasets: the field holding the tokens.
        tags_column: `jsonl` and hub datasets: the field holding the tags (names, or ids into `labels`).
        scheme: How the tags mark entities: `IOB1`, `IOB2` or `IOBES` (conlleval and seqeval's definitions; the
            entity-level F1 selects), `none` (plain tags, one per word with no entities: POS tags, or IO tags such as
            `PER`; token accuracy selects and is reported per tag), or `auto`: an entity scheme when a tag other than
            `O` has a `B-`, `I-`, `E-` or `S-` prefix, else `none`.
        label_all_tokens: Train on every WordPiece piece of a word (its word's tag; `B-` becomes `I-` after the
            first piece) instead of the first piece only. Predictions always read the first piece.
    """

    format: Literal["auto", "conll", "jsonl"] = "auto"
    tag_column: int = -1
    tokens_column: str = "tokens"
    tags_column: str = "tags"
    scheme: Literal["auto", "IOB1", "IOB2", "IOBES", "none"] = "auto"
    label_all_tokens: bool = False

    def __post_init__(self) -> None:
        check_types(self)


@dataclass
class QAConfig:
    """`data.qa:` of `type: question_answering` (extractive, SQuAD-format JSON).

    Attributes:
        version_2: SQuAD v2.0: questions may have no answer (`is_impossible`); the model may predict "" (the [CLS]
            position) when its score beats the best span's by `null_threshold`.
        doc_stride: Tokens of overlap between consecutive windows of a context longer than max_length.
        max_query_length: The question is cut to this many tokens.
        max_answer_length: The longest answer span (in tokens) n-best decoding considers.
        n_best: Start and end candidates per window in n-best decoding.
        null_threshold: v2.0: predict no answer when null score - best span score > this.
        metric: `squad` (the official SQuAD v1.1/v2.0 EM and F1) or `cmrc2018` (CMRC 2018's official metric:
            character-level for Chinese).
    """

    version_2: bool = False
    doc_stride: int = 128
    max_query_length: int = 64
    max_answer_length: int = 30
    n_best: int = 20
    null_threshold: float = 0.0
    metric: Literal["squad", "cmrc2018"] = "squad"

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("doc_stride", "max_query_length", "max_answer_length", "n_best"):
            if getattr(self, name) < 1:
                raise ConfigError(f"qa.{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class ChoicesConfig:
    """`data.choices:` of `type: multiple_choice`: a context (and question) with K candidate answers.

    Attributes:
        context_column: The field with the context (SWAG `sent1`; CHID `content`).
        question_column: A field joined to each candidate as its text (SWAG `sent2`, the start of the ending);
            null = the candidate alone.
        choices_column: A field holding the list of candidates (CHID `candidates`); or
        choice_columns: one field per candidate (SWAG `ending0`..`ending3`).
        blank: A placeholder in the context that each candidate fills (CHID `#idiom#`): the model reads the filled
            context alone instead of the pair (context, candidate).
    """

    context_column: str = "context"
    question_column: str | None = None
    choices_column: str | None = None
    choice_columns: list[str] = field(default_factory=list)
    blank: str | None = None

    def __post_init__(self) -> None:
        check_types(self)
        if bool(self.choices_column) == bool(self.choice_columns):
            raise ConfigError("choices: name either choices_column (a list field) or choice_columns (one per choice)")
        if self.blank and self.question_column:
            raise ConfigError("choices: blank and question_column do not go together (a filled context is read alone)")


@dataclass
class SimilarityConfig:
    """`data.similarity:` of `type: similarity`: a bi-encoder whose cosine of two texts' vectors scores them.

    Attributes:
        loss: `cosent` (pairs with scores: Su 2022's CoSENT, as text2vec trains: every pair of pairs in a batch
            whose gold scores are ordered should have their cosines ordered the same way, log(1 + sum exp(scale x
            (cos_lower - cos_higher)))); `in_batch_negatives` (pairs without scores, each text's partner against the
            other texts of the batch: InfoNCE with temperature 1 / scale, as SimCSE and sentence-transformers'
            MultipleNegativesRankingLoss).
        pooling: How a text's vector is read from the backbone (roformer.model.model.pool_states).
        scale: The cosines' multiplier in the loss (CoSENT's lambda, 20; 1 / InfoNCE's temperature, 20 = 0.05).
        negative_column: `in_batch_negatives`: a field of the training rows holding a hard negative of each pair (a
            triplet: anchor, positive, negative), scored against each anchor beside the batch's positives; null =
            pairs only.
    """

    loss: Literal["cosent", "in_batch_negatives"] = "cosent"
    pooling: Pooling = "mean"
    scale: float = 20.0
    negative_column: str | None = None

    def __post_init__(self) -> None:
        check_types(self)
        if self.scale <= 0:  # check_types refuses NaN and infinities
            raise ConfigError(f"similarity.scale must be > 0, got {self.scale}")
        if self.negative_column and self.loss != "in_batch_negatives":
            raise ConfigError("similarity.negative_column is for loss: in_batch_negatives (CoSENT reads scored pairs)")


@dataclass
class TripletConfig:
    """`data.triplet:` of `type: triplet`: which of two candidates is closer to an anchor text (CAIL2019-SCM).

    Each row holds an anchor (the first of `text_columns`) and two candidates (the other two); the label names the
    closer candidate's column. The model scores each (anchor, candidate) pair as a text pair (one logit, trained with
    binary cross-entropy: the closer pair 1, the other 0); a row is right when its closer pair scores higher. This is
    the RoFormer authors' CAIL2019-SCM recipe (`finetune_scm.py`).

    Attributes:
        unlabelled_closer: The candidate column that is closer in a row without a label (CAIL2019-SCM's released
            training files carry none: its rules guarantee sim(A, B) > sim(A, C)); null = such a row is unlabelled
            (a test row, predicted only).
        mirror: Also train on every pair with its two texts swapped (candidate first, anchor second), as CAIL2019
            competitors augmented; the evaluation reads the pairs as given.
        folds: k-fold cross-validation of `train_file` instead of a `validation_file`: rows are grouped by anchor
            text (an anchor's rows stay in one fold; a candidate document may recur in others), the groups dealt into
            `folds` folds in a fixed shuffled order, and the run of seed s holds out fold s mod folds as its dev
            split: `train.seeds: [0, 1, 2, 3, 4]` with `folds: 5` is 5-fold cross-validation, its mean and interval
            over the folds.
    """

    unlabelled_closer: str | None = None
    mirror: bool = False
    folds: int | None = None

    def __post_init__(self) -> None:
        check_types(self)
        if self.folds is not None and self.folds < 2:
            raise ConfigError(f"triplet.folds must be >= 2 or null (a validation_file), got {self.folds}")


MULTI_LABEL_METRICS = ("micro_f1", "macro_f1", "subset_accuracy")
# What data.metrics may name per type (the metrics its evaluation gives): their mean, `score`, selects checkpoints,
# learning rates and seeds. GLUE's are the task's own (roformer.tasks.glue_tasks), classification's and regression's
# roformer.tasks.glue_metrics.METRICS.
TYPE_METRICS = {
    "multi_label_classification": MULTI_LABEL_METRICS,
    "similarity": ("pearson", "spearman"),
    "token_classification": ("f1", "precision", "recall", "accuracy"),  # entity-level, and token accuracy
    "question_answering": ("exact_match", "f1"),
    "multiple_choice": ("accuracy",),
    "triplet": ("accuracy",),
}
TYPE_SECTIONS = {
    "token_classification": "tagging",
    "question_answering": "qa",
    "multiple_choice": "choices",
    "similarity": "similarity",
    "triplet": "triplet",
}


@dataclass
class FinetuneDataConfig:
    """Where the task's examples come from, what kind of task it is and how its examples become model inputs.

    Attributes:
        type: The kind of task: `glue` (a GLUE task by name), `classification` or `regression` of one text or a
            pair, `multi_label_classification` (a list of labels per text; sigmoid outputs), `token_classification`
            (a tag per word: NER, POS), `question_answering` (extractive, SQuAD format), `multiple_choice`,
            `similarity` (a bi-encoder of text pairs: sentence embeddings) or `triplet` (which of two candidates is
            closer to an anchor: CAIL2019-SCM).
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
        tagging: `token_classification`'s own settings (TaggingConfig).
        qa: `question_answering`'s own settings (QAConfig).
        choices: `multiple_choice`'s own settings (ChoicesConfig).
        similarity: `similarity`'s own settings (SimilarityConfig): sentence pairs, a bi-encoder, Spearman of cosines.
        triplet: `triplet`'s own settings (TripletConfig): unlabelled rows, mirrored pairs, cross-validation folds.
        jieba: Segment Chinese text into words with jieba before WordPiece, as the word-level (WoBERT-style)
            tokenizers were pretrained; character offsets stay exact.
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

    type: TaskType = "glue"
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
    tagging: TaggingConfig | None = None
    qa: QAConfig | None = None
    choices: ChoicesConfig | None = None
    similarity: SimilarityConfig | None = None
    triplet: TripletConfig | None = None
    jieba: bool = False
    max_length: int = 512
    pad_to_multiple_of: int = 8
    group_by_length: bool = False
    beyond_pretraining_length: bool = False
    max_train_examples: int | None = None
    max_eval_examples: int | None = None

    def __post_init__(self) -> None:
        check_types(self)
        if self.source is None:
            self.source = self._default_source()
        if self.type == "glue":
            self._check_glue()
        else:
            self._check_files_or_hub()
        self._check_sections()
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
        from roformer.tasks.glue_metrics import METRICS

        if self.type == "glue":
            known = get_task(self.task).metrics
        else:
            known = TYPE_METRICS.get(self.type, tuple(METRICS))
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
        folds = self.triplet.folds if self.type == "triplet" and self.triplet is not None else None
        if folds and self.validation_file:
            raise ConfigError("triplet.folds holds out folds of train_file: validation_file would go unused")
        if folds and self.source == "files" and not self.train_file:
            raise ConfigError("triplet.folds needs train_file (its rows are dealt into folds)")
        if not folds and self.source == "files" and not (self.train_file and self.validation_file):
            raise ConfigError(f"type {self.type} with source: files needs train_file and validation_file")
        if self.source == "hub" and not self.hub_name:
            raise ConfigError("source: hub needs hub_name")
        if self.validation_mismatched_file or self.test_mismatched_file:
            raise ConfigError("validation_mismatched_file / test_mismatched_file are for MNLI (type: glue)")
        if not self.task:
            self.task = self.type

    def _check_sections(self) -> None:
        """The section of this type is filled with its defaults; another type's section is an error."""
        own = TYPE_SECTIONS.get(self.type)
        for type_name, section in TYPE_SECTIONS.items():
            if section != own and getattr(self, section) is not None:
                raise ConfigError(f"{section}: is for type: {type_name} (this task is type: {self.type})")
        if own == "tagging" and self.tagging is None:
            self.tagging = TaggingConfig()
        if own == "qa" and self.qa is None:
            self.qa = QAConfig()
        if own == "similarity" and self.similarity is None:
            self.similarity = SimilarityConfig()
        if own == "triplet" and self.triplet is None:
            self.triplet = TripletConfig()
        if own == "choices" and self.choices is None:
            raise ConfigError("type: multiple_choice needs a choices: section (its columns)")
