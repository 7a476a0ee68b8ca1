"""Extractive question answering (SQuAD, CMRC 2018): questions as context windows, answers by n-best span decoding.

`QATask` is the fine-tuning task (roformer.tasks.base.FinetuneTask) of `type: question_answering`; its settings are
`data.qa` (roformer.tasks.qa.QAConfig). The model reads `[CLS] question [SEP] context window [SEP]` and gives every
token a start and an end logit (roformer.model.model.QuestionAnswering).

Data: SQuAD-format JSON files or a hub dataset with SQuAD's columns, read and checked by roformer.tasks.squad (where
answers whose `answer_start` is off are located, and what is an error).

Windows. As HF's run_qa (`prepare_train_features`): the question first (cut to `max_query_length` tokens), the context
second, cut into windows of the room left in `max_length`, consecutive windows sharing `doc_stride` tokens. Where
max_length is short (a model pretrained on short blocks caps it), a question keeps at most half the room and windows
share at most half their tokens, so that they always move on (HF's tokenizers refuse such a stride). A training
window's targets are the first and last token of the question's first answer, or [CLS] (position 0) when the answer
is not wholly inside the window or the question has none (SQuAD v2.0). Tokens keep their characters in the original
context (with `data.jieba`, through roformer.data.segment), so a predicted span is cut from the context as written.

Decoding. As HF's `postprocess_qa_predictions`: per window the `n_best` best start and end tokens of the context, the
pairs with end >= start and at most `max_answer_length` tokens, scored start + end logit; per question the best pair
over all its windows. SQuAD v2.0: no answer ("") when the [CLS] score (the lowest over the windows) beats the best
span's by more than `null_threshold`. One difference: tokens outside the context are excluded before the `n_best` are
taken (HF takes them first, so question tokens can crowd the context out of its candidates).

Files: `<split>_predictions.json` ({question id: answer text}: what the official scripts read) and
`<split>_nbest.json` (the best few answers with their probabilities); the submission is the test predictions.
"""

from __future__ import annotations

import json
import logging
import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from roformer.config import check_types
from roformer.data.segment import TokenizedText, tokenize_texts
from roformer.errors import ConfigError, UserError
from roformer.files import atomic_copy, atomic_write_text
from roformer.tasks import qa_metrics
from roformer.tasks.base import NO_FACTS, HeadOutputs, ModelFacts, TaskSpec, TokenRows, pad_rows, with_score
from roformer.tasks.config import FinetuneDataConfig
from roformer.tasks.squad import Question, load_splits

if TYPE_CHECKING:
    from roformer.data.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

PREDICTIONS_FILE = "{split}_predictions.json"
NBEST_FILE = "{split}_nbest.json"
NBEST_WRITTEN = 5  # answers per question in <split>_nbest.json


# ----------------------------------------------------------------------------------------------------------------
# Settings


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


# ----------------------------------------------------------------------------------------------------------------
# Windows


@dataclass
class QAEncoded(TokenRows):
    """A split as model rows: one row per window of a question's context (`[CLS] question [SEP] window [SEP]`).

    Attributes:
        questions: The split's questions.
        ids: Token ids of every row.
        types: Token types (0: [CLS], the question and its [SEP]; 1: the window and the last [SEP]).
        question_of: Each row's question (an index into `questions`).
        offsets: Each token's characters in the context, None outside the context (evaluated splits only).
        starts: Training: the answer's first token in each row, 0 ([CLS]) when the row does not hold it.
        ends: Training: the answer's last token, 0 likewise.
        labelled: Whether the questions have answers to score (dev always; test when its file has them).
    """

    questions: list[Question]
    ids: list[list[int]] = field(default_factory=list)
    types: list[list[int]] = field(default_factory=list)
    question_of: list[int] = field(default_factory=list)
    offsets: list[list[tuple[int, int] | None]] | None = None
    starts: list[int] | None = None
    ends: list[int] | None = None
    labelled: bool = True


def windows(tokens: int, room: int, overlap: int) -> list[tuple[int, int]]:
    """The `[start, end)` token ranges of a context's windows, consecutive ones sharing `overlap` tokens.

    Each holds `room` tokens (the last may hold fewer): HF tokenizers' overflowing windows with `stride=overlap`.
    """
    spans, start = [], 0
    while True:
        spans.append((start, min(start + room, tokens)))
        if start + room >= tokens:
            return spans
        start += room - overlap


def question_room(max_length: int, qa: QAConfig) -> int:
    """The most question tokens: `max_query_length`, but at most half of what [CLS] and two [SEP] leave.

    The context gets the rest: a window of max_length - 3 - question tokens.
    """
    return max(1, min(qa.max_query_length, (max_length - 3) // 2))


def window_overlap(room: int, doc_stride: int) -> int:
    """Tokens that consecutive windows of `room` context tokens share: doc_stride, but at most half a window."""
    return min(doc_stride, room // 2)


def answer_tokens(offsets: list[tuple[int, int]], span: tuple[int, int]) -> tuple[int, int] | None:
    """The first and last token (indices into `offsets`) of a character span, None when the tokens miss part of it.

    `offsets` are a window's context tokens, in order.
    """
    start, end = span
    if not offsets or offsets[0][0] > start or offsets[-1][1] < end:
        return None
    first = bisect_right([e for _, e in offsets], start)  # the first token ending after the span's start
    last = bisect_left([s for s, _ in offsets], end) - 1  # the last token starting before its end
    return (first, last) if first <= last else None


def check_template(tokenizer: Tokenizer) -> None:
    """Rows are built as `[CLS] A [SEP] B [SEP]` with types 0/1: the tokenizer's own pair template must be that.

    Raises:
        UserError: another template.
    """
    a, b = (tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("a", "b"))
    pair = tokenizer("a", "b", return_token_type_ids=True)
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
    if pair["input_ids"] != [cls, *a, sep, *b, sep] or pair["token_type_ids"] != types:
        raise UserError("question answering needs a BERT-style tokenizer: [CLS] question [SEP] context [SEP]")


def encode_split(
    questions: list[Question], tokenizer: Tokenizer, max_length: int, qa: QAConfig, jieba: bool, training: bool
) -> QAEncoded:
    """The rows of a split's questions: every window of each context, with answer targets or character offsets.

    Args:
        questions: The questions.
        tokenizer: A BERT-style fast tokenizer.
        max_length: Tokens per row, special tokens included.
        qa: The data.qa section (max_query_length, doc_stride).
        jieba: Cut texts into words with jieba first (roformer.data.segment).
        training: Give each row its answer's tokens (`starts`, `ends`); else each token's characters (`offsets`).
    """
    check_template(tokenizer)
    labelled = all(q.answers or q.impossible for q in questions)
    encoded = QAEncoded(questions, labelled=labelled)
    if training:
        encoded.starts, encoded.ends = [], []
    else:
        encoded.offsets = []
    limit = question_room(max_length, qa)
    contexts = list(dict.fromkeys(q.context for q in questions))  # each context once: a paragraph has many questions
    context_tokens = dict(zip(contexts, tokenize_texts(tokenizer, contexts, jieba)))
    question_tokens = tokenize_texts(tokenizer, [q.question for q in questions], jieba)
    cut = sum(len(t.ids) > limit for t in question_tokens)
    if cut:
        logger.info("%d questions cut to %d tokens", cut, limit)
    specials = (tokenizer.cls_token_id, tokenizer.sep_token_id)
    narrowed = 0
    for index, (q, asked) in enumerate(zip(questions, question_tokens)):
        room = max_length - 3 - len(asked.ids[:limit])
        overlap = window_overlap(room, qa.doc_stride)
        narrowed += overlap < qa.doc_stride
        _add_rows(encoded, index, asked.ids[:limit], context_tokens[q.context], room, overlap, specials)
    if narrowed:
        logger.warning(
            "data.qa.doc_stride %d is over half the %d-token windows of %d questions: theirs overlap by half",
            qa.doc_stride,
            max_length,
            narrowed,
        )
    return encoded


def _add_rows(
    encoded: QAEncoded,
    index: int,
    asked: list[int],
    context: TokenizedText,
    room: int,
    overlap: int,
    specials: tuple[int, int],
) -> None:
    """The rows of one question: one per window of `room` context tokens, consecutive ones sharing `overlap`."""
    q, (cls, sep) = encoded.questions[index], specials
    before = len(asked) + 2  # [CLS] question [SEP]
    for start, end in windows(len(context.ids), room, overlap):
        encoded.ids.append([cls, *asked, sep, *context.ids[start:end], sep])
        encoded.types.append([0] * before + [1] * (end - start + 1))
        encoded.question_of.append(index)
        if encoded.offsets is not None:
            encoded.offsets.append([None] * before + list(context.offsets[start:end]) + [None])
        if encoded.starts is not None and encoded.ends is not None:
            found = answer_tokens(context.offsets[start:end], q.spans[0]) if q.spans else None
            encoded.starts.append(before + found[0] if found else 0)
            encoded.ends.append(before + found[1] if found else 0)


# ----------------------------------------------------------------------------------------------------------------
# Decoding

Candidate = tuple[float, int, int]  # score (start + end logit), the span's first and past-last character
RowPrediction = tuple[float, list[Candidate]]  # a row's null score ([CLS] start + end) and its best spans


def best_spans(
    logits: torch.Tensor, offsets: list[list[tuple[int, int] | None]], n_best: int, max_answer_length: int
) -> list[RowPrediction]:
    """The null score and the `n_best` best valid spans of every row of a batch.

    Args:
        logits: (B, T, 2) start and end logits.
        offsets: Each row's token characters in the context (None outside it); rows may be shorter than T.
        n_best: Start and end candidates per row (the best of the context's tokens), and spans kept.
        max_answer_length: The longest span, in tokens.
    """
    logits = logits.detach().float().cpu()
    rows, length = logits.shape[:2]
    in_context = torch.zeros(rows, length, dtype=torch.bool)
    for i, row in enumerate(offsets):
        in_context[i, [p for p, o in enumerate(row) if o is not None]] = True
    starts = logits[..., 0].masked_fill(~in_context, -math.inf)
    ends = logits[..., 1].masked_fill(~in_context, -math.inf)
    k = min(n_best, length)
    start_values, start_index = starts.topk(k, dim=1)
    end_values, end_index = ends.topk(k, dim=1)
    tokens = end_index[:, None, :] - start_index[:, :, None] + 1  # (B, k starts, k ends)
    scores = start_values[:, :, None] + end_values[:, None, :]
    scores = scores.masked_fill((tokens < 1) | (tokens > max_answer_length), -math.inf).flatten(1)
    values, pairs = scores.topk(min(n_best, k * k), dim=1)
    null = (logits[:, 0, 0] + logits[:, 0, 1]).tolist()
    out = []
    for i, (row_values, row_pairs) in enumerate(zip(values.tolist(), pairs.tolist())):
        first, last = start_index[i].tolist(), end_index[i].tolist()
        spans = []
        for value, pair in zip(row_values, row_pairs):
            if value == -math.inf:  # sorted: the rest are invalid too
                break
            s, e = offsets[i][first[pair // k]], offsets[i][last[pair % k]]
            spans.append((value, s[0], e[1]))  # type: ignore[index]  # in the context: not None
        out.append((null[i], spans))
    return out


@dataclass
class Decoded:
    """A question's answer and the best few with their probabilities (softmax over the n-best scores)."""

    text: str
    nbest: list[dict[str, Any]]


def decode(split: QAEncoded, predictions: list[RowPrediction], qa: QAConfig) -> dict[str, Decoded]:
    """Every question's answer: the best span over its rows (v2.0: "" when the null score wins by null_threshold)."""
    spans: list[dict[tuple[int, int], float]] = [{} for _ in split.questions]
    null = [math.inf] * len(split.questions)
    for row, (null_score, candidates) in enumerate(predictions):
        index = split.question_of[row]
        null[index] = min(null[index], null_score)
        for score, start, end in candidates:  # a span seen by two overlapping windows: its best score
            spans[index][start, end] = max(score, spans[index].get((start, end), -math.inf))
    return {q.id: _decide(q.context, spans[i], null[i], qa) for i, q in enumerate(split.questions)}


def _decide(context: str, spans: dict[tuple[int, int], float], null: float, qa: QAConfig) -> Decoded:
    """One question's answer from its best score per span and its lowest null score."""
    ranked = sorted(spans.items(), key=lambda item: -item[1])[: qa.n_best]
    answers = [(context[s:e], score) for (s, e), score in ranked]
    if qa.version_2:
        answers.append(("", null))
        answers.sort(key=lambda a: -a[1])
    best = ranked[0] if ranked else None
    if best is None or (qa.version_2 and null - best[1] > qa.null_threshold):
        text = ""
    else:
        text = context[best[0][0] : best[0][1]]
    top = max((score for _, score in answers), default=0.0)
    weights = [math.exp(score - top) for _, score in answers]  # a softmax over all n-best, shifted: no overflow
    total = sum(weights)
    nbest = [
        {"text": t, "probability": w / total, "score": score} for (t, score), w in zip(answers[:NBEST_WRITTEN], weights)
    ]
    return Decoded(text, nbest)


# ----------------------------------------------------------------------------------------------------------------
# The fine-tuning task


class QATask(HeadOutputs):
    """Extractive question answering on SQuAD-format data: the task of `type: question_answering`.

    Args:
        data: The data: section (the shipped configs' `task` is `squad` or `cmrc2018`): its `qa:` settings, and
            `jieba` (cut texts into words with jieba before WordPiece). `data.metrics`: exact_match and/or f1.
        splits: Its questions per split (roformer.tasks.squad.load_splits).
    """

    architecture = "question_answering"
    num_labels = 2  # start and end: the head's outputs, whatever the config says

    def __init__(self, data: FinetuneDataConfig, splits: dict[str, list[Question]]) -> None:
        super().__init__(data)
        self.splits, self.qa, self.jieba = splits, data.qa or QAConfig(), data.jieba
        self.test_splits = [s for s in ("test",) if s in splits]

    @classmethod
    def from_config(cls, data: FinetuneDataConfig) -> QATask:
        """The task of a data: section, its splits read and checked.

        Raises:
            ConfigError: the cmrc2018 metric with SQuAD v2.0 (it has no unanswerable questions).
        """
        qa = data.qa or QAConfig()
        if qa.metric == "cmrc2018" and qa.version_2:
            raise ConfigError("data.qa.metric cmrc2018 has no unanswerable questions: use version_2: false")
        return cls(data, load_splits(data))

    def encode(self, tokenizer: Tokenizer, max_length: int, model: ModelFacts = NO_FACTS) -> dict[str, QAEncoded]:
        """Every split as windows of at most `max_length` tokens; training rows with their answer's tokens."""
        return {
            split: encode_split(questions, tokenizer, max_length, self.qa, self.jieba, training=split == "train")
            for split, questions in self.splits.items()
        }

    def collate(self, split: QAEncoded, rows: list[int], pad_id: int, cap: int) -> dict[str, torch.Tensor]:
        """The padded batch of `rows`; training rows also `start_positions` and `end_positions`."""
        batch = pad_rows(
            split.ids, split.types, rows, pad_id, self.padded_length(max(len(split.ids[r]) for r in rows), cap)
        )
        if split.starts is not None and split.ends is not None:
            batch["start_positions"] = torch.tensor([split.starts[r] for r in rows])
            batch["end_positions"] = torch.tensor([split.ends[r] for r in rows])
        return batch

    def predictions(self, logits: torch.Tensor, split: QAEncoded, rows: list[int]) -> list[RowPrediction]:
        """Each row's null score and its n-best spans (character offsets in the context, with their scores)."""
        if split.offsets is None:
            raise ValueError("the training split has no offsets to predict with")
        offsets = [split.offsets[r] for r in rows]
        return best_spans(logits, offsets, self.qa.n_best, self.qa.max_answer_length)

    def answers(self, split: QAEncoded, predictions: list[RowPrediction]) -> dict[str, Decoded]:
        """Every question's decoded answer (see `decode`)."""
        return decode(split, predictions, self.qa)

    def evaluate(self, split: QAEncoded, predictions: list[RowPrediction]) -> dict[str, float]:
        """data.qa.metric's official metrics (SQuAD v1.1, v2.0 or CMRC 2018) as fractions, and `score`.

        `score` is the mean of those data.metrics names (exact_match and f1 by default).
        """
        texts = {qid: decoded.text for qid, decoded in self.answers(split, predictions).items()}
        gold = {q.id: q.answers for q in split.questions}
        if self.qa.metric == "cmrc2018":
            metrics = qa_metrics.cmrc2018(texts, gold)
        else:
            metrics = (qa_metrics.squad_v2 if self.qa.version_2 else qa_metrics.squad_v1)(texts, gold)
        # the official scripts print percent; results.json holds fractions, as every other task's metrics
        fractions = {name: value / 100 for name, value in metrics.items()}
        return with_score(fractions, self.metrics)

    def write_predictions(
        self, folder: Path, encoded: dict[str, QAEncoded], predictions: dict[str, list[RowPrediction]]
    ) -> None:
        """`<split>_predictions.json` ({id: answer}, the official scripts' input) and `<split>_nbest.json`."""
        for split, rows in predictions.items():
            answers = self.answers(encoded[split], rows)
            texts = {qid: a.text for qid, a in answers.items()}
            nbest = {qid: a.nbest for qid, a in answers.items()}
            atomic_write_text(folder / PREDICTIONS_FILE.format(split=split), _json(texts))
            atomic_write_text(folder / NBEST_FILE.format(split=split), _json(nbest))

    def write_submission(self, run_folder: Path, submission: Path) -> None:
        """The selected run's test predictions, when there is a test split."""
        for split in self.test_splits:
            name = PREDICTIONS_FILE.format(split=split)
            atomic_copy(run_folder / name, submission / name)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=1) + "\n"


SPECS = (
    TaskSpec(
        name="question_answering",
        summary="extractive question answering (SQuAD v1.1/v2.0, CMRC 2018): a span of the context",
        builder=QATask.from_config,
        architecture="question_answering",
        metrics=("exact_match", "f1"),
        default_metrics=("exact_match", "f1"),
        predictions="dev_predictions.json",
        docs="task-qa.md",
        section="qa",
        settings=QAConfig,
    ),
)
