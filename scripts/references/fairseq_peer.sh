#!/usr/bin/env bash
# fairseq 0.12.2 (the package registry's newest) as a running peer of our translation recipe, in a throwaway
# virtualenv: its `transformer_tiny`-shaped model on the same Multi30k files and BPE for the same updates on this CPU
# (issue 66). Nothing it builds is committed; it writes its measurements to OUT.
#
#     bash scripts/references/fairseq_peer.sh build            # the virtualenv (VENV, default /tmp/fairseq-venv)
#     bash scripts/references/fairseq_peer.sh check            # it imports, and fairseq-train --help runs
#     bash scripts/references/fairseq_peer.sh run OUT UPDATES  # both sides, UPDATES updates each, one thread:
#                                                              # OUT/peer.json
#
# `run` trains our recipe (configs/translation/multi30k-tiny.yaml, rotary and sinusoidal) for UPDATES updates, then
# fairseq's transformer of the same shape (4 + 4 layers of width 128, 4 heads, feed-forward 256, post-LN, sinusoidal
# positions, all embeddings shared, dropout 0.3, Adam (0.9, 0.98) at 5e-3 under inverse_sqrt with 2,000 warmup
# updates, label smoothing 0.1, --max-tokens 4096: Wu et al.'s flags) on the same files cut into our BPE's pieces,
# for as many updates; both translate test 2016 with beam 5 (length penalty 1) and are scored by our metrics
# (roformer.tasks.mt_metrics: sacreBLEU, chrF++, bleu_tok_lc). scripts/references/fairseq_peer.py does the steps.
#
# fairseq 0.12.2 does not install as published on Python 3.11 with torch 2.x, so the build patches its source
# (scripts/references/fairseq_patch.py):
#   - its sdist lacks the sources of its torch C++ extensions (libbase for BASE layers, libnat for non-autoregressive
#     models, the alignment operators): they are left out (a transformer needs none of them);
#   - its dataclass configs (and those of hydra-core 1.0, which it pins) use instances as field defaults, which
#     Python 3.11 refuses ("mutable default ... use default_factory"): they become default_factory fields.
# torch is the local CPU wheel (pip install torch==2.13.0): any other torch request pulls a multi-GB CUDA build.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${VENV:-/tmp/fairseq-venv}
src=${SRC:-/tmp/fairseq-src}
case "${1:-check}" in
build)
    python3.11 -m venv "$venv"
    "$venv/bin/pip" install -q torch==2.13.0
    "$venv/bin/pip" install -q "numpy<2" cython wheel  # fairseq 0.12 predates numpy 2
    rm -rf "$src" && mkdir -p "$src"
    "$venv/bin/pip" download -q --no-deps fairseq==0.12.2 -d "$src"  # an sdist: fairseq 0.12.2 has no wheel
    tar xzf "$src"/fairseq-0.12.2.tar.gz -C "$src"
    tree="$src/fairseq-0.12.2"
    "$venv/bin/python" "$here/fairseq_patch.py" setup "$tree"
    "$venv/bin/pip" install -q --no-build-isolation "$tree"
    # hydra-core 1.0 (fairseq's pin) has the same instance defaults: patched in place with the same rule
    hydra=$("$venv/bin/python" -c "import importlib.util as u; print(u.find_spec('hydra').submodule_search_locations[0])")
    "$venv/bin/python" "$here/fairseq_patch.py" dataclasses "$hydra"
    ;;
check)
    "$venv/bin/python" -c "import fairseq, torch; print('fairseq', fairseq.__version__, 'torch', torch.__version__)"
    "$venv/bin/fairseq-train" --help > /dev/null && echo "fairseq-train --help: ok"
    ;;
run)
    out=${2:?usage: bash scripts/references/fairseq_peer.sh run OUT UPDATES}
    updates=${3:?usage: bash scripts/references/fairseq_peer.sh run OUT UPDATES}
    OMP_NUM_THREADS=1 python "$here/fairseq_peer.py" --venv "$venv" --out "$out" --updates "$updates"
    ;;
*)
    echo "usage: bash scripts/references/fairseq_peer.sh build|check|run OUT UPDATES" >&2
    exit 2
    ;;
esac
