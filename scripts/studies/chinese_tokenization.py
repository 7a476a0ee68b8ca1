"""What a Chinese tokenizer makes of text: vocabulary, tokens per character, and how much of a CAIL2019-SCM pair fits.

Character-level tokenization (bert-base-chinese: every CJK character a token) and word-level (WoBERT, RoFormer: jieba
words, then WordPiece) differ in more than the position encoding of the models that use them: a word-level model
reads fewer tokens per text, so it sees more of a long document within the same length. This prints, for each
tokenizer given (a pretraining run's `tokenizer/`, a model directory, a converted HF checkpoint):

- its vocabulary and kind (word-level: jieba first, detected from the tokenizer itself), and tokens per character
  over sample documents of a corpus (JSON lines, one text field);
- for CAIL2019-SCM triplets (JSON lines {A, B, C}): tokens per document, and at each max length the share of
  (A, candidate) pairs that fit whole and the mean share of a pair's tokens kept (`[CLS] A [SEP] X [SEP]`, cut
  longest-first as `type: triplet` cuts it).

    python scripts/studies/chinese_tokenization.py --tokenizer word=runs/chinese-tiny/roformer-seed0/tokenizer \\
        --tokenizer char=runs/bert-zh-char-tiny/tokenizer
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path

from roformer.data.tokenizer import jieba_presegmenter, load_tokenizer, word_vocabulary

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
CORPUS = [SHARED / "corpus/chinese-fewclue-unlabeled" / name for name in ("tnews.json", "eprstmt.json")]
SCM = SHARED / "cail2019-scm/sample.json"


def read_field(path: Path, field: str) -> list[str]:
    """The `field` of every JSON line of `path`."""
    with path.open(encoding="utf-8") as f:
        return [json.loads(line)[field] for line in f if line.strip()]


def token_counts(tokenizer, texts: list[str]) -> list[int]:
    """Tokens of each text (no special tokens), jieba first for a word-level tokenizer."""
    if word_vocabulary(tokenizer) is not None:
        segment = jieba_presegmenter(tokenizer)
        texts = [segment(t) for t in texts]
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", action="append", required=True, metavar="LABEL=DIR")
    parser.add_argument("--corpus", nargs="+", type=Path, default=CORPUS, help="JSON lines files")
    parser.add_argument("--field", default="sentence", help="the corpus files' text field")
    parser.add_argument("--documents", type=int, default=5000, help="corpus documents sampled (seed 0)")
    parser.add_argument("--scm", type=Path, default=SCM, help="CAIL2019-SCM triplets (JSON lines)")
    parser.add_argument("--lengths", default="512,1024")
    args = parser.parse_args()
    texts = [t for path in args.corpus for t in read_field(path, args.field)]
    texts = random.Random(0).sample(texts, min(args.documents, len(texts)))
    rows = [json.loads(line) for line in args.scm.open(encoding="utf-8") if line.strip()]
    lengths = [int(x) for x in args.lengths.split(",")]
    characters = sum(map(len, texts))
    documents = {d: None for r in rows for d in (r["A"], r["B"], r["C"])}  # each distinct document once
    print(f"corpus: {len(texts)} documents, {characters:,} characters; SCM: {len(rows)} triplets")
    print("\n| tokenizer | kind | vocabulary | tokens per character (corpus) | tokens per SCM document (mean) |")
    print("|---|---|---:|---:|---:|")
    pairs = {}
    for spec in args.tokenizer:
        label, _, path = spec.partition("=")
        tokenizer = load_tokenizer(path)
        kind = "word (jieba)" if word_vocabulary(tokenizer) is not None else "character"
        per_char = sum(token_counts(tokenizer, texts)) / characters
        counts = dict(zip(documents, token_counts(tokenizer, list(documents)), strict=True))
        print(f"| {label} | {kind} | {len(tokenizer):,} | {per_char:.3f} | {statistics.mean(counts.values()):.0f} |")
        pairs[label] = [counts[r["A"]] + counts[r[c]] + 3 for r in rows for c in ("B", "C")]  # [CLS] A [SEP] X [SEP]
    print("\n| max length | tokenizer | pairs that fit whole | tokens kept (mean share of a pair) |")
    print("|---:|---|---:|---:|")
    for length in lengths:
        for label, sizes in pairs.items():
            whole = sum(n <= length for n in sizes) / len(sizes)
            kept = statistics.mean(min(n, length) / n for n in sizes)
            print(f"| {length} | {label} | {100 * whole:.1f}% | {100 * kept:.1f}% |")


if __name__ == "__main__":
    main()
