"""Token classification (NER, POS tagging): `data.type: token_classification`, a tag per word.

`TaggingTask` is the fine-tuning task (roformer.tasks.base.FinetuneTask) of such a config; its own settings are
`data.tagging` (roformer.tasks.conll.TaggingConfig). The sentences come from CoNLL column files, JSON lines or a hub
dataset, and the predictions go to CoNLL files: roformer.tasks.conll reads and writes them.

The label set (the model's output ids, in order) is `data.labels` when given (a tag outside it is an error naming
its file and line), else the hub dataset's tag names, else the tags of the whole training file sorted by name, `O`
first when present (`O, B-LOC, B-MISC, ..., I-PER`): the same ids whatever `max_train_examples` keeps.

Words become WordPiece pieces (the tokenizer's `is_split_into_words=True`, cut to max_length). Only the first piece
of a word is trained (its word's tag) and read at prediction; the other pieces and the specials are labelled
IGNORE_INDEX. With `tagging.label_all_tokens` the other pieces are trained too, on the tag saying "inside this
word's entity": `I-X` for a word tagged `B-X`, `I-X`, `E-X` or `S-X`, in every scheme, and the word's own tag for `O`
and tags without a B/I/E/S prefix (POS tags). In IOBES a piece-level `E-`/`S-` would have to move from the first
piece, which must carry the word's tag since it is the one read; `I-X` is true of every non-first piece. Where that
tag is not in the label set the piece is not trained.

Entities or plain tags (`tagging.scheme`): with an entity scheme (IOB1, IOB2, IOBES; `auto` when a tag other than `O`
has a `B-`/`I-`/`E-`/`S-` prefix) the entity-level F1 selects (the metric reads the three schemes alike:
roformer.tasks.tagging_metrics) and a tag whose prefix the named scheme does not have is reported once, as a likely
mistake in the config; an entity scheme named for tags without such prefixes is an error. Plain tags (`none`, or
`auto` without such prefixes: POS, IO tags such as `PER`) have no entities, so their entity F1 would be 0 whatever
the predictions: token accuracy selects, `label_all_tokens` trains every piece on its word's own tag, and the report
scores each tag over words. `data.metrics` chooses the selecting metrics in both cases (f1, precision, recall,
accuracy; the entity ones need entities).

Word-level Chinese tokenizers (WoBERT, RoFormer-Chinese: roformer.data.tokenizer.word_vocabulary) keep a word whole
when it is in their vocabulary and spell any other out in characters (bert4keras' rule, as every other task reads
jieba's words), never as a first piece and `##` pieces the model was not pretrained on; the characters are the
word's pieces.

Words cut off by max_length (and words the tokenizer maps to no piece, e.g. only control characters) have no piece
to read: they are predicted `O` (id 0 when the set has no `O`), scored against their gold tags, and counted in a
warning per split.

Predictions are written per split as `<split>.conll`: each word's line with the predicted tag appended as the last
Predictions are written per split as `<split>.conll` (roformer.tasks.conll.conll_text). Labelled splits also get
`<split>.report.json`, the scores per entity type (per tag for plain tags). The test predictions are the submission.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from roformer.data.tokenizer import WordVocabulary, spelled_out, word_vocabulary
from roformer.errors import UserError
from roformer.files import atomic_copy, atomic_write_text
from roformer.labels import IGNORE_INDEX
from roformer.logs import MAIN_ONLY
from roformer.tasks.base import (
    NO_FACTS,
    HeadOutputs,
    ModelFacts,
    Publishes,
    TaskSpec,
    TokenRows,
    labels_file,
    pad_rows,
    with_score,
)
from roformer.tasks.baselines import Guess, commonest
from roformer.tasks.config import FinetuneDataConfig
from roformer.tasks.conll import Sentence, TaggingConfig, TagNames, conll_text, hub_tag_names, read_splits
from roformer.tasks.tagging_metrics import (
    ENTITY_PREFIXES,
    classification_report,
    has_entities,
    split_tag,
    tag_report,
    tag_scores,
    token_accuracy,
)

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

OUTSIDE = "O"  # the tag of words in no entity; also the prediction of words the model cannot see
SCHEME_PREFIXES = {"IOB1": ("B", "I"), "IOB2": ("B", "I"), "IOBES": ENTITY_PREFIXES, "auto": ENTITY_PREFIXES}
ENTITY_METRICS = ("f1", "precision", "recall")  # entity-level: plain tags have none


# ----------------------------------------------------------------------------------------------------------------
# The label set and the scheme


def label_set(train: list[Sentence]) -> list[str]:
    """The training tags sorted by name, `O` first when present: the model's output ids."""
    found = sorted({tag for sentence in train for tag in sentence.tags or []})
    return [OUTSIDE, *(t for t in found if t != OUTSIDE)] if OUTSIDE in found else found


def off_scheme(labels: list[str], scheme: str) -> list[str]:
    """The labels whose prefix the scheme does not have (`E-X` in IOB2; `O` and tags without `-` always fit)."""
    if scheme == "none":
        return []
    prefixes = SCHEME_PREFIXES[scheme]
    return [t for t in labels if "-" in t and t != OUTSIDE and split_tag(t)[0] not in prefixes]


def marks_entities(labels: list[str], scheme: str, where: str) -> bool:
    """Whether the tags mark entities (scored by entity F1) or are plain tags (token accuracy): see the module.

    Raises:
        UserError: an entity scheme named for tags without entity prefixes, naming `where` (the training file).
    """
    if scheme == "none":
        return False
    found = has_entities(labels)
    if not found and scheme != "auto":
        shown = ", ".join(labels[:6]) + (", ..." if len(labels) > 6 else "")
        raise UserError(
            f"{where}: data.tagging.scheme is {scheme}, but no tag has a B-/I-/E-/S- prefix ({shown}): for plain "
            "tags (POS, IO tags) set data.tagging.scheme: none (or auto)"
        )
    return found


def selecting_metrics(metrics: list[str] | None, entities: bool) -> tuple[str, ...]:
    """data.metrics, or the default (entity F1, or token accuracy for plain tags).

    Raises:
        UserError: an entity-level metric asked of plain tags.
    """
    if metrics is None:
        return ("f1",) if entities else ("accuracy",)
    entity_level = [m for m in metrics if m in ENTITY_METRICS]
    if entity_level and not entities:
        raise UserError(
            f"data.metrics: {', '.join(entity_level)} are entity-level, and these tags mark no entities "
            "(data.tagging.scheme none): select by accuracy"
        )
    return tuple(metrics)


# ----------------------------------------------------------------------------------------------------------------
# Encoding: words into pieces, tags onto pieces


@dataclass
class EncodedTags(TokenRows):
    """A split tokenized: one row per sentence, ragged (padding happens per batch).

    Attributes:
        ids: Token ids of every row.
        types: Token types (all 0: one text).
        labels: The label id of every piece (IGNORE_INDEX: not trained).
        positions: For every word of the sentence, the position of its first piece (-1: none, cut off).
        gold: The gold tags of every word (the whole sentence), or None for an unlabelled split.
        index: The sentences' ids.
    """

    ids: list[list[int]]
    types: list[list[int]]
    labels: list[list[int]]
    positions: list[list[int]]
    gold: list[list[str]] | None
    index: list[str]

    @property
    def labelled(self) -> bool:
        """Whether the split has gold tags (dev always; test when its file has them: then it is scored too)."""
        return self.gold is not None


def continuation_tag(tag: str, entities: bool = True) -> str:
    """The tag of a word's pieces after the first with `label_all_tokens`: `I-X` inside an entity, else the tag.

    Plain tags (`entities` false) continue as themselves: `B-X` there is a tag of its own, not an entity's start.
    """
    prefix, kind = split_tag(tag)
    return f"I-{kind}" if entities and prefix in ENTITY_PREFIXES and kind else tag


def first_pieces(word_ids: list[int | None], words: int) -> list[int]:
    """For each of `words` words, the position of its first piece in `word_ids` (-1 where it has none)."""
    positions = [-1] * words
    for position, word in enumerate(word_ids):
        if word is not None and positions[word] < 0:
            positions[word] = position
    return positions


def piece_labels(
    word_ids: list[int | None],
    tags: list[str],
    label_ids: dict[str, int],
    label_all_tokens: bool,
    entities: bool = True,
) -> list[int]:
    """The label of every piece of a sentence.

    The word's tag on its first piece; `continuation_tag` on the others with `label_all_tokens`; IGNORE_INDEX
    elsewhere (specials, other pieces, tags outside the label set).
    """
    labels, previous = [], None
    for word in word_ids:
        if word is None:
            labels.append(IGNORE_INDEX)
        elif word != previous:
            labels.append(label_ids.get(tags[word], IGNORE_INDEX))
        elif label_all_tokens:
            labels.append(label_ids.get(continuation_tag(tags[word], entities), IGNORE_INDEX))
        else:
            labels.append(IGNORE_INDEX)
        previous = word
    return labels


def spelled_words(words: list[str], vocab: WordVocabulary | None) -> tuple[list[str], list[int]]:
    """The words a tokenizer reads and, for each, the sentence word it belongs to.

    A word-level tokenizer's (`vocab`) out-of-vocabulary words are spelled out in characters (roformer.data.tokenizer
    `spelled_out`), all of them pieces of their word; any other tokenizer reads the words as given.
    """
    if vocab is None:
        return words, list(range(len(words)))
    pieces, owners = [], []
    for i, word in enumerate(words):
        for piece, _, _ in spelled_out([(word, 0, len(word))], vocab):
            pieces.append(piece)
            owners.append(i)
    return pieces, owners


def encode_tagged(
    sentences: list[Sentence],
    tokenizer: Tokenizer,
    max_length: int,
    label_ids: dict[str, int],
    label_all_tokens: bool,
    entities: bool = True,
) -> EncodedTags:
    """Tokenize the words of every sentence and label the pieces (`piece_labels`).

    Rows hold at most `max_length` tokens with the specials; the words past that have no piece. A word-level Chinese
    tokenizer reads an out-of-vocabulary word in characters (`spelled_words`).
    """
    if not sentences:
        return EncodedTags([], [], [], [], None, [])
    vocab = word_vocabulary(tokenizer)
    spelled = [spelled_words(s.tokens, vocab) for s in sentences]
    out = tokenizer(
        [pieces for pieces, _ in spelled],
        is_split_into_words=True,
        truncation=True,
        max_length=max_length,
        return_token_type_ids=True,
    )
    labels, positions = [], []
    for i, (sentence, (_, owners)) in enumerate(zip(sentences, spelled)):
        word_ids = [None if w is None else owners[w] for w in out.word_ids(i)]
        positions.append(first_pieces(word_ids, len(sentence.tokens)))
        if sentence.tags is None:
            labels.append([IGNORE_INDEX] * len(word_ids))
        else:
            labels.append(piece_labels(word_ids, sentence.tags, label_ids, label_all_tokens, entities))
    labelled = sentences[0].tags is not None
    gold = [list(s.tags or []) for s in sentences] if labelled else None
    return EncodedTags(out["input_ids"], out["token_type_ids"], labels, positions, gold, [s.index for s in sentences])


def unseen_words(encoded: EncodedTags) -> tuple[int, int]:
    """Words without a piece to read: (cut off by max_length at a sentence's end, mapped to no piece before it)."""
    cut = lost = 0
    for positions in encoded.positions:
        seen = [i for i, p in enumerate(positions) if p >= 0]
        end = seen[-1] + 1 if seen else 0
        cut += len(positions) - end
        lost += sum(p < 0 for p in positions[:end])
    return cut, lost


# ----------------------------------------------------------------------------------------------------------------
# The fine-tuning task


class TaggingTask(HeadOutputs):
    """A token classification task with its splits read: the fine-tuning task of `type: token_classification`.

    Args:
        data: The data: section (its `tagging:` settings).
        splits: Its sentences per split: `train`, `dev` (labelled) and optionally `test`.
        labels: The label set, in id order (see the module's docstring).
        entities: Whether the tags mark entities (entity F1 selects) or are plain tags (token accuracy).
    """

    architecture = "token_classification"
    micro_batch_loss = "token classification's loss is a mean over a micro-batch's scored tokens"

    def __init__(
        self, data: FinetuneDataConfig, splits: dict[str, list[Sentence]], labels: list[str], entities: bool = True
    ) -> None:
        super().__init__(data, default_metrics=selecting_metrics(data.metrics, entities))
        self.splits, self.labels, self.entities = splits, labels, entities
        self.tagging = data.tagging or TaggingConfig()
        self.num_labels = len(labels)
        self.label_names = list(labels)
        self.label_ids = {tag: i for i, tag in enumerate(labels)}
        self.outside_id = self.label_ids.get(OUTSIDE, 0)
        self.test_splits = ["test"] if "test" in splits else []

    def model_files(self, eval_batch_size: int) -> dict[str, str]:
        """`labels.json`: the head's outputs by name, so that best/ is usable without the run's config."""
        return labels_file(self.label_names)

    @classmethod
    def from_config(cls, data: FinetuneDataConfig) -> TaggingTask:
        """The task of a data: section, its splits read, cut to max_train_examples / max_eval_examples.

        Raises:
            UserError: unreadable data or bad rows (naming file and line), a training or dev split without tags.
        """
        tagging = data.tagging or TaggingConfig()
        names = data.labels
        if names is None and data.source == "hub":
            names = hub_tag_names(data.hub_name, data.hub_config, tagging.tags_column)
        splits = read_splits(data, TagNames(names, closed=data.labels is not None))
        labels = names if names is not None else label_set(splits["train"])
        entities = marks_entities(list(labels), tagging.scheme, splits["train"][0].where.rpartition(":")[0])
        _warn_about_labels(splits, labels, tagging.scheme)
        if data.max_train_examples is not None:
            splits["train"] = splits["train"][: data.max_train_examples]
        if data.max_eval_examples is not None:
            splits = {k: v if k == "train" else v[: data.max_eval_examples] for k, v in splits.items()}
        return cls(data, splits, list(labels), entities)

    def encode(self, tokenizer: Tokenizer, max_length: int, model: ModelFacts = NO_FACTS) -> dict[str, EncodedTags]:
        """Every split tokenized word by word, cut to `max_length` tokens (cut-off words counted in a warning)."""
        encoded = {}
        for name, sentences in self.splits.items():
            encoded[name] = encode_tagged(
                sentences, tokenizer, max_length, self.label_ids, self.tagging.label_all_tokens, self.entities
            )
            cut, lost = unseen_words(encoded[name])
            if cut or lost:
                logger.warning(
                    "%s %s: %d words cut off by max_length %d and %d mapped to no token: predicted %s",
                    self.name,
                    name,
                    cut,
                    max_length,
                    lost,
                    self.labels[self.outside_id],
                    extra=MAIN_ONLY,
                )
        return encoded

    def collate(self, split: EncodedTags, rows: list[int], pad_id: int, cap: int) -> dict[str, torch.Tensor]:
        """The padded batch of `rows`, with `labels` (B, T) padded with IGNORE_INDEX when the split has tags."""
        length = self.padded_length(max(len(split.ids[r]) for r in rows), cap)
        batch = pad_rows(split.ids, split.types, rows, pad_id, length)
        if split.labelled:
            labels = torch.full((len(rows), length), IGNORE_INDEX, dtype=torch.long)
            for i, r in enumerate(rows):
                labels[i, : len(split.labels[r])] = torch.tensor(split.labels[r])
            batch["labels"] = labels
        return batch

    def predictions(self, logits: torch.Tensor, split: EncodedTags, rows: list[int]) -> list[list[int]]:
        """Per row, the predicted tag id of every word: the argmax at its first piece (`O` where it has none)."""
        best = logits.argmax(-1).cpu().tolist()
        return [[best[i][p] if p >= 0 else self.outside_id for p in split.positions[r]] for i, r in enumerate(rows)]

    def evaluate(self, split: EncodedTags, predictions: list[list[int]]) -> dict[str, float]:
        """Entity-level precision, recall and f1 and token accuracy (plain tags: accuracy), and `score`.

        Every word of the split counts; `score` is the mean of the selecting metrics (`self.metrics`).

        Raises:
            ValueError: the split has no gold tags.
        """
        if split.gold is None:
            raise ValueError("an unlabelled split cannot be evaluated")
        predicted = self.tag_names(predictions)
        if self.entities:
            scores = tag_scores(split.gold, predicted)
        else:
            scores = {"accuracy": token_accuracy(split.gold, predicted)}
        return with_score(scores, self.metrics)

    def trivial_guess(self, train: EncodedTags) -> Guess | None:
        """`O` for every word (entity tags: nothing found); plain tags: the commonest training tag everywhere."""
        if self.entities:
            tag, kind = self.outside_id, "all_outside"
        elif train.gold:
            tag, kind = self.label_ids[commonest([t for row in train.gold for t in row])], "commonest_tag"
        else:
            return None
        return Guess(kind, lambda split: [[tag] * len(words) for words in split.positions])

    def tag_names(self, predictions: list[list[int]]) -> list[list[str]]:
        """Predicted tag ids as names."""
        return [[self.labels[i] for i in row] for row in predictions]

    def write_predictions(
        self, folder: Path, encoded: dict[str, EncodedTags], predictions: dict[str, list[list[int]]]
    ) -> None:
        """`<split>.conll` for every dev and test split, and `<split>.report.json` when labelled.

        The report scores each entity type (seqeval's report), or each tag over words for plain tags.
        """
        for split in self.dev_splits + self.test_splits:
            predicted = self.tag_names(predictions[split])
            atomic_write_text(folder / f"{split}.conll", conll_text(self.splits[split], predicted))
            gold = encoded[split].gold
            if gold is not None:
                scores = classification_report(gold, predicted) if self.entities else tag_report(gold, predicted)
                report = json.dumps(scores, indent=2)
                atomic_write_text(folder / f"{split}.report.json", report + "\n")

    def write_submission(self, run_folder: Path, submission: Path) -> None:
        """Copy the selected run's test predictions (`<split>.conll`) into `submission` (nothing without a test)."""
        for split in self.test_splits:
            atomic_copy(run_folder / f"{split}.conll", submission / f"{split}.conll")


def _warn_about_labels(splits: dict[str, list[Sentence]], labels: list[str], scheme: str) -> None:
    """Warn about tags the model cannot predict (dev or test tags outside the label set) and off-scheme labels."""
    known = set(labels)
    for name, sentences in splits.items():
        unknown = sorted({t for s in sentences for t in s.tags or [] if t not in known})
        if unknown:
            logger.warning("%s: tags not in the label set (never predicted): %s", name, ", ".join(unknown))
    odd = off_scheme(labels, scheme)
    if odd:
        logger.warning("labels %s do not fit data.tagging.scheme %s", ", ".join(odd), scheme)


SPECS = (
    TaskSpec(
        name="token_classification",
        summary="a tag per word: NER (entity F1), POS and other plain tags (token accuracy)",
        builder=TaggingTask.from_config,
        architecture="token_classification",
        metrics=("f1", "precision", "recall", "accuracy"),
        default_metrics=(),  # entity F1, or token accuracy for plain tags: told from the data
        predictions="dev.conll",
        docs="task-ner.md",
        section="tagging",
        settings=TaggingConfig,
        capabilities=(Publishes,),
    ),
)
