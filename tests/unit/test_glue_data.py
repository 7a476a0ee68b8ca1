"""GLUE data: the official TSV layout (row counts of the local tasks), the hub path, local files, bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from roformer.errors import UserError
from roformer.tasks.glue_tasks import TASKS, get_task, read_files, read_glue_dir, read_hub

ROW_COUNTS = {
    "cola": (8551, 1043, 1063),
    "mrpc": (3668, 408, 1725),
    "stsb": (5749, 1500, 1379),
    "rte": (2490, 277, 3000),
}


@pytest.mark.parametrize("name", sorted(ROW_COUNTS))
def test_local_glue_tasks_load_with_exact_row_counts(name: str, shared_data: Path) -> None:
    task = get_task(name)
    splits = read_glue_dir(task, shared_data / "glue")
    assert (len(splits["train"]), len(splits["dev"]), len(splits["test"])) == ROW_COUNTS[name]
    assert all(e.label is not None for e in splits["train"] + splits["dev"])
    assert all(e.label is None for e in splits["test"])
    assert [e.index for e in splits["test"][:3]] == ["0", "1", "2"]
    assert all(len(e.texts) == len(task.text_columns) and all(e.texts) for e in splits["train"])


def test_tsv_quirks(shared_data: Path) -> None:
    cola = read_glue_dir(get_task("cola"), shared_data / "glue")
    assert cola["train"][0].texts == ("Our friends won't buy this analysis, let alone the next one we propose.",)
    assert {e.label for e in cola["train"]} == {0, 1}
    mrpc = read_glue_dir(get_task("MRPC"), shared_data / "glue")  # header behind a byte-order mark
    assert mrpc["train"][0].label == 1 and mrpc["train"][0].texts[0].startswith("Amrozi accused his brother")
    assert any('"' in t for e in mrpc["train"] for t in e.texts)  # quotes kept as text, not quoting
    stsb = read_glue_dir(get_task("sts-b"), shared_data / "glue")
    assert stsb["train"][0].label == 5.0 and all(0.0 <= e.label <= 5.0 for e in stsb["dev"])
    rte = read_glue_dir(get_task("rte"), shared_data / "glue")
    assert rte["train"][0].label == TASKS["rte"].labels.index("not_entailment")


def test_every_task_has_consistent_metadata() -> None:
    assert set(TASKS) == {"cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"}
    for task in TASKS.values():
        assert len(task.text_columns) == len(task.hub_text_columns) in (1, 2)
        assert all(split.submission for split in task.test)
    assert [s.submission for s in TASKS["mnli"].test + TASKS["mnli"].extra_tests] == [
        "MNLI-m.tsv",
        "MNLI-mm.tsv",
        "AX.tsv",
    ]
    assert TASKS["stsb"].is_regression and TASKS["stsb"].num_labels == 1 and TASKS["mnli"].num_labels == 3


def test_bad_glue_input(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown GLUE task 'sst3'"):
        get_task("sst3")
    with pytest.raises(UserError, match="no RTE directory"):
        read_glue_dir(get_task("rte"), tmp_path)
    rte = tmp_path / "RTE"
    rte.mkdir()
    (rte / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\tc\td\tmaybe\n")
    with pytest.raises(UserError, match=r"train.tsv:3: label 'maybe' is not one of the rte labels"):
        read_glue_dir(get_task("rte"), tmp_path)
    (rte / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n")
    with pytest.raises(UserError, match="dev.tsv: GLUE split file not found"):
        read_glue_dir(get_task("rte"), tmp_path)
    (rte / "dev.tsv").write_text("index\tsentence1\tsentence2\n0\ta\tb\n")  # a test-style file used as dev
    with pytest.raises(UserError, match="no column 'label'"):
        read_glue_dir(get_task("rte"), tmp_path)


def test_local_files_with_named_columns(tmp_path: Path) -> None:
    train = tmp_path / "train.csv"
    train.write_text('sentence,label\n"a fine, warm film",1\nawful,0\n')
    test = tmp_path / "test.jsonl"
    test.write_text('{"sentence": "great", "idx": 7}\n')
    splits = read_files(get_task("sst2"), {"train": str(train), "test": str(test)})
    assert [(e.texts, e.label) for e in splits["train"]] == [(("a fine, warm film",), 1), (("awful",), 0)]
    assert splits["test"][0].index == "7" and splits["test"][0].label is None
    with pytest.raises(UserError, match="no label column 'label'"):
        read_files(get_task("sst2"), {"train": str(test)})


def test_hub_path(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    def fake_load(name, config, split):
        rows = [{"premise": "p", "hypothesis": "h", "label": -1 if split.startswith("test") else 2, "idx": 3}]
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    splits = read_hub(get_task("mnli"))
    assert set(splits) == {"train", "dev_matched", "dev_mismatched", "test_matched", "test_mismatched", "ax"}
    assert splits["train"][0].label == 2 and splits["ax"][0].label is None and splits["ax"][0].index == "3"


def test_mnli_from_local_files_with_unlabelled_tests_and_both_dev_splits(tmp_path: Path) -> None:
    """`source: files` for MNLI: test files without labels, matched and (optionally) mismatched dev files."""
    from roformer.config import ConfigError
    from roformer.tasks.config import FinetuneDataConfig
    from roformer.tasks.glue import load_glue_splits

    labelled = "premise,hypothesis,label\na cat sat,a cat is sitting,entailment\nit rains,it is dry,contradiction\n"
    for name in ("train", "dev_m", "dev_mm"):
        (tmp_path / f"{name}.csv").write_text(labelled)
    for name in ("test_m", "test_mm"):
        (tmp_path / f"{name}.csv").write_text("idx,premise,hypothesis\n0,a dog runs,an animal moves\n")
    files = {
        "source": "files",
        "task": "mnli",
        "train_file": str(tmp_path / "train.csv"),
        "validation_file": str(tmp_path / "dev_m.csv"),
        "test_file": str(tmp_path / "test_m.csv"),
    }
    splits = load_glue_splits(FinetuneDataConfig(**files))
    assert set(splits) == {"train", "dev_matched", "test_matched"} and splits["test_matched"][0].label is None
    both = FinetuneDataConfig(
        **files,
        validation_mismatched_file=str(tmp_path / "dev_mm.csv"),
        test_mismatched_file=str(tmp_path / "test_mm.csv"),
    )
    assert set(load_glue_splits(both)) == {"train", "dev_matched", "dev_mismatched", "test_matched", "test_mismatched"}
    with pytest.raises(ConfigError, match="for MNLI"):
        FinetuneDataConfig(
            source="files", task="rte", train_file="a", validation_file="b", validation_mismatched_file="c"
        )


def test_batches_pad_to_a_multiple_of_8_within_the_model_limit() -> None:
    from roformer.tasks.glue import Encoded, collate, padded_length

    encoded = Encoded([[2, 5, 6, 3], [2, 5, 6, 7, 8, 9, 10, 11, 12, 3]], [[0] * 4, [0] * 10], [0, 1], ["a", "b"])
    batch = collate(encoded, [0, 1], 0, False, multiple=8)
    assert batch["input_ids"].shape == (2, 16) and batch["attention_mask"].sum().item() == 14
    assert collate(encoded, [0], 0, False, multiple=8)["input_ids"].shape == (1, 8)
    assert padded_length(10, 8, cap=12) == 12 and padded_length(13, 8, cap=12) == 13 and padded_length(5, 1) == 5


def _padding_fraction(sampler, lengths: list[int], steps: int, batch: int) -> float:
    padded = real = 0
    for step in range(steps):
        rows = sampler.indices(step).tolist()
        for start in range(0, len(rows), batch):  # each micro-batch x process chunk is padded on its own
            chunk = [lengths[r] for r in rows[start : start + batch]]
            padded, real = padded + len(chunk) * max(chunk), real + sum(chunk)
    return 1 - real / padded


def test_length_grouped_batches_are_permutations_aligned_with_steps() -> None:
    from roformer.data.sampling import EpochSampler, LengthGroupedSampler

    lengths = [(i * 37) % 101 + 1 for i in range(1000)]
    g = 24  # 1000 is no multiple of 24: epochs 1 and 2 start inside a global batch
    grouped = LengthGroupedSampler(lengths, g, seed=3, window=5)
    plain = EpochSampler(len(lengths), g, seed=3)
    for epoch in range(3):
        assert sorted(grouped.permutation(epoch).tolist()) == list(range(1000))
    # 3 epochs in steps: every example 3 times, same as the plain sampler
    steps = 3 * 1000 // g
    seen = torch.cat([grouped.indices(s) for s in range(steps)]).bincount(minlength=1000)
    assert seen.min() >= 2 and seen.max() <= 3 and seen.sum() == steps * g
    # a global batch inside an epoch holds neighbours in length; the plain sampler's do not
    assert _padding_fraction(grouped, lengths, steps, 8) < 0.5 * _padding_fraction(plain, lengths, steps, 8)
    # deterministic (resume: a fresh sampler gives the same step), and the seed matters
    assert torch.equal(LengthGroupedSampler(lengths, g, 3, 5).indices(50), grouped.indices(50))
    assert not torch.equal(LengthGroupedSampler(lengths, g, 4, 5).indices(50), grouped.indices(50))
    # the batch order inside a window is shuffled: not monotone in length
    firsts = [lengths[grouped.indices(s)[0]] for s in range(5)]
    assert firsts != sorted(firsts, reverse=True)


def test_length_grouping_cuts_padding_on_mrpc(shared_data: Path) -> None:
    """Measured on MRPC (whitespace words as the length, chunks of 32): 28.5% padding -> 1.1%."""
    from roformer.data.sampling import EpochSampler, LengthGroupedSampler

    train = read_glue_dir(get_task("mrpc"), shared_data / "glue")["train"]
    lengths = [sum(len(t.split()) for t in ex.texts) + 3 for ex in train]
    plain = _padding_fraction(EpochSampler(len(lengths), 32, 0), lengths, 100, 32)
    grouped = _padding_fraction(LengthGroupedSampler(lengths, 32, 0), lengths, 100, 32)
    assert grouped < plain / 4, (plain, grouped)
