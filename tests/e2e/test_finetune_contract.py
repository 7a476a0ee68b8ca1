"""The contract of every shipped fine-tuning config (configs/finetune/), on small files in the config's own format.

`roformer finetune --config NAME --set init=DIR --set data.train_file=F --set data.validation_file=F` trains and
evaluates; `train.max_steps`, `train.lrs`, `train.seeds` and `train.progress` keep their meaning; results.json names
the dev metrics as their definitions do; predictions are written under the run directory in the task's own format.
The small files are the first examples of the real data (../shared/data), cut in the format each config reads.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
import torch
from helpers import REPO, launch_two, small_beir, write_wrapper

from roformer.cli import main
from roformer.config import load, read_yaml
from roformer.tasks.registry import spec_of
from roformer.train.config import FinetuneConfig

CONFIGS = sorted(
    p.stem
    for p in (REPO / "configs" / "finetune").glob("*.yaml")
    if p.stem != "recipe" and "tasks:" not in p.read_text()
)
CMRC_TRIAL = "qa/cmrc2018/cmrc2018_trial.json"
SCM_SAMPLE = "cail2019-scm/sample.json"  # CAIL2019-SCM's public sample (the full set is a download)


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


def small_job(name: str, shared_data: Path, pretrained: Path, tmp_path: Path) -> tuple[FinetuneConfig, list[str]]:
    """The shipped config `name` and the --set items of a 2-step job on small files cut from its real data."""
    config = load(FinetuneConfig, REPO / "configs" / "finetune" / f"{name}.yaml")
    kind = config.data.type
    common = [f"init={pretrained}", "train.max_steps=2", "train.lrs=[1.0e-3]", "train.seeds=[0]", "train.batch_size=4",
              "train.progress=false", "data.max_length=128"]  # fmt: skip
    if kind in ("retrieval", "rerank"):  # a BEIR folder (built-in documents), and a first stage for the reranker
        beir = small_beir(tmp_path / "beir")
        overrides = [f"data.beir_dir={beir}", *common]
        if kind == "rerank":
            overrides.append(f"data.rerank.first_stage={every_document_run(beir, tmp_path / 'first-stage')}")
        return config, overrides
    train = Path(config.data.train_file or shared_data / CMRC_TRIAL)  # squad: the hub by default
    if kind == "triplet" and not train.is_file():
        train = shared_data / SCM_SAMPLE
    elif not train.is_file():  # the template for one's own files: a csv of `text` and `label` (FewCLUE's EPRSTMT)
        train = csv_of_reviews(shared_data, tmp_path / "reviews.csv")
    suffix = train.suffix
    files = {"data.train_file": head(train, tmp_path / f"train{suffix}", 24)}
    folds = kind == "triplet" and config.data.triplet.folds
    if not folds:  # dev: some training rows, so that a 67-class task's dev labels are among its training labels
        files["data.validation_file"] = head(train, tmp_path / f"dev{suffix}", 12, every=2)
    if config.data.test_file:
        test = Path(config.data.test_file)  # labelled test files: training rows again (their labels are known)
        unlabelled = name == "ocnli"
        files["data.test_file"] = head(
            test if unlabelled else train, tmp_path / f"test{suffix}", 6, every=1 if unlabelled else 4
        )
    overrides = [f"{key}={path}" for key, path in files.items()] + [
        f"init={pretrained}",
        "data.max_length=128",
        "train.max_steps=2",
        "train.lrs=[1.0e-3]",
        "train.seeds=[0]",
        "train.batch_size=4",
        "train.progress=false",
    ]
    if kind == "question_answering":
        overrides += ["data.qa.doc_stride=32", "data.qa.max_query_length=32"]
    if kind == "triplet":  # the sample has no label field: B is the closer document (its README)
        overrides += ["data.triplet.unlabelled_closer=B"]
    return config, overrides


@pytest.mark.parametrize("name", CONFIGS)
def test_a_shipped_config_trains_on_files_in_its_format(
    name: str, shared_data: Path, pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    config, overrides = small_job(name, shared_data, pretrained, tmp_path)
    kind = config.data.type
    unlabelled = name == "ocnli"
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
    results = json.loads((out / "results.json").read_text())
    assert results["task"] == config.data.task and results["selected"]["peak_lr"] == 1e-3
    folds = kind == "triplet" and config.data.triplet.folds  # a grid axis: one run per held-out fold
    runs = results["runs"]
    assert [(r["seed"], r.get("fold")) for r in runs] == ([(0, f) for f in range(folds)] if folds else [(0, None)])
    assert ("fold" in results["selected"]) == bool(folds)
    run = runs[0]
    assert run["steps"] == 2
    spec = spec_of(kind)  # the type's declaration: the metrics its results name, its predictions file
    named = set(config.data.metrics or spec.default_metrics or spec.metrics)
    assert named <= set(run["dev"]["dev"]) and "score" in run["dev"]["dev"]
    for tag in [f"lr0.001-seed0-fold{f}" for f in range(folds)] if folds else ["lr0.001-seed0"]:
        assert (out / "predictions" / tag / spec.predictions).is_file()
    assert (out / "best" / "model.safetensors").is_file()
    labelled = kind in ("classification", "multi_label_classification", "token_classification")  # outputs' names
    assert (out / "best" / "labels.json").is_file() == labelled
    if config.data.test_file and kind != "question_answering":
        assert ("test" in results) == (not unlabelled)  # OCNLI's test file has no labels: predicted, not scored


@pytest.mark.parametrize(
    "name",
    [
        "conll2003",
        "cmrc2018",
        "fewclue-chid",
        "fewclue-tnews",
        "stsb-cosent",
        "cail2019-scm-sample",
        "retrieval",
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
    ["conll2003", "cmrc2018", "fewclue-chid", "fewclue-tnews", "chinese-stsb", "chinese-stsb-cosent", "cail2019-scm"],
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

    from roformer.train.recipe import ProcessLayout, dropout_seed
    from roformer.train.finetune import Finetuner, FinetuneRun

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

    spans = data.task.micro_batch_loss
    assert (spans is not None) == (config.data.type in ("token_classification", "similarity")), spans
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
