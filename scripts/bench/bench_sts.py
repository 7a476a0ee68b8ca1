"""STS-B with CoSENT from one init: `roformer finetune --config finetune/stsb-cosent` against the same recipe in
sentence-transformers (`SentenceTransformerTrainer` with `losses.CoSENTLoss`), each side a subprocess.

    python scripts/bench/bench_sts.py --init runs/bench/init/final --out runs/bench/sts --seeds 0 1 2
    python scripts/bench/bench_sts.py --init DIR --out /tmp/s --train-examples 64 --epochs 1 --seeds 0   # a smoke run

Both start from the same weights and tokenizer: ours reads the roformer directory `--init`; sentence-transformers
loads its export (`roformer export --format sentence-transformers`, mean pooling, made once before any timing), as a
user would. The recipe on both sides: GLUE's STS-B training pairs (the first `--train-examples`), CoSENT with scale
20 on the cosines of mean-pooled vectors, batch 32, `--epochs`, peak learning rate `--lr` with linear warmup over the
first 10% of the steps then linear decay, AdamW (eps 1e-6, weight decay 0.01), gradient clipping at 1.0, max length
64, fp32 on CPU; each side's own batch order under the seed. The metric on both sides: the Spearman correlation of
the final model's cosines with STS-B's dev scores, computed here from each side's vectors with scipy (ours: its
`best/` read by `SentenceEncoder`; theirs: `SentenceTransformer.encode` of its saved model). Ours keeps the best of
its per-epoch dev evaluations (its recipe), theirs the last; with dev evaluated only at the end both are the last.
Writes `--out/bench.json` and prints a table.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STSB = REPO.parent / "shared" / "data" / "glue" / "STS-B"
BATCH, SCALE, MAX_LENGTH, WARMUP, WEIGHT_DECAY = 32, 20.0, 64, 0.1, 0.01


def stsb(split: str, count: int | None = None) -> tuple[list[str], list[str], list[float]]:
    """STS-B's (sentence1, sentence2, score) columns of a split, the first `count` rows."""
    first, second, scores = [], [], []
    with (STSB / f"{split}.tsv").open(encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            first.append(row["sentence1"])
            second.append(row["sentence2"])
            scores.append(float(row["score"]))
    return first[:count], second[:count], scores[:count]


def spearman_of(first, second, scores) -> float:
    """The Spearman correlation of the cosines of two (N, C) arrays of vectors with the gold scores."""
    import numpy as np
    from scipy.stats import spearmanr

    cosines = (first * second).sum(1) / (np.linalg.norm(first, axis=1) * np.linalg.norm(second, axis=1))
    return float(spearmanr(cosines, scores).statistic)


def run_ours(args: argparse.Namespace, seed: int, out: Path) -> float:
    """`roformer finetune` in a subprocess; returns its wall time."""
    sets = {
        "init": args.init,
        "train.lrs": f"[{args.lr}]",
        "train.seeds": f"[{seed}]",
        "train.epochs": args.epochs,
        "train.batch_size": BATCH,
        "train.weight_decay": WEIGHT_DECAY,
        "train.warmup_fraction": WARMUP,
        "train.eval_every": 0,
        "train.progress": "false",
        "data.max_train_examples": args.train_examples or "null",
        "data.max_length": MAX_LENGTH,
        "data.test_file": "null",
    }
    command = [
        sys.executable,
        "-m",
        "roformer",
        "finetune",
        "--config",
        "finetune/stsb-cosent",
        "--output-dir",
        str(out),
    ]
    command += [item for key, value in sets.items() for item in ("--set", f"{key}={value}")]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"roformer finetune failed: {done.stderr.strip()[-2000:]}")
    return time.perf_counter() - start


def train_theirs(export: str, out: str, seed: int, lr: float, epochs: float, train_examples: int | None) -> None:
    """The sentence-transformers side (run as `--side st` in a subprocess): CoSENTLoss with the shared recipe."""
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
        losses,
    )

    model = SentenceTransformer(export, device="cpu")
    model.max_seq_length = MAX_LENGTH
    first, second, scores = stsb("train", train_examples)
    train = Dataset.from_dict({"sentence1": first, "sentence2": second, "score": scores})
    arguments = SentenceTransformerTrainingArguments(
        output_dir=out,
        num_train_epochs=epochs,
        per_device_train_batch_size=BATCH,
        learning_rate=lr,
        warmup_steps=WARMUP,  # a float: the fraction of the steps (transformers 5)
        weight_decay=WEIGHT_DECAY,
        adam_epsilon=1e-6,
        max_grad_norm=1.0,
        lr_scheduler_type="linear",
        seed=seed,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
    )
    trainer = SentenceTransformerTrainer(
        model=model, args=arguments, train_dataset=train, loss=losses.CoSENTLoss(model, scale=SCALE)
    )
    trainer.train()
    model.save(str(Path(out) / "model"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--epochs", type=float, default=3)
    parser.add_argument("--train-examples", type=int)
    parser.add_argument("--side", choices=["st"], help=argparse.SUPPRESS)  # internal: the subprocess
    parser.add_argument("--export", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "st":
        train_theirs(args.export, args.out, args.seed, args.lr, args.epochs, args.train_examples)
        return
    from roformer.embed import SentenceEncoder, export_sentence_transformers

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    export = out / "st-init"
    if not export.is_dir():
        export_sentence_transformers(SentenceEncoder.load(args.init, pooling="mean"), export, False, False)
    dev = stsb("dev")
    zero_shot = SentenceEncoder.load(args.init, pooling="mean")
    rows = [{"side": "init (no fine-tuning)", "seed": None, "wall": 0.0, "spearman": spearman_of(
        zero_shot.encode(dev[0]), zero_shot.encode(dev[1]), dev[2])}]  # fmt: skip
    for seed in args.seeds:
        run = out / f"ours-seed{seed}"
        wall = run_ours(args, seed, run)
        ours = SentenceEncoder.load(run / "best")
        rows.append({"side": "roformer finetune", "seed": seed, "wall": wall,
                     "spearman": spearman_of(ours.encode(dev[0]), ours.encode(dev[1]), dev[2])})  # fmt: skip
        theirs_dir = out / f"st-seed{seed}"
        command = [sys.executable, __file__, "--side", "st", "--init", args.init, "--export", str(export)]
        command += ["--out", str(theirs_dir), "--seed", str(seed), "--lr", str(args.lr), "--epochs", str(args.epochs)]
        if args.train_examples:
            command += ["--train-examples", str(args.train_examples)]
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, text=True)
        wall = time.perf_counter() - start
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(theirs_dir / "model"), device="cpu")
        vectors = [model.encode(texts, batch_size=BATCH, convert_to_numpy=True) for texts in dev[:2]]
        rows.append({"side": "sentence-transformers", "seed": seed, "wall": wall,
                     "spearman": spearman_of(*vectors, dev[2])})  # fmt: skip
    (out / "bench.json").write_text(json.dumps(rows, indent=1))
    print("| side | seeds | STS-B dev Spearman (mean ± std) | wall s (mean) |\n|---|---:|---:|---:|")
    for side in dict.fromkeys(r["side"] for r in rows):
        values = [r["spearman"] * 100 for r in rows if r["side"] == side]
        walls = [r["wall"] for r in rows if r["side"] == side]
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        print(
            f"| {side} | {len(values)} | {statistics.mean(values):.2f} ± {spread:.2f} | {statistics.mean(walls):.1f} |"
        )


if __name__ == "__main__":
    main()
