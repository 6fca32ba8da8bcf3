#!/usr/bin/env bash
# fsdist on every torch release it is tested with (docs/torch-versions.md). For each release: a
# venv with that torch installed first, fsdist's wheel on top with --no-deps, a check that
# installing the wheel with its dependencies leaves that torch in place, then a fixed part of the
# suite: every collective x op x dtype at worlds 2 and 3, DDP against a single process and against
# Gloo, FSDP2, DTensor, torch's tools (profiler, _get_backend, _dist2), the demo, and the CI part of
# torch's own distributed_test.py.
#
# Usage: scripts/test-torch-versions.sh [PYTEST ARGS]    (make test-torch-versions)
#   FSDIST_TORCH_VERSIONS="2.7.1 2.15.0"   the releases (default: the oldest supported, 2.10.0, 2.14.1, 2.15.0)
#   FSDIST_TORCH_VENVS=DIR    the venvs, one per release, kept for the next run (default .venv-torch)
# The torch wheels of releases other than 2.13.0+cpu are CUDA builds from the package index with
# their nvidia-* dependencies: ~3-4 GB to download and ~5.5 GB installed, per release. A
# release's first run downloads them (a minute or two here); each then takes ~5 min on 2 cores.
# Writes torch-versions-results/<release>.log and .xml (JUnit), and the table (table.md).
# Exit status: 0 when every release passed every check.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
releases=${FSDIST_TORCH_VERSIONS:-2.7.1 2.10.0 2.14.1 2.15.0}
venvs=${FSDIST_TORCH_VENVS:-$repo/.venv-torch}
out=$repo/torch-versions-results
mkdir -p "$venvs" "$out"
# A machine whose pip configuration caps torch (a constraints file) would refuse these releases or
# replace them: the cap is lifted for these commands only, never written anywhere.
export PIP_CONSTRAINT=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1
# what the selected tests import beside torch (the `test` and `torch-suite` extras, with numpy and
# filelock), installed without letting pip touch torch
test_deps=(numpy "filelock>=3.12" "pytest>=8" "pytest-timeout>=2.2" "hypothesis>=6.100,<7" "expecttest==0.3.0")

wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
rm -rf "$repo/build"
python3 -m pip wheel -q --no-deps -w "$wheels" "$repo"
wheel=$(ls "$wheels"/fsdist-*.whl)

selection=(
  test_collectives.py
  test_training.py
  test_torch_tooling.py
  test_examples.py::test_all_examples_in_one_four_rank_job
  torch_suite
)
status=0
rows=()
for release in $releases; do
  venv=$venvs/$release
  log=$out/$release.log
  echo "== torch $release (venv: $venv, log: $log)"
  py=$venv/bin/python
  if ! { { [ -x "$py" ] || python3 -m venv "$venv"; } && "$py" -m pip install -q "torch==$release" "${test_deps[@]}" &&
    "$py" -m pip install -q --force-reinstall --no-deps "$wheel"; } >"$log" 2>&1; then
    echo "   install failed: see $log"; rows+=("| $release | install failed (see $log) |"); status=1; continue
  fi
  before=$("$py" -c "import torch; print(torch.__version__)" 2>>"$log") || before="$release (import torch failed)"
  # the dependency fsdist declares must accept the torch the user has: pip would change nothing
  # (asked first with --dry-run, so that a failing check downloads no other torch)
  install="unchanged"
  plan=$("$py" -m pip install --dry-run "$wheel" 2>>"$log" | tee -a "$log" | grep "^Would install" || true)
  if grep -qiE "(^| )(torch|nvidia[-_][^ ]*)-[0-9]" <<<"$plan"; then
    install="would be replaced: $plan"
  else
    "$py" -m pip install -q "$wheel" >>"$log" 2>&1 || install="pip failed"
    after=$("$py" -c "import torch; print(torch.__version__)" 2>/dev/null)
    [ "$before" = "$after" ] || install="changed to $after"
  fi
  [ "$install" = unchanged ] || status=1
  echo "   torch $before; pip install of fsdist's wheel with its dependencies: torch $install"
  # the README's demo as a user runs it: 4 ranks, collectives then DDP, no variable set for it
  demo="pass"
  "$py" "$repo/examples/demo.py" >>"$log" 2>&1 || { demo="FAIL"; status=1; }
  echo "   demo (4 ranks, collectives + DDP): $demo"
  result=0
  rm -f "$out/$release.xml"
  (cd "$repo/tests" && FSDIST_TEST_WORLDS=2,3 "$py" -m pytest -p no:cacheprovider -q -rfE \
    --junitxml="$out/$release.xml" "${selection[@]}" "$@") >>"$log" 2>&1 || result=$?
  [ "$result" = 0 ] || status=1
  tail -n 1 "$log"
  row=$("$py" "$repo/scripts/torch_versions_report.py" row "$before" "$install" "$demo" "$result" "$out/$release.xml") ||
    row="| $before | torch $install | $demo | $result | no test results (see $log) |"
  rows+=("$row")
done
{
  python3 "$repo/scripts/torch_versions_report.py" header
  printf '%s\n' "${rows[@]}"
} | tee "$out/table.md"
exit $status
