"""The `data:` sections of the recipes: `DataConfig` (text into MLM blocks) and `GlueDataConfig` (a GLUE task).

Values only, checked on construction; what reads them is elsewhere in roformer.data (corpus, store, mlm, glue). The
loader and the resume policy read what their field metadata says (roformer.config: PATH, MAY_CHANGE_ON_RESUME).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from roformer.config import MAY_CHANGE_ON_RESUME, PATH, check_seed, check_types
from roformer.data.glue_tasks import get_task
from roformer.errors import ConfigError


@dataclass
class DataConfig:
    """Where the text comes from and how it becomes MLM blocks.

    Attributes:
        source: `builtin` (generated, see roformer.data.builtin), `text` (local files) or `hub` (datasets).
        paths: Files, folders or globs for `text` (relative paths are resolved against the config file's folder).
        validation_paths: Files for validation instead of a fraction of `paths`.
        validation_fraction: Fraction of documents held out for evaluation (fixed by `split_seed`).
        split_seed: Seed of the document-level train/validation split.
        text_column: Field holding the text in .jsonl/.csv/.parquet files and hub datasets.
        decode_errors: `strict` (a non-UTF-8 file is an error naming it) or `replace` (U+FFFD, counted in the log).
        hub_name: `datasets` name for `hub`, e.g. `wikitext`.
        hub_config: Its configuration, e.g. `wikitext-103-raw-v1`.
        hub_split: Its split.
        hub_revision: A commit, tag or branch of the hub dataset; null = the latest. Part of the cache key: pin it,
            or a cache entry cannot tell that the dataset changed upstream (a warning says so).
        builtin_documents: Number of generated documents for `builtin` (~85 words each).
        builtin_seed: Seed of the generated corpus.
        tokenizer: A tokenizer to load (a directory, tokenizer.json or vocab.txt); null = train one.
        vocab_size: Size of a trained tokenizer.
        lowercase: Lower-case (and strip accents) in a trained tokenizer.
        jieba: Pre-segment Chinese text into words with jieba (WoBERT-style) before WordPiece.
        max_seq_len: Block length including [CLS] and [SEP].
        mask_rate: Fraction of tokens selected for MLM (80% [MASK], 10% random, 10% kept).
        eval_mask_seed: Seed of the one fixed evaluation mask.
        max_eval_blocks: Cap on validation blocks, a random subset seeded by eval_mask_seed (null = all).
        num_proc: Processes for `datasets.map` tokenization of in-memory text (eval-mlm, streaming validation);
            null = 1. The token store build tokenizes on all cores through the tokenizer's own threads.
        whole_word_mask: Mask whole words (all WordPiece pieces of a word together) instead of single tokens.
        cache: Keep the tokenizer and packed blocks on disk, keyed by everything they depend on (the config's data
            fields and the size and modification time of every input file), so a second run starts at once.
        cache_dir: Where; null = `$ROFORMER_CACHE` or `~/.cache/roformer`.
        streaming: Read the corpus as it is trained on instead of packing it in memory first (corpora larger than
            RAM; `hub` with `datasets` streaming, or `text` files read one at a time). See roformer.data.streaming.
        stream_validation_documents: With streaming, the first N documents of the stream are the validation set.
        tokenizer_documents: A trained tokenizer learns from at most this many training documents: a seeded sample
            (all of them when there are fewer; with streaming, the first N of the stream).
        shuffle_buffer: With streaming, documents pass through a seeded shuffle buffer of this size each epoch.
        vocab_hash: The tokenizer's vocabulary hash (roformer.data.tokenizer.vocab_hash). A run writes it into its
            config.yaml; a config that sets it refuses a tokenizer whose vocabulary differs. Resume, `experiment`
            and `compare` check it.
    """

    source: Literal["builtin", "text", "hub"] = "builtin"
    paths: list[str] = field(default_factory=list, metadata=PATH)
    validation_paths: list[str] = field(default_factory=list, metadata=PATH)
    validation_fraction: float = 0.05
    split_seed: int = 0
    text_column: str = "text"
    decode_errors: Literal["strict", "replace"] = "strict"
    hub_name: str | None = None
    hub_config: str | None = None
    hub_split: str = "train"
    hub_revision: str | None = None
    builtin_documents: int = 20000
    builtin_seed: int = 0
    tokenizer: str | None = field(default=None, metadata=PATH)
    vocab_size: int = 8000
    lowercase: bool = True
    jieba: bool = False
    max_seq_len: int = 128
    mask_rate: float = 0.15
    eval_mask_seed: int = 1234
    max_eval_blocks: int | None = None
    num_proc: int | None = field(default=None, metadata=MAY_CHANGE_ON_RESUME)
    whole_word_mask: bool = False
    cache: bool = True
    cache_dir: str | None = field(default=None, metadata=MAY_CHANGE_ON_RESUME)
    streaming: bool = False
    stream_validation_documents: int = 1000
    tokenizer_documents: int = 100_000
    shuffle_buffer: int = 10_000
    vocab_hash: str | None = None

    def __post_init__(self) -> None:
        check_types(self)
        if self.source == "text" and not self.paths:
            raise ConfigError("source: text needs paths (files, folders or globs)")
        if self.source == "hub" and not self.hub_name:
            raise ConfigError("source: hub needs hub_name")
        if not 0.0 < self.mask_rate < 1.0:
            raise ConfigError(f"mask_rate must be in (0, 1), got {self.mask_rate}")
        if self.max_seq_len < 8:
            raise ConfigError(f"max_seq_len must be >= 8, got {self.max_seq_len}")
        if self.streaming and self.source == "builtin":
            raise ConfigError("streaming is for text and hub sources (the builtin corpus is generated in memory)")
        if self.streaming and self.validation_paths:
            raise ConfigError("streaming holds out the head of the stream: use stream_validation_documents")
        if self.builtin_documents <= 0 or self.vocab_size < 10:
            raise ConfigError("builtin_documents must be > 0 and vocab_size >= 10")
        for name in ("split_seed", "builtin_seed", "eval_mask_seed"):
            check_seed(name, getattr(self, name))
        if not self.validation_paths and not self.streaming and not 0.0 < self.validation_fraction < 1.0:
            raise ConfigError(
                f"validation_fraction must be in (0, 1) (or name validation_paths), got {self.validation_fraction}"
            )
        if self.max_eval_blocks is not None and self.max_eval_blocks < 1:
            raise ConfigError(f"max_eval_blocks must be >= 1 or null (all), got {self.max_eval_blocks}")


@dataclass
class GlueDataConfig:
    """Where the task's examples come from.

    Attributes:
        task: cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte or wnli.
        source: `glue_dir` (official TSV layout), `hub` (datasets) or `files` (local csv/tsv/json/jsonl).
        glue_dir: The GLUE directory (holding CoLA/, SST-2/, ...); relative to the config file.
        hub_name: The hub dataset for `hub`.
        train_file: `files`: the training file (text columns named as on the hub, e.g. sentence1/sentence2).
        validation_file: `files`: the dev file.
        test_file: `files`: an unlabelled test file (optional).
        validation_mismatched_file: `files`, MNLI: the mismatched dev file (optional; `validation_file` is matched).
        test_mismatched_file: `files`, MNLI: the mismatched test file (optional).
        text_columns: `files`: the text column names, if not the hub's.
        label_column: `files`: the label column (names or ids).
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

    task: str = ""
    source: Literal["glue_dir", "hub", "files"] = "glue_dir"
    glue_dir: str | None = field(default=None, metadata=PATH)
    hub_name: str = "nyu-mll/glue"
    train_file: str | None = field(default=None, metadata=PATH)
    validation_file: str | None = field(default=None, metadata=PATH)
    test_file: str | None = field(default=None, metadata=PATH)
    validation_mismatched_file: str | None = field(default=None, metadata=PATH)
    test_mismatched_file: str | None = field(default=None, metadata=PATH)
    text_columns: list[str] | None = None
    label_column: str = "label"
    max_length: int = 512
    pad_to_multiple_of: int = 8
    group_by_length: bool = False
    beyond_pretraining_length: bool = False
    max_train_examples: int | None = None
    max_eval_examples: int | None = None

    def __post_init__(self) -> None:
        check_types(self)
        if not self.task:
            raise ConfigError("task is required (cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli)")
        task = get_task(self.task)
        if self.source == "glue_dir" and not self.glue_dir:
            raise ConfigError("source: glue_dir needs glue_dir")
        if self.source == "files" and not (self.train_file and self.validation_file):
            raise ConfigError("source: files needs train_file and validation_file")
        mismatched = self.validation_mismatched_file or self.test_mismatched_file
        if mismatched and (self.source != "files" or len(task.dev) < 2):
            raise ConfigError("validation_mismatched_file / test_mismatched_file are for MNLI with source: files")
        if self.pad_to_multiple_of < 1:
            raise ConfigError(f"pad_to_multiple_of must be >= 1, got {self.pad_to_multiple_of}")
        if self.max_length < 8:
            raise ConfigError(f"max_length must be >= 8, got {self.max_length}")
        for name in ("max_train_examples", "max_eval_examples"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1 or null (all), got {getattr(self, name)}")
