#!/usr/bin/env bash
# The package as a user meets it: build the wheel, install it into a new virtualenv outside the repository, and from
# an empty directory run `--help` of every command, `roformer configs`, a short tiny pretraining by config name, and
# check that shipped configs resolve from inside the installed package.
#
#     bash scripts/checks/check_wheel.sh          # a fresh virtualenv: torch==2.13.0 (see README), then the wheel and
#                                                 # its dependencies from the package index (minutes; what a new user
#                                                 # runs)
#     bash scripts/checks/check_wheel.sh --reuse  # a virtualenv on top of this interpreter's packages: only the wheel
#                                                 # is installed (seconds; what tests/e2e/test_package.py runs)
#
# Run from the repository root. Leaves nothing behind but the temporary directory it prints (removed on success).
set -euo pipefail
mode=${1:-fresh}
case "$mode" in fresh|--reuse) ;; *) echo "usage: bash scripts/checks/check_wheel.sh [--reuse]" >&2; exit 2 ;; esac
repo=$(pwd)
work=$(mktemp -d)
trap 'status=$?; if [ $status -ne 0 ]; then echo "failed ($status); kept for inspection: $work" >&2; fi' EXIT
echo "== building the wheel into $work/dist"
# setuptools builds in the repository's build/ (git-ignored): whatever it leaves there is its own
python -m build --wheel --no-isolation --outdir "$work/dist" "$repo" > "$work/build.log" 2>&1 || {
    cat "$work/build.log"; exit 1; }
if grep -E "^WARNING|Package would be ignored" "$work/build.log"; then echo "the build warned (above)"; exit 1; fi
wheel=$(ls "$work"/dist/*.whl)
# the package index's page: the license file ships and the long description has no link the index cannot follow
python - "$wheel" <<'EOF'
import re
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as wheel:
    names = wheel.namelist()
    metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "the wheel has no LICENSE"
assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata, "license metadata"
description = metadata.split("\n\n", 1)[1]
relative = [t for t in re.findall(r"\]\(([^)\s]+)\)", description) if not re.match(r"[a-z]+:|#", t)]
assert "RoFormer" in description and not relative, f"relative links in the long description: {relative}"
print("wheel metadata: LICENSE and a long description without relative links")
EOF
echo "== installing $(basename "$wheel") ($mode)"
if [ "$mode" = "--reuse" ]; then
    # this interpreter's packages, also when it is itself a virtualenv (whose packages --system-site-packages would
    # miss): a .pth line that adds its site directories after the new one's, so the wheel comes first
    python -m venv "$work/venv"
    purelib=$("$work/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    python -c "import sysconfig; paths = sysconfig.get_paths(); \
print('import site; ' + '; '.join(f'site.addsitedir({d!r})' for d in dict.fromkeys([paths['purelib'], paths['platlib']])))" \
        > "$purelib/reuse-$(basename "$work").pth"
    "$work/venv/bin/python" -m pip install -q --no-deps --no-index "$wheel"
else
    python -m venv "$work/venv"
    "$work/venv/bin/python" -m pip install -q torch==2.13.0
    "$work/venv/bin/python" -m pip install -q "$wheel"
fi
export PATH="$work/venv/bin:$PATH"
mkdir "$work/empty" && cd "$work/empty"
echo "== from an empty directory: $(pwd)"
python - "$work/venv" <<'EOF'
import sys
from pathlib import Path

import roformer
from roformer.config import shipped_configs, shipped_configs_dir

venv = Path(sys.argv[1]).resolve()
assert venv in Path(roformer.__file__).resolve().parents, f"imported {roformer.__file__}, not the installed wheel"
assert venv in shipped_configs_dir().resolve().parents, shipped_configs_dir()
print(f"roformer imported from {Path(roformer.__file__).parent}, {len(shipped_configs())} shipped configs")
EOF
roformer --version
commands=$(python -c "from roformer.cli import build_parser; p = build_parser(); \
print(' '.join(p._subparsers._group_actions[0].choices))")
for command in $commands; do
    roformer "$command" --help > /dev/null
done
echo "--help of every command: $commands"
roformer configs > configs.txt
grep -q "pretrain/roformer-tiny" configs.txt
echo "roformer configs lists $(grep -c '^  ' configs.txt) configs"
echo "== shipped configs resolve inside the package; their data under the data root (./data), runs/ here"
unset ROFORMER_DATA
python - <<'EOF'
from pathlib import Path

from roformer.config import find_config, load
from roformer.study.experiment import load_experiment
from roformer.study.suite import load_suite_config
from roformer.train.config import FinetuneConfig

cwd = Path.cwd()
rte = load(FinetuneConfig, find_config("glue/rte", "glue"))
assert rte.init == str(cwd / "runs/roformer-base/final"), rte.init
assert rte.data.glue_dir == str(cwd / "data/glue"), rte.data.glue_dir
assert len(load_suite_config(find_config("all", "glue")).tasks) == 9
experiment, arms = load_experiment(find_config("rope-vs-bert-small", "experiments"))
assert arms["roformer"].data.paths == [str(cwd / "data/corpus/gutenberg")], arms["roformer"].data.paths
print("glue/rte init:", rte.init, "| rope-vs-bert-small data:", arms["roformer"].data.paths[0])
EOF
echo "== tiny pretraining by config name"
roformer pretrain --config roformer-tiny --set train.max_steps=20 --set train.eval_every=10 \
    --set train.save_every=10 --set data.builtin_documents=2000 --set train.progress=false 2>&1 | tail -1
test -f runs/roformer-tiny/final/model.safetensors
echo "== a shipped task without its data: one line naming the key, the data root and the hub"
if roformer finetune --config glue/rte --set init=runs/roformer-tiny/final 2> error.txt; then exit 1; fi
cat error.txt
test "$(wc -l < error.txt)" -eq 1
grep -q "data.glue_dir: .*/data/glue: no such folder; give it with --set data.glue_dir=PATH, or set ROFORMER_DATA" error.txt
grep -q "data.source=hub" error.txt
cd "$repo"
rm -rf "$work"
echo "wheel check passed"
