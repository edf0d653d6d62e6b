#!/usr/bin/env bash
# The checked-in goldens against mlx-vlm (CTest golden.replay_mlx_vlm):
#   1. kvlab golden models: the tiny models as folders (hash-checked), which mlx-vlm's own
#      loader reads unchanged (model_type llama / gemma4_text: its models/llama and
#      models/gemma4_text);
#   2. python -m kvlab_mlx golden-vlm: every single-request scenario through mlx-vlm's
#      generate_step and caches (save/load through its from_state, prefix through its
#      prefix_cache_snapshot / restore and trim), every batch through its BatchGenerator,
#      written as goldens in kvlab's format
#      (adapters/mlx/kvlab_mlx/golden_replay_vlm.py);
#   3. tools/golden_table.py replay --engine mlx-vlm: kvlab golden diff of each checked-in
#      golden against mlx-vlm's, judged by the register golden/known/mlx-vlm (an unlisted
#      divergence or a stale entry fails).
# usage: replay_mlx_vlm.sh KVLAB PYTHON WORKDIR
set -euo pipefail
kvlab=$1 py=$2 work=$3
root=$(cd "$(dirname "$0")/.." && pwd)
export PYTHONPATH="$root/adapters/mlx"
# The venv may predate mlx-vlm's pin (tools/setup_venv.sh installs it): skip with the reason.
if ! "$py" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("mlx_vlm") is None)'; then
  echo "SKIPPED: mlx-vlm is not installed in $py's venv (tools/setup_venv.sh)"
  exit 0
fi
rm -rf "$work/mlx-vlm"
mkdir -p "$work/mlx-vlm"
"$kvlab" golden models --models "$work/models"
for scenarios in "$root"/golden/scenarios/*; do
  id=$(basename "$scenarios")
  "$py" -m kvlab_mlx golden-vlm --model "$work/models/$id" --model-id "$id" --scenarios "$scenarios" --out "$work/mlx-vlm"
done
"$py" "$root/tools/golden_table.py" replay --kvlab "$kvlab" --golden-dir "$root/golden" --replays "$work/mlx-vlm" \
  --engine mlx-vlm --known "$root/golden/known/mlx-vlm" --json "$work/replay.json"
