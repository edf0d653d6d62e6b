#!/usr/bin/env bash
# The pinned venv of the vllm-mlx prefix-cache replay: build/venv-vllm-mlx from
# adapters/mlx/requirements-vllm-mlx.txt (hashes, --no-deps; vllm-mlx 0.6.0 beside
# mlx-lm 0.31.3, which its version range requires). Idempotent (tools/pinned_venv.sh).
# Never fails the caller: without network or Python it writes the reason to
# build/venv-vllm-mlx.unavailable, and conformance.cache_replay_vllm_mlx skips with it.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/build/venv-vllm-mlx"
unavailable="$root/build/venv-vllm-mlx.unavailable"
mkdir -p "$root/build"
# shellcheck source=tools/pinned_venv.sh
source "$root/tools/pinned_venv.sh"
if ! pinned_venv "$venv" "$root/build/venv-vllm-mlx.log" "$root/adapters/mlx/requirements-vllm-mlx.txt"; then
  echo "$pinned_venv_reason" >"$unavailable"
  echo "kvlab setup: vllm-mlx venv unavailable: $pinned_venv_reason (its replay will skip)"
  exit 0
fi
rm -f "$unavailable"
echo "kvlab setup: vllm-mlx venv ready (build/venv-vllm-mlx)"
