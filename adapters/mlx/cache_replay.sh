#!/usr/bin/env bash
# mlx-lm's own cache classes against kvlab's cache oracle (CTest conformance.cache_replay_mlx_lm):
#   kvlab vectors write (the cache op's scripts: flat q/k/v in, kvlab's observables out)
#   → kvlab_mlx run (kvlab_mlx/cache_replay.py drives KVCache, RotatingKVCache,
#     QuantizedKVCache, ChunkedKVCache as a model layer does) → kvlab check --vectors,
#   judged by the oracle under the cache op's policy, with the register of known
#   divergences harness/known/mlx-lm-caches: an unlisted divergence fails, and so does an
#   entry that no longer reproduces.
# usage: cache_replay.sh KVLAB PYTHON WORKDIR [TIER]
set -euo pipefail
kvlab=$1 py=$2 work=$3 tier=${4:-ci}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$work"
"$kvlab" vectors write --tier "$tier" --op cache -o "$work/kvlab_caches.safetensors"
PYTHONPATH="$root/adapters/mlx" "$py" -m kvlab_mlx run "$work/kvlab_caches.safetensors" \
  -o "$work/mlx_lm_caches.safetensors" | tee "$work/replay.txt"
"$kvlab" check --vectors "$work/mlx_lm_caches.safetensors" --known "$root/harness/known/mlx-lm-caches" \
  > "$work/judged.txt" || { cat "$work/judged.txt"; exit 1; }
tail -n 5 "$work/judged.txt"
