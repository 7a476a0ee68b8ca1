#!/usr/bin/env bash
# Configs mean the same under every PyYAML the project allows: tests/unit/test_config.py (merge keys, duplicates, every
# shipped YAML) under each PyYAML release named below, each installed into its own folder that shadows the installed
# one. 6.0.4 changed what nested `<<` merges read (yaml/pyyaml#953); our loader resolves merges itself
# (roformer.config_yaml._ConfigLoader), and this proves it under the broken release and the ones around it.
#
#     bash scripts/checks/check_yaml_versions.sh               # run by .ci/run, in its virtualenv
#     VERSIONS="6.0.2 6.0.4" bash scripts/checks/check_yaml_versions.sh
#
# Needs the package index (a PyYAML wheel is about 0.8 MB). Run from the repository root with the project installed.
set -euo pipefail
versions=${VERSIONS:-"6.0.1 6.0.3 6.0.4"}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for version in $versions; do
    python -m pip install -q --no-deps --target "$work/pyyaml-$version" "pyyaml==$version"
    installed=$(PYTHONPATH="$work/pyyaml-$version" python -c 'import yaml; print(yaml.__version__)')
    [[ "$installed" == "$version" ]] || { echo "expected PyYAML $version, imported $installed" >&2; exit 1; }
    echo "== tests/unit/test_config.py under PyYAML $version"
    PYTHONPATH="$work/pyyaml-$version" python -m pytest -q -p no:cacheprovider tests/unit/test_config.py
done
