#!/usr/bin/env python
"""CMRC 2018 as a question-to-passage retrieval set in the BEIR layout, for configs/finetune/cmrc2018-retrieval.yaml.

Every passage of the CMRC 2018 files in ../shared/data/qa/cmrc2018 (dev: 848 passages, trial: 256) is a document,
its article's title as the title; every question is a query whose one relevant document is the passage it was asked
about. The trial questions (1,002) are the training split, the dev questions (3,219) the dev split, ranked over all
1,104 passages (so a dev question is ranked against the trial passages too). The public CMRC 2018 training file is not
in ../shared; with it (`--train cmrc2018_train.json`) its 10,142 questions train instead and the trial questions
become the test split.

    python scripts/tools/cmrc2018_beir.py                       # writes runs/data/cmrc2018-beir
    python scripts/tools/cmrc2018_beir.py --out DIR --data ../shared/data/qa/cmrc2018

Writes corpus.jsonl, queries.jsonl and qrels/{train,dev[,test]}.tsv; deterministic (file order).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def articles(path: Path) -> list[dict]:
    """The articles of a CMRC 2018 file (SQuAD layout: data -> paragraphs -> qas)."""
    return json.loads(path.read_text(encoding="utf-8"))["data"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "qa" / "cmrc2018")
    parser.add_argument("--train", type=Path, default=None, help="the public training file, if you have it")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "data" / "cmrc2018-beir")
    args = parser.parse_args()
    splits = {"dev": args.data / "cmrc2018_dev.json", "train": args.data / "cmrc2018_trial.json"}
    if args.train is not None:
        splits = {"train": args.train, "dev": splits["dev"], "test": splits["train"]}
    corpus, queries, qrels = [], [], {}
    for split, path in splits.items():
        qrels[split] = []
        for article in articles(path):
            for paragraph in article["paragraphs"]:
                doc = paragraph["id"].strip()
                corpus.append({"_id": doc, "title": article.get("title", ""), "text": paragraph["context"]})
                for qa in paragraph["qas"]:
                    queries.append({"_id": qa["id"].strip(), "text": qa["question"]})
                    qrels[split].append((qa["id"].strip(), doc))
    (args.out / "qrels").mkdir(parents=True, exist_ok=True)
    for name, records in (("corpus", corpus), ("queries", queries)):
        lines = (json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        (args.out / f"{name}.jsonl").write_text("".join(lines), encoding="utf-8")
    for split, judged in qrels.items():
        rows = "".join(f"{query}\t{doc}\t1\n" for query, doc in judged)
        (args.out / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + rows, encoding="utf-8")
    counts = ", ".join(f"{split} {len(judged):,} questions" for split, judged in qrels.items())
    print(f"{args.out}: {len(corpus):,} passages; {counts}")


if __name__ == "__main__":
    main()
