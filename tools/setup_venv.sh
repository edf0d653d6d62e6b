#!/usr/bin/env bash
# The pinned Python environment of the real-engine replays (MLX, mlx-lm, mlx-vlm's cache
# code): build/venv, from adapters/mlx/requirements.txt and requirements-nodeps.txt (PyPI
# only). Idempotent: a venv whose stamp matches both requirements files is kept. Never
# fails the caller: without network (or Python), it writes the reason to
# build/venv.unavailable, and the MLX backend and the conformance tests skip with it.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/build/venv"
req="$root/adapters/mlx/requirements.txt"
nodeps="$root/adapters/mlx/requirements-nodeps.txt"  # engines installed without their deps
unavailable="$root/build/venv.unavailable"
mkdir -p "$root/build"
stamp=$(cat "$req" "$nodeps")

if [[ -f "$venv/.kvlab-requirements" ]] && [[ "$(cat "$venv/.kvlab-requirements")" == "$stamp" ]]; then
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
if ! "$venv/bin/pip" install -q --disable-pip-version-check --no-input --no-deps --require-hashes -r "$nodeps" \
    >>"$log" 2>&1; then
  reason=$(grep -m1 -E 'ERROR|Could not|Failed|THESE PACKAGES' "$log" | cut -c1-200)
  rm -rf "$venv"
  fail "pip install -r adapters/mlx/requirements-nodeps.txt failed: ${reason:-see build/venv.log}"
fi
printf '%s' "$stamp" >"$venv/.kvlab-requirements"
rm -f "$unavailable"
echo "kvlab setup: MLX venv ready"
