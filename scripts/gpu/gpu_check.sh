#!/usr/bin/env bash
# The GPU path end to end, on one GPU machine, in under 10 minutes per stage (stages can run in separate calls):
#     bash scripts/gpu/gpu_check.sh [all|tests|bench|relative|packing|pretrain|report|lease|translation|mqar]
#   tests     pytest -m gpu: bf16/fp16 steps, fp16 loss scaling, flash SDPA, compile, exact bf16 resume, FSDP/DeepSpeed
#   bench     scripts/bench/bench_model.py at BERT-base shapes, bf16: T=128 (batch 128) and T=512 (batch 32), eager and
#             compiled, ours vs HF RoFormer / HF BERT (sdpa): tokens/s, MFU, peak memory
#   relative  every position encoding against rotary (bench_model.py, bf16, compiled, T=512 x 32) and the ways to
#             compute the relative terms (bench_relative_terms.py, FlexAttention's score_mod included)
#   packing   padded, unpadded and packed batches, with the mask and with the variable-length kernel
#             (bench_packing.py, base shape, T=512, bf16)
#   pretrain  both arms of configs/experiments/rope-vs-bert-base.yaml on gutenberg, bf16, compiled, ~1000 steps,
#             held-out eval curves
#   report    one table of all of the above (gpu-report.md)
#   translation  issue 66's study on Multi30k (configs/experiments/translation-multi30k-tiny.yaml) with Wu et al.'s
#             full recipe (8,000 updates of 8,192 tokens, --patience 10): every (arm, seed) run at once, side by side
#             on the one GPU (a 2.6M-parameter model leaves it mostly idle), cut at GPU_CHECK_SECONDS (default 540);
#             then the study's tables (--compare-only) and every run's curves and results in $OUT/translation.tgz
#   mqar      issue 65's encoder MQAR table (configs/experiments/mqar-zoology.yaml: Zoology's regime, every encoding,
#             3 seeds, the extension methods), 9 runs at a time side by side, cut alike; $OUT/mqar.tgz
#   lease     all of it inside one device call of GPU_CHECK_SECONDS (default 560): the stages in order of what the
#             GPU issues need most (eager bench; compiled bench at T=512; packing; base pretraining with the GPU
#             tests beside it; every encoding, eager; compiled bench at T=128 if time is left), each cut at the
#             deadline (the encoder-decoder's checks and speed, scripts/gpu/seq2seq_gpu_check.py, after packing;
#             GPU_CHECK_PRETRAIN=0 skips the pretraining), results packed every 20 s into $OUT/results.tgz (the
#             device tool returns at most 8 files)
# Results go to $OUT (the device tool's folder) or runs/gpu-check; run data to /tmp/gpu-check. Prepare .gpu/ first
# with scripts/gpu/gpu_prepare.sh (wheels and data for a machine without network). GPU_CHECK_SMOKE=1 runs every stage at
# toy sizes (also on a CPU, in fp32 there) to check the plumbing; GPU_CHECK_MODES="eager" skips the compiled bench.
set -euo pipefail
stage=${1:-all}
out=${OUT:-runs/gpu-check}
work=${GPU_CHECK_WORK:-/tmp/gpu-check}
mkdir -p "$out" "$work"
out=$(cd "$out" && pwd) work=$(cd "$work" && pwd)  # absolute: stages change directory
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! python -c "import datasets" 2>/dev/null && [ -d .gpu/wheels ]; then
    python -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu-check-site .gpu/wheels/*.whl
    export PYTHONPATH="$PYTHONPATH:/tmp/gpu-check-site"
fi
corpus=${GPU_CHECK_CORPUS:-.gpu/data/gutenberg}
[ -d "$corpus" ] || corpus=../shared/data/corpus/gutenberg
python -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA')" \
    | tee "$out/device.txt"

if [ "${GPU_CHECK_SMOKE:-0}" = 1 ]; then
    bench_args=(--shape small --seq-lens 64 --batch-sizes 4 --repeats 1 --steps 1)
    relative_args=(--shape small --seq-lens 64 --batch-sizes 4 --repeats 1 --steps 1)
    terms_args=(--seq-lens 64 --batch-sizes 2 --repeats 1 --no-flex)
    dtype=$(python -c "import torch; print('bf16' if torch.cuda.is_available() else 'fp32')")
    steps=6 batch=4 length=64 eval_every=3 model=(--set model.num_layers=2 --set model.hidden_size=64
        --set model.num_heads=2 --set model.intermediate_size=128 --set data.vocab_size=2000)
    device_args=()
    lease_compiled=(--shape small --seq-lens 64 --batch-sizes 4 --repeats 1 --steps 1)
    lease_compiled_short=("${lease_compiled[@]}")
    packing_args=(--model configs/model/roformer-tiny.yaml --length 64 --documents 16 --steps 2
        "--device=$(python -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")"
        "--dtype=$([ "$dtype" = bf16 ] && echo bfloat16 || echo float32)")
    seq2seq_args=(--smoke)
else
    bench_args=(--shape base --seq-lens 128,512 --batch-sizes 128,32 --repeats 3 --steps 5)
    relative_args=(--shape base --seq-lens 512 --batch-sizes 32 --repeats 3 --steps 5 --compile)
    terms_args=(--device cuda --seq-lens 512,2048 --batch-sizes 32,8 --heads 12 --head-size 64)
    steps=1000 batch=32 length=512 eval_every=100 model=() dtype=bf16
    device_args=(--device cuda)
    lease_compiled=(--shape base --seq-lens 512 --batch-sizes 32 --repeats 3 --steps 5)
    lease_compiled_short=(--shape base --seq-lens 128 --batch-sizes 128 --repeats 3 --steps 5)
    # documents of 8-512 tokens: 45-50% padding a row each, the packing target's shape
    packing_args=(--model configs/model/roformer-base.yaml --length 512 --documents 96 --steps 6 --device cuda
        --dtype bfloat16)
    seq2seq_args=()
fi

run_tests() {
    python -m pytest -q -m gpu tests/e2e/test_gpu.py -p no:cacheprovider --junitxml "$out/gpu-tests.xml" || true
}

run_bench() {
    for mode in ${GPU_CHECK_MODES:-eager compiled}; do
        flag=(); [ "$mode" = compiled ] && flag=(--compile)
        python scripts/bench/bench_model.py "${device_args[@]}" --dtype "$dtype" "${flag[@]}" "${bench_args[@]}" \
            --json "$out/bench-$mode.json"
    done
}

run_relative() {
    python scripts/bench/bench_model.py "${device_args[@]}" --dtype "$dtype" "${relative_args[@]}" --baseline ours-rotary \
        --models ours-rotary,ours-rotary-unfused,ours-sinusoidal,ours-none,ours-shaw,ours-shaw-values,ours-t5_bias,ours-alibi \
        --json "$out/bench-relative.json"
    python scripts/bench/bench_relative_terms.py "${terms_args[@]}" | tee "$out/relative-terms.md"
}

run_packing() {
    python scripts/bench/bench_packing.py "${packing_args[@]}" | tee "$out/packing.md"
}

run_pretrain() {
    python -m roformer experiment --config configs/experiments/rope-vs-bert-base.yaml --output-dir "$work/base" \
        --set data.source=text --set "data.paths=[$PWD/$corpus]" --set data.decode_errors=replace \
        --set data.validation_fraction=0.02 --set data.max_eval_blocks=256 --set "data.max_seq_len=$length" \
        --set "train.max_steps=$steps" --set "train.batch_size=$batch" --set train.grad_accum=1 \
        --set train.warmup_steps=100 --set train.lr=2.0e-4 --set "train.eval_every=$eval_every" \
        --set train.save_every=0 --set train.log_every=10 --set "train.mixed_precision=$([ "$dtype" = bf16 ] && echo bf16 || echo null)" \
        --set "train.compile=$([ "${GPU_CHECK_SMOKE:-0}" = 1 ] && echo false || echo true)" \
        --set "train.report_to=[]" --set train.progress=false "${model[@]}"
    cp "$work/base/compare/summary.json" "$out/base-summary.json"
    cp "$work/base/compare/curves.png" "$out/base-curves.png" 2>/dev/null || true
}

side_by_side() {  # side_by_side NAME STUDY_CONFIG JOBS OVERRIDES...: a task study's runs at once on the one GPU
    local name=$1 study_config=$2 jobs=$3
    shift 3
    local study=$work/$name flags=() threads=$(($(nproc) / jobs))
    ((threads >= 1)) || threads=1
    for item in "$@"; do flags+=(--set "$item"); done
    mkdir -p "$study"
    # one process a run, the cores shared out; every run ends by one wall-clock time, 60 s before the stage's
    # deadline (a run started late gets what is left, none under 10 s); a run cut on an earlier call resumes
    export GPU_CHECK_END=$(($(date +%s) + ${GPU_CHECK_SECONDS:-540} - 60)) GPU_CHECK_THREADS=$threads
    python scripts/tools/study_runs.py --print0 "$study_config" "$study" "${flags[@]}" > "$study/runs.txt"
    pack() {  # what comes back: every run's results, curves and log (not its models), the tables and plots
        (cd "$study" && find . \( -name results.json -o -name results.md -o -name metrics.jsonl -o -name "*.log" \
            -o -path "./compare/*" -o -name report.md \) -type f -print0 | tar czf "$out/.$name.tgz" --null -T -) &&
            mv "$out/.$name.tgz" "$out/$name.tgz"
    }
    (while sleep 30; do pack || true; done) &  # the device tool returns what is there when a call is cut
    local packer=$!
    xargs -0 -n 2 -P "$jobs" sh -c 'left=$((GPU_CHECK_END - $(date +%s))); [ "$left" -gt 10 ] || exit 0
        resume=; [ -d "$1" ] && resume=--resume
        OMP_NUM_THREADS=$GPU_CHECK_THREADS timeout --kill-after=10 "$left" python -m roformer finetune \
            --config "$0" --output-dir "$1" $resume > "$1.log" 2>&1; exit 0' < "$study/runs.txt"
    python -m roformer experiment --config "$study_config" --output-dir "$study" --compare-only "${flags[@]}" \
        > "$study/compare.log" 2>&1 || true
    kill "$packer" 2>/dev/null || true
    pack || true
    cat "$study/compare/summary.md" 2>/dev/null || tail -n 5 "$study"/*/*.log 2>/dev/null || true
}

run_translation() {  # issue 66: Wu et al.'s full recipe (8,000 updates of 8,192 tokens, --patience 10), 8 runs at once
    local sets=(data.translation.max_tokens=8192 train.max_steps=8000 train.progress=false "train.report_to=[]")
    if [ "${GPU_CHECK_SMOKE:-0}" = 1 ]; then
        sets+=(train.max_steps=4 train.warmup_steps=2 data.max_train_examples=256 data.max_eval_examples=16
            data.translation.vocab_size=500 data.translation.max_tokens=1024)
    fi
    local data=.gpu/data
    [ -d "$data/translation/multi30k" ] || data=../shared/data
    export ROFORMER_DATA=$PWD/$data
    side_by_side translation configs/experiments/translation-multi30k-tiny.yaml 8 "${sets[@]}"
}

run_mqar() {  # issue 65: the encoder MQAR table in Zoology's regime, every encoding x 3 seeds, 9 runs at a time
    local sets=(train.progress=false "train.report_to=[]")
    if [ "${GPU_CHECK_SMOKE:-0}" = 1 ]; then
        sets+=(train.max_steps=2 train.eval_every=1 data.synthetic.train_examples=64 data.synthetic.eval_examples=8
            train.batch_size=8 data.synthetic.symbols=64 data.synthetic.values=64)
    fi
    side_by_side mqar configs/experiments/mqar-zoology.yaml 9 "${sets[@]}"
}

run_lease() {
    local deadline=$((SECONDS + ${GPU_CHECK_SECONDS:-560})) pack=$out results=$work/results
    mkdir -p "$results"
    cp "$pack/device.txt" "$results/"
    # the device tool returns at most 8 files: everything travels as one archive, refreshed as results land
    (while sleep 20; do tar czf "$pack/.results.tgz" -C "$results" . && mv "$pack/.results.tgz" "$pack/results.tgz"; done) &
    local packer=$!
    within() {  # within CAP CMD...: run CMD for at most CAP seconds and never past the deadline (less 25 s)
        local cap=$1 left=$((deadline - SECONDS - 25))
        shift
        ((left < cap)) && cap=$left
        ((cap > 10)) || { echo "== skipped (no time left): $*"; return 0; }
        echo "== $(date +%T) up to ${cap}s: $*"
        timeout --kill-after=5 "$cap" "$@" || echo "== stopped or failed ($?): $*"
    }
    local bench=(python scripts/bench/bench_model.py "${device_args[@]}" --dtype "$dtype")
    within 100 env GPU_CHECK_MODES=eager OUT="$results" bash "$0" bench
    local compiled=1  # GPU_CHECK_MODES=eager leaves the compiled benchmarks out of the lease too
    [[ " ${GPU_CHECK_MODES:-eager compiled} " == *" compiled "* ]] || compiled=0
    ((compiled)) && within 200 "${bench[@]}" "${lease_compiled[@]}" --compile --json "$results/bench-compiled.json"
    within 60 bash -c "python scripts/bench/bench_packing.py ${packing_args[*]} > $results/packing.md"
    # the encoder-decoder (issue 56): its CUDA checks and its Transformer-base speed, alone on the GPU
    within 150 bash -c "python scripts/gpu/seq2seq_gpu_check.py ${seq2seq_args[*]} --out $results/seq2seq.json \
        > $results/seq2seq.log 2>&1"
    # the GPU tests beside the pretraining: neither is a timing (the pretraining's tokens/s are shared with them);
    # GPU_CHECK_PRETRAIN=0 leaves the pretraining out (a lease that already has its curves)
    (within 240 python -m pytest -q -m gpu tests/e2e/test_gpu.py -p no:cacheprovider \
        --junitxml "$results/gpu-tests.xml" > "$results/gpu-tests.log" 2>&1) &
    local tests=$!
    if [ "${GPU_CHECK_PRETRAIN:-1}" = 1 ]; then
        within 300 env OUT="$results" bash "$0" pretrain > "$results/pretrain.log" 2>&1
    fi
    wait "$tests"
    local eager_relative=()
    for arg in "${relative_args[@]}"; do [ "$arg" = --compile ] || eager_relative+=("$arg"); done
    within 90 "${bench[@]}" "${eager_relative[@]}" --baseline ours-rotary --json "$results/bench-relative.json" \
        --models ours-rotary,ours-rotary-unfused,ours-sinusoidal,ours-none,ours-shaw,ours-shaw-values,ours-t5_bias,ours-alibi
    within 40 bash -c "python scripts/bench/bench_relative_terms.py ${terms_args[*]} > $results/relative-terms.md"
    ((compiled)) && within 200 "${bench[@]}" "${lease_compiled_short[@]}" --compile \
        --json "$results/bench-compiled-short.json"
    python scripts/gpu/gpu_report.py "$results" --runs "$work/base" > "$results/gpu-report.md" || true
    kill "$packer" 2>/dev/null || true
    tar czf "$pack/results.tgz" -C "$results" .
    cat "$results/gpu-report.md"
}

case "$stage" in
    tests) run_tests ;;
    bench) run_bench ;;
    relative) run_relative ;;
    packing) run_packing ;;
    pretrain) run_pretrain ;;
    report) ;;
    lease) run_lease; exit 0 ;;
    translation) run_translation; exit 0 ;;
    mqar) run_mqar; exit 0 ;;
    all) run_tests; run_bench; run_relative; run_packing; run_pretrain ;;
    *) echo "gpu_check.sh: unknown stage '$stage' (all, tests, bench, relative, packing, pretrain, report, lease, translation, mqar)" >&2; exit 2 ;;
esac
python scripts/gpu/gpu_report.py "$out" --runs "$work/base" | tee "$out/gpu-report.md"
