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

# shellcheck source=tools/pinned_venv.sh
source "$root/tools/pinned_venv.sh"
pinned_venv "$venv" "$out/venv.log" "$req" || fail "$pinned_venv_reason"
"$venv/bin/python" "$root/tools/ggml/gguf_vectors.py" "$out/gguf_vectors.txt" ||
  fail "tools/ggml/gguf_vectors.py failed"
rm -f "$out/unavailable"
echo "kvlab ggml setup: build/ggml/gguf_vectors.txt written"
