#!/usr/bin/env bash
# A refactor keeps behaviour: the same short pretraining and RTE fine-tune losses before and after it.
#
#     bash scripts/checks/refactor_losses.sh runs/refactor/before    # on the commit before the refactor
#     bash scripts/checks/refactor_losses.sh runs/refactor/after     # after it
#     diff runs/refactor/before/losses.txt runs/refactor/after/losses.txt && echo identical
#
# 20 steps of roformer-tiny pretraining (built-in corpus), then 20 steps of RTE fine-tuning from that model (one lr,
# one seed, max length 128, ../shared/data/glue), on the CPU; every train and eval loss with all its digits.
# About 2 minutes on 2 cores.
set -euo pipefail
out=${1:?usage: bash scripts/checks/refactor_losses.sh OUT_DIR}
glue=${GLUE_DIR:-../shared/data/glue}
rm -rf "$out"
mkdir -p "$out"
roformer pretrain --config roformer-tiny --output-dir "$out/pretrain" --set train.max_steps=20 \
    --set train.eval_every=10 --set train.save_every=0 --set train.progress=false > "$out/pretrain.log" 2>&1
roformer finetune --config glue/rte --output-dir "$out/rte" --set init="$out/pretrain/final" \
    --set data.glue_dir="$glue" --set data.max_length=128 --set train.max_steps=20 --set "train.lrs=[1e-4]" \
    --set "train.seeds=[0]" --set train.eval_every=10 --set train.batch_size=16 --set train.progress=false \
    > "$out/rte.log" 2>&1
python - "$out" <<'PY' > "$out/losses.txt"
import json
import sys
from pathlib import Path

for run in ("pretrain", "rte"):
    for line in (Path(sys.argv[1]) / run / "metrics.jsonl").read_text().splitlines():
        event = json.loads(line)
        losses = {k: v for k, v in event.items() if "loss" in k or k in ("accuracy", "eval_accuracy")}
        print(run, event.get("event"), event.get("step"), json.dumps(losses, sort_keys=True))
PY
cat "$out/losses.txt" | tail -4
