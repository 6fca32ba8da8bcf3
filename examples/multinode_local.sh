#!/usr/bin/env bash
# Two "nodes" on one machine that share nothing but a directory: two launchers, one 4-rank job.
#   examples/multinode_local.sh [SCRIPT] [ARGS...]     (default: examples/train_ddp.py --steps 30)
# On real machines run the same `fsdist run` line on each node with its own --node-rank and a
# --dir on the shared filesystem. Both launchers exit non-zero if any rank fails.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
[ $# -gt 0 ] || set -- "$here/train_ddp.py" --steps 30
dir=$(mktemp -d "${TMPDIR:-/tmp}/fsdist-multinode-XXXXXX")
trap 'rm -rf "$dir"' EXIT
for node in 0 1; do
  "$python" -m fsdist run --nnodes 2 --node-rank "$node" --nproc-per-node 2 --dir "$dir" "$@" &
  pids[node]=$!
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit "$status"
