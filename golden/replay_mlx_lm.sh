#!/usr/bin/env bash
# The checked-in goldens against mlx-lm (CTest golden.replay_mlx_lm):
#   1. kvlab golden models: the tiny models as folders mlx-lm loads (hash-checked);
#   2. python -m kvlab_mlx golden: every scenario replayed with mlx-lm's own machinery
#      (generate_step, BatchGenerator, LRUPromptCache, save/load_prompt_cache), written as
#      goldens in kvlab's format (adapters/mlx/kvlab_mlx/golden_replay.py);
#   3. tools/golden_table.py replay: kvlab golden diff of each checked-in golden against
#      mlx-lm's, judged by the register golden/known/mlx-lm (an unlisted divergence or a
#      stale entry fails), and the table model x scenario.
# usage: replay_mlx_lm.sh KVLAB PYTHON WORKDIR
set -euo pipefail
kvlab=$1 py=$2 work=$3
root=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$root/adapters/mlx"
mkdir -p "$work/mlx-lm"
"$kvlab" golden models --models "$work/models"
for scenarios in "$root"/golden/scenarios/*; do
  id=$(basename "$scenarios")
  "$py" -m kvlab_mlx golden --model "$work/models/$id" --model-id "$id" --scenarios "$scenarios" --out "$work/mlx-lm"
done
"$py" "$root/tools/golden_table.py" replay --kvlab "$kvlab" --golden-dir "$root/golden" --replays "$work/mlx-lm" \
  --known "$root/golden/known/mlx-lm" --json "$work/replay.json"
