"""Translation end to end (issue 56): `roformer finetune` of `type: translation` from scratch on tiny parallel files,
`roformer translate` with its models, an exact resume after SIGTERM, two processes, an init from a trained (or HF
converted) encoder-decoder, and every bad input (one line on stderr, exit code 2, nothing written)."""

from __future__ import annotations

import gzip
import json
import random
import re
import sys
from io import BytesIO, TextIOWrapper
from pathlib import Path

import pytest
import torch
import yaml
from helpers import launch_processes, stop_after, stop_in_process
from safetensors.torch import load_file

from roformer.cli import main
from roformer.model.model import load
from roformer.model.seq2seq import EncoderDecoder
from roformer.train.run_dir import read_metrics

WORDS = dict(
    zip(
        "the a man woman dog cat runs sits on in red blue big small house street and".split(),
        "der ein Mann Frau Hund Katze rennt sitzt auf in rot blau groß klein Haus Straße und".split(),
        strict=True,
    )
)
TIMING = {"tokens_per_sec", "elapsed_sec", "data_fraction"}


def sentences(count: int, seed: int) -> tuple[list[str], list[str]]:
    """`count` English sentences of 3 to 9 words and their word-by-word German."""
    rng = random.Random(seed)
    english, german = [], []
    for _ in range(count):
        words = [rng.choice(list(WORDS)) for _ in range(rng.randint(3, 9))]
        english.append(" ".join(words).capitalize() + ".")
        german.append(" ".join(WORDS[w] for w in words).capitalize() + ".")
    return english, german


def write_lines(path: Path, lines: list[str]) -> None:
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train (German gzipped), valid and test pairs in one folder."""
    folder = tmp_path_factory.mktemp("corpus")
    for name, count, seed in (("train", 240, 0), ("valid", 20, 1), ("test", 16, 2)):
        english, german = sentences(count, seed)
        write_lines(folder / f"{name}.en", english)
        write_lines(folder / (f"{name}.de.gz" if name == "train" else f"{name}.de"), german)
    return folder


def config(folder: Path, corpus: Path, name: str = "c.yaml", **train: object) -> Path:
    """A tiny from-scratch config over `corpus` (dropout on: resume must redraw the same masks)."""
    settings = {
        "init": "",
        "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64, "hidden_dropout": 0.1,
                  "attention_dropout": 0.0},
        "data": {
            "type": "translation", "source_lang": "en", "target_lang": "de",
            "train_prefix": str(corpus / "train"), "validation_prefix": str(corpus / "valid"),
            "test_prefix": str(corpus / "test"), "max_length": 32,
            "translation": {"vocab_size": 100, "max_tokens": 160, "beam": 2, "eval_beam": 1},
        },
        "train": {"lr": 3.0e-3, "schedule": "inverse_sqrt", "warmup_steps": 3, "max_steps": 6, "eval_every": 2,
                  "save_every": 2, "average_last": 2, "batch_size": 8, "progress": False, "log_every": 1, **train},
    }  # fmt: skip
    path = folder / name
    path.write_text(yaml.safe_dump(settings))
    return path


def finetune(config_path: Path, out: Path, *overrides: str) -> int:
    args = ["finetune", "--config", str(config_path), "--output-dir", str(out)]
    for item in overrides:
        args += ["--set", item]
    return main(args)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> tuple[Path, Path]:
    """(config, run directory) of an uninterrupted tiny run."""
    folder = tmp_path_factory.mktemp("reference")
    path = config(folder, corpus)
    assert finetune(path, folder / "run") == 0
    return path, folder / "run"


def events(run: Path) -> list[dict]:
    found = [e for e in read_metrics(run / "metrics.jsonl") if e["event"] in ("train", "eval")]
    return [{k: v for k, v in e.items() if k not in TIMING} for e in found]


def test_a_run_from_scratch_writes_scores_hypotheses_and_both_models(reference: tuple[Path, Path], corpus: Path):
    _, run = reference
    results = json.loads((run / "results.json").read_text())
    summary = results["translation"]
    assert results["metrics"] == ["bleu"] and results["init"] == "" and results["metrics_in_percent"]
    for model in ("best", "averaged"):
        for split in ("valid", "test"):
            scores = summary[model][split]
            assert 0 <= scores["bleu"] <= 100 and 0 <= scores["chrf"] <= 100 and scores["loss"] > 0
            assert scores["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
            assert scores["chrf_signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:2|space:no|version:")
    assert summary["search"]["beam"] == 2 and summary["search"]["length_penalty"] == 0.6
    assert results["averaged"]["points"] == [4, 6]  # the last two evaluation points
    assert results["runs"][0]["test"]["test"]["bleu"] == summary["best"]["test"]["bleu"]
    for model in ("best", "averaged"):  # hypotheses: one line per source line, beside results.json
        for split, source in (("valid", "valid.en"), ("test", "test.en")):
            lines = (run / "hypotheses" / model / f"{split}.de").read_text(encoding="utf-8").split("\n")
            assert len(lines) - 1 == len((corpus / source).read_text().splitlines())
        loaded = load(run / model)
        assert isinstance(loaded, EncoderDecoder) and loaded.config.encoder.hidden_size == 32
        assert json.loads((run / model / "translation.json").read_text())["beam"] == 2
    best, averaged = load_file(run / "best" / "model.safetensors"), load_file(run / "averaged" / "model.safetensors")
    assert any(not torch.equal(best[k], averaged[k]) for k in best)
    dev = [e for e in read_metrics(run / "metrics.jsonl") if e["event"] == "eval"]
    assert [e["step"] for e in dev] == [2, 4, 6] and all({"bleu", "chrf", "loss"} <= set(e) for e in dev)


def test_translate_gives_the_run_s_hypotheses_from_a_file_and_from_stdin(
    reference: tuple[Path, Path], corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch
) -> None:
    _, run = reference
    expected = (run / "hypotheses" / "best" / "test.de").read_text(encoding="utf-8")
    out = tmp_path / "test.de"
    assert main(["translate", "--model", str(run / "best"), "--input", str(corpus / "test.en"), "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == expected
    assert "16 translations written" in capsys.readouterr().err
    source = (corpus / "test.en").read_bytes()
    monkeypatch.setattr(sys, "stdin", TextIOWrapper(BytesIO(source), encoding="utf-8"))
    assert main(["translate", "--model", str(run / "averaged"), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.out == (run / "hypotheses" / "averaged" / "test.de").read_text(encoding="utf-8")
    assert captured.err == ""  # --quiet: no progress bar
    # an empty line is translated as an empty line: the output keeps the input's lines
    monkeypatch.setattr(sys, "stdin", TextIOWrapper(BytesIO(b"The man runs.\n\nA dog.\n"), encoding="utf-8"))
    assert main(["translate", "--model", str(run / "best"), "--quiet", "--beam", "1"]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""


def test_translate_drops_a_byte_order_mark_and_reads_every_line_end(
    reference: tuple[Path, Path], corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The run's test file saved as Windows (a mark, CR LF) and classic Mac OS (CR alone) editors save it."""
    _, run = reference
    expected = (run / "hypotheses" / "best" / "test.de").read_text(encoding="utf-8")
    lines = (corpus / "test.en").read_text(encoding="utf-8").splitlines()
    for name, end in (("crlf", "\r\n"), ("cr", "\r")):
        source = tmp_path / f"{name}.en"
        source.write_bytes(b"\xef\xbb\xbf" + "".join(line + end for line in lines).encode("utf-8"))
        out = tmp_path / f"{name}.de"
        assert main(["translate", "--model", str(run / "best"), "--input", str(source), "--out", str(out)]) == 0
        assert out.read_text(encoding="utf-8") == expected, name
    monkeypatch.setattr(sys, "stdin", TextIOWrapper(BytesIO((tmp_path / "cr.en").read_bytes()), encoding="utf-8"))
    assert main(["translate", "--model", str(run / "best"), "--quiet"]) == 0
    assert capsys.readouterr().out == expected


def assert_same_run(run: Path, reference: Path) -> None:
    """Equal events, results, hypotheses and models."""
    assert events(run) == events(reference)
    ours, theirs = (json.loads((r / "results.json").read_text()) for r in (run, reference))
    assert ours["runs"] == theirs["runs"] and ours["translation"] == theirs["translation"]
    for model in ("best", "averaged"):
        for split in ("valid.de", "test.de"):
            assert (run / "hypotheses" / model / split).read_text() == (
                reference / "hypotheses" / model / split
            ).read_text()
        a, b = load_file(run / model / "model.safetensors"), load_file(reference / model / "model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_sigterm_exits_75_and_the_resume_equals_the_uninterrupted_run(
    reference: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Stopped after step 5 (its checkpoint holds the averaged point of step 4, whose weights the resumed run must
    bring back): the resumed run's events, scores, hypotheses and both models are the uninterrupted run's, bit for
    bit."""
    path, ref = reference
    out = tmp_path / "run"
    stop_in_process(
        monkeypatch, 5
    )  # after the averaged point of step 4: its weights must come back from the checkpoint
    assert finetune(path, out) == 75
    assert "stopped by SIGTERM after step 5" in capsys.readouterr().err
    checkpoint = out / ".progress" / "lr0.003-seed0" / "checkpoints" / "step-5"
    assert (checkpoint / "average-step-4.safetensors").is_file()
    monkeypatch.undo()
    assert main(["finetune", "--output-dir", str(out), "--resume"]) == 0
    assert_same_run(out, ref)


@pytest.mark.slow  # the engine's 2 -> 1 resume stays in CI (test_elastic); translation's SIGTERM resume too
def test_two_processes_stopped_then_one_process_give_the_one_process_run(
    reference: tuple[Path, Path], tmp_path: Path, corpus: Path
) -> None:
    """Token batches are a function of the step: 2 processes x 1 micro-batch stopped by SIGTERM after step 3, then
    1 process x 2 micro-batches, equal 1 process x 2 micro-batches throughout (the same batches on the same chunks)."""
    path = config(tmp_path, corpus, grad_accum=1)
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert finetune(path, full, "train.grad_accum=2") == 0
    wrapper = stop_after(tmp_path / "stop.py", 3)
    results = launch_processes(2, wrapper, ["finetune", "--config", str(path), "--output-dir", str(cut)], timeout=300)
    assert [code for code, _ in results] == [75, 75], [err[-1500:] for _, err in results]
    assert main(["finetune", "--output-dir", str(cut), "--resume", "--set", "train.grad_accum=2"]) == 0
    ours, theirs = events(cut), events(full)
    assert [(e["event"], e["step"]) for e in ours] == [(e["event"], e["step"]) for e in theirs]
    for mine, other in zip(ours, theirs, strict=True):
        for key, value in mine.items():
            expected = other[key]
            assert value == (pytest.approx(expected, abs=1e-5) if isinstance(value, float) else expected), key


def test_an_init_of_a_trained_or_converted_encoder_decoder_is_fine_tuned(
    reference: tuple[Path, Path], tmp_path: Path, corpus: Path
) -> None:
    _, run = reference
    path = config(tmp_path, corpus, max_steps=2, average_last=0)
    settings = yaml.safe_load(path.read_text())
    settings.update(init=str(run / "best"), model={"hidden_dropout": 0.0})  # model: overrides of the init's
    path.write_text(yaml.safe_dump(settings))
    assert finetune(path, tmp_path / "ours") == 0
    tuned = load(tmp_path / "ours" / "best")
    assert tuned.config.encoder.hidden_dropout == 0.0 and not (tmp_path / "ours" / "averaged").exists()
    assert main(["convert", "--to-hf", str(run / "best"), "--out", str(tmp_path / "hf")]) == 0
    settings["init"] = str(tmp_path / "hf")
    path.write_text(yaml.safe_dump(settings))
    assert finetune(path, tmp_path / "theirs") == 0
    assert json.loads((tmp_path / "theirs" / "results.json").read_text())["translation"]["best"]["test"]


SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "translation" / "multi30k"


@pytest.mark.skipif(not SHARED.is_dir(), reason="Multi30k is not in ../shared/data/translation/multi30k")
def test_the_shipped_multi30k_recipe_runs_on_its_data(tmp_path: Path) -> None:
    """configs/translation/multi30k-cpu.yaml as shipped, on its first pairs and for two steps."""
    from helpers import REPO

    config_path = REPO / "configs" / "translation" / "multi30k-cpu.yaml"
    quick = ["data.max_train_examples=400", "data.max_eval_examples=12", "data.translation.vocab_size=500",
             "train.max_steps=2", "train.eval_every=0", "train.average_every=1", "train.progress=false"]  # fmt: skip
    assert finetune(config_path, tmp_path / "run", *quick) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["task"] == "multi30k-en-de" and set(results["translation"]["best"]) == {"valid", "test"}
    assert results["averaged"]["points"] == [1, 2]
    assert len((tmp_path / "run" / "hypotheses" / "best" / "test.de").read_text(encoding="utf-8").splitlines()) == 12


def test_a_hub_dataset_of_translation_records_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`source: hub` reads `translation` records per split (WMT14's layout), without the network here."""
    import datasets

    from roformer.config import from_dict
    from roformer.tasks.config import FinetuneDataConfig
    from roformer.tasks.translation import TranslationTask

    def load_dataset(name, config, split):  # what datasets gives for wmt/wmt14 de-en
        assert (name, config) == ("wmt/wmt14", "de-en")
        english, german = sentences({"train": 8, "validation": 3, "test": 2}[split], 0)
        rows = [{"de": g, "en": e} for e, g in zip(english, german, strict=True)]
        return datasets.Dataset.from_dict({"translation": rows})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    section = {"type": "translation", "source_lang": "en", "target_lang": "de", "hub_name": "wmt/wmt14",
               "hub_config": "de-en"}  # fmt: skip
    task = TranslationTask.from_config(from_dict(FinetuneDataConfig, section))
    assert [len(task.texts[s]) for s in ("train", "dev", "test")] == [8, 3, 2]
    assert task.texts["dev"].source_file == "wmt/wmt14:validation:en" and task.test_splits == ["valid", "test"]
    with pytest.raises(Exception, match="no language 'fr'"):
        TranslationTask.from_config(from_dict(FinetuneDataConfig, {**section, "target_lang": "fr"}))


# -- bad input: one line, exit code 2, nothing written ------------------------------------------------------------


def broken_corpus(folder: Path, corpus: Path, case: str) -> Path:
    """A copy of `corpus`'s files with one thing wrong; returns the folder."""
    folder.mkdir()
    english, german = sentences(60, 5)
    sides = {"en": english, "de": german}
    if case == "line counts":
        sides["de"] = german[:-1]
    elif case == "empty line":
        sides["de"] = german[:7] + [""] + german[8:]
    elif case == "long source":
        sides["en"] = english[:3] + [" ".join(["the red dog"] * 20) + "."] + english[4:]
    for lang, lines in sides.items():
        write_lines(folder / f"train.{lang}", lines)
    if case == "not utf-8":
        (folder / "train.en").write_bytes((folder / "train.en").read_bytes().replace(b"The", b"Th\xe9", 1))
    if case == "missing file":
        (folder / "train.de").unlink()
    for name in ("valid", "test"):
        for lang in ("en", "de"):
            source = corpus / f"{name}.{lang}"
            (folder / f"{name}.{lang}").write_bytes(source.read_bytes())
    return folder


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("line counts", r"train.en has 60 lines and .*train.de 59: parallel files pair their sentences by line number"),
        ("empty line", r"train.de:8: empty line \(in a pair, with .*train.en:8\)"),
        ("missing file", r"train.de: file not found \(nor train.de.gz\)"),
        ("not utf-8", r"train.en:\d+: not UTF-8 \(byte 0xe9 at column 3\)"),
        ("long source", r"train.en:4: the source has \d+ tokens, more than the 32 accepted \(data.max_length"),
    ],
)
def test_bad_parallel_files_are_one_line_and_write_nothing(
    tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture, case: str, message: str
) -> None:
    folder = broken_corpus(tmp_path / "data", corpus, case)
    path = config(tmp_path, folder)
    assert finetune(path, tmp_path / "run") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("roformer finetune: error: ") and re.search(message, err), err
    assert not (tmp_path / "run").exists()


def test_a_long_source_may_be_truncated_instead(tmp_path: Path, corpus: Path) -> None:
    folder = broken_corpus(tmp_path / "data", corpus, "long source")
    path = config(tmp_path, folder, max_steps=1, eval_every=0, average_last=0)
    assert finetune(path, tmp_path / "run", "data.translation.too_long=truncate") == 0


def placed(text: str, places: dict[str, str]) -> str:
    """`text` with every placeholder of `places` (TOKENIZER, MLM) replaced by its path."""
    for name, value in places.items():
        text = text.replace(name, value)
    return text


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.translation.beam=0"], "beam must be >= 1, got 0"),
        (
            ["data.translation.max_tokens=8"],
            "data.translation.max_tokens (8) is smaller than the longest training pair",
        ),
        (["model.vocab_size=50"], "model.vocab_size comes from the task's vocabulary"),
        (["model.encoder.hidden_sise=8"], "unknown key 'model.encoder.hidden_sise'"),
        (["data.source_lang=de"], "source_lang and target_lang are both 'de'"),
        (["data.translation.tokenizer=TOKENIZER"], "the tokenizer has no <pad>, <unk>, <s>, </s>"),
        # the tokenizers library aborted (exit 134, no message) trying to allocate 35 GB for it
        (["data.translation.vocab_size=500000000"], "vocab_size must be <= 1,000,000 (a BPE vocabulary"),
        # an encoder-decoder's own key in the model: section was refused as not a ModelConfig field
        (["init=MLM", "model.share_embeddings=true"], "MLM: not an encoder-decoder (a masked_lm model)"),
        (["init=MLM"], "MLM: not an encoder-decoder (a masked_lm model)"),
    ],
)
def test_bad_settings_are_one_line_and_write_nothing(
    tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture, overrides: list[str], message: str
) -> None:
    from tokenizers import Tokenizer, models

    tokenizer = tmp_path / "tokenizer.json"  # a tokenizer without a translation's specials
    Tokenizer(models.WordLevel({"[PAD]": 0, "[UNK]": 1, "der": 2}, unk_token="[UNK]")).save(str(tokenizer))
    mlm = tmp_path / "mlm"  # a masked LM and its tokenizer: not an encoder-decoder
    if any("MLM" in o for o in overrides):
        from helpers import tiny_config

        from roformer.data.tokenizer import save_tokenizer, train_tokenizer
        from roformer.model.model import MaskedLM

        words = train_tokenizer(sentences(40, 0)[0], vocab_size=120)
        MaskedLM(tiny_config(vocab_size=len(words))).save(mlm)
        save_tokenizer(words, mlm)
    places = {"TOKENIZER": str(tokenizer), "MLM": str(mlm)}
    path = config(tmp_path, corpus)
    assert finetune(path, tmp_path / "run", *[placed(o, places) for o in overrides]) == 2
    err = capsys.readouterr().err.strip()
    message = placed(message, places)
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "{best}", "--input", "{good}", "--beam", "0"], "argument --beam: expected an integer >= 1, got 0"),
        (["--model", "{best}", "--input", "{bad}"], "bad.en:2: not UTF-8 (byte 0xff at column 2)"),
        (["--model", "{best}", "--input", "{long}"], "tokens, more than the 32 accepted (--too-long truncate cuts"),
        (["--model", "{best}", "--input", "{tmp}/missing.en"], "missing.en: file not found"),
        (["--model", "{best}", "--input", "{tmp}"], "--input {tmp}: a folder, not a file (one sentence a line)"),
        (
            ["--model", "{best}", "--input", "{good}", "--length-penalty", "nan"],
            "argument --length-penalty: expected a finite number, got 'nan'",
        ),
        (
            ["--model", "{best}", "--input", "{good}", "--length-penalty", "inf"],
            "argument --length-penalty: expected a finite number, got 'inf'",
        ),
        # no machine has a 100th GPU: the case of `--device cuda` on one without CUDA, wherever the test runs
        (["--model", "{best}", "--input", "{good}", "--device", "cuda:99"], "--device 'cuda:99': not a device this"),
        (["--model", "{tmp}/nowhere", "--input", "{good}"], "nowhere: model directory not found"),
    ],
)
def test_bad_translate_input_is_one_line_and_writes_nothing(
    reference: tuple[Path, Path], corpus: Path, tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str],
    message: str,
) -> None:  # fmt: skip
    _, run = reference
    (tmp_path / "bad.en").write_bytes(b"A man runs.\nA\xff dog.\n")
    (tmp_path / "long.en").write_text("the dog " * 40 + "\n")
    places = {"best": run / "best", "good": corpus / "test.en", "bad": tmp_path / "bad.en",
              "long": tmp_path / "long.en", "tmp": tmp_path}  # fmt: skip
    command = ["translate", *(a.format(**places) for a in args), "--out", str(tmp_path / "out.de"), "--quiet"]
    try:
        code = main(command)
    except SystemExit as e:  # argparse's refusal of an option's value
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert message.format(**places) in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "long.en:1: the source has" in err if "{long}" in args else True
    assert not (tmp_path / "out.de").exists()


# -- a study of arms -----------------------------------------------------------------------------------------------


def test_a_translation_study_compares_bleu_by_length_with_intervals_and_a_bootstrap(
    tmp_path: Path, corpus: Path, capsys: pytest.CaptureFixture
) -> None:
    import sacrebleu

    settings = yaml.safe_load(config(tmp_path, corpus, max_steps=4, save_every=0).read_text())
    settings["data"].update(task="tiny-short")
    settings["data"]["translation"]["max_source_words"] = 6  # sources of 3-9 words: the rest tests longer ones
    settings["data"]["translation"]["long_test_pairs"] = 24
    (tmp_path / "task.yaml").write_text(yaml.safe_dump(settings))
    study = {"tasks": ["task.yaml"], "arms": {"rotary": {"set": []}, "none": {"set": ["model.position_encoding=none"]}},
             "seeds": [0, 1]}  # fmt: skip
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study, sort_keys=False))  # rotary first: the baseline
    command, out = ["experiment", "--config", str(tmp_path / "study.yaml")], tmp_path / "out"
    assert main([*command, "--output-dir", str(out), "--compare-only"]) == 2  # nothing to tabulate yet
    assert "--compare-only tabulates the runs of a study that has started" in capsys.readouterr().err
    assert main([*command, "--output-dir", str(out)]) == 0
    summary = json.loads((out / "compare" / "summary.json").read_text())["tasks"]["tiny-short"]
    assert summary["kind"] == "translation" and summary["model"] == "averaged" and summary["max_source_words"] == 6
    references = (corpus / "test.de").read_text().splitlines()
    sources = (corpus / "test.en").read_text().splitlines()
    assert summary["splits"]["test"] == len(references) and summary["splits"]["long"] == 24
    rotary = summary["arms"]["rotary"]
    assert rotary["seeds"] == [0, 1] and len(rotary["seconds"]) == 2
    for seed, bleu in zip((0, 1), rotary["splits"]["test"]["bleu"]["seeds"], strict=True):
        run = out / "tiny-short" / f"rotary-seed{seed}"
        hypotheses = (run / "hypotheses" / "averaged" / "test.de").read_text(encoding="utf-8").splitlines()
        assert bleu == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    cell = rotary["splits"]["test"]["bleu"]
    assert cell["mean"] == pytest.approx(sum(cell["seeds"]) / 2) and cell["interval"][0] <= cell["mean"]
    buckets = rotary["splits"]["test"]["buckets"]
    assert sum(b["sentences"] for b in buckets.values()) == len(sources) and set(buckets) <= set(summary["buckets"])
    test = summary["bootstrap"]["test"]
    assert test["baseline"] == "rotary" and test["systems"]["rotary"]["p_value"] is None
    assert "bs:1000" in test["signature"]
    none = test["systems"]["none"]  # 4 steps of training: the two arms may translate alike, and are then marked so
    assert (none["p_value"] is None) if none["identical"] else (0 < none["p_value"] <= 1)
    best = summary["best_seeds"]["rotary"]
    assert rotary["dev_bleu"][best] == max(rotary["dev_bleu"])  # the best seed is chosen by dev BLEU, not test
    text = (out / "compare" / "summary.md").read_text()
    assert "| rotary | 2 |" in text and "Paired bootstrap on long" in text and "BLEU by source words, test" in text
    assert (out / "compare" / "bleu-by-length.png").stat().st_size > 0
    assert not (out / "compare" / "generalization.png").exists()  # nor a decay: an encoder-decoder's is not measured
    assert not list((out / "compare" / "attention-distance").glob("*"))
    # a study in progress: --compare-only tabulates the finished runs (an arm with none is left out), trains none
    for seed in (0, 1):
        (out / "tiny-short" / f"none-seed{seed}" / "results.json").unlink()
    assert main([*command, "--output-dir", str(out), "--compare-only"]) == 0
    summary = json.loads((out / "compare" / "summary.json").read_text())["tasks"]["tiny-short"]
    assert list(summary["arms"]) == ["rotary"] and summary["bootstrap"] == {}
    assert not (out / "tiny-short" / "none-seed1" / "results.json").exists()
    assert "![bleu-by-length.png](compare/bleu-by-length.png)" in (out / "report.md").read_text()
    assert "generalization.png" not in (out / "report.md").read_text()
