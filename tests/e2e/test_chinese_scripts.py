"""The Chinese page's two scripts: tokenization statistics (scripts/studies/chinese_tokenization.py) and SCM at two
lengths (scripts/studies/scm_lengths.py), on small files written here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from roformer.data.tokenizer import jieba_presegmenter, save_tokenizer, train_tokenizer

pytest.importorskip("jieba")

DOCS = ["今天天气很好，我想去公园玩。", "北京大学的学生在看天气预报。", "原告诉称被告借款五万元未还。"] * 20


def run_script(name: str, *args: str) -> str:
    script = REPO / "scripts" / "studies" / name
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_tokenization_statistics_tell_word_from_character_level(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.json"
    corpus.write_text("".join(json.dumps({"sentence": d}, ensure_ascii=False) + "\n" for d in DOCS), "utf-8")
    scm = tmp_path / "scm.json"
    scm.write_text(json.dumps({"A": DOCS[0] * 40, "B": DOCS[1] * 40, "C": DOCS[2] * 40}, ensure_ascii=False) + "\n")
    segment = jieba_presegmenter()
    save_tokenizer(train_tokenizer([segment(d) for d in DOCS], 300, split_cjk=False), tmp_path / "word")
    save_tokenizer(train_tokenizer(DOCS, 300), tmp_path / "char")
    out = run_script(
        "chinese_tokenization.py", "--tokenizer", f"word={tmp_path / 'word'}", "--tokenizer",
        f"char={tmp_path / 'char'}", "--corpus", str(corpus), "--scm", str(scm), "--lengths", "512,1024",
    )  # fmt: skip
    rows = {line.split("|")[1].strip(): line.split("|") for line in out.splitlines() if line.startswith("| word |")}
    assert "word (jieba)" in rows["word"][2]
    per_char = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 5 and cells[1] in ("word", "char") and cells[2] in ("word (jieba)", "character"):
            per_char[cells[1]] = float(cells[4])
    assert per_char["char"] == pytest.approx(1.0, abs=0.01) and per_char["word"] < 0.8  # punctuation: 1 token each
    assert "| 512 | char | 0.0% |" in out  # 560-character documents: no pair fits in 512 tokens


def test_scm_lengths_pairs_the_two_lengths_by_run_and_fold(tmp_path: Path) -> None:
    accuracies = {  # suite: (fold accuracies at 512, at 1024)
        "a-seed0": ([0.50, 0.60, 0.55], [0.60, 0.70, 0.60]),
        "a-seed1": ([0.40, 0.50, 0.45], [0.50, 0.55, 0.55]),
    }
    suites = []
    for suite, lengths in accuracies.items():
        for task, values in zip(("cail2019-scm-sample", "cail2019-scm-sample-1024"), lengths, strict=True):
            runs = [{"seed": fold, "dev": {"dev": {"accuracy": v}}} for fold, v in enumerate(values)]
            (tmp_path / suite / task).mkdir(parents=True)
            (tmp_path / suite / task / "results.json").write_text(json.dumps({"runs": runs}))
        suites.append(str(tmp_path / suite))
    out = run_script("scm_lengths.py", *suites)
    (row,) = [line for line in out.splitlines() if line.startswith("| a |")]
    cells = [c.strip() for c in row.split("|")]
    assert cells[2] == "6" and cells[3] == "50.0%" and cells[4] == "58.3%"
    assert cells[5].startswith("+8.3 [") and cells[6] == "yes (paired t)"  # every pair gains 5-10 points
