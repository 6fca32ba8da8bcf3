#!/usr/bin/env bash
# Lint, format check and type check (configured in pyproject.toml).
# Usage: scripts/lint.sh [PYTHON]  (a python whose environment can take ruff and mypy)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${1:-${FSDIST_VENV:-$repo/.venv}/bin/python}
"$py" -m pip install -q --disable-pip-version-check "ruff==0.17.6" "mypy==2.4.1"
cd "$repo"
"$py" -m ruff check fsdist tests examples
"$py" -m ruff format --check fsdist tests examples
"$py" -m mypy
