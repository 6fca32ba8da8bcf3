#!/usr/bin/env bash
# Set up (venv + wheel) and run the demo: 4 ranks, a temporary directory, collectives + DDP.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${FSDIST_VENV:-$repo/.venv}
"$repo/scripts/setup-venv.sh" "$venv"
exec "$venv/bin/python" "$repo/examples/demo.py" "$@"
