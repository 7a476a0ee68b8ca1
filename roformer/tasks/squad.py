"""SQuAD-format questions for `type: question_answering`: files and hub splits read, answers located, splits checked.

SQuAD-format JSON files (`data[].paragraphs[].{context, qas[].{id, question, answers[].{text, answer_start},
is_impossible}}`) or a hub dataset with SQuAD's columns (id, context, question, answers{text, answer_start}).
`answer_start` is not always right (CMRC 2018 dev: -1 for 193 free-form answers, off by 1-2 characters for 7): an
answer whose text is not at its start is moved to the occurrence of the text nearest to it, and an answer whose text
is nowhere in the context is kept for the metric (which reads texts only) but not trained on; each split's counts
are one warning line. A training question none of whose answers is in its context is an error naming the file and
the question: nothing could be learnt from it, and the file is likely not what it claims to be. Duplicate question
ids in a split, and (SQuAD v1.1) a question without answers, are errors too. With `data.qa.metric: cmrc2018` the ids
are stripped of outer whitespace, as CMRC 2018's official script reads them (it looks the stripped ids up in the
predictions file); the SQuAD scripts take them as they are, and so do we.

roformer.tasks.qa is the task that cuts the questions' contexts into windows and decodes the answers.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roformer.errors import UserError
from roformer.tasks.base import cut_to_limits
from roformer.tasks.config import FinetuneDataConfig
from roformer.tasks.records import HUB_SPLITS, Record, read_hub_split, read_text

logger = logging.getLogger(__name__)


@dataclass
class Question:
    """One question about a context.

    Attributes:
        id: The question's id (the key of the predictions file).
        question: The question.
        context: The text that holds the answer.
        answers: The gold answer texts, as given (the metrics read them); empty for an unanswerable question or an
            unlabelled test file.
        spans: The character spans `(start, end)` of the answers found in the context (training targets: the first).
        impossible: SQuAD v2.0: the context does not answer the question.
    """

    id: str
    question: str
    context: str
    answers: list[str]
    spans: list[tuple[int, int]] = field(default_factory=list)
    impossible: bool = False


@dataclass
class AnswerCounts:
    """What locating a split's answers found.

    Attributes:
        relocated: Answers whose `answer_start` did not point at their text: moved to its nearest occurrence.
        absent: Answers whose text is nowhere in their context (kept for the metric, not trained on).
    """

    relocated: int = 0
    absent: int = 0


def locate(context: str, text: str, start: int) -> int | None:
    """Where `text` starts in `context`: `start` when it is there, else its occurrence nearest to `start`.

    Returns:
        The character offset, or None when the text is empty or not in the context.
    """
    if not text:
        return None
    if 0 <= start and context.startswith(text, start):
        return start
    found, at = [], context.find(text)
    while at >= 0:
        found.append(at)
        at = context.find(text, at + 1)
    return min(found, key=lambda i: (abs(i - start), i)) if found else None


def make_question(
    qid: str, question: str, context: str, answers: list[tuple[str, int]], impossible: bool, counts: AnswerCounts
) -> Question:
    """A question with its answers located in the context (see `locate`), counting the moved and the missing ones."""
    spans = []
    for text, start in answers:
        found = locate(context, text, start)
        if found is None:
            counts.absent += 1
            continue
        counts.relocated += int(found != start)
        spans.append((found, found + len(text)))
    texts = [] if impossible else [text for text, _ in answers]
    return Question(qid, question, context, texts, spans if not impossible else [], impossible)


def check_questions(
    questions: list[Question], where: str, split: str, version_2: bool, stripped_ids: bool = False
) -> None:
    """Unique ids; answers in labelled splits (unless v2.0 unanswerable); a located answer to train on.

    Args:
        questions: A split's questions.
        where: The split's source (a file, or a hub dataset and split), for the messages.
        split: `train`, `dev` or `test` (a test split needs no answers).
        version_2: SQuAD v2.0: a question may be unanswerable.
        stripped_ids: The ids were stripped of outer whitespace (`strip_ids`): the message of a duplicate says so.

    Raises:
        UserError: naming `where` (the file) and the question.
    """
    seen: set[str] = set()
    for q in questions:
        if q.id in seen:
            how = " (once stripped of outer spaces, as cmrc2018's script reads ids)" if stripped_ids else ""
            raise UserError(f"{where}: question id {q.id!r} appears twice{how}")
        seen.add(q.id)
        if split == "test":
            continue
        if not q.answers and not (version_2 and q.impossible):
            hint = "" if version_2 else " (SQuAD v2.0 data? set data.qa.version_2: true)"
            raise UserError(f"{where}: question {q.id!r} has no answer{hint}")
        if split == "train" and q.answers and not q.spans:
            raise UserError(f"{where}: question {q.id!r}: no answer text occurs in its context ({q.answers[0]!r})")


def strip_ids(questions: list[Question]) -> None:
    """Strip every question's id of outer whitespace, in place, as CMRC 2018's official script reads the gold ids.

    That script looks the stripped ids up in the predictions file, so the file written from these ids is found.
    """
    for q in questions:
        q.id = q.id.strip()


def read_squad(path: str | Path) -> tuple[list[Question], AnswerCounts]:
    """Every question of a SQuAD-format JSON file, its answers located (the file's order).

    Raises:
        UserError: a missing or unreadable file, not JSON or not SQuAD's layout, naming the file and where in it.
    """
    path = Path(path)
    text = read_text(path)
    try:
        squad = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg})") from None
    if not isinstance(squad, dict) or not isinstance(squad.get("data"), list):
        raise UserError(f"{path}: not SQuAD format (expected an object whose `data` is a list of articles)")
    questions, counts = [], AnswerCounts()
    for i, article in enumerate(squad["data"]):
        for j, paragraph in enumerate(_list(article, "paragraphs", f"{path}: data[{i}]")):
            where = f"{path}: data[{i}].paragraphs[{j}]"
            context = _string(paragraph, "context", where)
            for k, qa in enumerate(_list(paragraph, "qas", where)):
                questions.append(_squad_question(qa, context, f"{where}.qas[{k}]", str(path), counts))
    return questions, counts


def _squad_question(qa: Any, context: str, where: str, path: str, counts: AnswerCounts) -> Question:
    """One `qas` entry of a SQuAD file."""
    if not isinstance(qa, dict) or "id" not in qa:
        raise UserError(f"{where}: a question needs an `id`")
    qid = str(qa["id"])
    named = f"{path}: question {qid!r}"
    answers = []
    for answer in _list(qa, "answers", named, required=False):
        if not isinstance(answer, dict) or not isinstance(answer.get("text"), str):
            raise UserError(f"{named}: an answer needs a `text` string")
        start = answer.get("answer_start", -1)
        answers.append((answer["text"], start if isinstance(start, int) and not isinstance(start, bool) else -1))
    impossible = bool(qa.get("is_impossible", False))
    return make_question(qid, _string(qa, "question", named), context, answers, impossible, counts)


def _list(parent: Any, key: str, where: str, required: bool = True) -> list[Any]:
    value = parent.get(key, None if required else []) if isinstance(parent, dict) else None
    if not isinstance(value, list):
        raise UserError(f"{where}: `{key}` must be a list")
    return value


def _string(parent: dict[str, Any], key: str, where: str) -> str:
    value = parent.get(key)
    if not isinstance(value, str):
        raise UserError(f"{where}: `{key}` must be a string")
    return value


def read_hub_questions(name: str, config: str | None, split: str) -> tuple[list[Question], AnswerCounts]:
    """Every question of a hub split with SQuAD's columns (id, context, question, answers{text, answer_start}).

    A question without answer texts is unanswerable (squad_v2).
    """
    counts = AnswerCounts()
    return [_hub_question(r, counts) for r in read_hub_split(name, config, split)], counts


def _hub_question(record: Record, counts: AnswerCounts) -> Question:
    row = record.fields
    try:
        answers = row.get("answers") or {"text": [], "answer_start": []}
        pairs = list(zip(answers["text"], answers["answer_start"]))
        return make_question(str(row["id"]), row["question"], row["context"], pairs, not pairs, counts)
    except (KeyError, TypeError):
        raise UserError(f"{record.where}: expected SQuAD's columns id, context, question, answers") from None


def load_splits(data: FinetuneDataConfig) -> dict[str, list[Question]]:
    """The questions of every split present (train, dev, and test when given), checked, counts logged.

    For the cmrc2018 metric the ids are stripped of outer whitespace first (`strip_ids`).

    Raises:
        UserError: unreadable or malformed files, bad questions (see `check_questions`), an empty training split.
    """
    version_2 = data.qa.version_2 if data.qa else False
    stripped = data.qa is not None and data.qa.metric == "cmrc2018"  # SQuAD's scripts take the ids as they are
    if data.source == "hub":
        hub_splits = {split: HUB_SPLITS[split] for split in ("train", "dev")}  # a hub QA set's test has no answers
        sources = {split: f"{data.hub_name}:{hub}" for split, hub in hub_splits.items()}
        read = {split: read_hub_questions(data.hub_name, data.hub_config, hub) for split, hub in hub_splits.items()}
    else:
        files = {"train": data.train_file, "dev": data.validation_file, "test": data.test_file}
        sources = {split: str(path) for split, path in files.items() if path}
        read = {split: read_squad(path) for split, path in files.items() if path}
    splits = {}
    for split, (questions, counts) in read.items():
        if stripped:
            strip_ids(questions)
        check_questions(questions, sources[split], split, version_2, stripped)
        if counts.relocated or counts.absent:
            logger.warning(
                "%s: %d answers re-located (answer_start did not point at the text: its nearest occurrence is used), "
                "%d answer texts not in their context (scored, not trained on)",
                sources[split],
                counts.relocated,
                counts.absent,
            )
        splits[split] = questions
    splits = cut_to_limits(splits, data.max_train_examples, data.max_eval_examples)  # by questions
    if not splits["train"]:
        raise UserError(f"{sources['train']}: the training split has no questions")
    return splits
