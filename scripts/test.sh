#!/usr/bin/env bash
# Set up (venv + wheel + test extras) and run the test suite against the installed wheel.
# Runs from tests/ so that `import fsdist` finds the installed package, not the source tree.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${FSDIST_VENV:-$repo/.venv}
# torch-suite: tests/torch_suite (torch's own test suite) needs expecttest; make test-frameworks adds its extra
"$repo/scripts/setup-venv.sh" "$venv" "${FSDIST_EXTRAS:-test,torch-suite}"
cd "$repo/tests"
if [ "${FSDIST_COVERAGE:-0}" = 1 ]; then
  # coverage of every rank process too (multiprocessing-aware, combined afterwards)
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "coverage==7.17.5"
  export COVERAGE_RCFILE="$repo/pyproject.toml" COVERAGE_FILE="$repo/.coverage"
  rm -f "$repo"/.coverage*
  status=0
  "$venv/bin/python" -m coverage run -m pytest -p no:cacheprovider "$@" || status=$?
  "$venv/bin/python" -m coverage combine -q
  "$venv/bin/python" -m coverage report
  exit $status
fi
exec "$venv/bin/python" -m pytest -p no:cacheprovider "$@"
