"""`type: translation`: sentence pairs into an encoder-decoder, scored by sacreBLEU (the paper's sec. 4.2 setup).

What a fairseq or HF translation user expects, through the one fine-tuning engine (exact resume, SIGTERM, the lr x
seed grid, DDP under `accelerate launch`):

- Data: parallel files named as fairseq names them, `data.train_prefix` / `validation_prefix` / `test_prefix` with
  `data.source_lang` and `data.target_lang` (PREFIX.en and PREFIX.de, `.gz` accepted; roformer.tasks.parallel), or a
  hub dataset of `translation` records (`data.source: hub`, WMT14's `wmt14` / `de-en`).
- From scratch (`init:` empty): a joint BPE vocabulary trained on the training split's two sides
  (`translation.vocab_size`), and the encoder-decoder of the `model:` section: ModelConfig keys for both halves,
  `encoder:` / `decoder:` mappings for one, `share_embeddings` (default true: fairseq's `--share-all-embeddings`).
  With `init:` a pretrained encoder-decoder directory (ours, or a converted HF `EncoderDecoderModel`) is fine-tuned,
  read with its own tokenizer.
- Batches by tokens (`translation.max_tokens` per micro-batch and process, as fairseq's `--max-tokens`: rows x the
  longer side of the longest pair), each step's loss the mean over its target tokens, label-smoothed
  (`translation.label_smoothing`, 0.1). The Transformer's schedule is `train.schedule: inverse_sqrt`, and the
  average of the last checkpoints `train.average_last`.
- Evaluation: dev loss, BLEU and chrF++ at every evaluation point, decoding with `translation.eval_beam` (greedy by
  default: affordable); BLEU selects. At the end the best (and averaged) model translates the dev set again as
  `valid`, the test set as `test` (and, with `translation.max_source_words`, the held-out longer training pairs as
  `long`) with the full search (`beam`, `length_penalty`, `max_len_a/b`), scored with
  sacreBLEU's signatures in results.json (`translation`), the hypotheses one line per source line in
  `predictions/<run>/` and, for the selected run, `hypotheses/best/` and `hypotheses/averaged/`.
- Every model written gets `translation.json` (roformer.tasks.translator.Decoding): `roformer translate --model DIR`
  then decodes as the run did.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F

from roformer.config import PATH, check_types, from_dict
from roformer.errors import ConfigError, UserError
from roformer.files import atomic_write_text
from roformer.labels import IGNORE_INDEX
from roformer.model.config import EncoderDecoderConfig, ModelConfig
from roformer.model.search import SearchConfig, SearchValueError
from roformer.tasks.base import (
    NO_FACTS,
    ChecksModel,
    HeadOutputs,
    ModelFacts,
    Publishes,
    ReportsResults,
    TaskSpec,
    TokenBatches,
    with_score,
)
from roformer.tasks.mt_metrics import (
    TOKENIZED_LOWERCASE_RECIPE,
    corpus_scores,
    signatures,
    tokenized_lowercase_signature,
)
from roformer.tasks.parallel import (
    BOS,
    EOS,
    ParallelText,
    load_translation_tokenizer,
    read_hub_pairs,
    read_parallel,
    texts_of,
    train_bpe,
)
from roformer.tasks.translator import (
    DECODING_FILE,
    PAPER_SEARCH,
    USER_NAMES,
    Decoding,
    encode_sources,
    encode_targets,
    generate_ids,
    hypotheses,
    needed_ids,
    pad_sources,
    user_search,
)

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer
    from roformer.tasks.config import FinetuneDataConfig, Vocabulary

LANGUAGE_KEYS = ("source_lang", "target_lang", "train_prefix", "validation_prefix", "test_prefix")
HUB_SPLITS = {"train": "train", "dev": "validation", "test": "test"}  # our split: the hub dataset's (WMT14's names)
LONG_SPLIT = "long"  # the held-out training pairs longer than data.translation.max_source_words
FINAL_DEV = "valid"  # the dev set decoded at the end as the test set is (fairseq's `--gen-subset valid`)
# the largest joint BPE trained from scratch: far above any translation vocabulary (WMT's 32,000-40,000, the largest
# multilingual tables about 256,000), and far below what aborts the `tokenizers` trainer without a message (it
# allocates for the whole size up front: 35 GB at 500,000,000)
MAX_VOCAB_SIZE = 1_000_000


@dataclass
class TranslationConfig:
    """`data.translation`: the vocabulary, batches, loss and decoding of a translation task.

    Attributes:
        vocab_size: The joint BPE vocabulary's size when trained from scratch (37000 in the paper's WMT14 setup).
        min_frequency: A BPE merge needs a pair seen at least this often.
        tokenizer: A tokenizer to use instead of training one (a `save_pretrained` folder or a tokenizer.json with
            <pad>, <unk>, <s> and </s>); from scratch only (an init brings its own).
        max_tokens: Tokens per micro-batch and process: rows x the longer side of the batch's longest pair, padded
            (fairseq's `--max-tokens`); a step trains on processes x grad_accum such batches.
        label_smoothing: eps of the label-smoothed cross-entropy (0.1 in the Transformer and RoFormer setups).
        beam: Beams of the final translations of the dev and test sets (the paper: 4): the search's `num_beams`.
        length_penalty: Hypotheses score sum logprob / length^length_penalty (the paper: 0.6).
        early_stopping: A source stops once it has `beam` finished hypotheses.
        max_len_a: A target may have max_len_a x source tokens + max_len_b tokens (fairseq's options).
        max_len_b: See max_len_a (the search's `max_new_tokens`).
        eval_beam: Beams of the dev translations at every evaluation point (1: greedy, which keeps evaluation
            affordable); they select checkpoints, learning rates and seeds by BLEU.
        too_long: A sentence longer than data.max_length (or a learned position table) is an `error` naming its
            file and line, or is cut to it (`truncate`, counted in a log line).
        empty_lines: A training pair with an empty side is an `error` naming its file and line, or is left out
            (`skip`, counted in a log line); dev and test lines are always refused (their hypotheses keep the
            sources' lines).
        max_source_words: A length-generalization split: only training pairs whose source has at most this many
            words are trained on; the rest (the first `long_test_pairs` of them, in file order) are translated and
            scored at the end as the test split `long` (Rosendahl et al. 2019's setup: lengths never trained on).
            The dev set stays whole.
        long_test_pairs: How many of the held-out longer training pairs make the `long` split.
    """

    vocab_size: int = 8000
    min_frequency: int = 2
    tokenizer: str | None = field(default=None, metadata=PATH)
    max_tokens: int = 4096
    label_smoothing: float = 0.1
    beam: int = PAPER_SEARCH.num_beams
    length_penalty: float = PAPER_SEARCH.length_penalty
    early_stopping: bool = PAPER_SEARCH.early_stopping
    max_len_a: float = PAPER_SEARCH.max_len_a
    max_len_b: int = PAPER_SEARCH.max_new_tokens
    eval_beam: int = 1
    too_long: Literal["error", "truncate"] = "error"
    empty_lines: Literal["error", "skip"] = "error"
    max_source_words: int | None = None
    long_test_pairs: int = 1000

    def __post_init__(self) -> None:
        check_types(self)
        for name in ("vocab_size", "min_frequency", "max_tokens", "long_test_pairs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.vocab_size < 16:
            raise ConfigError(f"vocab_size must be >= 16 (the specials and an alphabet), got {self.vocab_size}")
        if self.vocab_size > MAX_VOCAB_SIZE:
            raise ConfigError(
                f"vocab_size must be <= {MAX_VOCAB_SIZE:,} (a BPE vocabulary; WMT's are 32,000-40,000), "
                f"got {self.vocab_size:,}"
            )
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.max_source_words is not None and self.max_source_words < 1:
            raise ConfigError(f"max_source_words must be >= 1 (or null: every pair), got {self.max_source_words}")
        for final in (True, False):
            try:
                self.search(final)
            except SearchValueError as e:  # named by its key here: `beam`, `eval_beam`, `max_len_b`
                raise ConfigError(str(e)) from None

    def search(self, final: bool = True) -> SearchConfig:
        """The search of the final translations (`beam`), or of the dev ones at every evaluation point (`eval_beam`).

        Raises:
            SearchValueError: a setting out of range, named by its key here.
        """
        return user_search(vars(self), USER_NAMES if final else {**USER_NAMES, "num_beams": "eval_beam"})


# ----------------------------------------------------------------------------------------------------------------
# The config: the data: keys and the model trained from scratch


def check_data(data: FinetuneDataConfig) -> None:
    """Languages, and the prefixes of files (or a hub dataset), not the files of the other types.

    Raises:
        ConfigError: naming the key.
    """
    for key in ("source_lang", "target_lang"):
        if not getattr(data, key):
            raise ConfigError(f"{key} is required for type: translation (the suffix of its files, e.g. en)")
    if data.source_lang == data.target_lang:
        raise ConfigError(f"source_lang and target_lang are both {data.source_lang!r}")
    for key in ("train_file", "validation_file", "test_file"):
        if getattr(data, key):
            raise ConfigError(f"{key}: type translation reads parallel files by prefix (data.train_prefix: PREFIX)")
    prefixes = [key for key in LANGUAGE_KEYS[2:] if getattr(data, key)]
    if data.source == "hub" and prefixes:
        raise ConfigError(f"{prefixes[0]}: source: hub reads the dataset's splits, not files")
    if data.source == "files":
        for key in ("train_prefix", "validation_prefix"):
            if not getattr(data, key):
                raise ConfigError(f"{key} is required for type: translation with files (PREFIX of PREFIX.<lang>)")


def encoder_decoder_config(section: dict[str, Any], vocabulary: Vocabulary) -> EncoderDecoderConfig:
    """The encoder-decoder of a `model:` section, with the task's joint vocabulary and its start and end ids.

    Keys of ModelConfig apply to both halves; `encoder:` and `decoder:` mappings to one; `share_embeddings`
    (default true) makes one word table of the joint vocabulary (fairseq's `--share-all-embeddings`).

    Raises:
        ConfigError: naming `model.<key>` (or `model.encoder.<key>`).
    """
    section = dict(section)
    share = section.pop("share_embeddings", True)
    halves = {half: section.pop(half, None) or {} for half in ("encoder", "decoder")}
    for key in ("decoder_start_token_id", "eos_token_id"):
        if key in section:
            raise ConfigError(f"model.{key} comes from the task's vocabulary; remove it")
    specials = {"vocab_size": vocabulary.size, "pad_token_id": vocabulary.pad_token_id}
    from_dict(ModelConfig, {**section, **specials}, prefix="model.")  # the shared keys named as written
    configs = {}
    for half, own in halves.items():
        if not isinstance(own, dict):
            raise ConfigError(f"model.{half}: expected a mapping of ModelConfig keys, got {type(own).__name__}")
        for key in ("vocab_size", "pad_token_id"):
            if key in own:
                raise ConfigError(f"model.{half}.{key} comes from the task's vocabulary; remove it")
        configs[half] = from_dict(ModelConfig, {**section, **own, **specials}, prefix=f"model.{half}.")
    if not isinstance(share, bool):
        raise ConfigError(f"model.share_embeddings must be true or false, got {share!r}")
    try:
        return EncoderDecoderConfig(
            configs["encoder"],
            configs["decoder"],
            share_embeddings=share,
            decoder_start_token_id=vocabulary.bos_token_id,
            eos_token_id=vocabulary.eos_token_id,
        )
    except ConfigError as e:
        raise ConfigError(f"model: {e}") from None


# ----------------------------------------------------------------------------------------------------------------
# Encoded splits


@dataclass
class TranslationSplit:
    """A split's pairs as ids: what batches hold, and the references hypotheses are scored against.

    Attributes:
        source_ids: Every source, its specials included.
        target_ids: Every target as the decoder's labels: its tokens and eos.
        references: The target sentences as read (sacreBLEU scores detokenized text against them).
        search: How this split is translated (the dev split: `eval_beam`; the final ones: `beam`); None: it is not
            (the training split).
    """

    source_ids: list[list[int]]
    target_ids: list[list[int]]
    references: list[str]
    search: SearchConfig | None
    labelled: bool = True
    sequences = 1

    @property
    def lengths(self) -> list[int]:
        """Source tokens of every pair: prediction batches are in this order, and data.max_length caps it."""
        return [len(row) for row in self.source_ids]

    @property
    def tokens(self) -> list[int]:
        """Real tokens of every pair, both sides (throughput)."""
        return [len(s) + len(t) for s, t in zip(self.source_ids, self.target_ids, strict=True)]


# ----------------------------------------------------------------------------------------------------------------
# The task


class TranslationTask(HeadOutputs):
    """Parallel sentences into an encoder-decoder: `type: translation`.

    Args:
        data: The data: section (its `translation:` settings, languages and prefixes).
        texts: The splits read: `train`, `dev` and, when given, `test`.
    """

    architecture = "encoder_decoder"
    num_labels = None  # an encoder-decoder has no label count

    def __init__(self, data: FinetuneDataConfig, texts: dict[str, ParallelText]) -> None:
        super().__init__(data)
        self.settings: TranslationConfig = data.translation or TranslationConfig()
        self.source_lang, self.target_lang = data.source_lang, data.target_lang
        self.texts = texts
        self.test_splits = [FINAL_DEV] + [name for name in ("test", LONG_SPLIT) if name in texts]
        self.encoded_with: Tokenizer | None = None  # the tokenizer the splits were encoded with (decoding reads it)
        self.max_length = data.max_length

    @classmethod
    def from_config(cls, data: FinetuneDataConfig) -> TranslationTask:
        """The task of a data: section, its splits read.

        The training pairs are cut to data.max_train_examples, the dev and test pairs to data.max_eval_examples.

        Raises:
            UserError: a missing file, files of different line counts, an empty or non-UTF-8 line (file and line), a
                hub dataset that does not load.
        """
        settings = data.translation or TranslationConfig()
        read = _hub_reader(data) if data.source == "hub" else _file_reader(data)
        texts = {"train": read("train", settings.empty_lines == "skip").head(data.max_train_examples)}
        if settings.max_source_words is not None:
            texts["train"], longer = texts["train"].split_by_source_words(settings.max_source_words)
            if not len(longer):
                raise UserError(
                    f"data.translation.max_source_words: no training pair of {texts['train'].source_file} has a "
                    f"source of more than {settings.max_source_words} words: the split `{LONG_SPLIT}` would be empty"
                )
            texts[LONG_SPLIT] = longer.head(settings.long_test_pairs)
        texts["dev"] = read("dev", False).head(data.max_eval_examples)
        if data.source == "hub" or data.test_prefix:
            texts["test"] = read("test", False).head(data.max_eval_examples)
        if not len(texts["train"]):
            raise UserError(f"{texts['train'].source_file}: no training pairs")
        return cls(data, texts)

    # -- vocabulary and model ------------------------------------------------------------------------------------

    def tokenizer(self) -> Tokenizer:
        """The tokenizer of a model trained from scratch.

        `translation.tokenizer`, else a joint BPE trained on the training split's two sides.

        Raises:
            UserError: a given tokenizer without <s> or </s> (a target's start and end), or one that does not load.
        """
        if self.settings.tokenizer:
            tokenizer = load_translation_tokenizer(self.settings.tokenizer)
            for name, token in (("bos_token", BOS), ("eos_token", EOS)):
                if getattr(tokenizer, f"{name}_id") is None:
                    raise UserError(
                        f"{self.settings.tokenizer}: the tokenizer has no {name} (e.g. {token}): a model trained from "
                        "scratch starts every target from bos and ends it with eos"
                    )
            return tokenizer
        return train_bpe(texts_of([self.texts["train"]]), self.settings.vocab_size, self.settings.min_frequency)

    def pretrained_tokenizer(self, init: Path) -> Tokenizer:
        """The tokenizer of a pretrained init (its start and end ids are its model's).

        Raises:
            UserError: none there, or one without padding; `translation.tokenizer` set too (the init has its own).
        """
        if self.settings.tokenizer:
            raise UserError("data.translation.tokenizer: an init brings its own tokenizer; leave it empty")
        return load_translation_tokenizer(init)

    def check_model(self, config: Any) -> ModelFacts:
        """The model is an encoder-decoder that knows its start and end ids: its eos, which ends every target.

        Raises:
            UserError: it is not, or one of the ids is missing.
        """
        needed_ids(config, "init")
        return ModelFacts(eos_id=config.eos_token_id)

    # -- encoding and batches ------------------------------------------------------------------------------------

    def decoding(self) -> Decoding:
        """How the final translations are made (the search of `beam`), with the sources' limits and padding."""
        return Decoding(
            search=self.settings.search(final=True),
            max_length=self.max_length,
            too_long=self.settings.too_long,
            pad_to_multiple_of=self.multiple,
            source_lang=self.source_lang,
            target_lang=self.target_lang,
        )

    def encode(
        self, tokenizer: Tokenizer, max_length: int, model: ModelFacts = NO_FACTS
    ) -> dict[str, TranslationSplit]:
        """Every split as ids (sources with their specials, targets ending in the model's eos: `model.eos_id`).

        Raises:
            UserError: a sentence longer than `max_length` under `too_long: error`, naming its file and line.
        """
        if model.eos_id is None:
            raise ValueError("targets end with the model's eos: encode with what check_model learned of the model")
        self.encoded_with, self.max_length = tokenizer, max_length
        advice = "data.max_length, or a learned position table; data.translation.too_long: truncate cuts such lines"
        encoded = {}
        for name, text in self.texts.items():
            settings = (max_length, self.settings.too_long)
            sources = encode_sources(tokenizer, text.sources, *settings, text.source_line, advice)
            targets = encode_targets(tokenizer, text.targets, model.eos_id, *settings, text.target_line, advice)
            search = None if name == "train" else self.settings.search(final=name != "dev")
            encoded[name] = TranslationSplit(sources, targets, text.targets, search)
        encoded[FINAL_DEV] = replace(encoded["dev"], search=self.settings.search(final=True))
        self._check_budget(encoded["train"], max_length)
        return encoded

    def pair_sizes(self, split: TranslationSplit, cap: int) -> list[int]:
        """What each pair costs a batch: its longer side, padded as batches are (fairseq's `num_tokens`)."""
        return [
            max(self.padded_length(len(s), cap), self.padded_length(len(t), cap))
            for s, t in zip(split.source_ids, split.target_ids, strict=True)
        ]

    def _check_budget(self, train: TranslationSplit, cap: int) -> None:
        """Every training pair fits a batch of `max_tokens` by itself (checked before any run directory is written).

        Raises:
            UserError: naming the key, the longest pair and where it is.
        """
        sizes = self.pair_sizes(train, cap)
        longest = max(range(len(sizes)), key=sizes.__getitem__)
        if sizes[longest] > self.settings.max_tokens:
            text = self.texts["train"]
            raise UserError(
                f"data.translation.max_tokens ({self.settings.max_tokens}) is smaller than the longest training pair "
                f"({sizes[longest]} tokens, padded: {text.source_line(longest)}): raise it"
            )

    def token_batches(self, split: TranslationSplit, cap: int) -> list[list[int]]:
        """The training pairs in batches of at most `max_tokens` (rows x the longer side of the longest, padded)."""
        from roformer.data.sampling import token_batches

        # by source then target length (fairseq's order), so that a batch's pairs are alike and padding is small
        order = sorted(
            range(len(split.source_ids)), key=lambda i: (len(split.source_ids[i]), len(split.target_ids[i]), i)
        )
        return token_batches(self.pair_sizes(split, cap), order, self.settings.max_tokens)

    def loss_weight(self, split: TranslationSplit, rows: list[int]) -> int:
        """The target tokens of `rows`: a batch's loss is their mean."""
        return sum(len(split.target_ids[r]) for r in rows)

    def padded_tokens(self, split: TranslationSplit, rows: list[int], cap: int) -> int:
        """Source and target positions of a batch of `rows`, padding included."""
        source = self.padded_length(max(len(split.source_ids[r]) for r in rows), cap)
        target = self.padded_length(max(len(split.target_ids[r]) for r in rows), cap)
        return len(rows) * (source + target)

    def collate(self, split: TranslationSplit, rows: list[int], pad_id: int, cap: int) -> dict[str, torch.Tensor]:
        """A batch of `rows`: sources and their mask, targets as labels with their decoder mask."""
        batch = pad_sources([split.source_ids[r] for r in rows], pad_id, self.multiple, cap)
        length = self.padded_length(max(len(split.target_ids[r]) for r in rows), cap)
        labels = torch.full((len(rows), length), IGNORE_INDEX, dtype=torch.long)
        for i, r in enumerate(rows):
            labels[i, : len(split.target_ids[r])] = torch.tensor(split.target_ids[r], dtype=torch.long)
        # the decoder reads the start token and the target but its last token: as many positions as labels
        batch.update(labels=labels, decoder_attention_mask=(labels != IGNORE_INDEX).long())
        return batch

    # -- loss, outputs and metrics -------------------------------------------------------------------------------

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The label-smoothed cross-entropy, a mean over the batch's target tokens."""
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "labels", "decoder_attention_mask")}
        return model(**inputs, label_smoothing=self.settings.label_smoothing).loss

    def outputs(
        self, model: torch.nn.Module, batch: dict[str, torch.Tensor], split: TranslationSplit
    ) -> dict[str, torch.Tensor]:
        """The translations of a batch of `split` under its search (`ids`), and what the search does not change.

        The latter: each pair's summed target log-loss (`nll`) over its `tokens`.
        """
        if split.search is None:
            raise ValueError("the training split is not translated")
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "labels", "decoder_attention_mask")}
        logits = model(**inputs).logits.float()
        labels = batch["labels"]
        per_token = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=IGNORE_INDEX, reduction="none")
        losses = {"nll": per_token.sum(-1).cpu(), "tokens": (labels != IGNORE_INDEX).sum(-1).cpu()}
        return {"ids": generate_ids(model, batch, split.search).cpu(), **losses}

    def predictions(self, outputs: dict[str, torch.Tensor], split: TranslationSplit, rows: list[int]) -> list[dict]:
        """Per pair: its hypothesis (detokenized text), summed log-loss and target tokens."""
        texts = hypotheses(self.encoded_with, outputs["ids"])
        return [
            {"hypothesis": text, "nll": float(nll), "tokens": int(tokens)}
            for text, nll, tokens in zip(texts, outputs["nll"].tolist(), outputs["tokens"].tolist(), strict=True)
        ]

    def evaluate(self, split: TranslationSplit, predictions: list[dict]) -> dict[str, float]:
        """The corpus BLEU (sacreBLEU's) and chrF++ of the hypotheses, the target log-loss per token; `score`."""
        scores = corpus_scores([p["hypothesis"] for p in predictions], split.references, self.target_lang)
        tokens = sum(p["tokens"] for p in predictions)
        scores["loss"] = sum(p["nll"] for p in predictions) / max(1, tokens)
        return with_score(scores, self.metrics)

    # -- files ---------------------------------------------------------------------------------------------------

    def hypothesis_file(self, split: str) -> str:
        """The file of a split's hypotheses: `<split>.<target_lang>`, one line per source line."""
        return f"{split}.{self.target_lang}"

    def write_predictions(
        self, folder: Path, encoded: dict[str, TranslationSplit], predictions: dict[str, list[dict]]
    ) -> None:
        """`<split>.<target_lang>` per dev and test split: the hypotheses, one per source line."""
        for split in self.dev_splits + self.test_splits:
            lines = "".join(p["hypothesis"] + "\n" for p in predictions[split])
            atomic_write_text(folder / self.hypothesis_file(split), lines)

    def write_submission(self, run_folder: Path, submission: Path) -> None:
        """The selected run's final translations (`valid`, `test`): `best/` and, when averaged, `averaged/`."""
        for model, folder in (("best", run_folder), ("averaged", run_folder / "averaged")):
            if not folder.is_dir():
                continue
            (submission / model).mkdir(exist_ok=True)
            for split in self.test_splits:
                shutil.copyfile(folder / self.hypothesis_file(split), submission / model / self.hypothesis_file(split))

    def result_notes(self, selected: dict[str, Any]) -> dict[str, Any]:
        """`translation`: BLEU and chrF++ of the final translations, per model and split, with their signatures.

        Also the search that made them and the languages: what an MT results table reports.
        """
        signature = signatures()
        models = {"best": selected.get("test", {}), "averaged": selected.get("averaged", {}).get("test", {})}
        scored = {
            model: {
                split: {
                    "bleu": metrics["bleu"],
                    "chrf": metrics["chrf"],
                    "loss": metrics["loss"],
                    "bleu_signature": signature["bleu"],
                    "chrf_signature": signature["chrf"],
                    **tokenized_lowercase(metrics),
                }
                for split, metrics in splits.items()
            }
            for model, splits in models.items()
            if splits
        }
        search = self.decoding().to_dict()
        return {
            "metrics_in_percent": True,  # sacreBLEU's scale (the loss is per token, in nats)
            "translation": {
                "languages": f"{self.source_lang}-{self.target_lang}",
                "search": {k: v for k, v in search.items() if k not in ("source_lang", "target_lang")},
                "eval_beam": self.settings.eval_beam,
                **scored,
                "signatures": signature,
            },
        }

    def model_files(self, eval_batch_size: int) -> dict[str, str]:
        """`translation.json`: how `roformer translate` decodes with the model.

        As the run's final translations, in batches of the same sentences: the same hypotheses.
        """
        return {DECODING_FILE: replace(self.decoding(), batch_size=eval_batch_size).to_json()}


def tokenized_lowercase(metrics: dict[str, Any]) -> dict[str, Any]:
    """`bleu_tok_lc` of a split's final metrics with its signature and recipe (none in a record made before it)."""
    if "bleu_tok_lc" not in metrics:
        return {}
    return {
        "bleu_tok_lc": metrics["bleu_tok_lc"],
        "bleu_tok_lc_signature": tokenized_lowercase_signature(),
        "bleu_tok_lc_recipe": TOKENIZED_LOWERCASE_RECIPE,
    }


def _file_reader(data: FinetuneDataConfig) -> Any:
    """Reads split `train`, `dev` or `test` from its prefix's files."""
    prefixes = {"train": data.train_prefix, "dev": data.validation_prefix, "test": data.test_prefix}
    return lambda split, skip: read_parallel(prefixes[split], data.source_lang, data.target_lang, skip)


def _hub_reader(data: FinetuneDataConfig) -> Any:
    """Reads split `train`, `dev` or `test` of the hub dataset (its train, validation and test)."""
    return lambda split, skip: read_hub_pairs(
        data.hub_name, data.hub_config, HUB_SPLITS[split], data.source_lang, data.target_lang, skip
    )


SPECS = (
    TaskSpec(
        name="translation",
        summary="sentence pairs (fairseq's PREFIX.<lang> files, or the hub) into an encoder-decoder: BLEU and chrF++",
        builder=TranslationTask.from_config,
        architecture="encoder_decoder",
        metrics=("bleu", "chrf"),
        default_metrics=("bleu",),
        predictions="dev.<target_lang>",
        docs="translation.md",
        section="translation",
        settings=TranslationConfig,
        check=check_data,
        needs_validation_file=lambda data: False,
        own_vocabulary=True,
        pretrained_init=True,
        scratch_model=encoder_decoder_config,
        data_keys=LANGUAGE_KEYS,
        capabilities=(TokenBatches, Publishes, ChecksModel, ReportsResults),
        submission_folder="hypotheses",
    ),
)
