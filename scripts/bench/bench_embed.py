"""Sentence-encoding throughput: roformer's `SentenceEncoder` (what `roformer embed` runs) against
`SentenceTransformer.encode` on the sentence-transformers export of the same model, in one process, same texts.

    python scripts/bench/bench_embed.py --model runs/bench/init/final                     # its weights and tokenizer
    python scripts/bench/bench_embed.py --model runs/bench/init/final --shape base --texts 500 --repeats 3
    python scripts/bench/bench_embed.py --model DIR --texts 64 --repeats 1                # a smoke run

The texts are STS-B's training sentences (../shared/data/glue/STS-B/train.tsv, sentence1 and sentence2 in file
order: 3 to 56 words, a mixed-length corpus), the first `--texts`. `--shape small|base` keeps the model directory's
tokenizer and draws a random backbone of that shape (4 x 256 or BERT-base's 12 x 768; throughput does not depend on
trained weights); without it the directory's own model is timed. Both sides: CPU, fp32, batch 32, no
normalisation, the pooling given (mean by default), tokenisation included. sentence-transformers loads the export with
`SentenceTransformer(DIR)` (transformers' RoFormerModel for rotary, BertModel otherwise). The two encode calls are
interleaved (A, B, A, B, ...) after a warm-up each, and the medians reported; the vectors are compared (largest
absolute difference and the smallest cosine between a text's two vectors).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from roformer.embed import SentenceEncoder, export_sentence_transformers
from roformer.model.model import Backbone

STSB = Path(__file__).resolve().parents[3] / "shared" / "data" / "glue" / "STS-B" / "train.tsv"
SHAPES = {
    "small": dict(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024),
    "base": dict(hidden_size=768, num_layers=12, num_heads=12, intermediate_size=3072),
}


def stsb_sentences(count: int) -> list[str]:
    """The first `count` sentences of STS-B's training pairs (both sides, in file order)."""
    texts: list[str] = []
    with STSB.open(encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            texts += [row["sentence1"], row["sentence2"]]
            if len(texts) >= count:
                break
    return texts[:count]


def encoder_of(model_dir: str, shape: str | None, pooling: str) -> SentenceEncoder:
    encoder = SentenceEncoder.load(model_dir, pooling=pooling)
    if shape is None:
        return encoder
    from dataclasses import replace

    torch.manual_seed(0)
    config = replace(encoder.model.config, **SHAPES[shape], embedding_size=None, add_pooler=False)
    return SentenceEncoder(Backbone(config), encoder.tokenizer, pooling=pooling, max_length=encoder.max_length)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a roformer model directory (its tokenizer is used)")
    parser.add_argument("--shape", choices=list(SHAPES), help="time a random backbone of this shape instead")
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--pooling", default="mean")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from sentence_transformers import SentenceTransformer

    texts = stsb_sentences(args.texts)
    ours = encoder_of(args.model, args.shape, args.pooling)
    with tempfile.TemporaryDirectory() as tmp:
        export_sentence_transformers(ours, Path(tmp) / "st", normalize=False, overwrite=False)
        theirs = SentenceTransformer(str(Path(tmp) / "st"), device="cpu")
    sides = {
        "roformer SentenceEncoder": lambda: ours.encode(texts, batch_size=args.batch_size),
        "SentenceTransformer.encode": lambda: theirs.encode(
            texts, batch_size=args.batch_size, convert_to_numpy=True, show_progress_bar=False
        ),
    }
    vectors = {name: fn() for name, fn in sides.items()}  # warm-up, and the vectors compared
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(args.repeats):
        for name, fn in sides.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    a, b = vectors.values()
    cosine = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    config = ours.model.config
    tokens = sum(len(ids) for ids in ours.tokenize(texts))
    print(
        f"{config.position_encoding} {config.num_layers} x {config.hidden_size}, {len(texts)} STS-B sentences "
        f"({tokens / len(texts):.1f} tokens each on average), batch {args.batch_size}, {args.pooling} pooling, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, medians of {args.repeats}"
    )
    print("\n| side | s | sentences/s | vs SentenceTransformer |\n|---|---:|---:|---:|")
    st_time = statistics.median(times["SentenceTransformer.encode"])
    for name, t in times.items():
        median = statistics.median(t)
        print(f"| {name} | {median:.2f} | {len(texts) / median:,.0f} | {st_time / median:.2f}x |")
    print(f"\nlargest |difference| {np.abs(a - b).max():.2e}, smallest cosine {cosine.min():.7f}")


if __name__ == "__main__":
    main()
