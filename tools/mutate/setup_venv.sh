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

if [[ -f "$venv/.kvlab-requirements" ]] && cmp -s "$req" "$venv/.kvlab-requirements"; then
  rm -f "$unavailable"
  echo "kvlab mutate setup: universalmutator venv present (build/mutate-venv)"
  exit 0
fi
python=${KVLAB_PYTHON:-python3}
command -v "$python" >/dev/null || fail "no $python on PATH"
rm -rf "$venv"
log="$root/build/mutate-venv.log"
"$python" -m venv "$venv" >"$log" 2>&1 || fail "'$python -m venv' failed (see build/mutate-venv.log)"
if ! "$venv/bin/pip" install -q --disable-pip-version-check --no-input --no-deps --require-hashes \
    -r "$req" >>"$log" 2>&1; then
  reason=$(grep -m1 -E 'ERROR|Could not|Failed|THESE PACKAGES' "$log" | cut -c1-200)
  rm -rf "$venv"
  fail "pip install -r tools/mutate/requirements.txt failed: ${reason:-see build/mutate-venv.log}"
fi
"$venv/bin/python" -c 'import universalmutator.mutator' >>"$log" 2>&1 ||
  { rm -rf "$venv"; fail "universalmutator installed but does not import (see build/mutate-venv.log)"; }
cp "$req" "$venv/.kvlab-requirements"
rm -f "$unavailable"
echo "kvlab mutate setup: universalmutator venv ready (build/mutate-venv)"
