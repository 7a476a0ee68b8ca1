"""Extractive QA metrics, as their official scripts compute them: SQuAD v1.1, SQuAD v2.0 and CMRC 2018.

Every metric takes the predictions (`{question id: answer text}`) and the gold answers of every question
(`{question id: [texts]}`), and returns percentages (0-100) like the official scripts: `exact_match` and `f1`, the
maximum over a question's gold answers, averaged over all gold questions. A question without a prediction scores 0 and
stays in the denominator, as SQuAD v1.1's and CMRC 2018's scripts do (SQuAD v2.0's script stops with a KeyError there).

- SQuAD v1.1 (`squad_v1`): answers normalised (lower-case, ASCII punctuation and the articles a/an/the removed,
  whitespace collapsed); F1 over the bag of whitespace tokens.
- SQuAD v2.0 (`squad_v2`): the same normalisation; a question without answers has the gold answer "" (only an empty
  prediction scores); an empty prediction or gold gives F1 1 if both are empty, else 0. Also the `HasAns_` and
  `NoAns_` breakdown, where such questions exist. The official script's `exact` is our `exact_match`.
- CMRC 2018 (`cmrc2018`, the official `cmrc2018_evaluate.py`, v5 "special", ported from Python 2): text is
  lower-cased and stripped, then split into CJK characters (U+4E00-U+9FA5) one by one and runs of everything else,
  which NLTK tokenizes; the listed punctuation is removed first. F1 is over the longest common *contiguous* run of
  tokens. EM compares the lower-cased, stripped texts with that punctuation removed. `average` = (EM + F1) / 2.
  The gold question ids are stripped of outer whitespace before the predictions are looked up (their keys are
  not); the SQuAD scripts take ids as they are.

CMRC 2018's tokenizer. The official script calls `nltk.word_tokenize`, which is Punkt sentence splitting (a trained
model, `punkt_tab`, downloaded separately: it cannot be fetched here) followed by `NLTKWordTokenizer` on each sentence.
We call `NLTKWordTokenizer` on the whole run, which needs no data. The two differ only where Punkt ends a sentence
inside a run of non-CJK text: after a period-final word followed by a space and more text ("e.g. by" gives `e.g`,
`.`, `by` with Punkt and `e.g.`, `by` without). On the cmrc2018 trial and dev files (every context, question and
answer; 4,675 distinct non-CJK runs) this happens in 6 runs; untrained Punkt (no data either) would differ in 9, the
old `TreebankWordTokenizer` (nltk < 3.5's `word_tokenize`) in 39. scripts/references/cmrc2018_golden.py runs the
official script with the real English Punkt model and records those runs; tests/unit/test_qa.py checks our scores
against it.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cache

from roformer.errors import UserError

# ----------------------------------------------------------------------------------------------------------------
# SQuAD v1.1 and v2.0

_SQUAD_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower-case, drop ASCII punctuation, then the articles a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _SQUAD_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def squad_exact(prediction: str, gold: str) -> int:
    """1 if the normalised texts are equal, else 0."""
    return int(normalize_answer(prediction) == normalize_answer(gold))


def squad_f1(prediction: str, gold: str, empty_matches: bool = False) -> float:
    """F1 of the normalised whitespace tokens (a bag: each token counts as often as it occurs in both).

    Args:
        prediction: The predicted text.
        gold: One gold answer.
        empty_matches: SQuAD v2.0: when either side has no tokens, 1 if both have none, else 0 (v1.1: 0).
    """
    predicted, wanted = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if empty_matches and (not predicted or not wanted):
        return float(predicted == wanted)
    same = sum((Counter(predicted) & Counter(wanted)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(wanted)
    return 2 * precision * recall / (precision + recall)


def squad_v1(predictions: Mapping[str, str], answers: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """SQuAD v1.1's official `exact_match` and `f1` (percent), each the maximum over a question's gold answers."""
    exact, f1 = _per_question(predictions, answers, squad_exact, squad_f1)
    return {"exact_match": _percent(exact.values()), "f1": _percent(f1.values())}


def squad_v2(predictions: Mapping[str, str], answers: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """SQuAD v2.0's official metrics (percent): `exact_match`, `f1`, and their `HasAns_`/`NoAns_` breakdown.

    A question without gold answers (or whose answers normalise to nothing) is unanswerable: its gold is "".
    """
    golds = {qid: [a for a in texts if normalize_answer(a)] or [""] for qid, texts in answers.items()}
    exact, f1 = _per_question(predictions, golds, squad_exact, lambda p, g: squad_f1(p, g, empty_matches=True))
    metrics = {"exact_match": _percent(exact.values()), "f1": _percent(f1.values())}
    unanswerable = {qid for qid, texts in golds.items() if texts == [""]}
    groups = {"HasAns": [q for q in golds if q not in unanswerable], "NoAns": [q for q in golds if q in unanswerable]}
    for prefix, ids in groups.items():
        if ids:  # as the official script: a group's keys only when it has questions
            metrics[f"{prefix}_exact_match"] = _percent(exact[q] for q in ids)
            metrics[f"{prefix}_f1"] = _percent(f1[q] for q in ids)
    return metrics


def _per_question(
    predictions: Mapping[str, str],
    answers: Mapping[str, Sequence[str]],
    exact: Callable[[str, str], float],
    f1: Callable[[str, str], float],
    strip_ids: bool = False,
) -> tuple[dict[str, float], dict[str, float]]:
    """Every gold question's best exact and F1 score over its answers; 0 for a question without a prediction.

    Args:
        predictions: `{question id: answer text}`.
        answers: `{question id: [gold texts]}`; the scores are keyed by these ids.
        exact: The exact-match score of a prediction against one gold text.
        f1: The F1 score of a prediction against one gold text.
        strip_ids: Look each gold id up in `predictions` stripped of outer whitespace, the predictions' keys as
            they are (CMRC 2018's script does; SQuAD's look the ids up as they are).
    """
    exact_scores, f1_scores = {}, {}
    for qid, golds in answers.items():
        key = qid.strip() if strip_ids else qid
        if key not in predictions or not golds:
            exact_scores[qid] = f1_scores[qid] = 0
            continue
        exact_scores[qid] = max(exact(predictions[key], g) for g in golds)
        f1_scores[qid] = max(f1(predictions[key], g) for g in golds)
    return exact_scores, f1_scores


def _percent(scores: Iterable[float]) -> float:
    """100 x the mean, summed in order as the official scripts do (so the floats are theirs to the last bit)."""
    total, count = 0, 0
    for score in scores:
        total += score
        count += 1
    return 100.0 * total / count if count else 0.0


# ----------------------------------------------------------------------------------------------------------------
# CMRC 2018

# The official list, in its order. '……' is two characters: the script compares one character at a time, so it never
# matches and a lone '…' stays (kept as the official script has it).
CMRC_PUNCTUATION = (*"-:_*^/\\~`+=，。：？！“”；’《》", "……", *"·、「」（）－～『』")
_CMRC_PUNCTUATION = frozenset(CMRC_PUNCTUATION)
_CJK = re.compile(r"[\u4e00-\u9fa5]")


@cache
def _word_tokenize() -> Callable[[str], list[str]]:
    """NLTK's word tokenizer without Punkt's sentence splitting (see the module docstring for why)."""
    try:
        from nltk.tokenize.destructive import NLTKWordTokenizer
    except ImportError:
        raise UserError("the cmrc2018 metric needs the nltk package (pip install nltk)") from None
    return NLTKWordTokenizer().tokenize


def cmrc_segments(text: str, remove_punctuation: bool = False) -> list[str]:
    """The official `mixed_segmentation`: CJK characters and listed punctuation one by one, NLTK tokens between.

    With `remove_punctuation` the listed punctuation is dropped before anything else, so the text on either side of
    it joins into one run ("a-b" is the one token `ab`), as in the official script.
    """
    tokenize = _word_tokenize()
    segments: list[str] = []
    run = ""
    for char in str(text).lower().strip():
        if remove_punctuation and char in _CMRC_PUNCTUATION:
            continue
        if _CJK.match(char) or char in _CMRC_PUNCTUATION:
            if run:
                segments.extend(tokenize(run))
                run = ""
            segments.append(char)
        else:
            run += char
    if run:
        segments.extend(tokenize(run))
    return segments


def cmrc_strip_punctuation(text: str) -> str:
    """The official `remove_punctuation`: lower-cased, stripped, the listed punctuation removed."""
    return "".join(char for char in str(text).lower().strip() if char not in _CMRC_PUNCTUATION)


def longest_common_run(first: Sequence[str], second: Sequence[str]) -> int:
    """The length of the longest contiguous run of tokens found in both sequences."""
    best = 0
    previous = [0] * (len(second) + 1)  # previous[j + 1]: the common run ending at the last token and second[j]
    for token in first:
        current = [0] * (len(second) + 1)
        for j, other in enumerate(second):
            if token == other:
                current[j + 1] = previous[j] + 1
                best = max(best, current[j + 1])
        previous = current
    return best


def cmrc_f1(prediction: str, gold: str) -> float:
    """F1 (0-1) of one answer: precision and recall of the longest common run of segments, punctuation removed."""
    predicted, wanted = cmrc_segments(prediction, True), cmrc_segments(gold, True)
    common = longest_common_run(wanted, predicted)
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(wanted)
    return 2 * precision * recall / (precision + recall)


def cmrc_exact(prediction: str, gold: str) -> int:
    """1 if the texts are equal once lower-cased, stripped and rid of the listed punctuation, else 0."""
    return int(cmrc_strip_punctuation(prediction) == cmrc_strip_punctuation(gold))


def cmrc2018(predictions: Mapping[str, str], answers: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """CMRC 2018's official `exact_match`, `f1` and `average` (their mean), in percent.

    As the official script, a gold id is looked up in `predictions` stripped of outer whitespace (" q1 " finds the
    prediction of "q1", not that of " q1 "). A question without gold answers scores 0 (the official script stops
    with a ValueError there).
    """
    exact, f1 = _per_question(predictions, answers, cmrc_exact, cmrc_f1, strip_ids=True)
    metrics = {"exact_match": _percent(exact.values()), "f1": _percent(f1.values())}
    metrics["average"] = (metrics["exact_match"] + metrics["f1"]) * 0.5
    return metrics
