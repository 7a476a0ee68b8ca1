"""Every command that takes `--out` writes into a folder that does not exist yet (made after the work, not lost)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from roformer.cli import COMMANDS, main
from roformer.data.builtin import generate_documents
from roformer.model.seq2seq import EncoderDecoder
from roformer.tasks.config import Vocabulary
from roformer.tasks.parallel import train_bpe
from roformer.tasks.translation import encoder_decoder_config
from roformer.train.run_dir import write_model_dir

# `--out` of each command below `new` (inputs made in `work`); what the command must have written there
OUT_CASES = {
    "convert": lambda model, work, new: (
        ["convert", "--to-hf", str(model), "--out", str(new / "hf")],
        new / "hf/config.json",
    ),
    "export": lambda model, work, new: (
        ["export", "--model", str(model), "--format", "sentence-transformers", "--out", str(new / "st")],
        new / "st/modules.json",
    ),
    "eval-mlm": lambda model, work, new: (
        ["eval-mlm", "--model", str(model), "--seq-lens", "32", "--max-tokens", "128", "--out", str(new / "l.json")],
        new / "l.json",
    ),
    "probe": lambda model, work, new: (
        ["probe", "--model", str(model), "--probe", "passkey", "--lengths", "64", "--samples", "2"]
        + ["--out", str(new / "p.json")],
        new / "p.json",
    ),
    "attention-distance": lambda model, work, new: (
        ["attention-distance", "--model", str(model), "--data", str(_text_folder(work)), "--length", "16"]
        + ["--samples", "2", "--out", str(new / "a.json")],
        new / "a.json",
    ),
    "embed": lambda model, work, new: (
        ["embed", "--model", str(model), "--input", str(_texts(work)), "--out", str(new / "v.npy")],
        new / "v.npy",
    ),
    "translate": lambda model, work, new: (
        ["translate", "--model", str(_translation_model(work)), "--input", str(_texts(work)), "--quiet"]
        + ["--beam", "1", "--out", str(new / "out.de")],
        new / "out.de",
    ),
    "compare": lambda model, work, new: (
        ["compare", *map(str, _probe_files(model, work)), "--out", str(new / "compare")],
        new / "compare/probes.png",
    ),
}


def _texts(folder: Path) -> Path:
    path = folder / "texts.txt"
    path.write_text("one two three\nfour five six\n")
    return path


def _translation_model(folder: Path) -> Path:
    """A fresh 1 + 1 layer encoder-decoder with a joint BPE of the test's texts: what `roformer translate` reads."""
    texts = ["one two three", "four five six", "eins zwei drei", "vier fünf sechs"]
    tokenizer = train_bpe(texts, vocab_size=60, min_frequency=1)
    vocabulary = Vocabulary(size=len(tokenizer), pad_token_id=0, bos_token_id=2, eos_token_id=3)
    section = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32}
    torch.manual_seed(0)
    model = EncoderDecoder(encoder_decoder_config(section, vocabulary))
    write_model_dir(model, tokenizer, folder / "translator")
    return folder / "translator"


def _text_folder(folder: Path) -> Path:
    texts = folder / "text"
    texts.mkdir()
    (texts / "a.txt").write_text("\n\n".join(generate_documents(40)))
    return texts


def _probe_files(model: Path, folder: Path) -> list[Path]:
    """Two seeds' passkey probe files of `model` (what `roformer compare` tabulates and draws)."""
    files = [folder / f"probe-{seed}.json" for seed in (0, 1)]
    for seed, path in enumerate(files):
        args = ["probe", "--model", str(model), "--probe", "passkey", "--lengths", "64", "--samples", "2"]
        assert main([*args, "--seed", str(seed), "--out", str(path)]) == 0
    return files


def commands_with_out() -> set[str]:
    """The subcommands whose parser has an `--out` option."""
    names = set()
    for command in COMMANDS:
        parser = argparse.ArgumentParser()
        command.add_arguments(parser)
        if any("--out" in action.option_strings for action in parser._actions):
            names.add(command.name)
    return names


def test_every_command_with_out_is_covered() -> None:
    assert commands_with_out() == set(OUT_CASES)


@pytest.mark.parametrize("command", sorted(OUT_CASES))
def test_out_into_a_folder_that_does_not_exist(
    command: str, pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    args, written = OUT_CASES[command](pretrained, tmp_path, tmp_path / "new" / "deeper")
    code = main(args)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert written.is_file()
    if command == "compare":  # it says what it drew: probes.png for probe files, not the curves of runs
        assert "(probes.png, summary.json, summary.md)" in out


@pytest.mark.parametrize("command", sorted(OUT_CASES))
def test_out_below_a_file_is_one_line_before_any_work(
    command: str, pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    args, _ = OUT_CASES[command](pretrained, tmp_path, blocker / "sub")
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "file" in err, err
    assert blocker.read_text() == "mine"
