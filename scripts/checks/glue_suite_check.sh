#!/usr/bin/env bash
# A fine-tuning refactor keeps behaviour: a 2-seed GLUE suite (CoLA, MRPC, STS-B, RTE from ../shared/data/glue; 300
# training examples, 1 epoch, max length 128, full dev sets) from one tiny pretrained model, whose results.json files
# must be byte-identical before and after the change.
#
#     bash scripts/checks/glue_suite_check.sh runs/suite-check/before     # on the commit before the refactor
#     bash scripts/checks/glue_suite_check.sh runs/suite-check/after      # after it
#     bash scripts/checks/glue_suite_check.sh --compare runs/suite-check/before runs/suite-check/after
#
# About 3 minutes on 2 cores. The init is a 20-step roformer-tiny run made first (also compared).
set -euo pipefail
if [[ "${1:-}" == "--compare" ]]; then
    before=${2:?}; after=${3:?}; status=0
    # results.json names its init, which lies under each side's own folder: compared with that folder's path blanked
    blank() { sed "s#$(cd "$1" && pwd)#OUT#g" "$1/$2"; }
    for file in $(cd "$before" && find . -name results.json -o -name '*.tsv' -path '*submission*' | sort); do
        if cmp -s <(blank "$before" "$file") <(blank "$after" "$file"); then
            echo "identical: $file"
        else
            echo "DIFFERENT: $file"; status=1
        fi
    done
    exit $status
fi
out=${1:?usage: bash scripts/checks/glue_suite_check.sh OUT_DIR | --compare BEFORE AFTER}
glue=${GLUE_DIR:-../shared/data/glue}
rm -rf "$out"
mkdir -p "$out"
roformer pretrain --config roformer-tiny --output-dir "$out/pretrain" --set train.max_steps=20 \
    --set train.eval_every=10 --set train.save_every=0 --set train.progress=false > "$out/pretrain.log" 2>&1
roformer glue --config glue/small-cpu --output-dir "$out/suite" --set init="$out/pretrain/final" \
    --set data.glue_dir="$glue" --set data.max_train_examples=300 --set train.epochs=1 \
    --set "train.seeds=[0, 1]" > "$out/suite.log" 2>&1
find "$out/suite" -name results.json | sort
