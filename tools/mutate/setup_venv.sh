#!/usr/bin/env bash
# The pinned universalmutator venv of tools/mutate.sh: build/mutate-venv, from
# tools/mutate/requirements.txt (pinned with hashes, --no-deps). Idempotent: a venv whose
# stamp matches the requirements is kept. Never fails the caller: without network or
# Python it writes the reason to build/mutate-venv.unavailable, and tools/mutate.sh exits
# with that reason (the mutation-deep label skips with it).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv="$root/build/mutate-venv"
req="$root/tools/mutate/requirements.txt"
unavailable="$root/build/mutate-venv.unavailable"
mkdir -p "$root/build"

fail() {
  echo "$1" >"$unavailable"
  echo "kvlab mutate setup: universalmutator venv unavailable: $1 (tools/mutate.sh will exit with it)"
  exit 0
}

# shellcheck source=tools/pinned_venv.sh
source "$root/tools/pinned_venv.sh"
log="$root/build/mutate-venv.log"
pinned_venv "$venv" "$log" "$req" || fail "$pinned_venv_reason"
"$venv/bin/python" -c 'import universalmutator.mutator' >>"$log" 2>&1 ||
  { rm -rf "$venv"; fail "universalmutator installed but does not import (see build/mutate-venv.log)"; }
rm -f "$unavailable"
echo "kvlab mutate setup: universalmutator venv ready (build/mutate-venv)"
