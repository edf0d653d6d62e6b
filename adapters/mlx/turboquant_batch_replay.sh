#!/usr/bin/env bash
# mlx-vlm 0.7.10's BatchTurboQuantKVCache judged by invariants, each batch row against
# mlx-vlm's own single-sequence TurboQuantKVCache (CTest conformance.turboquant_batch_mlx_vlm;
# docs/turboquant.md §Batches against mlx-vlm): COUNT seeded sequences of prefill chunks,
# decode steps, filters, extends, trims, state round trips and held states, from SEED,
# with the register harness/known/mlx-vlm-turboquant-batch. Without mlx-vlm in the venv it
# prints SKIPPED with the reason and exits 0.
# usage: turboquant_batch_replay.sh PYTHON [SEED] [COUNT]
set -euo pipefail
py=$1 seed=${2:-1} count=${3:-16}
root=$(cd "$(dirname "$0")/../.." && pwd)
if [[ ! -x $py ]]; then
  echo "SKIPPED: no python at $py (run tools/setup_venv.sh)"
  exit 0
fi
if ! "$py" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("mlx_vlm") is None)'; then
  echo "SKIPPED: mlx-vlm is not installed in $py's venv (tools/setup_venv.sh)"
  exit 0
fi
echo "turboquant_batch_replay: seed $seed, $count sequences"
if ! PYTHONPATH="$root/adapters/mlx" "$py" -m kvlab_mlx.turboquant_batch_replay --seed "$seed" --count "$count" \
    --known "$root/harness/known/mlx-vlm-turboquant-batch"; then
  echo "repro: bash adapters/mlx/turboquant_batch_replay.sh $py $seed $count"
  exit 1
fi
