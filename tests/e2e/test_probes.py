"""`roformer probe`: the inputs each probe builds, its rows and intervals, and its refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import REPO, run_python, tiny_run_config

from roformer.cli import main
from roformer.config import load
from roformer.data.builtin import generate_documents
from roformer.data.tokenizer import load_tokenizer, train_tokenizer
from roformer.study.probes import (
    CANDIDATES,
    MLM_KEYS,
    NAMES,
    Haystack,
    haystack_documents,
    mlm_samples,
    retrieval_samples,
    wilson_interval,
)
from roformer.train.config import PretrainConfig
from roformer.train.pretrain import pretrain
from roformer.train.run_dir import FINAL_DIR


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("probe")
    corpus = tmp / "corpus.txt"  # the built-in corpus has no digits: they are the passkey-MLM probe's keys
    corpus.write_text("\n\n".join(f"{d} {i % 10} {(i * 7) % 10}" for i, d in enumerate(generate_documents(300))))
    data = {"vocab_size": 400, "source": "text", "paths": [str(corpus)]}
    out = {}
    for encoding in ("rotary", "learned"):
        yaml = tiny_run_config(tmp / f"{encoding}.yaml", {"position_encoding": encoding}, data, max_steps=2)
        out[encoding] = pretrain(load(PretrainConfig, yaml), tmp / encoding) / FINAL_DIR
    return out


def test_the_wilson_interval_matches_its_textbook_values() -> None:
    low, high = wilson_interval(5, 20)  # Newcombe 1998, table I's method 3: 0.1119 to 0.4687
    assert (round(low, 4), round(high, 4)) == (0.1119, 0.4687)
    assert wilson_interval(0, 50)[0] == 0.0 and wilson_interval(50, 50)[1] == pytest.approx(1.0)


def test_the_probes_build_inputs_of_the_length_asked_with_the_fact_where_they_say(models: dict[str, Path]) -> None:
    tokenizer = load_tokenizer(models["rotary"])
    haystack = Haystack(tokenizer, haystack_documents(None), seed=0)
    documents, queries, targets = retrieval_samples("passkey", tokenizer, haystack, 96, 30, seed=1)
    assert len(documents) == CANDIDATES and all(len(d) == 96 for d in documents)
    assert len(set(targets)) == 30 and len(queries) == 30
    key_of = tokenizer("the pass key of", add_special_tokens=False)["input_ids"]
    for document in documents:
        assert any(document[i : i + len(key_of)] == key_of for i in range(len(document)))  # planted once at least
    made = mlm_samples(tokenizer, haystack, 128, 40, 25, seed=2)
    assert made is not None
    ids, masked, answers = made
    assert ids.shape == (25, 128) and bool((ids[torch.arange(25), masked] == tokenizer.mask_token_id).all())
    keys = torch.tensor([tokenizer.convert_tokens_to_ids(k) for k in MLM_KEYS])
    planted = ids[torch.arange(25), masked - 40]  # the key, `distance` tokens before its masked copy
    assert torch.equal(planted, keys[answers])
    with pytest.raises(ValueError, match=r"distance 60 does not fit 64 tokens \(distances \d+ to \d+ do\)"):
        mlm_samples(tokenizer, haystack, 64, 60, 5, seed=3)  # a distance the length cannot hold


def test_probe_rows_write_accuracy_interval_and_time(models: dict[str, Path], tmp_path: Path, capsys) -> None:
    out = tmp_path / "passkey.json"
    args = ["probe", "--model", str(models["learned"]), "--probe", "passkey", "--lengths", "32", "64", "128"]
    assert main([*args, "--samples", "10", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    short, ok, beyond = result["rows"]
    assert "a document of 32 cannot hold one" in short["error"]
    assert ok["probe"] == "passkey" and ok["length"] == 64 and ok["samples"] == 10 and ok["scaling"] == "none"
    assert ok["interval"][0] <= ok["accuracy"] <= ok["interval"][1] and ok["seconds"] > 0 and ok["chance"] == 0.01
    assert "learned positions cover 64 tokens, not 128" in beyond["error"]  # a row, not a failed run
    assert "| passkey | 64 |" in capsys.readouterr().out
    assert main([*args, "--samples", "10", "--out", str(out)]) == 2  # kept: --overwrite replaces it
    assert "exists (--overwrite replaces it)" in capsys.readouterr().err
    mlm = ["probe", "--model", str(models["rotary"]), "--probe", "passkey-mlm", "--lengths", "64", "96"]
    assert (
        main([*mlm, "--samples", "8", "--distances", "20", "--scaling", "self_extend", "--out", str(tmp_path / "m")])
        == 0
    )
    rows = json.loads((tmp_path / "m").read_text())["rows"]
    assert [(r["length"], r["distance"], r["scaling"], r["distractors"]) for r in rows] == [
        (64, 20, "self_extend x4", 9),
        (96, 20, "self_extend x6", 9),
    ]
    assert (
        main([*mlm, "--samples", "4", "--distances", "20", "--digits-every", "32", "--out", str(tmp_path / "d")]) == 0
    )
    assert [r["distractors"] for r in json.loads((tmp_path / "d").read_text())["rows"]] == [19, 29]
    assert main([*mlm, "--samples", "4", "--distances", "20", "70", "--out", str(tmp_path / "far")]) == 0
    rows = json.loads((tmp_path / "far").read_text())["rows"]
    assert [(r["length"], r["distance"], "error" in r) for r in rows] == [
        (64, 20, False),
        (64, 70, True),  # a distance the length cannot hold: a row that says so
        (96, 20, False),
        (96, 70, False),
    ]
    assert rows[1]["error"].startswith("distance 70 does not fit 64 tokens")
    assert "| passkey-mlm | 64 | 70 | none | distance 70 does not fit 64 tokens" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--probe", "haystack"], "unknown probe 'haystack'"),
        (["--probe", "needle", "--scaling", "pi"], "unknown method 'pi'"),
        (["--probe", "needle", "--samples", "101"], "asks 1 to 100 of its 100 documents"),
        (["--probe", "needle", "--lengths", "16"], "lengths must be >= 32"),
        (["--probe", "needle", "--haystack", "/nonexistent"], "/nonexistent"),
        (["--probe", "passkey-mlm", "--digits-every", "-1"], "digits_every must be >= 0"),
    ],
)
def test_bad_probe_input_is_one_line(models: dict[str, Path], arguments: list[str], message: str, capsys) -> None:
    assert main(["probe", "--model", str(models["rotary"]), "--lengths", "48", *arguments]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_scaling_is_refused_for_a_model_without_rotary_positions(models: dict[str, Path], capsys) -> None:
    args = ["probe", "--model", str(models["learned"]), "--probe", "needle", "--lengths", "48", "--scaling", "yarn"]
    assert main(args) == 2
    assert "has learned positions, not rotary" in capsys.readouterr().err


def test_compare_draws_and_tabulates_any_set_of_probe_files(models: dict[str, Path], tmp_path: Path, capsys) -> None:
    """Two seeds' files of one arm become a mean with a t interval; a run directory beside them is compared as ever."""
    files = []
    for name, model, seed in [("a", "rotary", 0), ("b", "rotary", 1), ("c", "learned", 0)]:
        files.append(tmp_path / f"{name}.json")
        args = ["probe", "--model", str(models[model]), "--probe", "needle", "--lengths", "48", "96"]
        assert main([*args, "--samples", "12", "--seed", str(seed), "--out", str(files[-1])]) == 0
    out = tmp_path / "cmp"
    assert main(["compare", *map(str, files), str(models["rotary"].parent), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    rows = {(r["label"], r["length"]): r for r in summary["probes"]}
    assert rows[("rotary", 48)]["seeds"] == 2 and rows[("rotary", 48)]["samples"] == 24
    first, second = (json.loads(f.read_text())["rows"][0]["accuracy"] for f in files[:2])
    assert rows[("rotary", 48)]["accuracy"] == pytest.approx((first + second) / 2)
    assert "error" in rows[("learned", 96)]  # its table ends at 64: a cell that says so
    assert (out / "probes.png").is_file() and (out / "curves.png").is_file()
    text = (out / "summary.md").read_text()
    assert "## Probe `needle` (accuracy [95% interval])" in text and "| learned (none) |" in text and "cannot" in text
    (tmp_path / "bad.json").write_text("{}")
    assert main(["compare", str(tmp_path / "bad.json"), "--out", str(tmp_path / "cmp2")]) == 2
    assert "not the results of roformer probe" in capsys.readouterr().err


def test_passkey_mlm_refuses_a_vocabulary_without_digit_tokens_and_a_model_without_an_mlm_head(
    models: dict[str, Path], tmp_path: Path, capsys
) -> None:
    from roformer.data.tokenizer import train_tokenizer
    from roformer.errors import UserError
    from roformer.model.model import load as load_model
    from roformer.study.probes import mlm_key_ids
    from roformer.train.run_dir import write_model_dir

    letters = train_tokenizer(["the pass key is here and there"] * 20, 40)
    with pytest.raises(UserError, match="ten distinct single tokens"):
        mlm_key_ids(letters)  # every digit is [UNK]
    backbone = load_model(models["rotary"], architecture="backbone")
    write_model_dir(backbone, load_tokenizer(models["rotary"]), tmp_path / "backbone")
    args = ["probe", "--model", str(tmp_path / "backbone"), "--probe", "passkey-mlm", "--lengths", "64"]
    assert main(args) == 2
    assert "holds a backbone model, not a masked LM" in capsys.readouterr().err


@pytest.mark.slow  # long: CI skips it (docs/install.md, the slow marker)
def test_the_passkey_corpus_plants_one_key_twice_in_every_document(tmp_path: Path) -> None:
    """scripts/tools/passkey_corpus.py: JSON lines a text corpus reads, each the probe's statement twice with one
    key."""
    (tmp_path / "filler").mkdir()
    (tmp_path / "filler" / "a.txt").write_text(" ".join(f"word{i}" for i in range(2000)))
    done = run_python([str(REPO / "scripts/tools/passkey_corpus.py"), "--filler", str(tmp_path / "filler"), "--out",
                       str(tmp_path / "out"), "--documents", "40", "--words", "5", "20"])  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = (tmp_path / "out" / "passkey.jsonl").read_text().splitlines()
    assert len(lines) == 40
    for line in lines:
        text = json.loads(line)["text"]
        keys = re.findall(r"the pass key is (\d)\.", text)
        assert len(keys) == 2 and keys[0] == keys[1], text
        assert 5 <= len(re.sub(r"the pass key is \d\.", "", text).split()) <= 20
    keys = {re.search(r"is (\d)\.", json.loads(line)["text"]).group(1) for line in lines}
    assert len(keys) > 3  # keys drawn, not one
    script = str(REPO / "scripts/tools/passkey_corpus.py")
    missing = run_python([script, "--filler", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")])
    too_few = run_python([script, "--filler", str(tmp_path / "filler"), "--out", str(tmp_path / "y"),
                          "--words", "5", "500"])  # fmt: skip
    for bad, message in [(missing, "no such file or folder"), (too_few, "2000 words, too few")]:
        assert bad.returncode == 2 and message in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


class CopyingMLM(torch.nn.Module):
    """An MLM that fills every position with the token `look_back` before it: one that copies a key perfectly."""

    def __init__(self, vocab_size: int, look_back: int) -> None:
        super().__init__()
        self.config = SimpleNamespace(position_encoding="none", holds_positions=lambda length: True)
        self.vocab_size, self.look_back = vocab_size, look_back

    def forward(self, ids: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(logits=torch.nn.functional.one_hot(ids.roll(self.look_back, dims=1), self.vocab_size))


class NameEmbedder:
    """Embeds a text by the two tokens after its first "pass key of" (a name): a retriever that finds the fact."""

    config = SimpleNamespace(position_encoding="none", holds_positions=lambda length: True)

    def __init__(self, tokenizer) -> None:
        self.key_of = tokenizer("pass key of", add_special_tokens=False)["input_ids"]
        self.vocab_size = len(tokenizer)

    def embed(self, ids: torch.Tensor, mask: torch.Tensor, pooling: str, normalize: bool) -> torch.Tensor:
        vectors = torch.zeros(len(ids), self.vocab_size**2)
        for row, seq in enumerate(ids.tolist()):
            at = next(i for i in range(len(seq)) if seq[i : i + len(self.key_of)] == self.key_of) + len(self.key_of)
            vectors[row, seq[at] * self.vocab_size + seq[at + 1]] = 1.0
        return vectors


def test_the_probes_score_a_model_that_has_the_skill_perfectly_and_one_one_token_off_at_chance(
    models: dict[str, Path],
) -> None:
    """The scoring, not only the inputs: a copier looking back exactly the key's distance fills every masked copy,
    one looking one token further is at chance; a retriever keyed on the name finds every passkey document."""
    from roformer.study.probes import ProbeSettings, probe_rows

    def accuracy(model, tokenizer, probe: str, **options) -> float:
        haystack = Haystack(tokenizer, haystack_documents(None), seed=0)
        (row,) = probe_rows(model, tokenizer, ProbeSettings(probe, [128], 60, **options), haystack)
        return row["accuracy"]

    tokenizer = load_tokenizer(models["rotary"])
    vocab = len(tokenizer)
    assert accuracy(CopyingMLM(vocab, 40), tokenizer, "passkey-mlm", distances=[40]) == 1.0
    assert accuracy(CopyingMLM(vocab, 41), tokenizer, "passkey-mlm", distances=[40]) < 0.3  # the key's "is"
    # a vocabulary that keeps the 100 names apart (the tiny one gives some names the same pieces)
    tokenizer = train_tokenizer([*generate_documents(200), *[" ".join(NAMES)] * 20, "pass key of"] * 2, 600)
    assert accuracy(NameEmbedder(tokenizer), tokenizer, "passkey") == 1.0
