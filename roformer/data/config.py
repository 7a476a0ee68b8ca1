"""The `data:` section of pretraining: `DataConfig` (text into MLM blocks); fine-tuning's is roformer.tasks.config.

Values only, checked on construction; what reads them is elsewhere in roformer.data (corpus, store, mlm). The loader
and the resume policy read what their field metadata says (roformer.config: PATH, MAY_CHANGE_ON_RESUME).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from roformer.config import MASKS_ONLY, MAY_CHANGE_ON_RESUME, PATH, STAGE, check_seed, check_types
from roformer.errors import ConfigError


@dataclass
class RateSchedule:
    """A mask rate that moves over a run: `start` at its first step, `end` at its last, in `shape` between.

    Ankner et al. 2024 ("Dynamic masking rate schedules for MLM pretraining") report a linear 30% -> 15% schedule
    beating both constants; mmBERT lowers its rate in stages.

    Attributes:
        start: The rate at the first step.
        end: The rate at the last step.
        shape: `linear` or `cosine` (half a cosine from start to end).
    """

    start: float
    end: float
    shape: Literal["linear", "cosine"] = "linear"

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("start", "end"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ConfigError(f"mask_rate.{name} must be in (0, 1), got {getattr(self, name)}")

    def at(self, progress: float) -> float:
        """The rate at `progress` (0: the first step, 1: the last)."""
        weight = progress if self.shape == "linear" else 0.5 * (1.0 - math.cos(math.pi * progress))
        return self.start + (self.end - self.start) * weight


@dataclass
class MixtureSource:
    """One corpus of a training mixture (`data.mixture`): its files and its share of the training blocks.

    Attributes:
        paths: Files, folders or globs of text (read as `source: text`, relative to the config file).
        weight: Its share: blocks are drawn from the sources in proportion to their weights.
    """

    paths: list[str] = field(default_factory=list, metadata=PATH)
    weight: float = 1.0

    def __post_init__(self) -> None:
        check_types(self)
        if not self.paths:
            raise ConfigError("mixture: every source needs paths")
        if self.weight <= 0:
            raise ConfigError(f"mixture: weights must be > 0, got {self.weight}")


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
        mask_rate: Fraction of the non-special tokens selected for MLM: a number, or a schedule over the run
            (`{start: 0.3, end: 0.15, shape: linear}`, `RateSchedule`). The rate each step selects with is logged
            beside the rate it realised (`mask_rate`, `mask_rate_realised` in train events).
        mask_split: What a selected token becomes: [MASK], a random token, itself, as fractions summing to 1
            (BERT's [0.8, 0.1, 0.1]; `[1, 0, 0]`: always [MASK], as EuroBERT and some 2024 recipes).
        eval_mask_rate: The rate of the one fixed evaluation mask (BERT's split), whatever the training rate or its
            schedule: eval losses compare across steps, runs, arms and mask recipes.
        eval_mask_seed: Seed of the one fixed evaluation mask.
        max_eval_blocks: Cap on validation blocks, a random subset seeded by eval_mask_seed (null = all).
        num_proc: Processes for `datasets.map` tokenization of in-memory text (eval-mlm, streaming validation);
            null = 1. The token store build tokenizes on all cores through the tokenizer's own threads.
        mixture: Train on several corpora in proportion to their weights (`[{paths: [...], weight: 0.7}, ...]`,
            `MixtureSource`; a stage may change them, as mmBERT's stages change their language mix). Each is a token
            store of its own, read with the run's tokenizer; `source`/`paths` remain the run's own corpus: its
            tokenizer and its validation blocks. Empty: train on `source`/`paths`.
        packing: `blocks` (documents run into each other inside a block: a token attends across the [SEP] between
            documents, BERT's and RoBERTa's FULL-SENTENCES packing) or `isolated` (the same blocks, but attention
            never crosses a document's [SEP] and positions restart at 0 in every document: `block_documents`, the
            model's `document_ids`), in training and evaluation.
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

    source: Literal["builtin", "text", "hub"] = field(default="builtin", metadata=STAGE)
    paths: list[str] = field(default_factory=list, metadata={**PATH, **STAGE})
    validation_paths: list[str] = field(default_factory=list, metadata=PATH)
    validation_fraction: float = 0.05
    split_seed: int = 0
    text_column: str = field(default="text", metadata=STAGE)
    decode_errors: Literal["strict", "replace"] = field(default="strict", metadata=STAGE)
    hub_name: str | None = field(default=None, metadata=STAGE)
    hub_config: str | None = field(default=None, metadata=STAGE)
    hub_split: str = field(default="train", metadata=STAGE)
    hub_revision: str | None = field(default=None, metadata=STAGE)
    builtin_documents: int = field(default=20000, metadata=STAGE)
    builtin_seed: int = field(default=0, metadata=STAGE)
    tokenizer: str | None = field(default=None, metadata=PATH)
    vocab_size: int = 8000
    lowercase: bool = True
    jieba: bool = False
    max_seq_len: int = field(default=128, metadata=STAGE)
    mask_rate: float | RateSchedule = field(default=0.15, metadata=MASKS_ONLY)
    mask_split: list[float] = field(default_factory=lambda: [0.8, 0.1, 0.1], metadata=MASKS_ONLY)
    eval_mask_rate: float = 0.15
    eval_mask_seed: int = 1234
    max_eval_blocks: int | None = None
    num_proc: int | None = field(default=None, metadata=MAY_CHANGE_ON_RESUME)
    mixture: list[MixtureSource] = field(default_factory=list, metadata=STAGE)
    packing: Literal["blocks", "isolated"] = "blocks"
    whole_word_mask: bool = field(default=False, metadata=MASKS_ONLY)
    cache: bool = True
    cache_dir: str | None = field(default=None, metadata=MAY_CHANGE_ON_RESUME)
    streaming: bool = False
    stream_validation_documents: int = 1000
    tokenizer_documents: int = 100_000
    shuffle_buffer: int = field(default=10_000, metadata=STAGE)
    vocab_hash: str | None = None

    @property
    def corpus_name(self) -> str:
        """What the corpus is, in a message: its files, its hub dataset, or the built-in corpus."""
        if self.source == "text":
            return ", ".join(map(str, self.paths)) or "(no paths)"
        if self.source == "hub":
            return f"hub:{self.hub_name}" + (f"/{self.hub_config}" if self.hub_config else "")
        return "builtin"

    def __post_init__(self) -> None:
        check_types(self)
        total = sum(m.weight for m in self.mixture)
        small = [m.weight for m in self.mixture if m.weight / total < 0.001]
        if small:  # under one block in a window of 1,000 (roformer.data.mlm.MixtureBlocks): never read
            raise ConfigError(
                f"mixture: a weight of {small[0]} is under 0.1% of the total {total}: it would draw nothing"
            )
        if self.source == "text" and not self.paths:
            raise ConfigError("source: text needs paths (files, folders or globs)")
        if self.source == "hub" and not self.hub_name:
            raise ConfigError("source: hub needs hub_name")
        if isinstance(self.mask_rate, float) and not 0.0 < self.mask_rate < 1.0:
            raise ConfigError(f"mask_rate must be in (0, 1), got {self.mask_rate}")
        if not 0.0 < self.eval_mask_rate < 1.0:
            raise ConfigError(f"eval_mask_rate must be in (0, 1), got {self.eval_mask_rate}")
        split = self.mask_split
        if len(split) != 3 or min(split) < 0 or abs(sum(split) - 1.0) > 1e-6:
            raise ConfigError(f"mask_split must be 3 fractions ([MASK], random, kept) >= 0 summing to 1, got {split}")
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
