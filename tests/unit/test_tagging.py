"""Token classification: the entity metric (against seqeval), the readers, word/piece alignment and the task's files."""

from __future__ import annotations

import json
import logging
import random
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch

from roformer.errors import ConfigError, UserError
from roformer.model.model import IGNORE_INDEX
from roformer.tasks import tagging as tagging_module
from roformer.tasks.base import FinetuneTask
from roformer.tasks.config import FinetuneDataConfig
from roformer.tasks.conll import TaggingConfig, TagNames, read_conll, read_json_sentences
from roformer.tasks.records import Record
from roformer.tasks.tagging import TaggingTask, continuation_tag, label_set
from roformer.tasks.tagging_metrics import (
    chunks,
    classification_report,
    has_entities,
    tag_report,
    tag_scores,
    token_accuracy,
)

TYPES = ("PER", "LOC", "MISC")

# ----------------------------------------------------------------------------------------------------------------
# The metric


def spans_to_tags(length: int, spans: list[tuple[str, int, int]], scheme: str) -> list[str]:
    """Well-formed tags of entities `spans` (type, first, last) in `scheme`; IOB1 uses B- only between neighbours."""
    tags = ["O"] * length
    for n, (kind, first, last) in enumerate(spans):
        for i in range(first, last + 1):
            tags[i] = f"I-{kind}"
        if scheme == "IOB2" or (scheme == "IOB1" and n and spans[n - 1][2] == first - 1 and spans[n - 1][0] == kind):
            tags[first] = f"B-{kind}"
        if scheme == "IOBES":
            if first == last:
                tags[first] = f"S-{kind}"
            else:
                tags[first], tags[last] = f"B-{kind}", f"E-{kind}"
    return tags


def random_spans(rng: random.Random, length: int) -> list[tuple[str, int, int]]:
    """Non-overlapping entities of 1-3 words, often touching (the case IOB1's B- exists for)."""
    spans, i = [], 0
    while i < length:
        if rng.random() < 0.4:
            last = min(length - 1, i + rng.randint(0, 2))
            spans.append((rng.choice(TYPES), i, last))
            i = last + 1
        else:
            i += rng.randint(1, 2)
    return spans


def tag_pool(scheme: str) -> list[str]:
    prefixes = "BIES" if scheme == "IOBES" else "BI"
    return ["O"] + [f"{p}-{t}" for p in prefixes for t in TYPES]


def random_pairs(scheme: str, seed: int, sentences: int = 40) -> tuple[list[list[str]], list[list[str]]]:
    """Well-formed gold sentences, and predictions that are noisy copies or arbitrary (ill-formed) tags."""
    rng = random.Random(seed)
    gold, predicted, pool = [], [], tag_pool(scheme)
    for _ in range(sentences):
        length = rng.randint(1, 12)
        tags = spans_to_tags(length, random_spans(rng, length), scheme)
        gold.append(tags)
        if rng.random() < 0.2:
            predicted.append([rng.choice(pool) for _ in tags])
        else:
            noise = rng.random() * 0.5
            predicted.append([rng.choice(pool) if rng.random() < noise else t for t in tags])
    return gold, predicted


def seqeval_scores(gold: list[list[str]], predicted: list[list[str]], **mode) -> dict[str, float]:
    metrics = pytest.importorskip("seqeval.metrics")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {
            "precision": metrics.precision_score(gold, predicted, zero_division=0, **mode),
            "recall": metrics.recall_score(gold, predicted, zero_division=0, **mode),
            "f1": metrics.f1_score(gold, predicted, zero_division=0, **mode),
        }


@pytest.mark.parametrize("scheme", ["IOB1", "IOB2", "IOBES"])
def test_scores_equal_seqeval_default_mode_on_random_sequences(scheme: str) -> None:
    metrics = pytest.importorskip("seqeval.metrics")
    for seed in range(30):
        gold, predicted = random_pairs(scheme, seed)
        ours = tag_scores(gold, predicted)
        assert {k: ours[k] for k in ("precision", "recall", "f1")} == pytest.approx(
            seqeval_scores(gold, predicted), abs=1e-12
        ), (scheme, seed)
        assert ours["accuracy"] == pytest.approx(metrics.accuracy_score(gold, predicted), abs=1e-12)


@pytest.mark.parametrize("scheme", ["IOB1", "IOB2", "IOBES"])
def test_report_per_type_equals_seqeval(scheme: str) -> None:
    metrics = pytest.importorskip("seqeval.metrics")
    gold, predicted = random_pairs(scheme, seed=99, sentences=200)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = metrics.classification_report(gold, predicted, output_dict=True, zero_division=0)
    ours = classification_report(gold, predicted)
    assert set(ours) == {k for k in theirs if k not in ("macro avg", "weighted avg")}
    for kind, row in ours.items():
        expected = theirs[kind]
        assert row["precision"] == pytest.approx(expected["precision"], abs=1e-12), kind
        assert row["recall"] == pytest.approx(expected["recall"], abs=1e-12), kind
        assert row["f1"] == pytest.approx(expected["f1-score"], abs=1e-12), kind
        assert row["support"] == expected["support"], kind


def test_chunks_equal_seqeval_entities_on_arbitrary_tags() -> None:
    """Any mix of prefixes (bare `B`, conlleval's `.`, E/S in IOB data) is read as seqeval reads it."""
    sequence_labeling = pytest.importorskip("seqeval.metrics.sequence_labeling")
    rng = random.Random(1)
    pool = tag_pool("IOBES") + ["B", "I", "."]
    for _ in range(2000):
        tags = [rng.choice(pool) for _ in range(rng.randint(0, 10))]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = [(t if t != "_" else "", a, b) for t, a, b in sequence_labeling.get_entities(tags)]
        assert sorted(chunks(tags)) == sorted(theirs), tags


def test_well_formed_iobes_scores_equal_seqeval_strict_mode() -> None:
    """On well-formed IOBES tags the lenient rules give exactly the strict scheme's entities."""
    scheme_module = pytest.importorskip("seqeval.scheme")
    rng = random.Random(5)
    gold, predicted = [], []
    for _ in range(300):
        length = rng.randint(1, 10)
        gold.append(spans_to_tags(length, random_spans(rng, length), "IOBES"))
        predicted.append(spans_to_tags(length, random_spans(rng, length), "IOBES"))
    strict = seqeval_scores(gold, predicted, mode="strict", scheme=scheme_module.IOBES)
    ours = tag_scores(gold, predicted)
    assert {k: ours[k] for k in strict} == pytest.approx(strict, abs=1e-12)


def test_ill_formed_predictions_count_as_conlleval_counts_them_not_as_strict_mode() -> None:
    scheme_module = pytest.importorskip("seqeval.scheme")
    gold, predicted = [["B-PER", "E-PER", "O"]], [["B-PER", "O", "O"]]  # a B- that never ends: a 1-word entity
    assert tag_scores(gold, predicted)["precision"] == 0.0  # predicted (PER, 0, 0), wrong
    assert seqeval_scores(gold, predicted, mode="strict", scheme=scheme_module.IOBES)["precision"] == 0.0
    gold, predicted = [["S-PER", "O"]], [["E-PER", "O"]]  # a lone E- is an entity to conlleval, none to strict
    assert tag_scores(gold, predicted)["f1"] == 1.0
    assert seqeval_scores(gold, predicted, mode="strict", scheme=scheme_module.IOBES)["f1"] == 0.0


@pytest.mark.parametrize(
    ("tags", "expected"),
    [
        (["B-PER", "I-PER", "O", "B-LOC"], [("PER", 0, 1), ("LOC", 3, 3)]),  # an entity at the end
        (["O", "I-PER", "I-PER"], [("PER", 1, 2)]),  # I- after O starts one (IOB1)
        (["I-PER", "I-LOC"], [("PER", 0, 0), ("LOC", 1, 1)]),  # a type switch ends one and starts another
        (["B-PER", "I-LOC", "I-LOC"], [("PER", 0, 0), ("LOC", 1, 2)]),
        (["I-PER", "B-PER", "I-PER"], [("PER", 0, 0), ("PER", 1, 2)]),  # B- after I- of its type: a new one
        (["B-PER", "B-PER"], [("PER", 0, 0), ("PER", 1, 1)]),
        (["B-MISC", "E-MISC", "S-LOC", "O"], [("MISC", 0, 1), ("LOC", 2, 2)]),
        (["E-PER", "I-PER"], [("PER", 0, 0), ("PER", 1, 1)]),  # after E- a new entity starts
        (["B-ORG", "I-ORG", "E-ORG"], [("ORG", 0, 2)]),
        (["O", "O"], []),
        ([], []),
    ],
)
def test_chunks_of_hand_written_cases(tags: list[str], expected: list[tuple[str, int, int]]) -> None:
    assert chunks(tags) == expected


def test_scores_of_a_small_case_by_hand() -> None:
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    predicted = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O"]]  # 2 of 3 right, 3 predicted
    scores = tag_scores(gold, predicted)
    assert scores["precision"] == pytest.approx(2 / 3) and scores["recall"] == pytest.approx(2 / 3)
    assert scores["f1"] == pytest.approx(2 / 3) and scores["accuracy"] == pytest.approx(5 / 6)
    report = classification_report(gold, predicted)
    assert report["LOC"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1.0}
    assert report["ORG"]["precision"] == 0.5 and report["micro avg"]["support"] == 3.0
    assert tag_scores([["O"]], [["O"]]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "accuracy": 1.0}


def test_misaligned_sentences_are_an_error() -> None:
    with pytest.raises(ValueError, match="sentence 0: 2 gold tags but 1 predicted"):
        tag_scores([["O", "O"]], [["O"]])
    with pytest.raises(ValueError, match="1 gold sentences but 0 predicted"):
        token_accuracy([["O"]], [])


# ----------------------------------------------------------------------------------------------------------------
# Readers and the label set


def write(path: Path, text: str, newline: str = "\n") -> Path:
    path.write_bytes(text.replace("\n", newline).encode())
    return path


CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER


-DOCSTART- -X- -X- O

BRUSSELS NNP B-NP B-LOC
"""


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_conll_reader_skips_docstart_and_blank_lines(tmp_path: Path, newline: str) -> None:
    sentences = read_conll(write(tmp_path / "a.txt", CONLL, newline))
    assert [s.tokens for s in sentences] == [["EU", "rejects", "German"], ["Peter", "Blackburn"], ["BRUSSELS"]]
    assert [s.tags for s in sentences] == [["B-ORG", "O", "B-MISC"], ["B-PER", "I-PER"], ["B-LOC"]]
    assert [s.where for s in sentences] == [f"{tmp_path / 'a.txt'}:{n}" for n in (3, 7, 13)]
    assert sentences[1].columns == [["Peter", "NNP", "B-NP", "B-PER"], ["Blackburn", "NNP", "I-NP", "I-PER"]]
    assert [s.index for s in sentences] == ["0", "1", "2"]


def test_conll_reader_takes_tabs_no_final_newline_and_a_tag_column(tmp_path: Path) -> None:
    path = write(tmp_path / "b.conll", "Paris\tNNP\tB-LOC\n\tis VBZ  O \n\nok UH O")
    sentences = read_conll(path, tag_column=2)
    assert [s.tokens for s in sentences] == [["Paris", "is"], ["ok"]]
    assert sentences[0].tags == ["B-LOC", "O"]
    assert read_conll(path, tag_column=1)[0].tags == ["NNP", "VBZ"]


def test_conll_reader_errors_name_file_and_line(tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.txt", "EU NNP B-NP B-ORG\nrejects VBZ O\n")
    with pytest.raises(UserError, match=r"bad\.txt:2: 3 columns, expected 4$"):
        read_conll(bad)
    with pytest.raises(UserError, match=r"empty\.txt: no sentences"):
        read_conll(write(tmp_path / "empty.txt", ""))
    with pytest.raises(UserError, match=r"doc\.txt: no sentences"):
        read_conll(write(tmp_path / "doc.txt", "-DOCSTART- -X- -X- O\n\n\n"))
    with pytest.raises(UserError, match=r"missing\.txt: data file not found"):
        read_conll(tmp_path / "missing.txt")
    with pytest.raises(UserError, match=r"two\.txt:1: data.tagging.tag_column 0 is not a tag column"):
        read_conll(write(tmp_path / "two.txt", "a O\n"), tag_column=0)
    with pytest.raises(UserError, match=r"labels\.txt:3: tag 'B-XYZ' is not in data.labels"):
        read_conll(write(tmp_path / "labels.txt", "a O\n\nb B-XYZ\n"), tags=TagNames(["O"], closed=True))


def test_a_one_column_conll_file_is_unlabelled(tmp_path: Path) -> None:
    (sentence,) = read_conll(write(tmp_path / "test.txt", "Paris\nis\n"))
    assert sentence.tokens == ["Paris", "is"] and sentence.tags is None


def test_json_lines_take_names_or_ids(tmp_path: Path) -> None:
    rows = [
        {"tokens": ["Paris", "is"], "tags": ["B-LOC", "O"], "id": "x"},
        {"tokens": [], "tags": []},  # skipped
        {"tokens": ["Bob"], "tags": [1]},
    ]
    path = write(tmp_path / "a.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    sentences = read_json_sentences(path, TaggingConfig(), TagNames(["O", "B-PER", "B-LOC"], closed=True))
    assert [s.tags for s in sentences] == [["B-LOC", "O"], ["B-PER"]]
    assert [s.index for s in sentences] == ["x", "2"] and sentences[1].where.endswith("a.jsonl:3")
    with pytest.raises(UserError, match=r"a\.jsonl:3: tag 1 is an id: set data.labels"):
        read_json_sentences(path, TaggingConfig())


def test_json_lines_errors_name_file_and_line(tmp_path: Path) -> None:
    tagging = TaggingConfig(tokens_column="words", tags_column="ner")
    good = json.dumps({"words": ["a"], "ner": ["O"]})
    path = write(tmp_path / "a.jsonl", good + "\n" + json.dumps({"words": ["a", "b"], "ner": ["O"]}) + "\n")
    with pytest.raises(UserError, match=r"a\.jsonl:2: 2 tokens but 1 tags"):
        read_json_sentences(path, tagging)
    path = write(tmp_path / "b.jsonl", good + "\n" + json.dumps({"words": ["a"]}) + "\n")
    with pytest.raises(UserError, match=r"b\.jsonl:2: no tags, where other sentences have them"):
        read_json_sentences(path, tagging)
    path = write(tmp_path / "c.jsonl", json.dumps({"words": ["a"], "ner": [7]}) + "\n")
    with pytest.raises(UserError, match=r"c\.jsonl:1: tag id 7 is outside the 1 labels"):
        read_json_sentences(path, tagging, TagNames(["O"]))
    path = write(tmp_path / "d.jsonl", json.dumps({"words": "a b", "ner": ["O"]}) + "\n")
    with pytest.raises(UserError, match=r"d\.jsonl:1: 'words' must be a list"):
        read_json_sentences(path, tagging)
    (unlabelled,) = read_json_sentences(write(tmp_path / "e.jsonl", json.dumps({"words": ["a"]})), tagging)
    assert unlabelled.tags is None


def test_label_set_is_sorted_with_o_first(tmp_path: Path) -> None:
    sentences = read_conll(write(tmp_path / "a.txt", "a I-PER\nb O\n\nc B-LOC\nd B-PER\n"))
    assert label_set(sentences) == ["O", "B-LOC", "B-PER", "I-PER"]
    assert label_set(read_conll(write(tmp_path / "b.txt", "a NN\nb DT\n"))) == ["DT", "NN"]


# ----------------------------------------------------------------------------------------------------------------
# The task


_FILES = {
    "train": ("train_file", "train.txt"),
    "validation": ("validation_file", "dev.txt"),
    "test": ("test_file", "test.txt"),
}


def tagging_config(folder: Path, files: dict[str, str], **fields) -> FinetuneDataConfig:
    """A token_classification data: section of CoNLL files written into `folder` (train, validation, test)."""
    paths = {key: str(write(folder / name, files[split])) for split, (key, name) in _FILES.items() if split in files}
    return FinetuneDataConfig(type="token_classification", **paths, **fields)


TRAIN = "John B-PER\nSmithson I-PER\nvisited O\nLondonderry B-LOC\n\nMary B-PER\nlives O\nin O\nBerlin B-LOC\n"
DEV = "Johnson B-PER\nvisited O\nLondonderry B-LOC\ntoday O\n\nnobody O\n"
TEST = "Mary\nvisited\nBerlin\n"


def test_task_from_files(tmp_path: Path) -> None:
    task = TaggingTask.from_config(tagging_config(tmp_path, {"train": TRAIN, "validation": DEV, "test": TEST}))
    members = set(FinetuneTask.__annotations__) | {n for n in vars(FinetuneTask) if not n.startswith("_")}
    assert [m for m in sorted(members - {"__annotations__"}) if not hasattr(task, m)] == []
    assert (task.name, task.architecture, task.metrics) == ("token_classification", "token_classification", ("f1",))
    assert task.labels == ["O", "B-LOC", "B-PER", "I-PER"] and task.num_labels == 4
    assert (task.dev_splits, task.test_splits) == (["dev"], ["test"])
    assert task.splits["test"][0].tags is None
    config = tagging_config(
        tmp_path, {"train": TRAIN, "validation": DEV}, task="ner", labels=["B-PER", "I-PER", "B-LOC", "O", "X"]
    )
    small = TaggingTask.from_config(config)
    assert small.labels == ["B-PER", "I-PER", "B-LOC", "O", "X"] and small.outside_id == 3
    assert (small.name, small.test_splits) == ("ner", [])
    limited = tagging_config(tmp_path, {"train": TRAIN, "validation": DEV}, max_train_examples=1, max_eval_examples=1)
    task = TaggingTask.from_config(limited)
    assert [len(task.splits[s]) for s in ("train", "dev")] == [1, 1]
    assert task.labels == ["O", "B-LOC", "B-PER", "I-PER"]  # from the whole training file


def test_task_refuses_unlabelled_training_data_and_tags_outside_labels(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"train\.txt:1: the train split has no tags"):
        TaggingTask.from_config(tagging_config(tmp_path, {"train": TEST, "validation": DEV}))
    labels = ["O", "B-PER", "I-PER", "B-LOC"]
    with pytest.raises(UserError, match=r"dev\.txt:2: tag 'B-ORG' is not in data.labels"):
        TaggingTask.from_config(
            tagging_config(tmp_path, {"train": TRAIN, "validation": "a O\nAcme B-ORG\n"}, labels=labels)
        )


def test_hub_tags_are_ids_named_by_the_dataset_features(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub path without the network: `datasets`' builder metadata and rows are stand-ins."""
    import datasets

    import roformer.tasks.conll as conll

    names = ["O", "B-PER", "I-PER"]
    features = datasets.Features(
        {"tokens": datasets.List(datasets.Value("string")), "ner_tags": datasets.List(datasets.ClassLabel(names=names))}
    )
    builder = type("Builder", (), {"info": datasets.DatasetInfo(features=features)})
    monkeypatch.setattr(datasets, "load_dataset_builder", lambda name, config: builder)
    rows = {"train": [{"id": "7", "tokens": ["Ann", "Lee", "ran"], "ner_tags": [1, 2, 0]}], "validation": []}
    rows["validation"] = rows["train"]

    def read_hub_split(name: str, config: str | None, split: str) -> list[Record]:
        if split not in rows:
            raise UserError(f"cannot load {name} split {split}: no such split")
        return [Record(row, f"{name}:{split}:{i}") for i, row in enumerate(rows[split])]

    monkeypatch.setattr(conll, "read_hub_split", read_hub_split)
    config = FinetuneDataConfig(
        type="token_classification", source="hub", hub_name="toy", tagging=TaggingConfig(tags_column="ner_tags")
    )
    task = TaggingTask.from_config(config)
    assert task.labels == names and task.test_splits == []  # the hub's order; no test split: none
    assert task.splits["dev"][0].tags == ["B-PER", "I-PER", "O"] and task.splits["dev"][0].index == "7"
    rows["train"] = [{"tokens": ["Ann"], "ner_tags": [5]}]
    with pytest.raises(UserError, match="toy:train:0: tag id 5 is outside the 3 labels"):
        TaggingTask.from_config(config)


@pytest.fixture(scope="module")
def tokenizer():
    """A WordPiece vocabulary so small that most words are several pieces."""
    from roformer.data.tokenizer import train_tokenizer

    texts = ["John Smith lives in Berlin", "Mary Johnson works at Google in London", "the quick brown fox"] * 3
    return train_tokenizer(texts, vocab_size=70, min_frequency=1)


def pieces(tokenizer, ids: list[int]) -> list[str]:
    return tokenizer.convert_ids_to_tokens(ids)


def test_first_pieces_carry_the_tags(tmp_path: Path, tokenizer) -> None:
    task = TaggingTask.from_config(tagging_config(tmp_path, {"train": TRAIN, "validation": DEV}))
    dev = task.encode(tokenizer, 64)["dev"]
    ids, labels, positions = dev.ids[0], dev.labels[0], dev.positions[0]
    words = DEV.split("\n\n")[0].split("\n")
    assert len(positions) == len(words)
    tokens = pieces(tokenizer, ids)
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and len(tokens) > len(words) + 2  # words split
    for position, line in zip(positions, words):
        word, tag = line.split()
        assert labels[position] == task.labels.index(tag)
        assert tokens[position] == tokenizer.tokenize(word)[0]
    assert [p for p, label in enumerate(labels) if label != IGNORE_INDEX] == positions
    assert dev.gold == [["B-PER", "O", "B-LOC", "O"], ["O"]] and dev.lengths == [len(r) for r in dev.ids]


def test_label_all_tokens_continues_the_word_inside_its_entity(tmp_path: Path, tokenizer) -> None:
    config = tagging_config(tmp_path, {"train": TRAIN, "validation": DEV}, labels=["O", "B-PER", "I-PER", "B-LOC"])
    config.tagging = TaggingConfig(label_all_tokens=True)
    task = TaggingTask.from_config(config)
    dev = task.encode(tokenizer, 64)["dev"]
    labels = [task.labels[i] if i != IGNORE_INDEX else None for i in dev.labels[0]]
    johnson = len(tokenizer.tokenize("Johnson"))
    londonderry = len(tokenizer.tokenize("Londonderry"))
    assert johnson > 1 and londonderry > 1
    assert labels[1 : 1 + johnson] == ["B-PER"] + ["I-PER"] * (johnson - 1)
    at = dev.positions[0][2]
    assert labels[at : at + londonderry] == ["B-LOC"] + [None] * (londonderry - 1)  # I-LOC: not a label
    assert labels[0] is None and labels[-1] is None
    assert [continuation_tag(t) for t in ("B-X", "I-X", "E-X", "S-X", "O", "NN", "-LRB-")] == [
        "I-X",
        "I-X",
        "I-X",
        "I-X",
        "O",
        "NN",
        "-LRB-",
    ]


def test_cut_off_words_are_predicted_o_and_scored(tmp_path: Path, tokenizer, caplog) -> None:
    task = TaggingTask.from_config(tagging_config(tmp_path, {"train": TRAIN, "validation": DEV}))
    with caplog.at_level(logging.WARNING, logger="roformer.tasks.tagging"):
        dev = task.encode(tokenizer, 8)["dev"]
    assert "dev: 2 words cut off by max_length 8 and 0 mapped to no token: predicted O" in caplog.text
    assert len(dev.ids[0]) == 8 and dev.positions[0][2:] == [-1, -1]
    logits = torch.zeros(2, 8, task.num_labels)
    logits[0, dev.positions[0][0], task.labels.index("B-PER")] = 1.0  # Johnson
    logits[0, dev.positions[0][1], task.labels.index("I-PER")] = 1.0  # visited: wrong
    logits[1, :, task.labels.index("O")] = 1.0
    predictions = task.predictions(logits, dev, [0, 1])
    assert [[task.labels[i] for i in row] for row in predictions] == [["B-PER", "I-PER", "O", "O"], ["O"]]
    scores = task.evaluate(dev, predictions)
    # predicted PER over words 0-1, gold PER (0, 0) and LOC (2, 2): nothing right
    assert scores == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "accuracy": 0.6, "score": 0.0}


def test_collate_pads_labels_with_ignore_index(tmp_path: Path, tokenizer) -> None:
    task = TaggingTask.from_config(tagging_config(tmp_path, {"train": TRAIN, "validation": DEV, "test": TEST}))
    encoded = task.encode(tokenizer, 64)
    train = encoded["train"]
    batch = task.collate(train, [1, 0], pad_id=0, cap=64)
    longest = max(train.lengths)
    assert batch["input_ids"].shape == batch["labels"].shape == (2, -(-longest // 8) * 8)
    for i, r in enumerate([1, 0]):
        n = train.lengths[r]
        assert batch["labels"][i, :n].tolist() == train.labels[r]
        assert (batch["labels"][i, n:] == IGNORE_INDEX).all() and batch["attention_mask"][i].sum() == n
    assert (task.padded_length(9, 64), task.padded_length(9, 12), task.padded_length(13, 12)) == (16, 12, 13)
    assert encoded["train"].labelled and not encoded["test"].labelled
    assert "labels" not in task.collate(encoded["test"], [0], pad_id=0, cap=64)


def test_predictions_file_round_trip(tmp_path: Path, tokenizer) -> None:
    data = tmp_path / "data"
    data.mkdir()
    conll_dev = "-DOCSTART- -X- O\n\nJohnson NNP B-PER\nvisited VBD O\n\nnobody NN O\n"
    task = TaggingTask.from_config(tagging_config(data, {"train": TRAIN, "validation": conll_dev, "test": TEST}))
    encoded = task.encode(tokenizer, 64)
    predicted = {"dev": [[2, 3], [1]], "test": [[0, 2, 1]]}  # O, B-LOC, B-PER, I-PER
    run = tmp_path / "run"
    run.mkdir()
    task.write_predictions(run, encoded, predicted)
    assert (run / "dev.conll").read_text() == ("Johnson NNP B-PER B-PER\nvisited VBD O I-PER\n\nnobody NN O B-LOC\n\n")
    back = read_conll(run / "dev.conll")
    assert [s.tags for s in back] == [["B-PER", "I-PER"], ["B-LOC"]]
    assert [s.tags for s in read_conll(run / "dev.conll", tag_column=-2)] == [["B-PER", "O"], ["O"]]
    assert (run / "test.conll").read_text() == "Mary O\nvisited B-PER\nBerlin B-LOC\n\n"
    report = json.loads((run / "dev.report.json").read_text())
    assert report["PER"]["support"] == 1.0 and report["micro avg"]["precision"] == 0.0
    assert not (run / "test.report.json").exists()
    submission = tmp_path / "submission"
    submission.mkdir()
    task.write_submission(run, submission)
    assert [p.name for p in submission.iterdir()] == ["test.conll"]


def test_json_predictions_are_word_gold_predicted(tmp_path: Path, tokenizer) -> None:
    rows = [{"tokens": ["New York", "is"], "tags": ["B-LOC", "O"]}, {"tokens": ["Bob"], "tags": ["B-PER"]}]
    train = write(tmp_path / "train.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    config = FinetuneDataConfig(type="token_classification", train_file=str(train), validation_file=str(train))
    task = TaggingTask.from_config(config)
    task.write_predictions(tmp_path, task.encode(tokenizer, 64), {"dev": [[1, 0], [0]]})
    assert (tmp_path / "dev.conll").read_text() == "New_York B-LOC B-LOC\nis O O\n\nBob B-PER O\n\n"
    submission = tmp_path / "submission"
    submission.mkdir()
    task.write_submission(tmp_path, submission)
    assert list(submission.iterdir()) == []  # no test split, no submission


# ----------------------------------------------------------------------------------------------------------------
# The real data


def test_conll2003_counts_match_the_data_readme(shared_data: Path) -> None:
    folder = shared_data / "ner" / "conll2003"
    counts = {name: read_conll(folder / f"{name}.txt") for name in ("train", "valid", "test")}
    assert {k: len(v) for k, v in counts.items()} == {"train": 14041, "valid": 3250, "test": 3453}
    entities = {
        name: Counter(kind for s in sentences for kind, _, _ in chunks(s.tags)) for name, sentences in counts.items()
    }
    assert entities["train"] == {"PER": 6600, "ORG": 6321, "LOC": 7140, "MISC": 3438}
    assert sum(entities["valid"].values()) == 5942 and sum(entities["test"].values()) == 5648
    assert label_set(counts["train"]) == ["O"] + [f"{p}-{t}" for p in "BI" for t in ("LOC", "MISC", "ORG", "PER")]


def test_the_ignored_label_is_the_models() -> None:
    assert tagging_module.IGNORE_INDEX == IGNORE_INDEX  # data does not import model: the value is repeated


# ----------------------------------------------------------------------------------------------------------------
# Plain tags (POS, IO), the selecting metric, word-level Chinese

POS_TRAIN = "The DT\ndog NN\nruns VBZ\n\nA DT\ncat NN\nsleeps VBZ\n"
POS_DEV = "The DT\ncat NN\nruns VBZ\n\ndog NN\n"
IO_TRAIN = "John PER\nvisited O\nBerlin LOC\n\nMary PER\n"


def perfect(task: TaggingTask, split: str) -> list[list[int]]:
    """Predictions equal to the gold tags of `split`."""
    return [[task.labels.index(t) for t in s.tags] for s in task.splits[split]]


@pytest.mark.parametrize(("train", "dev"), [(POS_TRAIN, POS_DEV), (IO_TRAIN, "Ann PER\nleft O\n")])
def test_plain_tags_select_by_token_accuracy_not_an_entity_f1_of_zero(tmp_path: Path, train: str, dev: str) -> None:
    task = TaggingTask.from_config(tagging_config(tmp_path, {"train": train, "validation": dev}))
    assert not task.entities and task.metrics == ("accuracy",)
    encoded = task.encode(train_tokenizer_of(train + dev), 32)["dev"]
    right = perfect(task, "dev")
    assert task.evaluate(encoded, right) == {"accuracy": 1.0, "score": 1.0}  # entity F1 was 0 whatever
    wrong = [[(i + 1) % task.num_labels for i in row] for row in right]
    assert task.evaluate(encoded, wrong)["score"] == 0.0
    task.write_predictions(tmp_path, {"dev": encoded}, {"dev": right})
    report = json.loads((tmp_path / "dev.report.json").read_text())
    assert report["accuracy"] == {"accuracy": 1.0, "support": float(sum(len(t) for t in encoded.gold))}


def test_an_entity_scheme_named_for_plain_tags_is_refused_and_none_forces_accuracy(tmp_path: Path) -> None:
    config = tagging_config(tmp_path, {"train": POS_TRAIN, "validation": POS_DEV})
    config.tagging = TaggingConfig(scheme="IOB2")
    with pytest.raises(UserError, match=r"train\.txt: data.tagging.scheme is IOB2, but no tag has a B-/I-/E-/S-"):
        TaggingTask.from_config(config)
    ner = tagging_config(tmp_path, {"train": TRAIN, "validation": DEV})
    ner.tagging = TaggingConfig(scheme="none", label_all_tokens=True)
    task = TaggingTask.from_config(ner)
    assert not task.entities and task.metrics == ("accuracy",)
    assert continuation_tag("B-PER", entities=False) == "B-PER"  # a plain tag of its own
    ner.tagging = TaggingConfig()
    assert TaggingTask.from_config(ner).entities  # auto: B-/I- prefixes


def test_data_metrics_choose_the_selecting_metric_of_tagging(tmp_path: Path) -> None:
    task = TaggingTask.from_config(tagging_config(tmp_path, {"train": TRAIN, "validation": DEV}, metrics=["accuracy"]))
    encoded = task.encode(train_tokenizer_of(TRAIN + DEV), 32)["dev"]
    outside = [[task.outside_id] * len(s.tags) for s in task.splits["dev"]]  # every word O: no entity found
    scores = task.evaluate(encoded, outside)
    assert scores["f1"] == 0.0 and scores["score"] == scores["accuracy"] == 3 / 5
    both = TaggingTask.from_config(
        tagging_config(tmp_path, {"train": TRAIN, "validation": DEV}, metrics=["f1", "accuracy"])
    )
    assert both.evaluate(encoded, outside)["score"] == pytest.approx(3 / 10)
    with pytest.raises(UserError, match=r"data.metrics: f1 are entity-level, and these tags mark no entities"):
        TaggingTask.from_config(tagging_config(tmp_path, {"train": POS_TRAIN, "validation": POS_DEV}, metrics=["f1"]))
    with pytest.raises(ConfigError, match=r"metrics: unknown \['bleu'\] for type token_classification"):
        tagging_config(tmp_path, {"train": TRAIN, "validation": DEV}, metrics=["bleu"])


def test_tag_report_counts_each_tag_over_words() -> None:
    gold = [["DT", "NN", "VBZ"], ["NN"]]
    predicted = [["DT", "NN", "NN"], ["VBZ"]]
    report = tag_report(gold, predicted)
    # NN: predicted twice, right once, gold twice; VBZ: predicted once (wrong), gold once
    assert report["NN"] == {"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2.0}
    assert report["VBZ"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1.0}
    assert report["DT"]["f1"] == 1.0 and report["accuracy"] == {"accuracy": 0.5, "support": 4.0}
    assert has_entities(["O", "B-PER"]) and has_entities(["S-X"]) and not has_entities(["O", "PER", "NN", "-LRB-"])


def train_tokenizer_of(text: str):
    from roformer.data.tokenizer import train_tokenizer

    words = [line.split()[0] for line in text.splitlines() if line.strip()]
    return train_tokenizer([" ".join(words)] * 5, vocab_size=80, min_frequency=1)


def test_word_level_chinese_spells_out_words_outside_the_vocabulary(tmp_path: Path) -> None:
    """bert4keras' rule, as QA and classification read jieba's words: characters, never `##` pieces."""
    transformers = pytest.importorskip("transformers")
    from roformer.data.tokenizer import load_tokenizer, word_vocabulary

    folder = tmp_path / "wobert"
    folder.mkdir()
    chars = list("北京市公园天气很好")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars), "北京", "公园"]
    (folder / "vocab.txt").write_text("".join(f"{t}\n" for t in vocab), encoding="utf-8")
    tokenizer = load_tokenizer(folder)
    assert word_vocabulary(tokenizer) is not None
    train = "北京市 B-LOC\n公园 I-LOC\n天气 O\n很好 O\n"
    task = TaggingTask.from_config(tagging_config(tmp_path, {"train": train, "validation": train}))
    dev = task.encode(tokenizer, 32)["dev"]
    tokens = pieces(tokenizer, dev.ids[0])
    assert tokens == ["[CLS]", "北", "京", "市", "公园", "天", "气", "很", "好", "[SEP]"]
    assert not any(t.startswith("##") for t in tokens)  # was 北京 ##市, 天 ##气, 很 ##好
    assert dev.positions[0] == [1, 4, 5, 7]
    # the authors' tokenizer (bert4keras: a word outside the vocabulary tokenized the plain BERT way) on each word
    bert = transformers.BertTokenizer(str(folder / "vocab.txt"))
    assert tokens[1:-1] == [
        t for w in ("北京市", "公园", "天气", "很好") for t in ([w] if w in vocab else bert.tokenize(w))
    ]
