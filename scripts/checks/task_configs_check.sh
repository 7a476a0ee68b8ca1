#!/usr/bin/env bash
# A refactor of the fine-tuning tasks keeps behaviour: one short run of every shipped task config that reads local
# data (configs/finetune/, ../shared/data), whose results.json and prediction files must hash the same before and
# after the change. scripts/checks/glue_suite_check.sh covers the GLUE suite; this covers every other task type.
#
#     bash scripts/checks/task_configs_check.sh runs/tasks-check/before     # on the commit before the refactor
#     bash scripts/checks/task_configs_check.sh runs/tasks-check/after      # after it
#     bash scripts/checks/task_configs_check.sh --compare runs/tasks-check/before runs/tasks-check/after
#
# The inits: roformer-tiny (built-in corpus) and roformer-zh-tiny (word-level Chinese), 20 pretraining steps each. Each
# run: one lr, one seed, 64 training and 64 evaluation examples, 8 steps, evaluated at the end. Left out: the configs
# of downloads (finetune/squad from the hub, the full CAIL2019-SCM) and the templates for your files
# (finetune/text-classification, finetune/multi-label-classification).
# `hashes.txt` lists sha256 of every results.json (its output folder's path blanked) and prediction file, and the
# compare step diffs the two lists. About 6 minutes on 2 cores.
set -euo pipefail
if [[ "${1:-}" == "--compare" ]]; then
    before=${2:?}; after=${3:?}
    if diff "$before/hashes.txt" "$after/hashes.txt"; then
        echo "identical: $(wc -l < "$before/hashes.txt") files"
    else
        echo "DIFFERENT (lines above: < before, > after)"; exit 1
    fi
    exit 0
fi
out=${1:?usage: bash scripts/checks/task_configs_check.sh OUT_DIR | --compare BEFORE AFTER}
rm -rf "$out"
mkdir -p "$out"
out=$(cd "$out" && pwd)
short=(--set train.max_steps=20 --set train.eval_every=20 --set train.save_every=0 --set train.progress=false)
roformer pretrain --config roformer-tiny --output-dir "$out/en" "${short[@]}" > "$out/en.log" 2>&1
roformer pretrain --config roformer-zh-tiny --output-dir "$out/zh" "${short[@]}" > "$out/zh.log" 2>&1
english=(conll2003 stsb-cosent)
chinese=(cmrc2018 ocnli chinese-stsb chinese-stsb-cosent fewclue-bustm fewclue-chid fewclue-cluewsc fewclue-csl
         fewclue-csldcp fewclue-eprstmt fewclue-iflytek fewclue-ocnli fewclue-tnews cail2019-scm-sample)
run() {
    local name=$1 init=$2
    shift 2
    roformer finetune --config "finetune/$name" --output-dir "$out/$name" --set init="$init" "$@" \
        --set "train.lrs=[1.0e-4]" --set "train.seeds=[0]" --set train.max_steps=8 --set train.eval_every=8 \
        --set data.max_train_examples=64 --set data.max_eval_examples=64 --set train.progress=false \
        > "$out/$name.log" 2>&1 || { echo "$name failed: see $out/$name.log"; exit 1; }
    echo "$name: done"
}
for name in "${english[@]}"; do run "$name" "$out/en/final"; done
for name in "${chinese[@]}"; do run "$name" "$out/zh/final"; done  # a word-level init: jieba implied
cd "$out"
for name in "${english[@]}" "${chinese[@]}"; do
    find "$name" -type f \( -name results.json -o -path '*/predictions/*' -o -path '*/submission/*' \) | sort
done | while read -r file; do
    printf '%s  %s\n' "$(sed "s#$out#OUT#g" "$file" | sha256sum | cut -c1-64)" "$file"
done > hashes.txt
wc -l < hashes.txt
