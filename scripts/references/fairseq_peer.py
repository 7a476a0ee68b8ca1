"""Our translation recipe beside fairseq 0.12.2's transformer of the same shape, on this CPU (fairseq_peer.sh run).

Both sides train for the same number of updates, one torch thread each, on the same Multi30k files: ours with its
own joint BPE, fairseq on the same text cut into that BPE's pieces (so both read the same tokens); both translate
test 2016 with beam 5 and length penalty 1 and are scored by roformer.tasks.mt_metrics. Written: OUT/peer.json and
OUT/peer.md (seconds per update, tokens per second, BLEU, chrF++, tokenized lower-cased BLEU).

    python scripts/references/fairseq_peer.py --venv /tmp/fairseq-venv --out runs/fairseq-peer --updates 600
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tokenizers import Tokenizer

from roformer.tasks.mt_metrics import corpus_scores

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data" / "translation" / "multi30k"
CONFIG = REPO / "configs" / "translation" / "multi30k-tiny.yaml"
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
# Wu et al. 2021's transformer_tiny flags (README-baseline of LividWo/Revisit-MMT), the model spelled out
FAIRSEQ_MODEL = (
    "--arch transformer --encoder-layers 4 --decoder-layers 4 --encoder-embed-dim 128 --decoder-embed-dim 128 "
    "--encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256 --encoder-attention-heads 4 --decoder-attention-heads 4 "
    "--share-all-embeddings --dropout 0.3 --activation-fn relu"
).split()
FAIRSEQ_OPTIMISATION = (
    "--optimizer adam --adam-betas (0.9,0.98) --lr 5e-3 --lr-scheduler inverse_sqrt --warmup-updates 2000 "
    "--criterion label_smoothed_cross_entropy --label-smoothing 0.1 --max-tokens 4096 --weight-decay 0.0"
).split()
SEARCH = "--beam 5 --lenpen 1 --max-len-a 1.2 --max-len-b 10".split()


def read_lines(path: Path) -> list[str]:
    """A split's lines as our reader takes them (gzip, stripped)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f]


def run_ours(out: Path, updates: int, encoding: str) -> dict:
    """Our recipe for `updates` updates (no patience, no averaging, one evaluation at the end): its scores and pace."""
    run = out / f"ours-{encoding}"
    settings = [
        f"train.max_steps={updates}", "train.patience=null", "train.average_last=0", "train.eval_every=0",
        "train.save_every=0", "train.progress=false", f"model.position_encoding={encoding}",
    ]  # fmt: skip
    command = [sys.executable, "-m", "roformer", "finetune", "--config", str(CONFIG), "--output-dir", str(run)]
    command += [arg for item in settings for arg in ("--set", item)]
    start = time.perf_counter()
    subprocess.run([*command, "--overwrite"], check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    trains = [e for e in events if e["event"] == "train"]
    test = json.loads((run / "results.json").read_text())["translation"]["best"]["test"]
    seconds = trains[-1]["elapsed_sec"]
    return {
        "side": f"ours ({encoding})",
        "updates": updates,
        "train_seconds": seconds,
        "seconds_per_update": seconds / updates,
        "tokens_per_second": statistics.median(e["tokens_per_sec"] for e in trains),
        "wall_seconds": wall,
        **{key: test[key] for key in ("bleu", "chrf", "bleu_tok_lc")},
        "tokenizer": str(run / "best" / "tokenizer.json"),
    }


def write_pieces(tokenizer: Tokenizer, folder: Path) -> None:
    """Every split of both languages as our BPE's pieces, space-separated: fairseq's input, the same tokens."""
    folder.mkdir(parents=True, exist_ok=True)
    for ours, theirs in SPLITS.items():
        for language in ("en", "de"):
            lines = read_lines(DATA / f"{theirs}.{language}.gz")
            encoded = tokenizer.encode_batch(lines, add_special_tokens=False)
            (folder / f"{ours}.{language}").write_text("".join(" ".join(e.tokens) + "\n" for e in encoded))


def run_fairseq(venv: Path, out: Path, updates: int, tokenizer: Path) -> dict:
    """fairseq-preprocess, -train and -generate on our pieces; the same scores as ours, and fairseq's own pace."""
    pieces, binary, checkpoints = out / "fairseq-pieces", out / "fairseq-bin", out / "fairseq-checkpoints"
    write_pieces(Tokenizer.from_file(str(tokenizer)), pieces)
    tool = venv / "bin"
    subprocess.run(
        [tool / "fairseq-preprocess", "--source-lang", "en", "--target-lang", "de", "--joined-dictionary",
         "--trainpref", pieces / "train", "--validpref", pieces / "valid", "--testpref", pieces / "test",
         "--destdir", binary, "--workers", "1"],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    start = time.perf_counter()
    log = subprocess.run(
        [tool / "fairseq-train", binary, *FAIRSEQ_MODEL, *FAIRSEQ_OPTIMISATION, "--max-update", str(updates),
         "--cpu", "--num-workers", "0", "--seed", "0", "--save-dir", checkpoints, "--no-epoch-checkpoints",
         "--log-format", "json", "--log-interval", "50", "--disable-validation"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - start
    stats = [json.loads(m) for m in re.findall(r"\{\"epoch\".*\}", log.stdout + log.stderr) if '"train_wall"' in m]
    last = stats[-1]
    generated = subprocess.run(
        [tool / "fairseq-generate", binary, "--path", checkpoints / "checkpoint_last.pt", "--gen-subset", "test",
         *SEARCH, "--batch-size", "128", "--cpu", "--post-process", "sentencepiece"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    hypotheses = dict(re.findall(r"^D-(\d+)\t[^\t]*\t(.*)$", generated, re.M))
    ordered = [hypotheses[str(i)] for i in range(len(hypotheses))]
    references = read_lines(DATA / "test_2016_flickr.de.gz")
    scores = corpus_scores(ordered, references, "de")
    seconds = float(last["train_wall"])
    return {
        "side": "fairseq 0.12.2 (sinusoidal)",
        "updates": int(last.get("train_num_updates", updates)),
        "train_seconds": seconds,
        "seconds_per_update": seconds / updates,
        "target_tokens_per_second": float(last["train_wps"]),
        "wall_seconds": wall,
        **scores,
    }


def markdown(rows: list[dict]) -> str:
    """The table of docs/translation.md's peer section."""
    lines = [
        "| side | updates | s/update | BLEU | chrF++ | BLEU tok. lc |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['side']} | {r['updates']} | {r['seconds_per_update']:.3f} | {r['bleu']:.2f} | {r['chrf']:.2f} | "
            f"{r['bleu_tok_lc']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--venv", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--updates", type=int, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [run_ours(args.out, args.updates, encoding) for encoding in ("sinusoidal", "rotary")]
    rows.append(run_fairseq(args.venv, args.out, args.updates, Path(rows[0]["tokenizer"])))
    (args.out / "peer.json").write_text(json.dumps(rows, indent=2))
    (args.out / "peer.md").write_text(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
