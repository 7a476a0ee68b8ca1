"""Multiple-choice data (roformer.tasks.choices): reading, labels, SWAG pairs, CHID blanks and their window, batches."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from helpers import tiny_config

from roformer.data.tokenizer import train_tokenizer
from roformer.errors import ConfigError, UserError
from roformer.model.attention import PER_ROW_INPUTS, ForwardInputs, SelfAttention
from roformer.model.model import MultipleChoice
from roformer.tasks import choices as choices_module
from roformer.tasks import records as records_module
from roformer.tasks.base import FinetuneTask
from roformer.tasks.choices import ChoicesConfig, ChoicesTask, EncodedChoices, blank_window, parse_choice_label
from roformer.tasks.config import FinetuneDataConfig
from roformer.tasks.records import Record

WORDS = [f"w{i}" for i in range(80)]
SWAG = {"context_column": "sent1", "question_column": "sent2", "choice_columns": ["ending0", "ending1", "ending2"]}
CHID = {"context_column": "content", "choices_column": "candidates", "blank": "#idiom#"}


@pytest.fixture(scope="module")
def tokenizer():
    """A word-level tokenizer of WORDS: one token per word, so windows can be read as words."""
    return train_tokenizer([" ".join(WORDS)] * 2 + ["the a is of . , ?"], vocab_size=400, min_frequency=1)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return path


def swag_row(context: str, start: str, endings: list[str], label: object = 0, **extra: object) -> dict:
    return {
        "sent1": context,
        "sent2": start,
        **{f"ending{j}": e for j, e in enumerate(endings)},
        "label": label,
        **extra,
    }


def chid_row(content: str, candidates: list[str], answer: object = 0, **extra: object) -> dict:
    return {"content": content, "candidates": candidates, "answer": answer, **extra}


def make_task(
    tmp_path: Path,
    train: list[dict],
    dev: list[dict] | None = None,
    test: list[dict] | None = None,
    choices: dict | None = None,
    **data: object,
) -> ChoicesTask:
    """The task of jsonl files holding `train`, `dev` (default: train) and `test` (optional)."""
    files = {"train_file": write_jsonl(tmp_path / "train.jsonl", train)}
    files["validation_file"] = write_jsonl(tmp_path / "dev.jsonl", dev if dev is not None else train)
    if test is not None:
        files["test_file"] = write_jsonl(tmp_path / "test.jsonl", test)
    config = FinetuneDataConfig(
        type="multiple_choice",
        choices=ChoicesConfig(**(choices or SWAG)),
        **{k: str(v) for k, v in files.items()},
        **data,
    )
    return ChoicesTask.from_config(config)


def tokens(tokenizer, ids: list[int]) -> str:
    return " ".join(tokenizer.convert_ids_to_tokens(ids))


# ----------------------------------------------------------------------------------------------------------------
# The task as the recipe sees it


def test_the_task_gives_every_member_of_the_protocol(tmp_path: Path) -> None:
    task = make_task(tmp_path, [swag_row("w1", "w2", ["w3", "w4", "w5"])], test=[swag_row("w1", "w2", ["a", "b", "c"])])
    members = set(FinetuneTask.__annotations__) | {n for n in vars(FinetuneTask) if not n.startswith("_")}
    assert [m for m in sorted(members - {"__annotations__"}) if not hasattr(task, m)] == []
    assert (task.name, task.architecture, task.num_labels, task.metrics) == (
        "multiple_choice",
        "multiple_choice",
        3,
        ("accuracy",),
    )
    assert (task.dev_splits, task.test_splits) == (["dev"], ["test"])
    assert make_task(tmp_path, [swag_row("w1", "w2", ["w3", "w4", "w5"])], task="swag").name == "swag"


def test_num_labels_does_not_change_the_choice_head() -> None:
    # load_pretrained passes num_labels = K; the head scores each choice with one output whatever it says
    shapes = [{k: v.shape for k, v in MultipleChoice(tiny_config(num_labels=k)).state_dict().items()} for k in (2, 7)]
    assert shapes[0] == shapes[1] and shapes[0]["out.weight"] == (1, tiny_config().hidden_size)


def test_only_the_per_row_forward_inputs_are_cut_into_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new forward input of the whole batch (a tensor, not one per row) reaches attention as given.

    Every tensor input was reshaped as if it had a row per choice: such an input crashed the head.
    """
    monkeypatch.setattr(ForwardInputs, "__optional_keys__", ForwardInputs.__optional_keys__ | {"batch_scale"})
    seen = []
    forward = SelfAttention.forward
    monkeypatch.setattr(SelfAttention, "forward", lambda self, x, ctx: seen.append(ctx.inputs) or forward(self, x, ctx))
    B, K, T = 2, 3, 7
    ids = torch.randint(1, 50, (B, K, T), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(T).expand(B, K, T) + 2  # per row: every choice its own
    scale = torch.tensor([2.0])  # of the batch
    torch.manual_seed(0)
    with torch.no_grad():
        logits = MultipleChoice(tiny_config()).eval()(ids, position_ids=positions, batch_scale=scale).logits
    assert logits.shape == (B, K) and len(seen) == tiny_config().num_layers
    assert all(inputs["batch_scale"] is scale for inputs in seen)
    assert all(torch.equal(inputs["position_ids"], positions.reshape(B * K, T)) for inputs in seen)
    assert "batch_scale" not in PER_ROW_INPUTS and PER_ROW_INPUTS < ForwardInputs.__optional_keys__


def test_blank_and_question_together_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="blank and question_column"):
        make_task(tmp_path, [chid_row("w1 #idiom#", ["w2", "w3"])], choices={**CHID, "question_column": "q"})


# ----------------------------------------------------------------------------------------------------------------
# SWAG-style pairs


def test_swag_candidates_are_pairs_of_context_and_question_plus_candidate(tmp_path: Path, tokenizer) -> None:
    rows = [swag_row("w1 w2 w3", "w4", ["w5", "w6 w7", "w8"], 1), swag_row("w9", "w10 w11", ["w12", "w13", "w14"], 2)]
    task = make_task(tmp_path, rows)
    split = task.encode(tokenizer, 64)["train"]
    assert len(split.ids) == 6 and split.num_choices == 3 and split.labels == [1, 2]
    assert tokens(tokenizer, split.ids[1]) == "[CLS] w1 w2 w3 [SEP] w4 w6 w7 [SEP]"
    assert split.types[1] == [0] * 5 + [1] * 4
    assert tokens(tokenizer, split.ids[5]) == "[CLS] w9 [SEP] w10 w11 w14 [SEP]"
    assert split.lengths == [9, 7]  # the longest candidate of each question


def test_without_a_question_the_second_text_is_the_candidate(tmp_path: Path, tokenizer) -> None:
    settings = {"context_column": "sent1", "choice_columns": ["ending0", "ending1"]}
    task = make_task(tmp_path, [swag_row("w1 w2", "unused", ["w3", "w4"])], choices=settings)
    split = task.encode(tokenizer, 64)["train"]
    assert [tokens(tokenizer, row) for row in split.ids] == ["[CLS] w1 w2 [SEP] w3 [SEP]", "[CLS] w1 w2 [SEP] w4 [SEP]"]


def test_pairs_are_cut_longest_first_to_max_length(tmp_path: Path, tokenizer) -> None:
    context = " ".join(WORDS[:30])
    task = make_task(tmp_path, [swag_row(context, "w40", ["w41 w42", "w43", "w44"])])
    split = task.encode(tokenizer, 12)["train"]
    assert [len(row) for row in split.ids] == [12, 12, 12]
    assert tokens(tokenizer, split.ids[0]) == "[CLS] w0 w1 w2 w3 w4 w5 [SEP] w40 w41 w42 [SEP]"  # the context is cut


def test_a_list_of_candidates_may_be_a_json_list_in_a_csv_cell(tmp_path: Path) -> None:
    for split in ("train", "dev"):
        with (tmp_path / f"{split}.csv").open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["content", "candidates", "answer"])
            writer.writerow(["w1 #idiom# w2", json.dumps(["w3", "w4"]), "w4"])
    config = FinetuneDataConfig(
        type="multiple_choice",
        train_file=str(tmp_path / "train.csv"),
        validation_file=str(tmp_path / "dev.csv"),
        label_column="answer",
        choices=ChoicesConfig(**CHID),
    )
    question = ChoicesTask.from_config(config).splits["train"][0]
    assert (question.choices, question.label, question.id) == (("w3", "w4"), 1, "0")


# ----------------------------------------------------------------------------------------------------------------
# CHID-style blanks


def test_each_candidate_fills_the_blank_and_is_read_alone(tmp_path: Path, tokenizer) -> None:
    task = make_task(
        tmp_path, [chid_row("w1 w2 #idiom# w3, w4", ["w5", "w6 w7", "w8"], 2)], choices=CHID, label_column="answer"
    )
    split = task.encode(tokenizer, 64)["train"]
    assert [tokens(tokenizer, row) for row in split.ids] == [
        "[CLS] w1 w2 w5 w3 , w4 [SEP]",
        "[CLS] w1 w2 w6 w7 w3 , w4 [SEP]",
        "[CLS] w1 w2 w8 w3 , w4 [SEP]",
    ]
    assert all(set(types) == {0} for types in split.types) and split.labels == [2]


def test_a_long_context_keeps_a_window_centred_on_the_candidate(tmp_path: Path, tokenizer) -> None:
    left, right = " ".join(WORDS[:30]), " ".join(WORDS[30:60])
    rows = [
        chid_row(f"{left} #idiom# {right}", ["w70", "w71 w72 w73"]),
        chid_row(f"w0 #idiom# {right}", ["w70", "w71 w72 w73"]),  # little on the left: the right side gets the room
        chid_row(f"{left} #idiom# w30", ["w70", "w71 w72 w73"]),  # and the other way round
    ]
    split = make_task(tmp_path, rows, choices=CHID, label_column="answer").encode(tokenizer, 12)["train"]
    assert [tokens(tokenizer, row) for row in split.ids] == [
        "[CLS] w26 w27 w28 w29 w70 w30 w31 w32 w33 w34 [SEP]",  # 9 tokens of room: 4 left, 5 right
        "[CLS] w27 w28 w29 w71 w72 w73 w30 w31 w32 w33 [SEP]",
        "[CLS] w0 w70 w30 w31 w32 w33 w34 w35 w36 w37 [SEP]",
        "[CLS] w0 w71 w72 w73 w30 w31 w32 w33 w34 w35 [SEP]",
        "[CLS] w22 w23 w24 w25 w26 w27 w28 w29 w70 w30 [SEP]",
        "[CLS] w24 w25 w26 w27 w28 w29 w71 w72 w73 w30 [SEP]",
    ]


@pytest.mark.parametrize(
    ("left", "middle", "right", "budget", "kept"),
    [
        (100, 2, 100, 10, (4, 4)),
        (100, 1, 100, 10, (4, 5)),  # the odd token goes right
        (1, 2, 100, 10, (1, 7)),
        (100, 2, 0, 10, (8, 0)),
        (3, 2, 3, 10, (3, 3)),  # everything fits
        (5, 10, 5, 10, (0, 0)),  # the candidate fills the budget
    ],
)
def test_blank_window(left: int, middle: int, right: int, budget: int, kept: tuple[int, int]) -> None:
    assert blank_window(left, middle, right, budget) == kept
    assert sum(kept) + middle <= budget


def test_a_candidate_longer_than_max_length_is_an_error(tmp_path: Path, tokenizer) -> None:
    task = make_task(
        tmp_path, [chid_row("w1 #idiom# w2", ["w3", " ".join(WORDS[:20])])], choices=CHID, label_column="answer"
    )
    with pytest.raises(UserError, match=r"train\.jsonl:1: candidate 1 has 20 tokens, more than max_length - 2 = 10"):
        task.encode(tokenizer, 12)


@pytest.mark.parametrize("content", ["w1 w2", "w1 #idiom# w2 #idiom#"])
def test_a_context_needs_exactly_one_blank(tmp_path: Path, content: str) -> None:
    rows = [chid_row("w1 #idiom#", ["w2", "w3"]), chid_row(content, ["w2", "w3"])]
    with pytest.raises(UserError, match=r"train\.jsonl:2: \d blanks '#idiom#' in 'content', one expected"):
        make_task(tmp_path, rows, choices=CHID, label_column="answer")


def test_jieba_segments_the_sides_of_the_blank_and_the_candidates(
    tmp_path: Path, tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = []

    def segmenter(tokenizer=None):
        def segment(text: str) -> str:
            seen.append(text)
            return text.replace("w1", "w1 w2")  # visible in the tokens

        return segment

    monkeypatch.setattr(choices_module, "jieba_presegmenter", segmenter)
    task = make_task(
        tmp_path, [chid_row("w1 #idiom# w1", ["w1", "w3"])], choices=CHID, label_column="answer", jieba=True
    )
    split = task.encode(tokenizer, 64)["train"]
    assert tokens(tokenizer, split.ids[0]) == "[CLS] w1 w2 w1 w2 w1 w2 [SEP]"
    assert set(seen) == {"w1 ", " w1", "w1", "w3"}  # the sides of the blank, the candidates


# ----------------------------------------------------------------------------------------------------------------
# Labels


@pytest.mark.parametrize(("value", "index"), [(2, 2), ("2", 2), (" 1 ", 1), (2.0, 2), ("w6", 1), ("w7 ", 2), (0, 0)])
def test_a_label_is_an_index_digits_or_the_candidate_text(value: object, index: int) -> None:
    assert parse_choice_label(value, ("w5", "w6", "w7"), "f.jsonl:3") == index


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (3, "label 3 is out of range \\(3 candidates: 0-2\\)"),
        ("-2", "label -2 is out of range"),
        ("w9", "label 'w9' is neither a candidate's index nor one of the candidates"),
        (True, "label True is neither"),
        (1.5, "label 1.5 is neither"),
    ],
)
def test_a_bad_label_names_the_file_and_line(value: object, message: str) -> None:
    with pytest.raises(UserError, match=f"^f.jsonl:3: {message}"):
        parse_choice_label(value, ("w5", "w6", "w7"), "f.jsonl:3")


def test_a_label_matching_two_candidates_is_ambiguous() -> None:
    with pytest.raises(UserError, match="f:1: label 'w5' matches candidates \\[0, 2\\]"):
        parse_choice_label("w5", ("w5", "w6", "w5"), "f:1")


def test_an_out_of_range_label_in_a_file_names_its_line(tmp_path: Path) -> None:
    rows = [swag_row("w1", "w2", ["a", "b", "c"], 0), swag_row("w1", "w2", ["a", "b", "c"], 7)]
    with pytest.raises(UserError, match=r"train\.jsonl:2: label 7 is out of range"):
        make_task(tmp_path, rows)


def test_every_question_needs_the_same_number_of_candidates(tmp_path: Path) -> None:
    dev = [chid_row("w1 #idiom#", ["a", "b"]), chid_row("w1 #idiom#", ["a", "b", "c"])]
    with pytest.raises(UserError, match=r"dev\.jsonl:2: 3 candidates, but .*train\.jsonl:1 has 2"):
        make_task(tmp_path, [chid_row("w1 #idiom#", ["a", "b"])], dev, choices=CHID, label_column="answer")
    with pytest.raises(UserError, match=r"train\.jsonl:1: 1 candidate; multiple choice needs at least 2"):
        make_task(tmp_path, [chid_row("w1 #idiom#", ["a"])], choices=CHID, label_column="answer")


def test_an_empty_candidate_or_a_missing_field_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"train\.jsonl:1: candidate 1 is empty"):
        make_task(tmp_path, [swag_row("w1", "w2", ["a", " ", "c"])])
    with pytest.raises(UserError, match=r"train\.jsonl:1: no field 'ending2'"):
        make_task(tmp_path, [{"sent1": "w1", "sent2": "w2", "ending0": "a", "ending1": "b", "label": 0}])
    with pytest.raises(UserError, match=r"train\.jsonl:1: field 'candidates' is not a list"):
        make_task(tmp_path, [chid_row("w1 #idiom#", "a b")], choices=CHID, label_column="answer")


def test_test_rows_without_labels_are_only_predicted(tmp_path: Path, tokenizer) -> None:
    train = [swag_row("w1", "w2", ["a", "b", "c"], 1)]
    test = [
        {k: v for k, v in swag_row("w1", "w2", ["a", "b", "c"]).items() if k != "label"},
        swag_row("w1", "w2", ["a", "b", "c"], None),
        swag_row("w1", "w2", ["a", "b", "c"], -1),  # the hub's mark
        swag_row("w1", "w2", ["a", "b", "c"], ""),
    ]
    task = make_task(tmp_path, train, test=test)
    assert [q.label for q in task.splits["test"]] == [None] * 4
    encoded = task.encode(tokenizer, 32)["test"]
    assert not encoded.labelled and "labels" not in task.collate(encoded, [0, 1], 0, 32)


def test_a_labelled_split_needs_every_label_and_a_test_split_all_or_none(tmp_path: Path) -> None:
    train = [swag_row("w1", "w2", ["a", "b", "c"], 1)]
    with pytest.raises(UserError, match=r"dev\.jsonl:1: no label in 'label'"):
        make_task(tmp_path, train, [swag_row("w1", "w2", ["a", "b", "c"], None)])
    with pytest.raises(UserError, match=r"dev\.jsonl:1: no field 'label'"):
        make_task(tmp_path, train, [{"sent1": "w1", "sent2": "w2", "ending0": "a", "ending1": "b", "ending2": "c"}])
    test = [swag_row("w1", "w2", ["a", "b", "c"], 1), swag_row("w1", "w2", ["a", "b", "c"], None)]
    with pytest.raises(UserError, match=r"test\.jsonl:2: no label, but .*test\.jsonl:1 has one"):
        make_task(tmp_path, train, test=test)


def test_example_caps_and_ids(tmp_path: Path) -> None:
    rows = [swag_row("w1", "w2", ["a", "b", "c"], i % 3, id=f"q{i}") for i in range(5)]
    task = make_task(tmp_path, rows, test=rows, max_train_examples=2, max_eval_examples=3)
    assert [len(task.splits[s]) for s in ("train", "dev", "test")] == [2, 3, 3]
    assert [q.id for q in task.splits["dev"]] == ["q0", "q1", "q2"]


def test_an_empty_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"test\.jsonl: the test split is empty"):
        make_task(tmp_path, [swag_row("w1", "w2", ["a", "b", "c"])], test=[])


def test_hub_splits_are_train_validation_and_test_when_present(monkeypatch: pytest.MonkeyPatch) -> None:
    def read(name: str, config: str | None, split: str) -> list[Record]:
        if split == "test" and config == "no-test":
            raise UserError(f"cannot load {name} split test")
        label = -1 if split == "test" else 1
        return [Record(swag_row("w1", "w2", ["a", "b", "c"], label), f"{name}:{split}:0")]

    monkeypatch.setattr(records_module, "read_hub_split", read)
    for config, tests in (("regular", ["test"]), ("no-test", [])):
        data = FinetuneDataConfig(
            type="multiple_choice", source="hub", hub_name="swag", hub_config=config, choices=ChoicesConfig(**SWAG)
        )
        task = ChoicesTask.from_config(data)
        assert sorted(task.splits) == sorted(["train", "dev", *tests]) and task.test_splits == tests
        assert task.splits["dev"][0].where == "swag:validation:0"
    assert task.splits["train"][0].label == 1


# ----------------------------------------------------------------------------------------------------------------
# Batches, predictions, metrics and files


def encoded_split(lengths: list[list[int]], labels: list[int | None]) -> EncodedChoices:
    """K = len(lengths[0]) rows per question, of the given lengths (ids 5, 6, ... after [CLS])."""
    ids = [[2] + [5 + t for t in range(n - 1)] for row in lengths for n in row]
    types = [[0] * len(row) for row in ids]
    questions = [
        choices_module.ChoiceQuestion("c", None, ("a",) * len(lengths[0]), y, str(i), "f") for i, y in enumerate(labels)
    ]
    return EncodedChoices.of(ids, types, questions, len(lengths[0]))


def test_collate_pads_every_choice_of_a_batch_to_its_longest(tmp_path: Path) -> None:
    task = make_task(tmp_path, [swag_row("w1", "w2", ["a", "b"], 0, ending2="c")], pad_to_multiple_of=8)
    split = encoded_split([[3, 5], [9, 2], [4, 4]], [1, 0, 1])
    assert split.lengths == [5, 9, 4]
    batch = task.collate(split, [2, 0], pad_id=0, cap=64)
    assert {k: tuple(v.shape) for k, v in batch.items()} == {
        "input_ids": (2, 2, 8),  # the longest (5) rounded up to 8
        "token_type_ids": (2, 2, 8),
        "attention_mask": (2, 2, 8),
        "labels": (2,),
    }
    assert batch["attention_mask"].sum(-1).tolist() == [[4, 4], [3, 5]]
    assert batch["input_ids"][1, 0].tolist() == [2, 5, 6, 0, 0, 0, 0, 0]
    assert batch["labels"].tolist() == [1, 1]
    assert tuple(task.collate(split, [1], pad_id=0, cap=12)["input_ids"].shape) == (1, 2, 12)  # 16 capped at 12


def test_predictions_are_the_argmax_and_accuracy_scores_them(tmp_path: Path) -> None:
    task = make_task(tmp_path, [swag_row("w1", "w2", ["a", "b", "c"])])
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.5], [-2.0, -3.0, -1.0], [0.0, 0.0, 1.0]])
    split = encoded_split([[2, 2, 2]] * 4, [1, 0, 0, 2])
    predicted = task.predictions(logits, split, [0, 1, 2, 3])
    assert predicted == [1, 0, 2, 2]
    assert task.evaluate(split, predicted) == {"accuracy": 0.75, "score": 0.75}


def test_prediction_files_and_the_submission(tmp_path: Path) -> None:
    row = swag_row("w1", "w2", ["a", "b", "c"])
    task = make_task(tmp_path, [row], test=[{**row, "label": None}])
    encoded = {"dev": encoded_split([[2, 2, 2]] * 2, [1, 0]), "test": encoded_split([[2, 2, 2]] * 2, [None, None])}
    encoded["test"].index = ["t0", "t1"]
    folder, submission = tmp_path / "run", tmp_path / "submission"
    folder.mkdir()
    submission.mkdir()
    task.write_predictions(folder, encoded, {"dev": [1, 2], "test": [0, 2]})
    read = {f.name: [json.loads(line) for line in f.read_text().splitlines()] for f in folder.iterdir()}
    assert read == {
        "dev.jsonl": [{"id": "0", "prediction": 1, "label": 1}, {"id": "1", "prediction": 2, "label": 0}],
        "test.jsonl": [{"id": "t0", "prediction": 0}, {"id": "t1", "prediction": 2}],
    }
    task.write_submission(folder, submission)
    assert [f.name for f in submission.iterdir()] == ["test.jsonl"]
    assert (submission / "test.jsonl").read_text() == (folder / "test.jsonl").read_text()


# ----------------------------------------------------------------------------------------------------------------
# Real data


def test_fewclue_chid(shared_data: Path) -> None:
    folder = shared_data / "clue" / "fewclue" / "chid"
    config = FinetuneDataConfig(
        type="multiple_choice",
        task="chid",
        train_file=str(folder / "train_few_all.json"),
        validation_file=str(folder / "dev_few_all.json"),
        test_file=str(folder / "test_public.json"),
        label_column="answer",
        choices=ChoicesConfig(**CHID),
    )
    task = ChoicesTask.from_config(config)
    assert {name: len(questions) for name, questions in task.splits.items()} == {"train": 202, "dev": 202, "test": 2002}
    assert task.num_labels == 7 and task.test_splits == ["test"]
    assert all(q.label is not None for questions in task.splits.values() for q in questions)  # test_public: labelled

    # a character-level tokenizer of the dev split: a window decodes to the filled context around the candidate
    dev = task.splits["dev"]
    tokenizer = train_tokenizer([q.context for q in dev] + [c for q in dev for c in q.choices], 30000, min_frequency=1)
    normalize = tokenizer.backend_tokenizer.normalizer.normalize_str
    split = task.encode(tokenizer, 64)["dev"]
    assert max(split.lengths) == 64 and len(split.ids) == 7 * 202
    for i, q in enumerate(dev):
        for j, candidate in enumerate(q.choices):
            row = tokenizer.decode(split.ids[7 * i + j][1:-1]).replace(" ", "")
            filled = "".join(normalize(q.context.replace("#idiom#", candidate)).split())
            left, right = ("".join(normalize(side).split()) for side in q.context.split("#idiom#"))
            assert row in filled  # a window of the filled context
            middle = "".join(normalize(candidate).split())
            at = row.find(middle)  # holds the candidate where the blank was
            assert at >= 0 and left.endswith(row[:at]) and right.startswith(row[at + len(middle) :])


def test_a_row_counts_the_tokens_of_all_its_candidates() -> None:
    """Throughput and padding figures: a question is K sequences, each padded to the batch's length."""
    ids = [[2, 5, 3], [2, 5, 6, 7, 3], [2, 3], [2, 8, 3]]  # two questions of K = 2
    questions = [type("Q", (), {"label": 0, "id": str(i)})() for i in range(2)]
    split = EncodedChoices.of(ids, [[0] * len(r) for r in ids], questions, num_choices=2)
    assert (split.lengths, split.tokens, split.sequences) == ([5, 3], [8, 5], 2)
