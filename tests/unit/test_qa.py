"""Extractive QA: the official metrics (SQuAD v1.1/v2.0 worked examples, CMRC 2018 against its script's golden file),
the SQuAD reader on the real cmrc2018 files, context windows and answer targets, n-best decoding, jieba offsets."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch
from helpers import REPO

from roformer.data.segment import tokenize_texts
from roformer.data.tokenizer import Tokenizer, train_tokenizer
from roformer.errors import UserError
from roformer.tasks import qa_metrics
from roformer.tasks.config import FinetuneDataConfig
from roformer.tasks.qa import (
    QAConfig,
    QAEncoded,
    QATask,
    answer_tokens,
    best_spans,
    decode,
    encode_split,
    question_room,
    window_overlap,
    windows,
)
from roformer.tasks.squad import Question, load_splits, locate, read_squad

GOLDEN = REPO / "tests" / "golden" / "cmrc2018_metric.json"
CMRC = "qa/cmrc2018"


# ----------------------------------------------------------------------------------------------------------------
# SQuAD v1.1 and v2.0: the official definitions, worked by hand


def test_squad_normalisation() -> None:
    assert qa_metrics.normalize_answer("The  Eiffel-Tower!") == "eiffeltower"  # punctuation goes, words may join
    assert qa_metrics.normalize_answer("an apple a day, the end") == "apple day end"
    assert qa_metrics.normalize_answer("theatre") == "theatre"  # articles are whole words only


def test_squad_v1_worked_example() -> None:
    answers = {
        "q1": ["Eiffel Tower"],
        "q2": ["Paris", "France"],  # the best gold answer counts
        "q3": ["1000 people"],
        "q4": ["x y y z"],
        "q5": ["anything"],  # no prediction: 0, still in the denominator
    }
    predictions = {"q1": "the Eiffel Tower", "q2": "in Paris, France", "q3": "1,000 people", "q4": "x y y y"}
    # q2: tokens (in, paris, france) vs (paris): precision 1/3, recall 1 -> F1 0.5, the same against (france)
    # q4: a bag of tokens: common x, y, y = 3 of 4 predicted and 3 of 4 gold -> F1 0.75
    assert qa_metrics.squad_f1("in Paris, France", "Paris") == pytest.approx(0.5)
    assert qa_metrics.squad_f1("x y y y", "x y y z") == pytest.approx(0.75)
    metrics = qa_metrics.squad_v1(predictions, answers)
    assert metrics == {"exact_match": pytest.approx(100 * 2 / 5), "f1": pytest.approx(100 * (1 + 0.5 + 1 + 0.75) / 5)}
    assert qa_metrics.squad_v1({"q": ""}, {"q": ["the"]}) == {"exact_match": 100.0, "f1": 0.0}  # v1.1: F1 0 if empty


def test_squad_v2_worked_example() -> None:
    answers = {"a1": ["Paris"], "a2": ["Paris"], "n1": [], "n2": [], "n3": ["the"]}  # "the" normalises to nothing
    predictions = {"a1": "paris.", "a2": "", "n1": "", "n2": "London", "n3": ""}
    metrics = qa_metrics.squad_v2(predictions, answers)
    # a1 1/1, a2 0/0 (an empty prediction of an answerable question), n1 1/1, n2 0/0, n3 1/1 (gold "" after all)
    assert metrics == {
        "exact_match": pytest.approx(60.0),
        "f1": pytest.approx(60.0),
        "HasAns_exact_match": pytest.approx(50.0),
        "HasAns_f1": pytest.approx(50.0),
        "NoAns_exact_match": pytest.approx(100 * 2 / 3),
        "NoAns_f1": pytest.approx(100 * 2 / 3),
    }
    assert set(qa_metrics.squad_v2({"a": "x"}, {"a": ["x"]})) == {
        "exact_match",
        "f1",
        "HasAns_exact_match",
        "HasAns_f1",
    }


# ----------------------------------------------------------------------------------------------------------------
# CMRC 2018


def test_cmrc2018_worked_examples() -> None:
    seg = qa_metrics.cmrc_segments
    assert seg("Hello世界-abc") == ["hello", "世", "界", "-", "abc"]
    assert seg("Hello世界-abc", remove_punctuation=True) == ["hello", "世", "界", "abc"]
    assert seg("a-b c", remove_punctuation=True) == ["ab", "c"]  # removed before runs are cut: the two sides join
    assert seg("好……", remove_punctuation=True) == ["好", "……"]  # '……' is listed, but one character never equals it
    # the longest common *contiguous* run: 北京 (or 大学), 2 of 4 predicted and 2 of 5 gold; a bag would give 8/9
    assert qa_metrics.cmrc_f1("北京大学", "北京的大学") == pytest.approx(2 * 0.5 * 0.4 / 0.9)
    assert qa_metrics.cmrc_exact(" “北京”。", "北京") == 1 and qa_metrics.cmrc_exact("北京…", "北京") == 0
    assert qa_metrics.longest_common_run(list("abcxabcd"), list("zabcdz")) == 4
    metrics = qa_metrics.cmrc2018(
        {"q1": "北京", "q2": "北京大学"}, {"q1": ["北京"], "q2": ["北京的大学"], "q3": ["上海"]}
    )
    f1 = 100 * (1 + 2 * 0.5 * 0.4 / 0.9) / 3
    assert metrics == pytest.approx({"exact_match": 100 / 3, "f1": f1, "average": (100 / 3 + f1) / 2})


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


def dev_answers(shared_data: Path) -> dict[str, list[str]]:
    squad = json.loads((shared_data / CMRC / "cmrc2018_dev.json").read_text(encoding="utf-8"))
    return {
        qa["id"]: [a["text"] for a in qa["answers"]]
        for article in squad["data"]
        for paragraph in article["paragraphs"]
        for qa in paragraph["qas"]
    }


def test_cmrc2018_equals_the_official_script(golden: dict, shared_data: Path) -> None:
    """Every question's EM and F1, and the totals, exactly as cmrc2018_evaluate.py
    (scripts/references/cmrc2018_golden.py)."""
    answers = dev_answers(shared_data)
    predictions = {}
    for qid, (prediction, em, f1) in golden["questions"].items():
        if prediction is None:  # a missing id
            continue
        predictions[qid] = prediction
        assert max(qa_metrics.cmrc_exact(prediction, a) for a in answers[qid]) == em, (qid, prediction)
        assert max(qa_metrics.cmrc_f1(prediction, a) for a in answers[qid]) == f1, (qid, prediction)
    totals = golden["totals"]
    assert totals["TOTAL"] == len(golden["questions"]) == 200 and totals["SKIP"] == 200 - len(predictions) > 0
    metrics = qa_metrics.cmrc2018(predictions, {qid: answers[qid] for qid in golden["questions"]})
    assert metrics == {"exact_match": totals["EM"], "f1": totals["F1"], "average": totals["AVERAGE"]}
    scores = golden["questions"].values()
    assert sum(em for _, em, _ in scores) > 40 and sum(0 < f1 < 1 for _, _, f1 in scores) > 40  # a real mix


def official_cmrc2018(shared_data: Path) -> dict:
    """cmrc2018_evaluate.py's functions (scripts/references/cmrc2018_golden.py's Python 3 conversion, syntax only).

    Its `nltk.word_tokenize` needs the Punkt model, which is not here: NLTKWordTokenizer stands in, which splits
    the CJK answers used with it the same way (see roformer.tasks.qa_metrics).
    """
    import importlib.util
    from types import SimpleNamespace

    from nltk.tokenize.destructive import NLTKWordTokenizer

    script = REPO / "scripts" / "references" / "cmrc2018_golden.py"
    spec = importlib.util.spec_from_file_location("cmrc2018_golden", script)
    assert spec is not None and spec.loader is not None
    golden_script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(golden_script)
    official = golden_script.load_official(shared_data / CMRC / "cmrc2018_evaluate.py")
    official["nltk"] = SimpleNamespace(word_tokenize=NLTKWordTokenizer().tokenize)
    return official


def test_cmrc2018_strips_question_ids_where_the_official_script_does(shared_data: Path, tmp_path: Path) -> None:
    """The official script strips the gold ids (`qas['id'].strip()`) and looks them up in the predictions as they are
    (their keys are not stripped): ours scores every predictions file as it does, and the reader strips the ids of a
    cmrc2018 task, so that the predictions file it writes is one the official script finds its answers in."""
    context = "北京是中国的首都，上海是最大的城市。"
    raw_ids = [" q1 ", "q2\t", "q3", "\u3000q4"]  # \u3000: the ideographic space, which str.strip removes too
    golds = [["北京"], ["上海"], ["中国"], ["首都"]]
    qas = [
        {"id": qid, "question": "问题", "answers": [{"text": g[0], "answer_start": context.find(g[0])}]}
        for qid, g in zip(raw_ids, golds)
    ]
    dev = write_squad(tmp_path / "dev.json", qas, context=context)
    ground_truth = json.loads(dev.read_text())
    official = official_cmrc2018(shared_data)
    answers = dict(zip(raw_ids, golds))
    stripped = [qid.strip() for qid in raw_ids]
    cases = {
        "stripped keys": dict(zip(stripped, ["北京", "上海市", "中国", "首都"])),
        "raw keys": dict(zip(raw_ids, ["北京", "上海", "中国", "首都"])),  # only q3's is found
        "mixed": {"q1": "北京", "q2\t": "上海", " q3": "中国", "q4": "首"},
    }
    for name, predictions in cases.items():
        f1, em, total, skip = official["evaluate"](ground_truth, predictions)
        ours = qa_metrics.cmrc2018(predictions, answers)
        assert ours == {"exact_match": em, "f1": f1, "average": (em + f1) * 0.5}, name
    assert official["evaluate"](ground_truth, cases["raw keys"])[3] == 3  # three unanswered for the official script

    # the reader: a cmrc2018 task's ids are stripped, a SQuAD task's kept as the SQuAD scripts read them
    train = write_squad(tmp_path / "train.json", qas, context=context)
    cmrc = FinetuneDataConfig(
        type="question_answering",
        task="toy",
        train_file=str(train),
        validation_file=str(dev),
        qa=QAConfig(metric="cmrc2018"),
    )
    questions = load_splits(cmrc)["dev"]
    assert [q.id for q in questions] == stripped
    texts = {q.id: q.answers[0] for q in questions}  # what the task writes to dev_predictions.json, all right
    f1, em, total, skip = official["evaluate"](ground_truth, texts)
    assert (em, f1, skip) == (100.0, 100.0, 0)
    assert qa_metrics.cmrc2018(texts, {q.id: q.answers for q in questions})["exact_match"] == 100.0
    squad = FinetuneDataConfig(type="question_answering", task="toy", train_file=str(train), validation_file=str(dev))
    assert [q.id for q in load_splits(squad)["dev"]] == raw_ids
    assert qa_metrics.squad_v1(dict(zip(stripped, ["北京"] * 4)), answers)["exact_match"] == 0.0  # not stripped


def test_cmrc2018_ids_equal_once_stripped_are_duplicates(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"dev\.json: question id 'd1' appears twice \(once stripped of outer spaces"):
        load_splits(
            files_config(tmp_path, [qa_entry("q1")], [qa_entry("d1"), qa_entry(" d1")], qa=QAConfig(metric="cmrc2018"))
        )
    assert len(load_splits(files_config(tmp_path, [qa_entry("q1")], [qa_entry("d1"), qa_entry(" d1")]))["dev"]) == 2


def test_cmrc2018_tokenizer_against_nltk_word_tokenize(golden: dict) -> None:
    """NLTKWordTokenizer alone equals word_tokenize (Punkt + NLTKWordTokenizer) except where Punkt ends a sentence
    inside a run: 6 of the 4,675 runs of the trial and dev files, each a period split off a word before a space."""
    tokenize = qa_metrics._word_tokenize()
    recorded = golden["tokenizer"]
    assert recorded["runs_checked"] == 4675 and len(recorded["agree"]) == 40
    for run, tokens in recorded["agree"].items():
        assert tokenize(run) == tokens, run
    assert len(recorded["punkt_splits"]) == 6
    for run, tokens in recorded["punkt_splits"].items():
        ours = tokenize(run)
        assert "".join(ours) == "".join(tokens) and len(ours) < len(tokens), run
        assert tokens.count(".") > ours.count("."), run


# ----------------------------------------------------------------------------------------------------------------
# Reading


def test_locate_moves_an_answer_to_its_nearest_occurrence() -> None:
    context = "ab cab ab"
    assert locate(context, "ab", 3) == 4  # off by one: 4 is nearer than 0 or 7
    assert locate(context, "ab", 0) == 0  # right as given
    assert locate(context, "ab", -1) == 0  # no start: the first
    assert locate(context, "ab", 2) == 0  # a tie (0 and 4 both 2 away): the earlier
    assert locate(context, "zz", 0) is None and locate(context, "", 0) is None


def test_real_cmrc2018_answers_are_relocated_and_counted(shared_data: Path) -> None:
    """The README's counts: trial 5 answers off by one; dev 193 answers at -1 (free-form texts that are not in the
    context at all) and 7 off by 1-2 characters; no question is left without a located answer."""
    trial, counts = read_squad(shared_data / CMRC / "cmrc2018_trial.json")
    assert len(trial) == 1002 and (counts.relocated, counts.absent) == (5, 0)
    dev, counts = read_squad(shared_data / CMRC / "cmrc2018_dev.json")
    assert len(dev) == 3219 and (counts.relocated, counts.absent) == (7, 193)
    assert sum(len(q.answers) for q in dev) == 9657 and sum(len(q.spans) for q in dev) == 9657 - 193
    for q in trial + dev:
        assert q.spans, q.id
        assert all(q.context[s:e] in q.answers for s, e in q.spans), q.id
    by_id = {q.id: q for q in trial}
    assert by_id["TRIAL_210_QUERY_0"].spans == [(13, 17)]  # given 14: one character late


def write_squad(path: Path, qas: list[dict], context: str = "Alice lives in Paris. Bob lives in Rome.") -> Path:
    path.write_text(json.dumps({"version": "1.1", "data": [{"paragraphs": [{"context": context, "qas": qas}]}]}))
    return path


def qa_entry(qid: str, text: str | None = "Paris", start: int = 15, **extra: object) -> dict:
    answers = [] if text is None else [{"text": text, "answer_start": start}]
    return {"id": qid, "question": "Where does Alice live?", "answers": answers, **extra}


def files_config(tmp_path: Path, train: list[dict], dev: list[dict], **data: object) -> FinetuneDataConfig:
    return FinetuneDataConfig(
        type="question_answering",
        task="toy",
        train_file=str(write_squad(tmp_path / "train.json", train)),
        validation_file=str(write_squad(tmp_path / "dev.json", dev)),
        **data,
    )


def test_bad_files_are_errors_naming_the_file_and_question(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"train\.json: question id 'q1' appears twice"):
        load_splits(files_config(tmp_path, [qa_entry("q1"), qa_entry("q1")], [qa_entry("d1")]))
    with pytest.raises(UserError, match=r"train\.json: question 'q2': no answer text occurs in its context \('Oslo'"):
        load_splits(files_config(tmp_path, [qa_entry("q1"), qa_entry("q2", "Oslo")], [qa_entry("d1")]))
    with pytest.raises(UserError, match=r"dev\.json: question 'd1' has no answer \(SQuAD v2\.0 data\?"):
        load_splits(files_config(tmp_path, [qa_entry("q1")], [qa_entry("d1", None)]))
    (tmp_path / "broken.json").write_text('{"data": [\n{"paragraphs": }]}')
    with pytest.raises(UserError, match=r"broken\.json:2:16: not valid JSON"):
        read_squad(tmp_path / "broken.json")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(UserError, match=r"list\.json: not SQuAD format"):
        read_squad(tmp_path / "list.json")
    with pytest.raises(UserError, match=r"x\.json: data\[0\]\.paragraphs\[0\]: `context` must be a string"):
        read_squad(write_squad(tmp_path / "x.json", [], context=None))  # type: ignore[arg-type]


def test_load_splits_counts_once_per_split_and_limits_by_question(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # dev: an absent answer is fine (the metric reads texts), and a question may have one, v2.0 unanswerable too
    train = [qa_entry("q1"), qa_entry("q2", "Rome", 30), qa_entry("q3", "Paris", 14)]
    dev = [{**qa_entry("d1"), "answers": [{"text": "Lyon", "answer_start": -1}, {"text": "Paris", "answer_start": 15}]}]
    dev += [qa_entry("d2", None, is_impossible=True)]
    with caplog.at_level(logging.WARNING, logger="roformer.tasks.squad"):
        splits = load_splits(files_config(tmp_path, train, dev, max_train_examples=2, qa=QAConfig(version_2=True)))
    assert [q.id for q in splits["train"]] == ["q1", "q2"] and [q.id for q in splits["dev"]] == ["d1", "d2"]
    assert splits["train"][1].spans == [(35, 39)] and splits["dev"][1].impossible and not splits["dev"][1].answers
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2
    assert "train.json: 2 answers re-located" in warnings[0] and "0 answer texts not in their context" in warnings[0]
    assert "dev.json: 0 answers re-located" in warnings[1] and "1 answer texts not in their context" in warnings[1]


# ----------------------------------------------------------------------------------------------------------------
# Windows and targets


@pytest.fixture(scope="module")
def trial(tmp_path_factory: pytest.TempPathFactory) -> list[Question]:
    from helpers import SHARED_DATA

    path = SHARED_DATA / CMRC / "cmrc2018_trial.json"
    if not path.is_file():
        pytest.skip(f"real data not found at {path}")
    return read_squad(path)[0][:200]


@pytest.fixture(scope="module")
def chinese_tokenizer(trial: list[Question]) -> Tokenizer:
    return train_tokenizer([q.context for q in trial] + [q.question for q in trial], 1500)


def test_windows_cover_the_context_with_the_stride() -> None:
    for tokens, room, overlap in [(0, 10, 3), (10, 10, 3), (11, 10, 3), (45, 11, 4), (100, 17, 16)]:
        spans = windows(tokens, room, overlap)
        assert spans[0][0] == 0 and spans[-1][1] == tokens
        assert all(end - start <= room for start, end in spans)
        assert all(b[0] == a[1] - overlap and a[1] - a[0] == room for a, b in zip(spans, spans[1:]))
    assert windows(45, 11, 4) == [(0, 11), (7, 18), (14, 25), (21, 32), (28, 39), (35, 45)]


def test_rows_are_hf_overflowing_windows(trial: list[Question], chinese_tokenizer: Tokenizer) -> None:
    """Question first, context second, truncation only_second, stride doc_stride: token for token as HF's run_qa."""
    questions = [q for q in trial if len(chinese_tokenizer(q.question)["input_ids"]) < 40]
    encoded = encode_split(questions, chinese_tokenizer, 96, QAConfig(doc_stride=24), jieba=False, training=True)
    hf = chinese_tokenizer(
        [q.question for q in questions],
        [q.context for q in questions],
        truncation="only_second",
        max_length=96,
        stride=24,
        return_overflowing_tokens=True,
        return_token_type_ids=True,
    )
    assert len(encoded.ids) > 2 * len(questions)  # contexts of up to 980 characters: several windows each
    assert encoded.ids == hf["input_ids"] and encoded.types == hf["token_type_ids"]
    assert encoded.question_of == hf["overflow_to_sample_mapping"]


def test_training_targets_point_at_the_answer(trial: list[Question], chinese_tokenizer: Tokenizer) -> None:
    qa = QAConfig(doc_stride=32, max_query_length=24)
    training = encode_split(trial, chinese_tokenizer, 128, qa, jieba=False, training=True)
    offsets = encode_split(trial, chinese_tokenizer, 128, qa, jieba=False, training=False).offsets
    assert offsets is not None and training.starts is not None and training.ends is not None
    held = set()
    for row, (start, end) in enumerate(zip(training.starts, training.ends)):
        q = trial[training.question_of[row]]
        if start == 0:
            assert end == 0
            continue
        held.add(q.id)
        assert training.types[row][start] == 1 and start <= end < len(training.ids[row]) - 1
        first, last = offsets[row][start], offsets[row][end]
        assert first is not None and last is not None
        answer = q.context[q.spans[0][0] : q.spans[0][1]]
        assert q.context[first[0] : last[1]].strip().lower() == answer.strip().lower(), q.id
    # an answer of up to doc_stride tokens is wholly inside some window (a longer one may straddle every window)
    assert {q.id for q in trial if q.spans[0][1] - q.spans[0][0] <= 32} <= held and len(held) > 0.8 * len(trial)
    assert max(training.lengths) == 128


def test_targets_are_cls_when_the_window_misses_the_answer_or_there_is_none() -> None:
    offsets = [(0, 5), (6, 11), (12, 17)]
    assert answer_tokens(offsets, (6, 11)) == (1, 1)
    assert answer_tokens(offsets, (7, 9)) == (1, 1)  # inside one token
    assert answer_tokens(offsets, (5, 17)) == (1, 2)  # a leading space: the first token with characters of it
    assert answer_tokens(offsets, (12, 20)) is None  # runs past the window
    assert answer_tokens(offsets[1:], (0, 5)) is None and answer_tokens([], (0, 1)) is None
    tokenizer = train_tokenizer(["alice lives in paris bob lives in rome where does alice live"] * 3, 60)
    context = "bob lives in rome " * 3 + "alice lives in paris"  # 16 tokens: windows [0, 9) and [7, 16)
    paris = context.index("paris")
    questions = [
        Question("a", "where does alice live", context, ["paris"], [(paris, paris + 5)]),
        Question("n", "where does alice live", context, [], [], impossible=True),
    ]
    encoded = encode_split(questions, tokenizer, 16, QAConfig(doc_stride=2, max_query_length=5), False, True)
    assert encoded.starts is not None and encoded.ends is not None
    rows = {qid: [r for r, i in enumerate(encoded.question_of) if questions[i].id == qid] for qid in "an"}
    assert all(encoded.starts[r] == encoded.ends[r] == 0 for r in rows["n"])
    hits = [r for r in rows["a"] if encoded.starts[r]]
    assert len(rows["a"]) > len(hits) > 0  # windows without the answer point at [CLS]
    assert all(tokenizer.decode(encoded.ids[r][encoded.starts[r] : encoded.ends[r] + 1]) == "paris" for r in hits)


def test_short_max_lengths_still_give_windows_that_move_on(caplog: pytest.LogCaptureFixture) -> None:
    assert question_room(384, QAConfig()) == 64 and window_overlap(384 - 3 - 64, 128) == 128  # BERT's SQuAD setup
    assert question_room(64, QAConfig(doc_stride=16)) == 30  # at most half of 64 - [CLS] [SEP] [SEP]
    assert question_room(32, QAConfig(doc_stride=32)) == 14 and window_overlap(15, 32) == 7  # a 32-token model
    tokenizer = train_tokenizer(["one two three four five six seven eight nine ten"] * 3, 60)
    context = "three four five six seven eight nine ten " * 2
    long_question = Question("q", " ".join(["one two"] * 20), context, ["four"], [(6, 10)])
    with caplog.at_level(logging.WARNING, logger="roformer.tasks.qa"):
        encoded = encode_split([long_question], tokenizer, 16, QAConfig(doc_stride=8), False, False)
    assert all(types.count(0) == 2 + 6 for types in encoded.types)  # the question: 6 of its 40 tokens
    # windows of 16 - 3 - 6 = 7 context tokens, sharing 3 (not 8): 16 tokens in windows starting at 0, 4, 8, 12
    assert [len(ids) for ids in encoded.ids] == [16, 16, 16, 8 + 4 + 1]
    assert "doc_stride 8 is over half the 16-token windows of 1 questions" in caplog.text


# ----------------------------------------------------------------------------------------------------------------
# Decoding

# one row: [CLS] q q [SEP] c0 c1 c2 c3 [SEP] (pad): context tokens at 4..7, characters 0-3, 4-7, 8-11, 12-15
ROW = [None, None, None, None, (0, 3), (4, 7), (8, 11), (12, 15), None]


def logits_row(starts: dict[int, float], ends: dict[int, float], length: int = 10) -> torch.Tensor:
    logits = torch.zeros(length, 2)
    for position, value in starts.items():
        logits[position, 0] = value
    for position, value in ends.items():
        logits[position, 1] = value
    return logits


def test_best_spans_picks_the_best_valid_span() -> None:
    # the best start and end of all are in the question (1) and the padding (9); the best context end (4) is before
    # the best context start (6), a pair that would score 4: the best valid span is 6..7 (2 + 1.5), then 4..4 (2.5)
    logits = logits_row({1: 9.0, 6: 2.0, 4: 0.5}, {9: 9.0, 4: 2.0, 7: 1.5})[None]
    ((null, spans),) = best_spans(logits, [ROW], n_best=20, max_answer_length=30)
    assert spans[0] == (3.5, 8, 15) and null == pytest.approx(0.0)
    assert spans == sorted(spans, reverse=True) and all(e > s for _, s, e in spans)
    assert all(score > -math.inf for score, _, _ in spans) and len(spans) == 10  # every pair with end >= start
    ((_, top2),) = best_spans(logits, [ROW], n_best=2, max_answer_length=30)
    assert top2 == [(3.5, 8, 15), (2.5, 0, 3)]
    no_context = [None, None, None, None]  # an empty context: [CLS] q [SEP] [SEP]
    assert best_spans(torch.ones(2, 10, 2), [ROW, no_context], 20, 30)[1] == (2.0, [])


def test_best_spans_respects_max_answer_length() -> None:
    logits = logits_row({4: 5.0, 6: 1.0}, {7: 5.0, 5: 0.5})[None]  # 4..7 is 4 tokens
    ((_, spans),) = best_spans(logits, [ROW], n_best=20, max_answer_length=4)
    assert spans[0] == (10.0, 0, 15)
    ((_, spans),) = best_spans(logits, [ROW], n_best=20, max_answer_length=2)
    assert spans[0] == (6.0, 8, 15)  # 6..7 (1 + 5) beats 4..5 (5 + 0.5)
    first = {o[0]: p for p, o in enumerate(ROW) if o}
    last = {o[1]: p for p, o in enumerate(ROW) if o}
    assert len(spans) == 7 and all(last[e] - first[s] + 1 <= 2 for _, s, e in spans)  # 4 of 1 token, 3 of 2


def split_of(questions: list[Question], rows: list[int]) -> QAEncoded:
    return QAEncoded(questions, ids=[[0] * len(ROW) for _ in rows], question_of=rows, offsets=[ROW for _ in rows])


def test_decoding_aggregates_windows_and_v2_null() -> None:
    context = "abc efg ijk mno"
    questions = [Question("q1", "?", context, ["ijk"]), Question("q2", "?", context, [], impossible=True)]
    split = split_of(questions, [0, 0, 1])
    predictions = [
        (1.0, [(2.0, 0, 3)]),  # q1, first window: "abc"
        (0.5, [(4.0, 8, 11), (3.0, 0, 3)]),  # q1, second window: "ijk" wins; the null score is the lowest, 0.5
        (6.0, [(5.0, 12, 15)]),  # q2: null 6 beats "mno" 5
    ]
    v1 = decode(split, predictions, QAConfig())
    assert v1["q1"].text == "ijk" and v1["q2"].text == "mno"
    assert [a["text"] for a in v1["q1"].nbest] == ["ijk", "abc"]  # "abc" once, with its best score (3.0)
    assert v1["q1"].nbest[0]["probability"] == pytest.approx(1 / (1 + math.exp(-1)))
    v2 = decode(split, predictions, QAConfig(version_2=True))
    assert v2["q1"].text == "ijk" and v2["q2"].text == ""
    assert [a["text"] for a in v2["q2"].nbest] == ["", "mno"]
    assert decode(split, predictions, QAConfig(version_2=True, null_threshold=1.5))["q2"].text == "mno"
    assert decode(split_of(questions[:1], [0]), [(0.0, [])], QAConfig())["q1"].text == ""  # no valid span at all


def qa_data(**settings: object) -> FinetuneDataConfig:
    """The data: section of a toy question answering task (its files are never read: the tests give the splits)."""
    return FinetuneDataConfig(type="question_answering", task="toy", train_file="t", validation_file="d", **settings)


def test_the_task_scores_its_predictions(tmp_path: Path) -> None:
    tokenizer = train_tokenizer(["alice lives in paris bob lives in rome where does alice live"] * 3, 60)
    questions = [Question("a", "where does alice live", "alice lives in paris", ["paris", "Paris!"], [(15, 20)])]
    questions.append(Question("b", "where does bob live", "bob lives in rome", ["rome"], [(13, 17)]))
    data = {"train": questions, "dev": questions, "test": questions[:1]}
    task = QATask(qa_data(qa=QAConfig(doc_stride=2, max_query_length=5), jieba=False), data)
    assert task.dev_splits == ["dev"] and task.test_splits == ["test"] and task.num_labels == 2
    assert (task.name, task.tracker_project, task.multiple) == ("toy", "roformer-toy", 8)  # from the data: section
    assert task.metrics == ("exact_match", "f1")  # the type's declared default
    encoded = task.encode(tokenizer, 12)
    train, dev = encoded["train"], encoded["dev"]
    batch = task.collate(train, list(range(len(train.ids))), 0, 12)
    assert max(train.lengths) == 11 and batch["input_ids"].shape[1] == 12  # 16 (a multiple of 8) is past the cap
    assert batch["start_positions"].tolist() == train.starts and "start_positions" not in task.collate(dev, [0], 0, 12)
    # logits that point at each window's answer tokens when it has them: the gold spans win
    rows = list(range(len(dev.ids)))
    logits = torch.zeros(len(rows), 12, 2)
    for r, (s, e) in enumerate(zip(train.starts, train.ends)):
        logits[r, s, 0] = logits[r, e, 1] = 5.0 if s else 0.0
    predictions = task.predictions(logits, dev, rows)
    metrics = task.evaluate(dev, predictions)
    assert metrics == {"exact_match": 1.0, "f1": 1.0, "score": 1.0}  # fractions, as every task's results.json
    task.write_predictions(tmp_path, encoded, {"dev": predictions, "test": predictions[: dev.question_of.count(0)]})
    assert json.loads((tmp_path / "dev_predictions.json").read_text()) == {"a": "paris", "b": "rome"}
    assert json.loads((tmp_path / "test_predictions.json").read_text()) == {"a": "paris"}
    assert json.loads((tmp_path / "dev_nbest.json").read_text())["a"][0]["text"] == "paris"
    (tmp_path / "submission").mkdir()
    task.write_submission(tmp_path, tmp_path / "submission")
    assert (tmp_path / "submission" / "test_predictions.json").read_text() == (
        tmp_path / "test_predictions.json"
    ).read_text()


def test_data_metrics_choose_what_selects(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    questions = [Question("a", "where", "alice lives in paris france", ["paris france"], [(15, 27)])]
    scores = {}
    for metrics in (None, ["f1"], ["exact_match"]):
        task = QATask(qa_data(metrics=metrics), {"train": questions, "dev": questions})
        monkeypatch.setattr(task, "answers", lambda split, predictions: {"a": SimpleNamespace(text="paris")})
        scores[str(metrics)] = task.evaluate(SimpleNamespace(questions=questions), [])
    f1 = 2 * (1 / 1) * (1 / 2) / (1 + 1 / 2)  # 1 of 1 predicted tokens right, 1 of 2 gold
    assert scores["['f1']"] == {"exact_match": 0.0, "f1": pytest.approx(f1), "score": pytest.approx(f1)}
    assert scores["['exact_match']"]["score"] == 0.0 and scores["None"]["score"] == pytest.approx(f1 / 2)


# ----------------------------------------------------------------------------------------------------------------
# jieba


def test_jieba_offsets_are_exact() -> None:
    pytest.importorskip("jieba")
    from roformer.data.tokenizer import jieba_presegmenter

    texts = ["北京大学的学生在北京市工作。 Apple 公司发布了iPhone 15，售价5999元！", "", "  他说：“你好”  "]
    segment = jieba_presegmenter()
    tokenizer = train_tokenizer([segment(t) for t in texts * 3], 120, split_cjk=False)
    surface = 0
    for text, tokens in zip(texts, tokenize_texts(tokenizer, texts, jieba=True)):
        assert len(tokens.ids) == len(tokens.offsets)
        for token, (start, end) in zip(tokenizer.convert_ids_to_tokens(tokens.ids), tokens.offsets):
            if token != tokenizer.unk_token:
                assert text[start:end].lower() == token.removeprefix("##"), (token, text[start:end])
                surface += 1
        assert [s for s, _ in tokens.offsets] == sorted(s for s, _ in tokens.offsets)
    assert surface > 20
    # the jieba path through the windows: the answer's tokens map back to its characters
    context = "北京大学的学生在北京市工作。"
    question = Question("q", "学生在哪里工作", context, ["北京市"], [(8, 11)])
    encoded = encode_split([question], tokenizer, 32, QAConfig(doc_stride=4, max_query_length=8), True, True)
    offsets = encode_split([question], tokenizer, 32, QAConfig(doc_stride=4, max_query_length=8), True, False).offsets
    assert encoded.starts and offsets
    start, end = encoded.starts[0], encoded.ends[0]  # type: ignore[index]
    assert context[offsets[0][start][0] : offsets[0][end][1]] == "北京市"  # type: ignore[index]
