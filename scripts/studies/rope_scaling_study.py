"""RoPE context scaling, measured: a RoFormer trained at a short length, evaluated far beyond it with none / PI / NTK /
YaRN, then (as the position-interpolation paper does) after a short continued pretraining at the longer length.

    python scripts/studies/rope_scaling_study.py --out runs/rope-scaling      # tiny config: ~6 minutes on 2 CPU cores

Steps (every one through the CLI's own functions, so the numbers are what a user gets):
1. `roformer pretrain` of `--config` (default the tiny recipe, 128 tokens) unless `<out>/base` exists;
2. `roformer eval-mlm --rope-scaling none,linear,ntk,yarn` at `--seq-lens` (factor = length / trained length);
3. for each method, `roformer pretrain` with `init: <out>/base/final`, `data.max_seq_len = --long`, the method's
   `rope_scaling` at factor long / trained, `--continue-steps` steps; then `eval-mlm` of each at `--seq-lens`.
Prints two markdown tables (eval loss / masked-token accuracy) and writes them to `<out>/tables.md`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from roformer.config import load
from roformer.study.length_eval import LengthEvalSettings, evaluate_lengths, parse_rope_scalings
from roformer.study.markdown import length_results_table
from roformer.train.config import PretrainConfig
from roformer.train.pretrain import pretrain

REPO = Path(__file__).resolve().parents[2]
METHODS = ("none", "linear", "ntk", "yarn")


def continued(args: argparse.Namespace, base: Path, method: str, factor: float) -> Path:
    """A continued pretraining of the base model at --long tokens with `method`'s scaling; returns its run dir."""
    out = args.out / f"continued-{method}"
    if (out / "final" / "model.safetensors").is_file():
        return out
    scaling = f"{{type: {method}, factor: {factor}, original_max_position: {args.trained}}}"
    scaling = "null" if method == "none" else scaling
    overrides = [
        f"init={base / 'final'}",
        f"model.rope_scaling={scaling}",
        f"data.max_seq_len={args.long}",
        f"train.max_steps={args.continue_steps}",
        f"train.batch_size={args.continue_batch}",
        "train.warmup_steps=10",
        f"train.lr={args.continue_lr}",
        f"train.eval_every={args.continue_steps}",
        "train.save_every=0",
        "train.progress=false",
    ]
    pretrain(load(PretrainConfig, args.config, overrides), out, overwrite=out.exists())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs/pretrain/roformer-tiny.yaml")
    parser.add_argument("--out", type=Path, default=Path("runs/rope-scaling"))
    parser.add_argument("--seq-lens", default="128,256,512,1024,2048")
    parser.add_argument("--long", type=int, default=1024, help="length of the continued pretraining")
    parser.add_argument("--continue-steps", type=int, default=100)
    parser.add_argument("--continue-batch", type=int, default=4)
    parser.add_argument("--continue-lr", type=float, default=5e-4)
    parser.add_argument("--max-tokens", type=int, default=32768, help="tokens scored at every length")
    args = parser.parse_args()
    lengths = [int(n) for n in args.seq_lens.split(",")]
    base = args.out / "base"
    if not (base / "final" / "model.safetensors").is_file():
        pretrain(load(PretrainConfig, args.config, ["train.progress=false"]), base, overwrite=base.exists())
    args.trained = load(PretrainConfig, base / "config.yaml").data.max_seq_len
    scalings = parse_rope_scalings(",".join(METHODS))
    zero_shot = evaluate_lengths(
        base / "final", base, LengthEvalSettings(lengths, args.max_tokens, rope_scalings=scalings)
    )
    tables = [
        f"Trained at {args.trained} tokens, evaluated with each method (factor = length / {args.trained}):\n",
        length_results_table(zero_shot),
    ]
    rows = []
    factor = args.long / args.trained
    for method in METHODS:
        run = continued(args, base, method, factor)
        results = evaluate_lengths(run / "final", base, LengthEvalSettings(lengths, args.max_tokens))
        rows.append((method, results))
    header = "| method | " + " | ".join(str(n) for n in lengths) + " |"
    tables += [
        f"\nAfter {args.continue_steps} steps of continued pretraining at {args.long} tokens (batch "
        f"{args.continue_batch}, factor {factor:g}):\n",
        header,
        "|---|" + "---:|" * len(lengths),
    ]
    for method, results in rows:
        cells = [f"{r['eval_loss']:.3f} / {100 * r['eval_accuracy']:.1f}%" for r in results]
        tables.append(f"| {method} | " + " | ".join(cells) + " |")
    text = "\n".join(tables) + "\n"
    print(text)
    (args.out / "tables.md").write_text(text)
    (args.out / "results.json").write_text(json.dumps({"zero_shot": zero_shot, "continued": dict(rows)}, indent=2))


if __name__ == "__main__":
    main()
