#!/usr/bin/env bash
# mlx-vlm 0.7.10's TurboQuant against kvlab's oracle (CTest conformance.turboquant_mlx_vlm;
# docs/turboquant.md §Against mlx-vlm): kvlab_mlx/turboquant_mlx_vlm.py writes mlx-vlm's
# rotations, codebooks, codes, decodes and attention outputs on inputs seeded by SEED;
# the judge gives those rotations and codebooks to kvlab's codec and compares within
# derived f32 error bounds, with the register harness/known/mlx-vlm-turboquant.
# usage: turboquant_mlx_vlm.sh JUDGE PYTHON WORKDIR [SEED]
set -euo pipefail
judge=$1 py=$2 work=$3 seed=${4:-1}
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$work"
echo "turboquant_mlx_vlm: seed $seed"
PYTHONPATH="$root/adapters/mlx" "$py" -m kvlab_mlx.turboquant_mlx_vlm --seed "$seed" -o "$work/mlx_vlm.$seed.txt"
if ! "$judge" "$work/mlx_vlm.$seed.txt" "$root/harness/known/mlx-vlm-turboquant"; then
  echo "repro: bash adapters/mlx/turboquant_mlx_vlm.sh $judge $py $work $seed"
  exit 1
fi
