#!/usr/bin/env bash
# The pinned Python environment of the real-engine replays (MLX, mlx-lm): build/venv,
# from adapters/mlx/requirements.txt (PyPI only). Idempotent: a venv whose stamp matches
# the requirements file is kept. Never fails the caller: without network (or Python),
# it writes the reason to build/venv.unavailable, and the MLX backend and the
# conformance tests skip with that reason.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/build/venv"
req="$root/adapters/mlx/requirements.txt"
unavailable="$root/build/venv.unavailable"
mkdir -p "$root/build"

if [[ -f "$venv/.kvlab-requirements" ]] && cmp -s "$req" "$venv/.kvlab-requirements"; then
  echo "kvlab setup: MLX venv present (build/venv)"
  rm -f "$unavailable"
  exit 0
fi

fail() {
  echo "$1" >"$unavailable"
  echo "kvlab setup: MLX venv unavailable: $1 (the mlx backend and the conformance tests will skip)"
  exit 0
}

python=${KVLAB_PYTHON:-python3}
command -v "$python" >/dev/null || fail "no $python on PATH"
rm -rf "$venv"
log="$root/build/venv.log"
"$python" -m venv "$venv" >"$log" 2>&1 || fail "'$python -m venv' failed (see build/venv.log)"
echo "kvlab setup: installing the pinned MLX venv (build/venv, $(grep -c '==' "$req") packages from PyPI)"
if ! "$venv/bin/pip" install -q --disable-pip-version-check --no-input -r "$req" >>"$log" 2>&1; then
  reason=$(grep -m1 -E 'ERROR|Could not|Failed' "$log" | cut -c1-200)
  rm -rf "$venv"
  fail "pip install -r adapters/mlx/requirements.txt failed: ${reason:-see build/venv.log}"
fi
cp "$req" "$venv/.kvlab-requirements"
rm -f "$unavailable"
echo "kvlab setup: MLX venv ready"
