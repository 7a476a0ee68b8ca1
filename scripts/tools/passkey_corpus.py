"""A pretraining corpus that teaches passkey-MLM's skill at short range: the long-context study's trained-skill arm.

Every document is a run of filler words cut from a text folder (gutenberg by default) with one key planted twice,
"the pass key is K." and later the same sentence again, both within the document (`--words` words of filler: the
two always share a 128-token block). Masked-LM training on it (`data.mixture` beside the plain corpus) teaches a model
to fill a masked key from its earlier statement, at the distances of its training blocks; `roformer probe --probe
passkey-mlm` then asks for the same skill at distances and lengths it never saw, which is where position encodings
and extension methods differ. The probe's keys and fillers are drawn independently of these (other seeds).

    python scripts/tools/passkey_corpus.py --out runs/passkey-corpus            # 20,000 documents, passkey.jsonl
    python scripts/tools/passkey_corpus.py --filler DIR --documents 5000 --seed 1 --out DIR2

Writes one JSON-lines file (`text` per line), which `data.source: text` reads as one document a line.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path
from typing import NoReturn

from roformer.data.text import expand_paths, read_documents
from roformer.errors import UserError
from roformer.study.probes import MLM_KEYS

REPO = Path(__file__).resolve().parents[2]


def filler_words(folder: Path) -> list[str]:
    """Every word of the folder's text files, in order (whitespace-split, no line structure)."""
    words: list[str] = []
    for path in expand_paths([str(folder)]):
        for document in read_documents(path, decode_errors="replace"):
            words.extend(re.split(r"\s+", document.strip()))
    return [w for w in words if w]


def passkey_document(words: list[str], low: int, high: int, rng: random.Random) -> str:
    """`low`-`high` filler words from a random place with "the pass key is K." planted twice, in order."""
    count = rng.randint(low, high)
    start = rng.randrange(len(words) - count)
    body = words[start : start + count]
    statement = f"the pass key is {rng.choice(MLM_KEYS)}."
    first, second = sorted(rng.sample(range(count + 1), 2))
    return " ".join([*body[:first], statement, *body[first:second], statement, *body[second:]])


def fail(message: str) -> NoReturn:
    """Bad input: one line on stderr, exit code 2."""
    print(f"passkey_corpus.py: {message}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--filler", type=Path, default=REPO.parent / "shared/data/corpus/gutenberg")
    parser.add_argument("--out", type=Path, required=True, help="a folder; passkey.jsonl is written in it")
    parser.add_argument("--documents", type=int, default=20000)
    parser.add_argument("--words", type=int, nargs=2, default=(10, 70), metavar=("LOW", "HIGH"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    try:
        words = filler_words(args.filler)
    except UserError as e:
        fail(f"--filler: {e}")
    if len(words) < 10 * args.words[1]:
        fail(f"--filler {args.filler}: {len(words)} words, too few for documents of {args.words[1]}")
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / "passkey.jsonl"
    with target.open("w", encoding="utf-8") as f:
        for _ in range(args.documents):
            f.write(json.dumps({"text": passkey_document(words, *args.words, rng)}) + "\n")
    print(f"{args.documents} documents -> {target}")


if __name__ == "__main__":
    main()
