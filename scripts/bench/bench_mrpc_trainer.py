"""GLUE MRPC fine-tuning end to end: `roformer finetune` against transformers' `Trainer` (what `run_glue` runs).

Both start from the same weights (a roformer model directory, exported to HF RoFormer/BERT with `to_hf` for the
Trainer) and tokenizer, and use the same recipe: batch size, epochs, max length, peak learning rate, 10% linear
warmup then linear decay, AdamW (weight decay 0.01, eps 1e-6), gradient clipping at 1.0, fp32, evaluation on dev at
the end of every epoch, predictions for the test set at the end. The classifier head is drawn fresh on each side.
Reported: the wall time of the whole job (reading and tokenising the data included), training examples per second
(examples x epochs over the wall time) and the dev accuracy / F1 of the final model.

    python scripts/bench/bench_mrpc_trainer.py --init runs/roformer-tiny/final --glue-dir ../shared/data/glue
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers

import roformer


def read_mrpc(path: Path) -> tuple[list[tuple[str, str]], list[int]]:
    """(sentence pairs, labels) of an official MRPC TSV (Quality, #1 ID, #2 ID, #1 String, #2 String)."""
    with path.open(encoding="utf-8") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    labels = [int(r[0]) if r[0] in ("0", "1") else -1 for r in rows]
    return [(r[3], r[4]) for r in rows], labels


def ours(args: argparse.Namespace, out: Path) -> dict[str, float]:
    command = [
        sys.executable, "-m", "roformer", "finetune", "--config", "configs/glue/mrpc.yaml",
        "--output-dir", str(out), "--overwrite",
        "--set", f"init={args.init}", "--set", f"data.glue_dir={args.glue_dir}",
        "--set", f"data.max_length={args.max_length}", "--set", f"train.epochs={args.epochs}",
        "--set", f"train.batch_size={args.batch_size}", "--set", f"train.lr={args.lr}",
        "--set", "train.lrs=[]", "--set", "train.seeds=[]", "--set", "train.progress=false",
    ]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    run = json.loads((out / "results.json").read_text())["runs"][0]
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    final = [e for e in events if e.get("event") == "eval" and e.get("split") == "dev"][-1]
    return {"wall": wall, "accuracy": final["accuracy"], "f1": final["f1"], "steps": run["steps"]}


def trainer(args: argparse.Namespace, out: Path) -> dict[str, float]:
    start = time.perf_counter()
    model = roformer.load(args.init, architecture="sequence_classification", num_labels=2, classifier_dropout=0.1)
    hf_model = roformer.to_hf(model).train()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(Path(args.init) / "tokenizer.json"), pad_token="[PAD]"
    )

    def encode(split: str) -> list[dict[str, torch.Tensor]]:
        pairs, labels = read_mrpc(Path(args.glue_dir) / "MRPC" / f"{split}.tsv")
        enc = tokenizer([a for a, _ in pairs], [b for _, b in pairs], truncation=True, max_length=args.max_length)
        return [
            {**{k: v[i] for k, v in enc.items()}, **({"labels": labels[i]} if split != "test" else {})}
            for i in range(len(pairs))
        ]

    train, dev, test = encode("train"), encode("dev"), encode("test")

    def metrics(prediction: transformers.EvalPrediction) -> dict[str, float]:
        predicted = np.argmax(prediction.predictions, axis=-1)
        gold = prediction.label_ids
        tp = float(((predicted == 1) & (gold == 1)).sum())
        f1 = 2 * tp / max(1.0, float((predicted == 1).sum() + (gold == 1).sum()))
        return {"accuracy": float((predicted == gold).mean()), "f1": f1}

    warmup = int(0.1 * math.ceil(len(train) / args.batch_size) * args.epochs)  # as roformer's warmup_fraction
    training_args = transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=args.batch_size,
        num_train_epochs=args.epochs, learning_rate=args.lr, warmup_steps=warmup, weight_decay=0.01, adam_epsilon=1e-6,
        max_grad_norm=1.0, lr_scheduler_type="linear", eval_strategy="epoch", save_strategy="no", logging_steps=50,
        report_to=[], seed=0, disable_tqdm=True, use_cpu=not torch.cuda.is_available(),
    )  # fmt: skip
    job = transformers.Trainer(
        model=hf_model, args=training_args, train_dataset=train, eval_dataset=dev,
        data_collator=transformers.DataCollatorWithPadding(tokenizer), compute_metrics=metrics,
    )  # fmt: skip
    job.train()
    final = job.evaluate()
    job.predict(test)
    wall = time.perf_counter() - start
    return {"wall": wall, "accuracy": final["eval_accuracy"], "f1": final["eval_f1"], "steps": job.state.global_step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--init", required=True, help="a roformer model directory with its tokenizer (final/)")
    parser.add_argument("--glue-dir", required=True)
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--lr", type=float, default=5e-5)
    args = parser.parse_args()
    n_train = len(read_mrpc(Path(args.glue_dir) / "MRPC" / "train.tsv")[1])
    print(f"MRPC, init {args.init}, batch {args.batch_size}, {args.epochs} epochs, max length {args.max_length}, "
          f"lr {args.lr}, torch {torch.__version__}, transformers {transformers.__version__}")  # fmt: skip
    print("| job | wall s | train examples/s | steps | dev accuracy | dev F1 |\n|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        results = {
            "roformer finetune": ours(args, Path(tmp) / "ours"),
            "transformers Trainer": trainer(args, Path(tmp)),
        }
    for name, r in results.items():
        rate = n_train * args.epochs / r["wall"]
        scores = f"{100 * r['accuracy']:.1f} | {100 * r['f1']:.1f}"
        print(f"| {name} | {r['wall']:.0f} | {rate:.0f} | {r['steps']} | {scores} |")
    ratio = results["transformers Trainer"]["wall"] / results["roformer finetune"]["wall"]
    print(f"\nTrainer wall time / ours: {ratio:.2f}")


if __name__ == "__main__":
    main()
