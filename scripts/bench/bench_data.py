"""Token-store benchmark: build time, throughput, memory and loader speed at 1x, 4x and 16x the gutenberg corpus.

    python scripts/bench/bench_data.py                       # ../shared/data/corpus/gutenberg, sizes 1,4,16
    python scripts/bench/bench_data.py --corpus DIR --sizes 1,2

For each size (the corpus copied that many times under new names) it measures, each in a fresh process so that peak
RSS belongs to that step alone: the store build (count, tokenizer sample, tokenize + write) with a tokenizer trained
once on the 1x corpus, its tokens/s and peak RSS; a short tiny-model pretraining run reading the store, its peak RSS;
bytes per token on disk; and the loader alone (block reads from the memory map + masking, no model), in tokens/s.
In the same process as each build it times raw `tokenizers` `encode_batch` on the same documents (the limit of any
builder on these cores). Prints one markdown table.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def config_for(corpus: Path, cache: Path, tokenizer: Path | None) -> dict:
    data = {
        "source": "text",
        "paths": [str(corpus)],
        "vocab_size": 8000,
        "max_seq_len": 128,
        "decode_errors": "replace",
        "cache_dir": str(cache),
        "max_eval_blocks": 64,
    }
    if tokenizer is not None:
        data["tokenizer"] = str(tokenizer)
    model = {"vocab_size": 8000, "hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 128}
    train = {"max_steps": 20, "batch_size": 32, "eval_every": 0, "save_every": 0, "progress": False, "log_every": 10}
    return {"model": model, "data": data, "train": train}


def child_build(config_path: Path) -> dict:
    """Build the store; time raw encode_batch on the same documents; report seconds, tokens and peak RSS."""
    from roformer.config import load
    from roformer.data.corpus import open_documents
    from roformer.data.store import build_token_store, store_directory
    from roformer.data.token_store import TokenStore
    from roformer.data.tokenizer import load_tokenizer
    from roformer.train.config import PretrainConfig

    data = load(PretrainConfig, config_path).data
    directory = store_directory(data)
    started = time.perf_counter()
    build_token_store(data, directory)
    build_sec = time.perf_counter() - started
    build_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    stores = [TokenStore(directory / s) for s in ("train", "validation")]
    tokens, disk = sum(s.num_tokens for s in stores), sum(s.nbytes for s in stores)
    backend = load_tokenizer(data.tokenizer).backend_tokenizer
    corpus, _ = open_documents(data)
    batch, encoded, raw_sec = [], 0, 0.0
    for document in corpus():  # the same documents, 1000 at a time, as the builder tokenizes them
        batch.append(document)
        if len(batch) == 1000:
            t0 = time.perf_counter()
            encoded += sum(len(e.ids) for e in backend.encode_batch(batch, add_special_tokens=False))
            raw_sec += time.perf_counter() - t0
            batch = []
    if batch:
        t0 = time.perf_counter()
        encoded += sum(len(e.ids) for e in backend.encode_batch(batch, add_special_tokens=False))
        raw_sec += time.perf_counter() - t0
    return {
        "build_sec": build_sec,
        "build_rss_mb": build_rss,
        "tokens": tokens,
        "disk_bytes": disk,
        "raw_tokens_per_sec": encoded / raw_sec,
    }


def child_train(config_path: Path, out: Path) -> dict:
    """A short pretraining run reading the store; its peak RSS; then the loader alone, timed."""
    from roformer.config import load
    from roformer.data.mlm import train_batches
    from roformer.data.store import build_mlm_data
    from roformer.train.config import PretrainConfig
    from roformer.train.pretrain import pretrain

    config = load(PretrainConfig, config_path)
    pretrain(config, out)
    train_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    data = build_mlm_data(config.data)
    batches = train_batches(data, config.data, seed=0, batch_size=64)
    steps, started = 200, time.perf_counter()
    for step in range(steps):
        batches.step(step * 97)  # spread over the epoch: cold pages, not one hot region
    loader = steps * batches.global_batch * config.data.max_seq_len / (time.perf_counter() - started)
    return {"train_rss_mb": train_rss, "loader_tokens_per_sec": loader, "blocks": len(data.train)}


def run_child(*args: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=REPO.parent / "shared" / "data" / "corpus" / "gutenberg")
    parser.add_argument("--sizes", default="1,4,16")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        result = child_build(Path(rest[0])) if kind == "build" else child_train(Path(rest[0]), Path(rest[1]))
        print(json.dumps(result))
        return 0
    work = Path(tempfile.mkdtemp(prefix="roformer-bench-data-"))
    try:
        files = sorted(p for p in args.corpus.iterdir() if p.is_file())
        tokenizer = work / "tokenizer"
        from roformer.data.config import DataConfig
        from roformer.data.corpus import load_documents
        from roformer.data.tokenizer import save_tokenizer, train_tokenizer

        documents, _ = load_documents(DataConfig(source="text", paths=[str(args.corpus)], decode_errors="replace"))
        save_tokenizer(train_tokenizer(documents, 8000), tokenizer)  # one vocabulary for every size
        rows = []
        for size in [int(s) for s in args.sizes.split(",")]:
            corpus = work / f"corpus-{size}x"
            corpus.mkdir()
            for copy in range(size):
                for f in files:
                    shutil.copyfile(f, corpus / f"{copy:02d}-{f.name}")
            text_mb = sum(p.stat().st_size for p in corpus.iterdir()) / 2**20
            path = work / f"config-{size}x.yaml"
            path.write_text(yaml.safe_dump(config_for(corpus, work / f"cache-{size}x", tokenizer)))
            built = run_child("build", str(path))
            trained = run_child("train", str(path), str(work / f"run-{size}x"))
            rows.append({"size": size, "text_mb": text_mb, **built, **trained})
            shutil.rmtree(corpus)
        print(
            "\n| corpus | text | tokens | build s | build tokens/s | raw encode_batch tokens/s | build / raw | "
            "build peak RSS | train peak RSS | bytes/token | loader tokens/s |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            rate = r["tokens"] / r["build_sec"]
            print(
                f"| gutenberg x{r['size']} | {r['text_mb']:.0f} MB | {r['tokens'] / 1e6:.1f}M | "
                f"{r['build_sec']:.1f} | "
                f"{rate / 1e6:.2f}M | {r['raw_tokens_per_sec'] / 1e6:.2f}M | {rate / r['raw_tokens_per_sec']:.0%} | "
                f"{r['build_rss_mb']:.0f} MB | {r['train_rss_mb']:.0f} MB | {r['disk_bytes'] / r['tokens']:.2f} | "
                f"{r['loader_tokens_per_sec'] / 1e6:.1f}M |"
            )
        first, last = rows[0], rows[-1]
        build_ratio = last["build_rss_mb"] / first["build_rss_mb"]
        train_ratio = last["train_rss_mb"] / first["train_rss_mb"]
        print(f"\npeak RSS x{last['size']} / x{first['size']}: build {build_ratio:.2f}, train {train_ratio:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
