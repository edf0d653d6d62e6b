#!/usr/bin/env bash
# The gguf-py cross-check of the ggml block oracle: builds build/ggml-venv from
# tools/ggml/requirements.txt (pinned with hashes, --no-deps) and writes
# build/ggml/gguf_vectors.txt with tools/ggml/gguf_vectors.py. Idempotent (a venv whose
# stamp matches the requirements is kept). Never fails the caller: without network or
# Python it writes the reason to build/ggml/unavailable, and
# tests/unit/test_ggml_gguf_vectors.cc skips with it.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv="$root/build/ggml-venv"
req="$root/tools/ggml/requirements.txt"
out="$root/build/ggml"
mkdir -p "$out"

fail() {
  echo "$1" >"$out/unavailable"
  rm -f "$out/gguf_vectors.txt"
  echo "kvlab ggml setup: gguf-py vectors unavailable: $1 (test_ggml_gguf_vectors will skip)"
  exit 0
}

if ! [[ -f "$venv/.kvlab-requirements" ]] || ! cmp -s "$req" "$venv/.kvlab-requirements"; then
  python=${KVLAB_PYTHON:-python3}
  command -v "$python" >/dev/null || fail "no $python on PATH"
  rm -rf "$venv"
  log="$out/venv.log"
  "$python" -m venv "$venv" >"$log" 2>&1 || fail "'$python -m venv' failed (see build/ggml/venv.log)"
  if ! "$venv/bin/pip" install -q --disable-pip-version-check --no-input --no-deps --require-hashes \
      -r "$req" >>"$log" 2>&1; then
    reason=$(grep -m1 -E 'ERROR|Could not|Failed|THESE PACKAGES' "$log" | cut -c1-200)
    rm -rf "$venv"
    fail "pip install -r tools/ggml/requirements.txt failed: ${reason:-see build/ggml/venv.log}"
  fi
  cp "$req" "$venv/.kvlab-requirements"
fi
"$venv/bin/python" "$root/tools/ggml/gguf_vectors.py" "$out/gguf_vectors.txt" ||
  fail "tools/ggml/gguf_vectors.py failed"
rm -f "$out/unavailable"
echo "kvlab ggml setup: build/ggml/gguf_vectors.txt written"
