#!/usr/bin/env bash
# The Python route end to end (CTest conformance.vectors_round_trip_mlx):
#   kvlab vectors write (the conformance cases of every op) → kvlab_mlx run (MLX's Python
#   API and mlx-lm recompute the outputs) → kvlab check --vectors, judged by the oracle,
#   then by the mlx backend (the C++ route): both routes must agree.
# usage: round_trip.sh KVLAB PYTHON WORKDIR
set -euo pipefail
kvlab=$1 py=$2 work=$3
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$work"
cases=()
# The cache op has its own replay (cache_replay.sh), with its registers.
for f in "$root"/harness/cases/*/conformance; do [[ $f == */cache/conformance ]] || cases+=(--cases "$f"); done
"$kvlab" vectors write "${cases[@]}" -o "$work/kvlab.safetensors"
PYTHONPATH="$root/adapters/mlx" "$py" -m kvlab_mlx run "$work/kvlab.safetensors" -o "$work/mlx.safetensors"
"$kvlab" check --vectors "$work/mlx.safetensors" > "$work/judged_by_oracle.txt" || { cat "$work/judged_by_oracle.txt"; exit 1; }
tail -n 12 "$work/judged_by_oracle.txt"
"$kvlab" check --vectors "$work/mlx.safetensors" --backend mlx > "$work/judged_by_mlx.txt" || { cat "$work/judged_by_mlx.txt"; exit 1; }
tail -n 3 "$work/judged_by_mlx.txt"
