#!/usr/bin/env bash
# A new user's first hour, timed: every workflow's first command from an empty directory with the package installed,
# to its answer, and how long a mistyped key takes to be refused. Run from anywhere with `roformer` on the PATH:
#     ROFORMER_DATA=/path/to/shared/data bash scripts/checks/new_user_trial.sh [OUT.md]
# Each workflow runs as the docs give it, with fewer steps (a first try, not a result); the table gives the seconds
# from the command to its answer (the finished line or the config error) and the exit code. Best on a quiet machine:
# the times are wall-clock. About a minute on 2 cores (docs/cli.md has a measured table).
set -uo pipefail
out=${1:-new-user-trial.md}
data=${ROFORMER_DATA:?set ROFORMER_DATA to the data root (the folder holding glue/, translation/, corpus/)}
trial=$(mktemp -d "${TMPDIR:-/tmp}/roformer-trial.XXXXXX")
trap 'rm -rf "$trial"' EXIT
cd "$trial" || exit 1
export ROFORMER_DATA=$data OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
rows=()
timed() {  # timed NAME EXPECTED_CODE COMMAND...: one row of the table
    local name=$1 expected=$2 start end code
    shift 2
    start=$EPOCHREALTIME
    "$@" > "$trial/last.log" 2>&1
    code=$?
    end=$EPOCHREALTIME
    local answer
    answer=$(grep -v '^\s*$' "$trial/last.log" | tail -n 1 | cut -c1-110 | tr '|' '/')
    local seconds
    seconds=$(python3 -c "print(f'{$end - $start:.1f}')")
    rows+=("| $name | $seconds | $code$([ "$code" = "$expected" ] || echo " (expected $expected)") | \`$answer\` |")
    echo "$name: exit $code in $seconds s"
}
timed "pretrain: MLM on the built-in corpus (20 steps)" 0 \
    roformer pretrain --config roformer-tiny --output-dir mlm --set train.max_steps=20 --set train.progress=false
timed "finetune: RTE from it (20 steps)" 0 \
    roformer finetune --config glue/rte --output-dir rte --set init=mlm/final --set train.max_steps=20 \
    --set "train.lrs=[1e-4]" --set "train.seeds=[0]" --set data.max_length=128 --set train.progress=false
timed "finetune: the shift task from scratch (200 steps)" 0 \
    roformer finetune --config synthetic/shift --output-dir shift --set train.max_steps=200 --set train.progress=false
timed "finetune: Multi30k translation (20 steps)" 0 \
    roformer finetune --config translation/multi30k-cpu --output-dir mt --set train.max_steps=20 \
    --set data.max_eval_examples=32 --set train.progress=false
timed "translate: 3 sentences with it" 0 \
    sh -c 'printf "A man is eating.\nTwo dogs play in the snow.\nA girl reads a book.\n" | roformer translate --model mt/best'
timed "experiment: a 2-arm task study (mqar, 20 steps)" 0 \
    roformer experiment --config experiments/length-generalization-mqar-long --output-dir study \
    --set train.max_steps=20 --set data.synthetic.train_examples=256 --set data.synthetic.eval_examples=16
timed "typo: pretrain --set train.max_stepz" 2 roformer pretrain --config roformer-tiny --output-dir x --set train.max_stepz=1
timed "typo: finetune --set data.glue_dri" 2 roformer finetune --config glue/rte --output-dir x --set data.glue_dri=x
timed "typo: inside a section, data.synthetic.symbls" 2 \
    roformer finetune --config synthetic/shift --output-dir x --set data.synthetic.symbls=3
timed "typo: a bad value, data.synthetic.symbols=3x" 2 \
    roformer finetune --config synthetic/shift --output-dir x --set data.synthetic.symbols=3x
timed "wrong init: a model that is not there" 2 \
    roformer finetune --config glue/rte --output-dir x --set init=runs/nothing-here
{
    echo "| first command | seconds | exit | its answer (last line) |"
    echo "|---|---:|---|---|"
    printf '%s\n' "${rows[@]}"
} > "$OLDPWD/$out"
cat "$OLDPWD/$out"
