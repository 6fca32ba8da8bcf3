#!/usr/bin/env bash
# Set up (venv + wheel + test extras) and run the test suite against the installed wheel.
# Runs from tests/ so that `import fsdist` finds the installed package, not the source tree.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${FSDIST_VENV:-$repo/.venv}
"$repo/scripts/setup-venv.sh" "$venv" test
cd "$repo/tests"
exec "$venv/bin/python" -m pytest -p no:cacheprovider "$@"
