"""The contract of every shipped fine-tuning config (configs/finetune/), on small files in the config's own format.

`roformer finetune --config NAME --set init=DIR --set data.train_file=F --set data.validation_file=F` trains and
evaluates; `train.max_steps`, `train.lrs`, `train.seeds` and `train.progress` keep their meaning; results.json names
the dev metrics as their definitions do; predictions are written under the run directory in the task's own format.
What a run must have written is asked of the task the run built (its declaration's predictions file, its label names,
folds and labelled test splits), never of a list of type names: a new type is checked with no edit here.

The small files are the first examples of the config's own data (../shared/data), cut in the format it reads: the
training file's rows for the training, dev and test samples (rows whose labels the model knows). A config whose data
is not on disk (a hub dataset, a download, a template for one's own files, a BEIR folder) names what to use instead
on a line of its own YAML, in its header comments (or its included config's, as `include:` does for keys):

    # contract test sample: data.train_file={shared}/cail2019-scm/sample.json data.triplet.unlabelled_closer=B

`--set` items, separated by spaces (several such lines add up). A file key names the file its sample is cut from
instead (`{own}`: the config's own file of that key, e.g. OCNLI's unlabelled test file); any other item is passed as
it is. Placeholders: `{shared}` (../shared/data), `{own}`, and the samples built here: `{beir}` (a BEIR folder of
built-in documents), `{first_stage}` (a first stage ranking every document of `{beir}`), `{reviews_csv}` (EPRSTMT's
reviews as a csv of `text` and `label`). Why a comment: the sample is the test's concern, so it must not be a config
key users would see (or could set) in a run's config.yaml; why in the YAML: whoever adds a config whose data is not
here says what stands in for it where the config is, and `test_every_config_s_sample_is_on_disk` checks every line.
"""

from __future__ import annotations

import csv
import json
import re
from functools import cached_property
from pathlib import Path

import pytest
import torch
from helpers import REPO, launch_two, small_beir, write_wrapper

from roformer.cli import main
from roformer.config import load
from roformer.config_yaml import read_yaml
from roformer.tasks.base import CrossValidates, Publishes, learn_model
from roformer.tasks.registry import spec_of
from roformer.train.config import FinetuneConfig

CONFIG_DIR = REPO / "configs" / "finetune"
CONFIGS = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml") if p.stem != "recipe" and "tasks:" not in p.read_text())
SAMPLE_LINE = "# contract test sample:"
SAMPLED_FILES = ("data.train_file", "data.validation_file", "data.test_file")  # keys whose sample is cut from a file


def head(source: Path, target: Path, count: int, every: int = 1) -> Path:
    """`count` examples of `source` (every `every`-th of a sample of count x every), written in its format to `target`.

    The sample: the first articles (SQuAD JSON) or sentences (CoNLL), or rows spread over the file (lines).
    """
    skip, count = 0, count * every
    text = source.read_text(encoding="utf-8")
    if source.suffix == ".json" and text.lstrip().startswith("{") and '"paragraphs"' in text[:5000]:  # SQuAD
        squad = json.loads(text)
        articles = []
        for article in squad["data"][skip : skip + count : every]:
            for paragraph in article["paragraphs"]:
                paragraph["qas"] = paragraph["qas"][:2]
            articles.append(article)
        target.write_text(json.dumps({**squad, "data": articles}, ensure_ascii=False), encoding="utf-8")
    elif "-DOCSTART-" in text[:100]:  # CoNLL: sentences
        sentences = [s for s in text.split("\n\n") if s.strip() and not s.startswith("-DOCSTART-")]
        target.write_text("\n\n".join(sentences[skip : skip + count : every]) + "\n", encoding="utf-8")
    else:  # JSON lines, tsv, csv (after its header): lines, keeping their line endings
        lines = text.splitlines(keepends=True)
        header = lines[:1] if source.suffix in (".csv", ".tsv") else []  # .tsv: GLUE's, with a header
        rows = lines[len(header) :]
        spread = rows[skip :: max(1, len(rows) // count)][:count:every]  # some files are sorted by label (CSLDCP)
        target.write_text("".join(header + [r if r.endswith("\n") else r + "\n" for r in spread]), encoding="utf-8")
    return target


def csv_of_reviews(shared_data: Path, target: Path) -> Path:
    """EPRSTMT's reviews as the template's csv: columns `text` and `label`."""
    rows = [json.loads(line) for line in (shared_data / "clue/fewclue/eprstmt/train_few_all.json").open()]
    with target.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows((row["sentence"], row["label"]) for row in rows)
    return target


def every_document_run(beir: Path, folder: Path) -> Path:
    """A first stage ranking every document of `beir` for each dev and test query, in corpus order (TREC files)."""
    folder.mkdir()
    docs = [json.loads(line)["_id"] for line in (beir / "corpus.jsonl").read_text().splitlines()]
    for split in ("dev", "test"):
        queries = dict.fromkeys(
            line.split("\t")[0] for line in (beir / "qrels" / f"{split}.tsv").read_text().splitlines()[1:]
        )
        lines = [f"{q} Q0 {d} {rank} {-rank} first\n" for q in queries for rank, d in enumerate(docs, start=1)]
        (folder / f"{split}.trec").write_text("".join(lines))
    return folder


def declared_sample(path: Path) -> list[str]:
    """The items of a config's `# contract test sample:` lines; without any, those of the config it includes."""
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith(SAMPLE_LINE)]
    if lines:
        return [item for line in lines for item in line.removeprefix(SAMPLE_LINE).split()]
    included = read_yaml(path).get("include")
    return declared_sample(path.parent / included) if included else []


class Samples:
    """What a sample line's placeholders stand for, built on first use in `folder`.

    Args:
        shared_data: ../shared/data (`{shared}`).
        folder: Where the built samples are written.
        own: The config's own file of the item being filled (`{own}`), or None.
    """

    def __init__(self, shared_data: Path, folder: Path) -> None:
        self.shared_data, self.folder, self.own = shared_data, folder, None

    def fill(self, item: str, own: str | None) -> str:
        """`item` with its placeholders replaced."""
        self.own = own
        return item.format_map(self)

    def __getitem__(self, placeholder: str) -> Path:
        if placeholder == "own":
            if self.own is None:
                raise ValueError("{own} stands for the config's own file of a file key: this config has none")
            return Path(self.own)
        if placeholder not in ("shared", "beir", "first_stage", "reviews_csv"):
            raise KeyError(f"unknown placeholder {{{placeholder}}} in a {SAMPLE_LINE!r} line")
        return getattr(self, placeholder)

    @property
    def shared(self) -> Path:
        return self.shared_data

    @cached_property
    def beir(self) -> Path:
        return small_beir(self.folder / "beir")

    @cached_property
    def first_stage(self) -> Path:
        return every_document_run(self.beir, self.folder / "first-stage")

    @cached_property
    def reviews_csv(self) -> Path:
        return csv_of_reviews(self.shared_data, self.folder / "reviews.csv")


def small_job(name: str, shared_data: Path, pretrained: Path, tmp_path: Path) -> tuple[FinetuneConfig, list[str]]:
    """The shipped config `name` and the --set items of a 2-step job on small files cut from its data (or its sample).

    The training, dev and test files are cut from the training file unless the config's sample names another source;
    a dev file only where the type reads one (cross-validation holds out its own), a test file where the config has
    one. A type without a training file (a BEIR folder) runs on what its sample names.
    """
    path = CONFIG_DIR / f"{name}.yaml"
    config = load(FinetuneConfig, path)
    samples, sources, overrides = Samples(shared_data, tmp_path), {}, []
    for item in declared_sample(path):
        key, _, value = item.partition("=")
        own = getattr(config.data, key.removeprefix("data."), None) if key in SAMPLED_FILES else None
        if key in SAMPLED_FILES:
            sources[key] = Path(samples.fill(value, own))
        else:
            overrides.append(f"{key}={samples.fill(value, None)}")
    train = sources.get("data.train_file") or (Path(config.data.train_file) if config.data.train_file else None)
    if train is not None:
        assert train.is_file(), f"{path}: {train} is not here: name a stand-in on a {SAMPLE_LINE!r} line"
        spec = config.data.spec  # a type that holds out its own dev split (cross-validation) is given no dev file
        needs_dev = spec.needs_validation_file is None or spec.needs_validation_file(config.data)
        files = {"data.train_file": head(train, tmp_path / f"train{train.suffix}", 24)}
        if needs_dev:  # dev: some training rows, so that a 67-class task's dev labels are among its training labels
            dev = sources.get("data.validation_file", train)
            files["data.validation_file"] = head(dev, tmp_path / f"dev{train.suffix}", 12, every=2)
        if config.data.test_file or "data.test_file" in sources:  # training rows again unless the sample says
            test = sources.get("data.test_file", train)
            files["data.test_file"] = head(test, tmp_path / f"test{train.suffix}", 6, every=1 if test != train else 4)
        overrides = [f"{key}={file}" for key, file in files.items()] + overrides
    common = [f"init={pretrained}", "data.max_length=128", "train.max_steps=2", "train.lrs=[1.0e-3]",
              "train.seeds=[0]", "train.batch_size=4", "train.progress=false"]  # fmt: skip
    return config, overrides + common


def test_a_sample_line_is_read_and_its_placeholders_filled(tmp_path: Path) -> None:
    """A config's own sample lines, else its included config's; file keys become sources, other items --set items."""
    (tmp_path / "base.yaml").write_text(f"{SAMPLE_LINE} data.train_file={{own}} data.qa.n_best=3\ndata: {{}}\n")
    (tmp_path / "child.yaml").write_text("include: base.yaml\n")
    (tmp_path / "own.yaml").write_text(f"{SAMPLE_LINE} a=1\n{SAMPLE_LINE} b={{shared}}/x\ninclude: base.yaml\n")
    assert declared_sample(tmp_path / "child.yaml") == ["data.train_file={own}", "data.qa.n_best=3"]
    assert declared_sample(tmp_path / "own.yaml") == ["a=1", "b={shared}/x"]  # its own lines win
    samples = Samples(tmp_path, tmp_path)
    assert samples.fill("b={shared}/x", None) == f"b={tmp_path}/x"
    assert samples.fill("{own}", "train.json") == "train.json"
    with pytest.raises(KeyError, match="unknown placeholder"):
        samples.fill("{nope}", None)
    with pytest.raises(ValueError, match="has none"):
        samples.fill("{own}", None)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_s_sample_is_on_disk(name: str, shared_data: Path, tmp_path: Path) -> None:
    """Every shipped config's small job reads files that are here: its own data, or what its sample line names."""
    _, overrides = small_job(name, shared_data, tmp_path / "init", tmp_path)
    items = [item.partition("=") for item in overrides]
    paths = [value for key, _, value in items if key.endswith(("_file", "_dir", ".first_stage"))]  # what it reads
    assert paths and all(Path(p).exists() for p in paths), overrides


# The CAIL2019-SCM configs that differ from cail2019-scm-sample in the backbone or the data size alone: the same
# format, read by the same code, so CI trains the sample and these are `slow`
SAME_FORMAT = {"cail2019-scm", "cail2019-scm-roformer", "cail2019-scm-wobert", "cail2019-scm-bert"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SAME_FORMAT else n for n in CONFIGS])
def test_a_shipped_config_trains_on_files_in_its_format(
    name: str, shared_data: Path, pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """What the run wrote is what the task it built says it writes (the task rebuilt from the run's config.yaml)."""
    from roformer.train.finetune import task_inputs

    config, overrides = small_job(name, shared_data, pretrained, tmp_path)
    out = tmp_path / "run"
    code = main(
        [
            "finetune",
            "--config",
            f"finetune/{name}",
            "--output-dir",
            str(out),
            *sum((["--set", o] for o in overrides), []),
        ]
    )
    assert code == 0, capsys.readouterr().err
    task, tokenizer, model_config = task_inputs(load(FinetuneConfig, out / "config.yaml"))
    results = json.loads((out / "results.json").read_text())
    assert results["task"] == config.data.task == task.name and results["selected"]["peak_lr"] == 1e-3
    folds = task.cross_validation_folds if task.spec.declares(CrossValidates) else None  # a grid axis: per fold
    runs = results["runs"]
    assert [(r["seed"], r.get("fold")) for r in runs] == ([(0, f) for f in range(folds)] if folds else [(0, None)])
    assert ("fold" in results["selected"]) == bool(folds)
    run = runs[0]
    assert run["steps"] == 2
    assert set(task.metrics) <= set(run["dev"]["dev"]) and "score" in run["dev"]["dev"]  # the selecting ones
    predictions = spec_of(config.data.type).predictions  # the type's declaration: its dev predictions file
    for tag in [f"lr0.001-seed0-fold{f}" for f in range(folds)] if folds else ["lr0.001-seed0"]:
        assert (out / "predictions" / tag / predictions).is_file()
    assert (out / "best" / "model.safetensors").is_file()
    published = task.model_files(1) if task.spec.declares(Publishes) else {}  # what best/ holds beside the model
    assert all((out / "best" / name).is_file() for name in published)
    labels = out / "best" / "labels.json"  # the names of the head's outputs, where they have names
    assert labels.is_file() == ("labels.json" in published)
    if labels.is_file():
        names = json.loads(labels.read_text())
        assert names == task.label_names and len(names) == task.num_labels
    encoded = task.encode(tokenizer, config.data.max_length, learn_model(task, model_config))
    scored = [split for split in task.test_splits if encoded[split].labelled]  # OCNLI's test: predicted, not scored
    assert list(run.get("test", {})) == scored and ("test" in results) == bool(scored)
    # every scored split is read against the constant answer, where the type defines one (roformer.tasks.baselines)
    has_baseline = task.trivial_guess(encoded["train"]) is not None
    assert set(results["baseline"]) == ({*task.dev_splits, *scored} if has_baseline else set())
    assert has_baseline == (config.data.type not in ("question_answering", "retrieval", "rerank"))
    own_test = any(item.startswith("data.test_file=") for item in declared_sample(CONFIG_DIR / f"{name}.yaml"))
    if config.data.test_file and not own_test:
        assert scored == task.test_splits  # a test file cut from training rows has their labels


@pytest.mark.parametrize(
    "name",
    [
        "conll2003",  # CI: a token head and a ranking head; the others (QA, choices, classification, pairs) are slow
        pytest.param("cmrc2018", marks=pytest.mark.slow),
        pytest.param("fewclue-chid", marks=pytest.mark.slow),
        pytest.param("fewclue-tnews", marks=pytest.mark.slow),
        pytest.param("stsb-cosent", marks=pytest.mark.slow),
        pytest.param("cail2019-scm-sample", marks=pytest.mark.slow),
        pytest.param("retrieval", marks=pytest.mark.slow),
        "rerank",
    ],
)
def test_two_processes_predict_what_one_does(
    name: str, shared_data: Path, pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The initial model predicted by one process and by two: the same results and prediction files, byte for byte.

    Every row (a sentence, a window of a context, a question with its candidates) is predicted once, on one process,
    and gathered in split order: QA's windows of one question may land on both processes. `max_steps: 0` (the
    head drawn from the seed, no step) keeps this to the task's part: after training steps, two processes' weights
    differ from one's by float rounding (the steps are the engine's, whatever the task: tests/e2e/test_pretrain.py),
    which can flip the argmax of near-tied candidates of a 2-step model.
    """
    _, overrides = small_job(name, shared_data, pretrained, tmp_path)
    overrides = [o for o in overrides if not o.startswith("train.max_steps=")] + ["train.max_steps=0"]
    sets = sum((["--set", o] for o in overrides), [])
    assert main(["finetune", "--config", f"finetune/{name}", "--output-dir", str(tmp_path / "one"), *sets]) == 0
    wrapper = write_wrapper(tmp_path / "run.py", "")
    two = ["finetune", "--config", f"finetune/{name}", "--output-dir", str(tmp_path / "two"), *sets]
    ranks = launch_two(wrapper, [*two, "--set", "train.batch_size=2"], timeout=240)
    assert [code for code, _ in ranks] == [0, 0], [err[-1500:] for _, err in ranks]
    one, other = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("one", "two"))
    for results in (one, other):
        results.pop("init", None)
    for split, metrics in one["runs"][0]["dev"].items():
        assert metrics == pytest.approx(other["runs"][0]["dev"][split], rel=1e-5)
    folder = Path("predictions") / ("lr0.001-seed0" + ("-fold0" if "fold" in one["runs"][0] else ""))
    for file in sorted((tmp_path / "one" / folder).iterdir()):
        theirs = tmp_path / "two" / folder / file.name
        if file.suffix == ".trec":  # cosines of vectors from batches padded alike or not: the ranks, scores to 1e-5
            mine, other_lines = (f.read_text().split("\n") for f in (file, theirs))
            assert [line.split()[:4] for line in mine] == [line.split()[:4] for line in other_lines], file.name
            scores = [[float(line.split()[4]) for line in lines if line] for lines in (mine, other_lines)]
            assert scores[0] == pytest.approx(scores[1], abs=1e-5), file.name
        elif file.suffix != ".json" or "nbest" not in file.name:  # n-best probabilities: floats of two layouts
            assert file.read_bytes() == theirs.read_bytes(), file.name


BAD_DATA = {  # config, file suffix, train file text, what the one-line error says
    "label outside the declared set": (
        "ocnli",
        ".json",
        '{"sentence1": "a", "sentence2": "b", "label": "maybe"}\n',
        r"train\.json:1: label 'maybe'",
    ),
    "CoNLL line with the wrong column count": (
        "conll2003",
        ".txt",
        "EU NNP B-NP B-ORG\nrejects VBZ B-VP\n",
        r"train\.txt:2: 3 columns, expected 4",
    ),
    "QA answer whose text is nowhere in the context": (
        "cmrc2018",
        ".json",
        '{"data": [{"paragraphs": [{"context": "北京是首都。", "qas": [{"id": "q1", "question": "哪里?", '
        '"answers": [{"text": "上海", "answer_start": 0}]}]}]}]}',
        r"train\.json.*q1",
    ),
    "empty split": ("chinese-stsb", ".data", "", r"train\.data: the train split is empty"),
    "score that is not a number": ("chinese-stsb", ".data", "a\tb\tfive\n", r"train\.data:1: score 'five'"),
    "different candidate counts": (
        "fewclue-chid",
        ".json",
        '{"content": "#idiom#", "candidates": ["a", "b"], "answer": 0}\n'
        '{"content": "#idiom#", "candidates": ["a", "b", "c"], "answer": 0}\n',
        r"train\.json:2:.*3 candidates",
    ),
}


@pytest.mark.parametrize("case", list(BAD_DATA))
def test_bad_data_is_one_line_naming_file_and_line_and_writes_nothing(
    case: str, pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    name, suffix, text, expected = BAD_DATA[case]
    train = tmp_path / f"train{suffix}"
    train.write_text(text, encoding="utf-8")
    sets = [f"init={pretrained}", f"data.train_file={train}", f"data.validation_file={train}", "data.test_file=null"]
    out = tmp_path / "run"
    code = main(
        ["finetune", "--config", f"finetune/{name}", "--output-dir", str(out), *sum((["--set", s] for s in sets), [])]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and re.search(expected, err), err
    assert not out.exists()


def test_a_suite_of_other_tasks_writes_one_table_and_a_submission_folder_per_task(
    shared_data: Path, pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """configs/finetune/english-cpu.yaml (CoNLL-2003): what `roformer experiment` runs as its downstream stage."""
    out = tmp_path / "suite"
    sets = [f"init={pretrained}", "data.max_train_examples=48", "data.max_eval_examples=24", "train.max_steps=2"]
    code = main(
        ["glue", "--config", "finetune/english-cpu", "--output-dir", str(out), *sum((["--set", s] for s in sets), [])]
    )
    assert code == 0, capsys.readouterr().err
    table = (out / "results.md").read_text()
    assert "| conll2003 | dev | f1 |" in table and "| conll2003 | dev | precision |" in table
    assert (out / "submission" / "conll2003" / "test.conll").is_file()  # a GLUE task's files stay flat
    assert set(json.loads((out / "results.json").read_text())) == {"conll2003"}


@pytest.mark.parametrize(
    "name",
    [
        "conll2003",
        pytest.param("cmrc2018", marks=pytest.mark.slow),  # the longest two: CI runs the other five
        "fewclue-chid",
        "fewclue-tnews",
        "chinese-stsb",
        "chinese-stsb-cosent",
        pytest.param("cail2019-scm", marks=pytest.mark.slow),
    ],
)
def test_every_task_type_resumes_exactly(
    name: str, shared_data: Path, pretrained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after a checkpoint, `--resume` gives every loss, result, prediction file and best weight of the whole run.

    With what a real job has on: dropout (whose masks must replay), length-grouped batches and unpadding.
    """
    from safetensors.torch import load_file

    from roformer.train.engine import Engine

    config, overrides = small_job(name, shared_data, pretrained, tmp_path)
    overrides = [o for o in overrides if not o.startswith("train.max_steps=")]
    overrides += ["train.max_steps=6", "train.save_every=2", "train.log_every=1", "train.eval_every=3"]
    overrides += ["model.hidden_dropout=0.1", "model.attention_dropout=0.1", "data.group_by_length=true"]
    sets = sum((["--set", o] for o in overrides), [])
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main(["finetune", "--config", f"finetune/{name}", "--output-dir", str(whole), *sets]) == 0
    original = Engine.train_step

    def crash(self, task, step):
        if step == 5:
            raise KeyboardInterrupt
        return original(self, task, step)

    with monkeypatch.context() as patch:
        patch.setattr(Engine, "train_step", crash)
        assert main(["finetune", "--config", f"finetune/{name}", "--output-dir", str(cut), *sets]) == 130
    assert (cut / ".progress" / "lr0.001-seed0" / "checkpoints" / "step-4").is_dir()
    assert main(["finetune", "--resume", "--output-dir", str(cut)]) == 0
    results = [json.loads((d / "results.json").read_text()) for d in (whole, cut)]
    assert results[0]["runs"] == results[1]["runs"] and results[0]["selected"] == results[1]["selected"]

    def events(run: Path) -> list[dict]:
        drop = ("elapsed_sec", "tokens_per_sec", "data_fraction")
        lines = (run / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if k not in drop} for line in lines]

    assert events(cut) == events(whole)  # every loss, once, in order
    folder = Path("predictions") / "lr0.001-seed0"
    for file in sorted((whole / folder).iterdir()):
        assert file.read_bytes() == (cut / folder / file.name).read_bytes(), file.name
    a, b = (load_file(d / "best" / "model.safetensors") for d in (whole, cut))
    assert all(torch.equal(a[k], b[k]) for k in a)


LAYOUTS = [(2, 1, 2), (1, 2, 2), (1, 1, 4)]  # (processes, grad_accum, batch_size): one global batch of 4 examples


@pytest.mark.parametrize(
    "name, sets",
    [
        ("conll2003", []),
        ("cmrc2018", []),
        ("fewclue-chid", []),
        ("fewclue-tnews", []),
        ("chinese-stsb", []),
        ("chinese-stsb-cosent", []),
        ("chinese-stsb-cosent", ["data.similarity.loss=in_batch_negatives"]),
        ("cail2019-scm", []),
    ],
)
def test_every_task_type_takes_the_same_steps_under_any_process_layout(
    name: str, sets: list[str], shared_data: Path, pretrained: Path, tmp_path: Path
) -> None:
    """What makes a run resumable on another number of processes (docs/resuming.md), per task type, in one process.

    A step's examples are a function of (seed, step) alone; 2 processes x 1 micro-batch and 1 process x 2 micro-batches
    of batch_size 2 cut them into the same chunks (the same padded inputs, the same dropout seeds) and take the same
    gradient, exactly, dropout on (the shipped configs' classifier_dropout 0.1); one micro-batch of 4 (dropout off:
    its masks are other draws) takes the same gradient, to float rounding, where the loss is a mean of per-example
    terms, and another one for the types whose loss spans a micro-batch (`micro_batch_loss`: token classification,
    sentence vectors): such a run resumed under another batch_size changes, and says so. The gradient is the
    engine's: every (micro-batch, process) loss over processes x micro-batches (DDP averages, accelerate divides).
    """
    from types import SimpleNamespace

    from roformer.train.finetune import Finetuner
    from roformer.train.finetune_run import FinetuneRun
    from roformer.train.recipe import ProcessLayout, dropout_seed

    _, overrides = small_job(name, shared_data, pretrained, tmp_path)
    config = load(FinetuneConfig, REPO / "configs" / "finetune" / f"{name}.yaml", overrides + sets)
    finetuner = Finetuner(config, tmp_path / "run")
    data = finetuner.run_data(finetuner.grid[0][2])  # the first run's splits (its held-out fold, if any)
    torch.manual_seed(0)
    model = finetuner.load_model()

    def step_under(layout: tuple[int, int, int], step: int, dropout: bool) -> tuple[list, list, dict, float]:
        """(the step's examples, each chunk's inputs, the gradient, the logged loss) under a layout."""
        processes, accum, size = layout
        engine = SimpleNamespace(global_batch=4, layout=None)
        run = FinetuneRun(engine, 0, data, 4, config.data.group_by_length)  # type: ignore[arg-type]
        model.train(dropout)
        model.zero_grad()
        chunks, total, logged = [], 0.0, 0.0
        for micro in range(accum):
            for rank in range(processes):
                engine.layout = ProcessLayout(rank, processes, size, accum, torch.device("cpu"))
                plan = run.plan(step)
                batch = plan.micro(micro)
                torch.manual_seed(dropout_seed(0, step, micro * processes + rank))  # as Engine.train_step
                loss, share = plan.loss(model, batch)
                chunks.append(batch)
                total = total + loss / (processes * accum)
                logged += float(share)
        total.backward()
        gradient = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return plan.indices, chunks, gradient, logged

    spans = data.task.micro_batch_loss  # what the type declares; the steps below say whether it is so
    for step in (0, 1):
        (order, chunks, gradient, logged), (same_order, same_chunks, same_gradient, same_logged) = (
            step_under(layout, step, dropout=True) for layout in LAYOUTS[:2]
        )
        assert order == same_order and len(order) == 4  # the data: (seed, step) alone
        for mine, theirs in zip(chunks, same_chunks, strict=True):
            assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
        assert logged == same_logged and all(torch.equal(gradient[k], same_gradient[k]) for k in gradient)
        (_, _, gradient, logged), (one_order, _, one_chunk, one_logged) = (
            step_under(layout, step, dropout=False) for layout in (LAYOUTS[0], LAYOUTS[2])
        )
        assert one_order == order
        close = all(torch.allclose(gradient[k], one_chunk[k], rtol=1e-4, atol=1e-6) for k in gradient)
        assert close == (spans is None), (step, spans)
        if spans is None:
            assert logged == pytest.approx(one_logged, rel=1e-5)


@pytest.mark.slow
def test_the_chinese_suite_runs_every_task_with_its_own_overrides(
    shared_data: Path, pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """configs/finetune/chinese-cpu.yaml: one seed for the suite, five runs for SCM (one per held-out fold),
    the 1024-token SCM task beside the 512 one. About a minute (every SCM fold predicted at 512 and 1024)."""
    out = tmp_path / "suite"
    sets = [f"init={pretrained}", "data.max_eval_examples=12", "train.max_steps=1"]
    code = main(
        ["glue", "--config", "finetune/chinese-cpu", "--output-dir", str(out), *sum((["--set", s] for s in sets), [])]
    )
    assert code == 0, capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    assert list(results) == [
        "chinese-stsb",
        "fewclue-tnews",
        "fewclue-bustm",
        "fewclue-csl",
        "ocnli",
        "cail2019-scm-sample",
        "cail2019-scm-sample-1024",
    ]
    for task, runs_of in [("ocnli", [(0, None)]), ("cail2019-scm-sample", [(0, fold) for fold in range(5)])]:
        runs = json.loads((out / task / "results.json").read_text())["runs"]
        assert [(run["seed"], run.get("fold")) for run in runs] == runs_of, task
    lengths = [read_yaml(out / task / "config.yaml")["data"]["max_length"] for task in list(results)[-2:]]
    assert lengths == [512, 1024]


def test_a_cross_validated_job_started_before_folds_were_an_axis_is_not_resumed(
    shared_data: Path, pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Its runs were `lr..-seed<s>` (seed s held out fold s): resuming would retrain them all and leave their files."""
    _, overrides = small_job("cail2019-scm-sample", shared_data, pretrained, tmp_path)
    args = ["finetune", "--config", "finetune/cail2019-scm-sample", "--output-dir", str(tmp_path / "run")]
    sets = sum((["--set", o] for o in overrides), [])
    assert main([*args, *sets, "--set", "train.max_steps=0"]) == 0
    (tmp_path / "run" / ".progress" / "lr0.001-seed1").mkdir(parents=True)  # as the old layout left one
    capsys.readouterr()
    assert main([*args, *sets, "--set", "train.max_steps=0", "--resume"]) == 2
    assert "were started before folds were a grid axis" in capsys.readouterr().err
