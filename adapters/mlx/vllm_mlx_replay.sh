#!/usr/bin/env bash
# vllm-mlx's prefix store against kvlab's PrefixCache (CTest
# conformance.cache_replay_vllm_mlx), or its register's repros and the adapter's
# prefix-verb tests (REPROS=1: conformance.repros_vllm_mlx), in the venv of its own (build/venv-vllm-mlx,
# tools/setup_venv_vllm_mlx.sh). Without that venv it prints SKIPPED with the reason the
# setup wrote, and the test skips. STORE=mlx-vlm-apc[-kvq]: mlx-vlm's APC instead, in
# build/venv (CTests conformance.cache_replay_mlx_vlm_apc[_kvq]; with REPROS=1 mlx-vlm's
# repros and the APC store's tests).
# usage: [STORE=NAME] vllm_mlx_replay.sh KVLAB WORKDIR [TIER COUNT SEED]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
venv=${KVLAB_VLLM_MLX_VENV:-$root/build/venv-vllm-mlx} setup=tools/setup_venv_vllm_mlx.sh
if [[ ${STORE:-} == mlx-vlm-* ]]; then  # mlx-vlm's APC (kvlab_mlx/prefix_store_apc.py): build/venv
  venv=${KVLAB_MLX_VENV:-$root/build/venv} setup=tools/setup_venv.sh
fi
if [[ ! -x $venv/bin/python ]]; then
  echo "SKIPPED: no venv at $venv for ${STORE:-vllm-mlx}: $(cat "$venv.unavailable" 2>/dev/null || echo "run $setup")"
  exit 0
fi
if [[ ${REPROS:-0} == 1 && ${STORE:-} == mlx-vlm-* ]]; then  # APC's repros are mlx-vlm's
  "$venv/bin/python" "$root/adapters/mlx/repros/run.py" mlx-vlm
  cd "$root/adapters/mlx"
  exec env PYTHONPATH=. "$venv/bin/python" -m unittest tests.test_prefix_store_apc
fi
if [[ ${REPROS:-0} == 1 ]]; then
  "$venv/bin/python" "$root/adapters/mlx/repros/run.py" vllm-mlx
  cd "$root/adapters/mlx"
  exec env PYTHONPATH=. "$venv/bin/python" -m unittest tests.test_cache_replay.PrefixVerbs \
    tests.test_cache_replay.PrefixStores tests.test_cache_replay.KvlabPolicyRule
fi
# STORE: which of vllm-mlx's prefix stores (kvlab_mlx/engines.py VLLM_MLX_STORES): vllm-mlx
# (MemoryAwarePrefixCache), vllm-mlx-kvq (the same with kv_quantize), vllm-mlx-manager
# (PrefixCacheManager), vllm-mlx-paged; or mlx-vlm's APC, mlx-vlm-apc and mlx-vlm-apc-kvq
# (engines.py MLX_VLM_STORES), in build/venv (KVLAB_MLX_VENV); their repros run in
# conformance.repros_mlx_vlm. Each request's hit kind goes to WORKDIR/hits.jsonl for the table.
mkdir -p "$2"
rm -f "$2/hits.jsonl"
export KVLAB_PREFIX_HITS="$2/hits.jsonl"
bash "$root/adapters/mlx/cache_replay.sh" "$1" "$venv/bin/python" "$2" "${3:-ci}" "${4:-320}" "${5:-1}" "${STORE:-vllm-mlx}"
# The replay judges each hit's reuse by a shadow of kvlab's matching rule
# (kvlab_mlx/prefix_stores.py); it must give the oracle's own count at every request.
cd "$root/adapters/mlx"
exec env PYTHONPATH=. "$venv/bin/python" -m kvlab_mlx prefix-rule "$2/tier.kvlab.safetensors" "$2/random.kvlab.safetensors"
