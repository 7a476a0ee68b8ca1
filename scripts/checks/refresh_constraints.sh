#!/usr/bin/env bash
# Refresh constraints.txt, the exact versions a published number is measured with: a new virtualenv, the README's
# install command (torch==2.13.0, then `pip install -e ".[dev]"`, whatever the index resolves today), the whole test
# suite, and only if it passes, `pip freeze` of that virtualenv (the project itself left out) into constraints.txt.
#
#     bash scripts/checks/refresh_constraints.sh            # about 6 min on 2 cores: install, suite, freeze
#     TESTS=0 bash scripts/checks/refresh_constraints.sh    # freeze without the suite (then run it before committing)
#
# Reproduce a published number with these versions (docs/install.md, "Exact versions"):
#     pip install torch==2.13.0 && pip install -c constraints.txt -e ".[dev]"
# Needs the package index. Run from the repository root, with ../shared beside it as in CI.
set -euo pipefail
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PIP_DISABLE_PIP_VERSION_CHECK=1
repo=$(pwd)
venv=$(mktemp -d "${TMPDIR:-/tmp}/roformer-constraints.XXXXXX")
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
# shellcheck disable=SC1091
source "$venv/bin/activate"
pip install -q torch==2.13.0
pip install -q -e ".[dev]"
if [[ "${TESTS:-1}" == 1 ]]; then
    python -m pytest -q -p no:cacheprovider
fi
{
    echo "# The exact versions the test suite last passed with (scripts/checks/refresh_constraints.sh, $(date -u +%Y-%m-%d),"
    echo "# $(python --version), $(uname -m) $(uname -s)): published numbers name these. Reproduce with"
    echo "#     pip install torch==2.13.0 && pip install -c constraints.txt -e \".[dev]\""
    echo "# Refresh: bash scripts/checks/refresh_constraints.sh (a new virtualenv, the suite, then pip freeze)."
    pip freeze --exclude-editable --all | grep -viE '^(roformer-pytorch|pip|setuptools|wheel)==' | sed -E "s|^(torch==[^+]+)\+.*|\1|" | LC_ALL=C sort -f
} > "$repo/constraints.txt.tmp"
mv "$repo/constraints.txt.tmp" "$repo/constraints.txt"
echo "wrote constraints.txt ($(grep -vc '^#' "$repo/constraints.txt") pins)"
