#!/usr/bin/env bash
# Fill .gpu/ (git-ignored) with what scripts/gpu/gpu_check.sh needs on a GPU machine that has no network: the wheels of
# the Python packages such a machine may lack (pure-Python, for CPython 3.12; versions as tested here) and copies
# of the gutenberg corpus and Multi30k. Run it where pip can reach a package index, from the repository root:
#     bash scripts/gpu/gpu_prepare.sh [path/to/shared/data]
# then send the repository with .gpu/ to the GPU machine and run `bash scripts/gpu/gpu_check.sh` there.
set -euo pipefail
data=${1:-../shared/data}
mkdir -p .gpu/wheels .gpu/data
python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu/wheels datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
python -m pip download -q --no-deps --only-binary=:all: -d .gpu/wheels sacremoses==0.2.0  # pure Python
rm -rf .gpu/data/gutenberg
cp -r "$data/corpus/gutenberg" .gpu/data/gutenberg
rm -rf .gpu/data/translation && mkdir -p .gpu/data/translation  # Multi30k (1.3 MB), gpu_check.sh translation
cp -r "$data/translation/multi30k" .gpu/data/translation/multi30k
du -sh .gpu
