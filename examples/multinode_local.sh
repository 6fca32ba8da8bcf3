#!/usr/bin/env bash
# Two "nodes" on one machine that share nothing but a directory: two launchers, one 4-rank job.
# Each launcher's ranks get a node id and a node-local directory of their own, as on two machines:
# their collectives run in two tiers (ranks of a node meet in its directory, leaders in the shared one).
#   examples/multinode_local.sh [SCRIPT] [ARGS...]     (default: examples/train_ddp.py --steps 30)
# On real machines run the same `fsdist run` line on each node with its own --node-rank and a
# --dir on the shared filesystem. Both launchers exit non-zero if any rank fails.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# the checkout's venv (scripts/demo.sh, scripts/test.sh make it) unless PYTHON names another
python=${PYTHON:-$here/../.venv/bin/python}
[ -x "$python" ] || python=python3
[ $# -gt 0 ] || set -- "$here/train_ddp.py" --steps 30
dir=$(mktemp -d "${TMPDIR:-/tmp}/fsdist-multinode-XXXXXX")
nodes=$(mktemp -d "${TMPDIR:-/tmp}/fsdist-multinode-local-XXXXXX")
trap 'rm -rf "$dir" "$nodes"' EXIT
for node in 0 1; do
  mkdir -m 700 "$nodes/node$node"
  FSDIST_NODE_ID="node$node" FSDIST_LOCAL_DIR="$nodes/node$node" \
    "$python" -m fsdist run --nnodes 2 --node-rank "$node" --nproc-per-node 2 --dir "$dir" "$@" &
  pids[node]=$!
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit "$status"
