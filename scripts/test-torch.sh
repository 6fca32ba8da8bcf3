#!/usr/bin/env bash
# torch's own distributed test suite (DistributedTest._DistTestBase, the tests torch selects for
# Gloo) on fsdist, the whole selection, at each world size; see docs/torch-suite.md.
# Usage: scripts/test-torch.sh            fsdist at world sizes 2 and 3 (12-30 min each on 2 cores)
#        FSDIST_TORCH_SUITE_BACKENDS="gloo fsdist" FSDIST_TORCH_SUITE_WORLD_SIZES=2 scripts/test-torch.sh
# Writes torch-suite-results/<backend>-w<N>.xml (JUnit) and .log, and prints the result tables.
# Exit status: 0 when every run had no failure.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${FSDIST_VENV:-$repo/.venv}
"$repo/scripts/setup-venv.sh" "$venv" test,torch-suite
out=${FSDIST_TORCH_SUITE_RESULTS:-$repo/torch-suite-results}
mkdir -p "$out"
status=0
columns=()
for world_size in ${FSDIST_TORCH_SUITE_WORLD_SIZES:-2 3}; do
  for backend in ${FSDIST_TORCH_SUITE_BACKENDS:-fsdist}; do
    name="$backend-w$world_size"
    echo "== torch suite: $backend, world size $world_size (log: $out/$name.log)"
    # runs from tests/ like scripts/test.sh, so the installed fsdist is tested, under the suite's hygiene
    (cd "$repo/tests" && FSDIST_TORCH_SUITE=full FSDIST_TORCH_SUITE_BACKEND="$backend" \
      FSDIST_TORCH_SUITE_WORLD_SIZE="$world_size" \
      "$venv/bin/python" -m pytest -p no:cacheprovider torch_suite -q -rfE \
      --junitxml="$out/$name.xml") >"$out/$name.log" 2>&1 || status=1
    tail -n 3 "$out/$name.log"
    columns+=("$name=$out/$name.xml")
  done
done
"$venv/bin/python" "$repo/tests/torch_suite/report.py" "${columns[@]}" | tee "$out/tables.md"
exit $status
