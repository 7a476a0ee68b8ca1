#!/usr/bin/env bash
# Every shipped fine-tuning config (configs/finetune/) end to end on its real data (../shared/data), one learning rate
# and one seed each, then one table of wall time and the dev (and labelled test) metrics: what each task costs on
# this machine and that every config runs as shipped. Not a benchmark of models: pass the inits you want measured.
#
#     bash scripts/studies/finetune_tour.sh EN_INIT ZH_INIT OUT_DIR [--set KEY=VALUE ...]
#
# EN_INIT fine-tunes the English tasks (conll2003), ZH_INIT the Chinese ones (cmrc2018, ocnli, chinese-stsb, the
# nine FewCLUE tasks, CAIL2019-SCM's sample: its fold 0 only, as train.seeds is [0]). finetune/squad (the hub),
# finetune/text-classification (a template for your own files) and the configs of downloads (the full CAIL2019-SCM)
# are left out. Extra arguments are passed to every `roformer finetune` (e.g. --set "train.lrs=[1.0e-3]").
# The table: OUT_DIR/tour.md. docs/fine-tuning.md ("Every shipped config") shows one, with the command that made it.
set -euo pipefail
en_init=${1:?usage: bash scripts/studies/finetune_tour.sh EN_INIT ZH_INIT OUT_DIR [--set KEY=VALUE ...]}
zh_init=${2:?}
out=${3:?}
shift 3
mkdir -p "$out"
english=(conll2003)
chinese=(cmrc2018 ocnli chinese-stsb fewclue-bustm fewclue-chid fewclue-cluewsc fewclue-csl fewclue-csldcp
         fewclue-eprstmt fewclue-iflytek fewclue-ocnli fewclue-tnews cail2019-scm-sample)
: > "$out/times.tsv"
run() {
    local name=$1 init=$2
    shift 2
    local start=$SECONDS
    roformer finetune --config "finetune/$name" --output-dir "$out/$name" --overwrite --set init="$init" \
        --set train.seeds=[0] --set train.progress=false "$@" > "$out/$name.log" 2>&1 \
        || { echo "$name failed: see $out/$name.log"; exit 1; }
    printf '%s\t%s\n' "$name" "$((SECONDS - start))" >> "$out/times.tsv"
    echo "$name: $((SECONDS - start)) s"
}
for name in "${english[@]}"; do run "$name" "$en_init" "$@"; done
for name in "${chinese[@]}"; do run "$name" "$zh_init" "$@"; done
python - "$out" <<'EOF'
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
lines = ["| config | wall s | selected lr | dev | test |", "|---|---:|---:|---|---|"]


def cells(metrics: dict) -> str:
    return ", ".join(f"{name} {100 * s['mean']:.2f}" for name, s in metrics.items() if name != "score")


for row in (out / "times.tsv").read_text().splitlines():
    name, seconds = row.split("\t")
    results = json.loads((out / name / "results.json").read_text())
    dev = cells(results["summary"][results["selection_split"]])
    test = "; ".join(cells(m) for m in results.get("test", {}).values()) or "(unlabelled or none)"
    lines.append(f"| {name} | {seconds} | {results['selected']['peak_lr']:g} | {dev} | {test} |")
(out / "tour.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
