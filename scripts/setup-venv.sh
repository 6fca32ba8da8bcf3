#!/usr/bin/env bash
# Make (or refresh) a virtual environment with fsdist installed from a freshly built wheel.
# Usage: scripts/setup-venv.sh VENV [EXTRAS]   e.g. scripts/setup-venv.sh .venv test
# torch is pinned to 2.13.0 on purpose: an open-ended "torch" makes pip pull a multi-GB CUDA
# build, while 2.13.0 resolves to the CPU wheel where one is provided (e.g. a local wheelhouse).
set -euo pipefail
venv=${1:-.venv}
extras=${2:-}
repo=$(cd "$(dirname "$0")/.." && pwd)
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --disable-pip-version-check "torch==2.13.0"
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
# setuptools builds in $repo/build and would ship modules left there by an earlier layout
rm -rf "$repo/build"
"$py" -m pip wheel -q --disable-pip-version-check --no-deps -w "$wheels" "$repo"
wheel=$(ls "$wheels"/fsdist-*.whl)
"$py" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel"
"$py" -m pip install -q --disable-pip-version-check "${wheel}${extras:+[$extras]}"
