#!/usr/bin/env bash
# The declared dependency floors, tried: a new virtualenv with every core dependency of pyproject.toml at exactly its
# lower bound (`name>=X` installed as `name==X`), the test tools resolved against those pins, then the test suite.
# The floors in pyproject.toml are the versions this script last passed with (see docs/install.md); older versions
# are untested, not known to fail.
#
#     bash scripts/checks/check_lower_bounds.sh                 # the whole suite (the README's test command)
#     bash scripts/checks/check_lower_bounds.sh tests/unit/test_hf.py -x   # arguments go to pytest
#     KEEP=1 bash scripts/checks/check_lower_bounds.sh          # keep the virtualenv (its path is printed)
#     PYTHON=python3.11 bash scripts/checks/check_lower_bounds.sh   # at requires-python's floor
#     PINS=scripts/gpu/gpu_machine_pins.txt PYTHON=python3.12 bash scripts/checks/check_lower_bounds.sh
#                                                        # other exact versions: the GPU machine's, before a lease
#
# Needs a package index (torch's floor is a CUDA build from PyPI with its CUDA packages, a few GB; the tests run on
# the CPU). Run from the repository root; ../shared/data beside it enables the real-data tests as in CI.
set -euo pipefail
repo=$(pwd)
work=$(mktemp -d)
python=${PYTHON:-python}  # the virtualenv's interpreter, e.g. PYTHON=python3.11 (requires-python's floor)
# the virtualenv is a few GB: removed however the script ends, unless KEEP=1
trap 'if [ "${KEEP:-0}" = "1" ]; then echo "virtualenv kept: $work/venv"; else rm -rf "$work"; fi' EXIT
echo "== virtualenv in $work ($("$python" --version))"
"$python" -m venv "$work/venv"
venv_python="$work/venv/bin/python"
"$venv_python" -m pip install -q --upgrade pip "setuptools>=77"
python - "$repo/pyproject.toml" "$work" "${PINS:-}" <<'EOF'  # this interpreter reads pyproject.toml (tomllib: 3.11+)
import re
import sys
import tomllib
from pathlib import Path

project = tomllib.loads(Path(sys.argv[1]).read_text())["project"]
pins, tools = [], []
for requirement in project["dependencies"]:
    match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9][0-9A-Za-z.]*)(,.*)?", requirement.replace(" ", ""))
    if match is None:
        sys.exit(f"pyproject.toml: a core dependency not of the form name>=X (no extras, no markers): {requirement}")
    pins.append(f"{match[1]}=={match[2]}")
tools = project["optional-dependencies"]["dev"]
if sys.argv[3]:  # PINS: a requirements file of exact versions, in place of those packages' floors (others kept)
    lines = Path(sys.argv[3]).read_text().splitlines()
    chosen = [line.strip() for line in lines if line.strip() and not line.startswith("#")]

    def name(pin: str) -> str:
        return pin.split("==")[0].lower().replace("_", "-")

    pins = [pin for pin in pins if name(pin) not in {name(c) for c in chosen}] + chosen
Path(sys.argv[2], "floors.txt").write_text("\n".join(pins) + "\n")
Path(sys.argv[2], "tools.txt").write_text("\n".join(tools) + "\n")
print("floors:", " ".join(pins))
EOF
echo "== installing the floors"
"$venv_python" -m pip install -q -r "$work/floors.txt"
echo "== installing the test tools against them (constraints: the floors)"
"$venv_python" -m pip install -q -c "$work/floors.txt" -r "$work/tools.txt"
"$venv_python" -m pip install -q --no-deps --no-build-isolation -e "$repo"
"$venv_python" -m pip check
"$venv_python" - <<'EOF'
from importlib import metadata

names = ["torch", "transformers", "tokenizers", "accelerate", "datasets", "huggingface_hub", "safetensors", "numpy"]
print("installed:", ", ".join(f"{name} {metadata.version(name)}" for name in names))
EOF
echo "== the test suite"
status=0
"$venv_python" -m pytest -q -p no:cacheprovider "$@" || status=$?
# the editable install above wrote a finder into the virtualenv only; this interpreter's install is untouched
exit $status
